"""One episode served lazily: its outline (the byte span of every trace and node, found once
by ``_outline`` and kept), then one node at a time, read from the chunk by its span alone.

A 60 MB record is read whole only to outline it (or to give its text for a diff): in a
worker thread, into a mapping that is unmapped in one too; a sealed chunk's frames it spans
decompressed. The outline's summary is encoded once and kept. A node is read back as its own
bytes (a sealed chunk decompresses only the frames they span) and parsed a field a step, so
no parse of a whole record or of a huge string holds the loop (docs/design.md D19).
"""

from __future__ import annotations

import io
import mmap
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any, Final, TypeVar

import anyio
import orjson

from ...errors import TraceFormatError
from .._layout import chunk_path, sealed_path
from .._outline import NodeOutline, Outline, OutlineScan, Span, count_items
from .._reader import after_newline, chunk_name
from .._sealed import DamagedFrame, SealedChunk
from ._runs import OutsideRun, Run, inside
from ._table import Clock, Where

__all__ = ["Episodes", "NotFound"]

#: A field's JSON is parsed and shown when at most this long, else ``{"$bytes": N}``.
SMALL: Final = 64 << 10
#: A node's ``content`` (or ``reasoning_content``) is cut to this many bytes of JSON.
TEXT_BYTES: Final = 1 << 20
#: Characters of a node's content shown in the outline.
PREVIEW: Final = 200
#: The transcript for a diff holds at most this many bytes of text.
TRANSCRIPT_BYTES: Final = 2 << 20
#: A record is read this many bytes at a time.
_PIECE: Final = 2 << 20
#: Outlines kept (each: the spans of a record's nodes and its summary, ~1-4 MB for 60 MB).
KEPT: Final = 8
_TOKENS: Final = ("token_ids", "logprobs", "advantages", "mask", "is_content")
_TEXTS: Final = ("content", "reasoning_content")


T = TypeVar("T")


class NotFound(LookupError):
    """The run has no such line, trace or node."""


class _Nodes:
    """The spans of a record's nodes and of their fields, kept in a few arrays rather than
    an object per node and field: the outlines kept cost the cyclic collector nothing to
    walk (docs/design.md D19)."""

    def __init__(self) -> None:
        self.traces = array("q", [0])  # trace t's nodes are nodes[traces[t]:traces[t + 1]]
        self.nodes = array("q")  # per node: start, end, its first field's index
        self.fields = array("q")  # per field: key number, start, end
        self.keys: tuple[str, ...] = ()

    @classmethod
    async def pack(cls, outline: Outline) -> _Nodes:
        """The spans of ``outline``'s nodes, packed a step at a time."""
        packed = cls()
        keys: dict[str, int] = {}
        nodes, fields = packed.nodes, packed.fields
        clock = Clock()
        for trace in outline.traces:
            for node in trace.nodes:
                nodes.extend((*node.span, len(fields) // 3))
                for key, span in node.fields.items():
                    fields.extend((keys.setdefault(key, len(keys)), *span))
                await clock.tick()
            packed.traces.append(len(nodes) // 3)
        nodes.extend((0, 0, len(fields) // 3))  # where the last node's fields end
        packed.keys = tuple(keys)
        return packed

    def __len__(self) -> int:
        return len(self.traces) - 1

    def count(self, trace: int) -> int:
        """How many nodes trace ``trace`` holds."""
        return self.traces[trace + 1] - self.traces[trace]

    def node(self, trace: int, node: int) -> NodeOutline:
        at = 3 * (self.traces[trace] + node)
        start, end, first = self.nodes[at : at + 3]
        fields = self.fields[3 * first : 3 * self.nodes[at + 5]]
        return NodeOutline(
            (start, end),
            {
                self.keys[fields[i]]: (fields[i + 1], fields[i + 2])
                for i in range(0, len(fields), 3)
            },
        )


class _Outlined:
    """A record's node spans and the summary served for it (encoded once)."""

    def __init__(self, where: Where, length: int, nodes: _Nodes, summary: bytes) -> None:
        self.where = where
        self.length = length
        self.nodes = nodes
        self.summary = summary


def _open(run: Run, chunk: int) -> io.BufferedReader | SealedChunk:
    """Chunk ``chunk`` of ``run`` (plain before sealed), only from inside the run."""
    plain = chunk_path(run.stream, chunk)
    try:
        return open(inside(plain, run.root), "rb")
    except FileNotFoundError:
        return SealedChunk(inside(sealed_path(run.stream, chunk), run.root))


def _read(run: Run, where: Where, start: int, end: int) -> bytes:
    """Bytes ``start`` to ``end`` of the record ``where`` points at. Blocking."""
    with _open(run, where.chunk) as f:
        f.seek(where.offset + start)
        want = end - start
        data = f.read(want)
        while len(data) < want and (more := f.read(want - len(data))):
            data += more
    if len(data) != want:
        raise ValueError("the index points past the data")
    return data


def _read_line(run: Run, where: Where) -> mmap.mmap:
    """The record's whole line (its newline dropped), in an anonymous mapping, a piece at a
    time. Blocking.

    Not one ``bytes``: allocating 60 MB and touching its pages in one C call holds the GIL
    for 15-25 ms, and freeing it 4-9 ms. A mapping's pages are touched a piece at a time (a
    plain chunk's by the kernel, in ``readinto``, with the GIL released), and it is unmapped
    with the GIL released (``_release``)."""
    with _open(run, where.chunk) as f:
        length = where.length
        if length is None:  # a row prime-rl wrote: the line at its offset
            length = after_newline(f, where.offset) - where.offset
        want = length - 1
        if want <= 0:
            raise ValueError("the index points at an empty line")
        line = mmap.mmap(-1, want)
        try:
            f.seek(where.offset)
            got = 0
            with memoryview(line) as view:
                while got < want:
                    piece = view[got : min(want, got + _PIECE)]
                    if isinstance(f, SealedChunk):
                        data = f.read(len(piece))
                        piece[: len(data)] = data
                        n = len(data)
                    else:
                        n = f.readinto(piece)
                    piece.release()
                    if not n:
                        break
                    got += n
            if got != want:
                raise ValueError("the index points past the data")
        except BaseException:
            line.close()
            raise
    return line


def _close(line: mmap.mmap) -> None:
    """Unmap a record's mapping: 5-15 ms for 60 MB of touched pages on these machines, with
    the GIL released (so: in a worker thread, where the loop runs on meanwhile)."""
    line.close()


async def _release(line: mmap.mmap) -> None:
    """Let go of a record's mapping off the loop, even when the request is cancelled."""
    with anyio.CancelScope(shield=True):
        await anyio.to_thread.run_sync(_close, line)


async def _fields(data: memoryview) -> dict[str, Span]:
    """The spans of an object's keys (relative to ``data``), scanned in steps."""
    scan = OutlineScan(data)
    while (found := scan.step()) is None:
        await anyio.sleep(0)
    return found.fields


def _small(data: memoryview, span: Span) -> Any:
    """A field's value when its JSON is small, else ``{"$bytes": N}``."""
    start, end = span
    if end - start > SMALL:
        return {"$bytes": end - start}
    return orjson.loads(data[start:end])


def _string_prefix(raw: memoryview, limit: int) -> str:
    """The start of a JSON string (``raw`` is its JSON, quotes included), about ``limit``
    bytes of it, cut where no escape or UTF-8 sequence is split."""
    cut = bytes(raw[: max(2, limit)])
    for back in range(12):
        piece = cut[: len(cut) - back] if back else cut
        try:
            value = orjson.loads(piece + b'"')
        except orjson.JSONDecodeError:
            continue
        if isinstance(value, str):
            return value
    return ""


def _parse_message(
    view: memoryview, fields: Mapping[str, Span], *, limit: int
) -> tuple[dict[str, Any], bool]:
    """A large message from the spans of its keys: texts over ``limit`` bytes cut, other
    fields shown when small. Returns (message, whether a text was cut)."""
    message: dict[str, Any] = {}
    cut = False
    for key, (a, b) in fields.items():
        if key in _TEXTS and view[a] == 0x22 and b - a > limit:
            message[key], cut = _string_prefix(view[a:b], limit), True
        elif key in _TEXTS and b - a <= TEXT_BYTES:
            message[key] = orjson.loads(view[a:b])
        else:
            message[key] = _small(view, (a, b))
    return message, cut


async def _message(data: memoryview, span: Span, *, limit: int) -> tuple[dict[str, Any], bool]:
    """A node's ``message``; when its JSON is over ``SMALL``, its texts are cut to about
    ``limit`` bytes. Returns (message, whether a text was cut). On the loop, in steps."""
    start, end = span
    view = data[start:end]
    if end - start <= SMALL:
        value = orjson.loads(view)
        return (value if isinstance(value, dict) else {"$value": value}), False
    return _parse_message(view, await _fields(view), limit=limit)


async def _node_answer(raw: bytes, found: NodeOutline) -> bytes:
    """The JSON answer for one node from its bytes: its message (texts cut to
    ``TEXT_BYTES``), its other small fields, and its per-token arrays as stored (each
    checked by a parse: the outline only skipped over them). A field a step, on the loop
    (in a worker thread the parses would hold the GIL from the loop up to the switch
    interval and more).

    :raises ValueError: A field is not JSON.
    """
    start = found.span[0]
    data = memoryview(raw)
    message: Any = None
    cut = False
    fields: dict[str, Any] = {}
    tokens: list[bytes] = []
    count = 0
    for key, (a, b) in found.fields.items():
        a, b = a - start, b - start
        if key == "message":
            message, cut = await _message(data, (a, b), limit=TEXT_BYTES)
        elif key in _TOKENS:
            value = orjson.loads(data[a:b])
            if key == "token_ids" and isinstance(value, list):
                count = len(value)
            tokens.append(orjson.dumps(key) + b":" + raw[a:b])
        else:
            fields[key] = _small(data, (a, b))
        await anyio.sleep(0)
    missing = [orjson.dumps(key) + b":null" for key in _TOKENS if key not in found.fields]
    return b"".join(
        [
            b'{"message":',
            orjson.dumps(message),
            b',"truncated":',
            b"true" if cut else b"false",
            b',"fields":',
            orjson.dumps(fields),
            b',"tokens":{"count":%d,' % count,
            b",".join(tokens + missing),
            b"}}",
        ]
    )


def _text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # content parts: their text
        return "\n".join(
            part["text"]
            for part in content
            if isinstance(part, dict) and isinstance(part.get("text"), str)
        )
    return ""


async def _in_thread(read: Callable[..., T], run: Run, where: Where, *args: Any, what: str) -> T:
    """``read(run, where, *args)`` in a worker thread, what can go wrong reading a record
    translated to ``TraceFormatError`` naming the episode and its chunk."""
    try:
        return await anyio.to_thread.run_sync(read, run, where, *args)
    except (FileNotFoundError, OutsideRun) as exc:
        chunk = chunk_name(run.stream, where.chunk)
        raise TraceFormatError(
            f"{what}: its chunk is missing or outside the run ({exc})", chunk=chunk
        ) from exc
    except (ValueError, DamagedFrame) as exc:
        raise _not_json(run, where, what, exc) from exc


def _not_json(run: Run, where: Where, what: str, exc: Exception) -> TraceFormatError:
    return TraceFormatError(
        f"{what} is not where its row says, or not JSON ({exc})",
        chunk=chunk_name(run.stream, where.chunk),
        offset=where.offset,
    )


class Episodes:
    """The outlines of a browser's episodes, each built once and kept (``KEPT`` of them),
    one at a time (a 60 MB record is held only while it is outlined)."""

    def __init__(self) -> None:
        self._kept: OrderedDict[tuple[str, int, int, int], _Outlined] = OrderedDict()
        self._building: dict[tuple[str, int, int, int], anyio.Event] = {}
        self._one = anyio.Semaphore(1)

    async def outline(self, run: Run, line: int) -> tuple[_Outlined, float]:
        """The episode's outline and the seconds spent building it (0 when kept)."""
        where = run.table.locate(line)
        if where is None:
            raise NotFound(f"{run.name} has no episode at line {line}")
        key = (run.name, line, where.chunk, where.offset)
        while True:
            kept = self._kept.get(key)
            if kept is not None:
                self._kept.move_to_end(key)
                return kept, 0.0
            building = self._building.get(key)
            if building is None:
                break
            await building.wait()
        done = self._building[key] = anyio.Event()
        try:
            started = time.perf_counter()
            async with self._one:
                built = await self._build(run, where)
            self._kept[key] = built
            while len(self._kept) > KEPT:
                self._kept.popitem(last=False)
            return built, time.perf_counter() - started
        finally:
            del self._building[key]
            done.set()

    async def _build(self, run: Run, where: Where) -> _Outlined:
        what = f"episode at line {where.line}"
        chunk = chunk_name(run.stream, where.chunk)
        line = await _in_thread(_read_line, run, where, what=what)
        size = len(line)
        try:
            with memoryview(line) as data:
                scan = OutlineScan(line)
                try:
                    while (outline := scan.step()) is None:
                        await anyio.sleep(0)
                except ValueError as exc:
                    raise TraceFormatError(
                        f"{what} is not a JSON record ({exc})", chunk=chunk, offset=where.offset
                    ) from exc
                finally:
                    del scan
                summary = await _summary(data, outline)
        finally:
            await _release(line)  # the record is held only while it is outlined
        body = orjson.dumps({"row": run.table.row(where.line), "bytes": size, **summary})
        return _Outlined(where, size, await _Nodes.pack(outline), body)

    async def node(self, run: Run, line: int, trace: int, node: int) -> bytes:
        """Node ``node`` of trace ``trace`` as its JSON answer (``_node_answer``)."""
        outlined, _ = await self.outline(run, line)
        nodes = outlined.nodes
        if not 0 <= trace < len(nodes) or not 0 <= node < nodes.count(trace):
            raise NotFound(f"episode {line} has no trace {trace} node {node}")
        found = nodes.node(trace, node)
        what = f"episode at line {line}, trace {trace} node {node}"
        where = outlined.where
        raw = await _in_thread(_read, run, where, *found.span, what=what)
        try:
            return await _node_answer(raw, found)
        except ValueError as exc:  # orjson's JSONDecodeError is a ValueError
            raise _not_json(run, where, what, exc) from exc

    async def text(self, run: Run, line: int) -> dict[str, Any]:
        """The episode as plain text (``[T.N role]`` and content per node), at most
        ``TRANSCRIPT_BYTES`` of it, for a diff. The record is read once, as for its outline
        (a node at a time, a sealed chunk would decompress its frames again for each)."""
        outlined, _ = await self.outline(run, line)
        nodes = outlined.nodes
        record = await _in_thread(_read_line, run, outlined.where, what=f"episode at line {line}")
        parts: list[str] = []
        size = 0
        truncated = False
        try:
            with memoryview(record) as data:
                for t in range(len(nodes)):
                    for n in range(nodes.count(t)):
                        span = nodes.node(t, n).fields.get("message")
                        if span is None:
                            continue
                        if size >= TRANSCRIPT_BYTES:
                            truncated = True
                            break
                        message, cut = await _message(data, span, limit=TRANSCRIPT_BYTES - size)
                        role = message.get("role")
                        role = role if isinstance(role, str) else "?"
                        text = f"[{t}.{n} {role}]\n{_text_of(message)}\n"
                        if size + len(text) > TRANSCRIPT_BYTES:
                            text, cut = text[: TRANSCRIPT_BYTES - size], True
                        parts.append(text)
                        size += len(text)
                        truncated = truncated or cut
                        await anyio.sleep(0)
        except ValueError as exc:
            raise _not_json(run, outlined.where, f"episode at line {line}", exc) from exc
        finally:
            await _release(record)
        return {"text": "".join(parts), "truncated": truncated}


async def _summary(data: memoryview, outline: Outline) -> dict[str, Any]:
    """What the page shows of an outlined record: its small top-level fields, and per trace
    its small fields and a line per node."""
    clock = Clock()

    async def small_fields(spans: Mapping[str, Span], skip: str) -> dict[str, Any]:
        out = {}
        for key, span in spans.items():
            if key != skip:
                out[key] = _small(data, span)  # up to 64 KiB parsed: a step each
                await clock.tick()
        return out

    fields = await small_fields(outline.fields, "traces")
    traces = []
    for t, trace in enumerate(outline.traces):
        small = await small_fields(trace.fields, "nodes")
        agent = small.get("agent")
        nodes = []
        for n, node in enumerate(trace.nodes):
            nodes.append(await _node_line(data, n, node.span, node.fields))
            await clock.tick()
        traces.append(
            {
                "index": t,
                "id": small.get("id"),
                "agent": agent.get("name") if isinstance(agent, dict) else None,
                "fields": small,
                "nodes": nodes,
            }
        )
        await clock.tick()
    return {"fields": fields, "traces": traces}


async def _node_line(
    data: memoryview, n: int, span: Span, fields: Mapping[str, Span]
) -> dict[str, Any]:
    """One node's line in the outline: its role, the start of its content, its counts."""
    role: Any = None
    preview = ""
    chars: int | None = None
    calls = 0
    if "message" in fields:
        span_of = fields["message"]
        small = span_of[1] - span_of[0] <= SMALL  # else only the start of its text is read
        message, cut = await _message(data, span_of, limit=TEXT_BYTES if small else 4 * PREVIEW)
        role = message.get("role")
        text = _text_of(message)
        preview = text[:PREVIEW]
        chars = None if cut else len(text)
        tool_calls = message.get("tool_calls")
        calls = len(tool_calls) if isinstance(tool_calls, list) else 0
    token_span = fields.get("token_ids")
    tokens: int | None = 0
    if token_span is not None:
        try:
            tokens = count_items(data, token_span)
        except ValueError:  # not an array of numbers: shown when the node is opened
            tokens = None
    sampled = _small(data, fields["sampled"]) if "sampled" in fields else None
    # The nodes it follows: its semantic parents when it names some, else its one parent.
    parents = _small(data, fields["semantic_parents"]) if "semantic_parents" in fields else None
    if not parents and "parent" in fields:
        parent = _small(data, fields["parent"])
        parents = [parent] if type(parent) is int else parents
    error = False
    for key in ("error", "errors"):
        if key in fields:
            value = _small(data, fields[key])
            error = error or bool(value)
    return {
        "index": n,
        "role": role if isinstance(role, str) else None,
        "preview": preview,
        "chars": chars,
        "tool_calls": calls,
        "tokens": tokens,
        "sampled": sampled if isinstance(sampled, bool) else None,
        "parents": parents,
        "error": error,
        "bytes": span[1] - span[0],
    }
