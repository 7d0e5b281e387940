"""Read a trace stream back: every record of every chunk (plain or sealed), in order, in
bounded memory; or one record, by its number or its id, through the index."""

from __future__ import annotations

import itertools
import math
import os
import secrets
from collections.abc import AsyncIterator, Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, Literal, Protocol

import anyio
import ijson
import orjson

from ..errors import TraceFormatError
from ._annotations import fold as fold_annotations
from ._annotations import read_annotations
from ._index import count_rows, find_id, last_row, row_by_line, rows_of_chunk
from ._layout import (
    IndexRow,
    annotations_of,
    chunk_path,
    index_path,
    list_chunks,
    sealed_path,
    stream_of,
)
from ._sealed import DamagedFrame, open_chunk

__all__ = [
    "LineSpan",
    "TraceReader",
    "after_newline",
    "aread_records",
    "chunk_name",
    "find_record",
    "find_row",
    "iter_spans",
    "line_at",
    "parse_span",
    "read_record",
    "read_records",
]

_BLOCK = 1 << 20
#: Lines longer than this are parsed by ijson straight from the file instead of being read
#: into memory and parsed there (which would hold the record twice).
BIG_LINE = 16 << 20
_INT_MIN = -(1 << 63)  # orjson.loads reads ints in [i64 min, u64 max] as ints, others as floats
_UINT_MAX = (1 << 64) - 1
#: Read after a long line (see ``parse_span``); random, so no line can forge it.
_SENTINEL = secrets.randbits(60) | 1 << 60

OnError = Literal["raise", "skip"]


class _Readable(Protocol):
    def read(self, n: int = -1, /) -> bytes: ...
    def seek(self, offset: int, whence: int = 0, /) -> int: ...


#: Given where a line cut by a damaged frame starts and where the frame ends, where the next
#: whole record starts (None: unknown) and how many records were lost.
Resync = Callable[[int, int], tuple[int | None, int]]


class LineSpan:
    """One line of one chunk: where it is, and whether it ends with a newline; or (``lost``
    > 0) the bytes a damaged frame of a sealed chunk made unreadable."""

    __slots__ = ("chunk", "complete", "data", "length", "lost", "offset")

    def __init__(
        self,
        chunk: int,
        offset: int,
        length: int,
        complete: bool,
        data: bytes | None,
        lost: int = 0,
    ) -> None:
        self.chunk = chunk
        self.offset = offset
        self.length = length  # without the newline
        self.complete = complete
        self.data = data  # the line's bytes, or None for a line longer than BIG_LINE
        self.lost = lost  # records lost to a damaged frame (then the span is not a line)


def after_newline(f: _Readable, offset: int) -> int:
    """The offset just past the first newline at or after ``offset`` (the end of the chunk
    when there is none), reading on past damaged frames."""
    f.seek(offset)
    while True:
        try:
            block = f.read(_BLOCK)
        except DamagedFrame as exc:
            offset = f.seek(exc.end)
            continue
        if not block:
            return offset
        at = block.find(b"\n")
        if at >= 0:
            return offset + at + 1
        offset += len(block)


def _spans_of(
    f: _Readable, chunk: int, *, big_line: int, resync: Resync | None = None
) -> Iterator[LineSpan]:
    """Split one chunk file into lines, reading at most ~``big_line`` bytes at a time; a
    damaged frame gives one span with ``lost`` set, and reading goes on at the next record
    (found by ``resync``, else after the next newline)."""
    buf = bytearray()
    start = 0  # index in buf of the current line's first byte
    pos = 0  # file offset of buf[0]
    while True:
        try:
            nl = buf.find(b"\n", start)
            if nl >= 0:
                yield LineSpan(chunk, pos + start, nl - start, True, bytes(buf[start:nl]))
                start = nl + 1
                continue
            if len(buf) - start > big_line:
                # A long line: find where it ends without keeping it.
                scanned = len(buf) - start
                pos, start = pos + start, 0
                buf.clear()
                while True:
                    block = f.read(_BLOCK)
                    if not block:
                        yield LineSpan(chunk, pos, scanned, False, None)
                        return
                    at = block.find(b"\n")
                    if at >= 0:
                        yield LineSpan(chunk, pos, scanned + at, True, None)
                        buf += block[at + 1 :]
                        pos += scanned + at + 1
                        break
                    scanned += len(block)
                continue
            if start:
                del buf[:start]
                pos += start
                start = 0
            block = f.read(_BLOCK)
            if not block:
                if buf:
                    yield LineSpan(chunk, pos, len(buf), False, bytes(buf))
                return
            buf += block
        except DamagedFrame as exc:
            line_start = pos + start
            nxt, lost = resync(line_start, exc.end) if resync else (None, 1)
            if nxt is None:
                nxt = after_newline(f, exc.end)
            f.seek(nxt)
            buf.clear()
            pos, start = nxt, 0
            yield LineSpan(chunk, line_start, nxt - line_start, False, None, lost=max(lost, 1))


def chunk_name(root: Path, chunk: int) -> str:
    """The chunk's file name, as errors give it."""
    plain = chunk_path(root, chunk)
    return plain.name if plain.exists() else sealed_path(root, chunk).name


def iter_spans(
    directory: str | os.PathLike[str],
    *,
    big_line: int = BIG_LINE,
    chunks: list[int] | None = None,
) -> Iterator[LineSpan]:
    """Every line of every chunk of the stream (or of ``chunks``), plain or sealed, in
    order; past a damaged frame, a span with ``lost`` set, then the next record (found
    through the index).

    :raises TraceFormatError: A stray file in the directory, or a sealed chunk whose seek
        table is damaged.
    """
    root = Path(directory)
    for chunk in list_chunks(root) if chunks is None else chunks:
        with open_chunk(root, chunk) as f:
            yield from _spans_of(f, chunk, big_line=big_line, resync=_index_resync(root, chunk))


class _Range:
    """A read-only file-like view of ``f[offset:offset+length]`` for ijson, followed by
    ``tail``."""

    def __init__(self, f: _Readable, offset: int, length: int, tail: bytes = b"") -> None:
        self.f = f
        self.left = length
        self.tail = tail
        f.seek(offset)

    def read(self, n: int = -1) -> bytes:
        if self.left <= 0:
            tail, self.tail = self.tail, b""
            return tail
        n = self.left if n < 0 else min(n, self.left)
        data = self.f.read(n)
        self.left -= len(data)
        if b"\x0b" in data or b"\x0c" in data:
            # yajl takes these for whitespace; JSON (and orjson) allows them nowhere raw.
            raise ValueError("a control character outside the JSON grammar")
        return data


def _number(value: Any) -> Any:
    """An ijson number as orjson.loads gives it: Decimals and ints past 64 bits as floats,
    and a float past the double range refused, as orjson refuses it."""
    big_int = type(value) is int and not _INT_MIN <= value <= _UINT_MAX
    if not big_int and not isinstance(value, Decimal):
        return value
    value = float(value)
    if math.isinf(value):
        raise ValueError("number out of range")
    return value


def _orjson_numbers(value: Any) -> Any:
    """``_number`` over a parsed value (in place, no recursion)."""
    stack = [value]
    while stack:
        node = stack.pop()
        pairs = node.items() if isinstance(node, dict) else enumerate(node)
        for key, item in pairs:
            if isinstance(item, (dict, list)):
                stack.append(item)
            elif isinstance(item, (int, Decimal)) and type(item) is not bool:
                node[key] = _number(item)
    return value


def parse_span(root: Path, span: LineSpan) -> Any:
    """The record on the line: parsed from memory, or streamed by ijson from the chunk."""
    if span.data is not None:
        return orjson.loads(span.data)
    with open_chunk(root, span.chunk) as f:
        # Not use_float (the C backend then refuses ints past 2**63): Decimals become floats
        # after. A random sentinel follows the line and must parse whole and last, else the
        # line is not exactly one value (yajl ignores a cut string at the end of its input).
        tail = b" %d" % _SENTINEL
        items = ijson.items(_Range(f, span.offset, span.length, tail), "", multiple_values=True)
        values = list(itertools.islice(items, 3))
        if len(values) < 2 or values[-1] != _SENTINEL or type(values[-1]) is not int:
            raise ValueError("not one complete JSON value")
        if len(values) > 2:
            raise ValueError("more than one JSON value on the line")
        value = values[0]
    return _orjson_numbers(value) if isinstance(value, (dict, list)) else _number(value)


class TraceReader(Iterator[Any]):
    """Iterates the records of a trace stream, plain and sealed chunks alike, in order.

    A last line without its newline (a writer still at work, or a crash not yet mended) is
    not a record: it is counted in ``torn_tail_bytes`` and never returned. Any other line
    that is not one complete JSON value, a damaged frame of a sealed chunk, or a sealed
    chunk whose seek table is damaged raises ``TraceFormatError`` naming the file and
    offset; with ``on_error="skip"`` it is skipped, the records lost counted in ``skipped``
    (through the index, for a damaged frame or chunk) and the damaged frames and chunks in
    ``damaged``.

    :param directory: A run's directory (its stream is ``monitors/file/traces/stream``) or
        a stream's.
    :param on_error: ``"raise"`` or ``"skip"`` for a line that is not a record.
    :param big_line: Lines longer than this many bytes are parsed from the file, not memory.
    :param fold: Fold the annotations beside the stream (``annotations/``) onto each
        episode's traces as prime-rl's readers do (read whole first); False leaves the
        records as written.
    :raises ValueError: ``on_error`` is something else.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        on_error: OnError = "raise",
        big_line: int = BIG_LINE,
        fold: bool = False,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.directory = stream_of(directory)
        self.on_error = on_error
        self.records = 0
        self.skipped = 0
        self.damaged = 0
        self.torn_tail_bytes = 0
        self._lines = self._records(big_line)
        if fold:
            updates = read_annotations(annotations_of(self.directory))
            self._lines = fold_annotations(self._lines, updates)

    def __next__(self) -> Any:
        return next(self._lines)

    def _records(self, big_line: int) -> Iterator[Any]:
        root = self.directory
        chunks = list_chunks(root)
        for chunk in chunks:
            try:
                f = open_chunk(root, chunk)
            except TraceFormatError:
                if self.on_error == "raise":
                    raise
                self.damaged += 1
                self.skipped += max(1, len(_chunk_rows(root, chunk)))
                continue
            with f:
                resync = _index_resync(root, chunk)
                for span in _spans_of(f, chunk, big_line=big_line, resync=resync):
                    if span.lost:
                        if self.on_error == "skip":
                            self.damaged += 1
                            self.skipped += span.lost
                            continue
                        raise TraceFormatError(
                            f"a damaged zstd frame: {span.lost} records unreadable",
                            chunk=chunk_name(root, chunk),
                            offset=span.offset,
                        )
                    if not span.complete and chunk == chunks[-1]:
                        self.torn_tail_bytes += span.length
                        return
                    try:
                        if not span.complete:
                            raise ValueError("a line without its newline before the last chunk")
                        record = parse_span(root, span)
                    except (ValueError, ijson.JSONError, DamagedFrame) as exc:
                        if self.on_error == "skip":
                            self.skipped += 1
                            continue
                        raise TraceFormatError(
                            f"not a complete JSON record ({exc})",
                            chunk=chunk_name(root, chunk),
                            offset=span.offset,
                        ) from exc
                    self.records += 1
                    yield record


def _chunk_rows(directory: Path, chunk: int) -> list[IndexRow]:
    """The index rows of one chunk (found by bisection; an unreadable row ends them)."""
    return rows_of_chunk(index_path(directory), chunk)


def _index_resync(directory: Path, chunk: int) -> Resync:
    """Find the next record after a damaged frame through the index (read only then)."""

    def resync(line_start: int, frame_end: int) -> tuple[int | None, int]:
        rows = _chunk_rows(directory, chunk)
        later = [r.offset for r in rows if r.offset >= frame_end]
        nxt = later[0] if later else None
        end = rows[-1].end if rows else None
        if nxt is None and end is not None and end >= frame_end:
            nxt = end  # the chunk's last indexed record ends past the frame
        lost = sum(1 for r in rows if line_start <= r.offset < (nxt or frame_end))
        return nxt, lost

    return resync


def read_records(
    directory: str | os.PathLike[str], *, on_error: OnError = "raise", fold: bool = False
) -> TraceReader:
    """Every record of the stream in ``directory``, in order, streamed (see ``TraceReader``).

    :param directory: A run's directory or a stream's.
    :param on_error: ``"raise"`` ``TraceFormatError`` on a line that is not a record, or
        ``"skip"`` it.
    :param fold: Fold the run's annotations onto the episodes' traces.
    :returns: A ``TraceReader``: iterate it for the records.
    """
    return TraceReader(directory, on_error=on_error, fold=fold)


async def aread_records(
    directory: str | os.PathLike[str], *, on_error: OnError = "raise", fold: bool = False
) -> AsyncIterator[Any]:
    """``read_records`` with the reading and parsing done in a worker thread.

    :param directory: A run's directory or a stream's.
    :param on_error: ``"raise"`` ``TraceFormatError`` on a line that is not a record, or
        ``"skip"`` it.
    :param fold: Fold the run's annotations onto the episodes' traces.
    :returns: An async iterator of the records.
    """
    reader = await anyio.to_thread.run_sync(
        lambda: TraceReader(directory, on_error=on_error, fold=fold)
    )
    done = object()
    while True:
        record = await anyio.to_thread.run_sync(next, reader, done)
        if record is done:
            return
        yield record


def read_row(directory: str | os.PathLike[str], n: int) -> IndexRow:
    """Index row ``n`` (from 0; negative counts from the end), found by bisecting the index
    (its row ``n`` has ``"line": n + 1``).

    :param directory: A run's directory or a stream's.
    :param n: The record's number.
    :returns: Where record ``n`` lives.
    :raises IndexError: The stream holds no record ``n``.
    :raises TraceFormatError: A row on the way is not an index row.
    """
    index = index_path(stream_of(directory))
    try:
        if n < 0:
            try:
                last = last_row(index)
            except ValueError:  # a bad last row (a bad disk): the rows before it count
                last = None
            n += count_rows(index) if last is None or last.line is None else last.line
        row = row_by_line(index, n + 1) if n >= 0 else None
    except FileNotFoundError:
        row = None
    except ValueError as exc:
        raise TraceFormatError(f"{exc}", chunk=index.name) from exc
    if row is None:
        raise IndexError(f"record {n} out of range: the stream holds {count_rows(index)}")
    return row


def read_at(directory: str | os.PathLike[str], row: IndexRow, *, what: str) -> Any:
    """The record ``row`` points at, decompressing only the frames it spans when its chunk
    is sealed, and streamed through ijson when it is longer than ``BIG_LINE``.

    :raises TraceFormatError: The bytes are not one complete record, a frame they span is
        damaged, or the chunk is missing.
    """
    root = stream_of(directory)
    try:
        length = _length(root, row)
        span = LineSpan(row.chunk, row.offset, length - 1, True, None)
        if length - 1 <= BIG_LINE:
            span.data = _read_line(root, row, length)[:-1]
        return parse_span(root, span)
    except FileNotFoundError as exc:
        raise TraceFormatError(
            f"{what}: its chunk is missing", chunk=chunk_path(root, row.chunk).name
        ) from exc
    except (ValueError, ijson.JSONError, DamagedFrame) as exc:
        raise TraceFormatError(
            f"{what} is not a complete JSON record ({exc})",
            chunk=chunk_name(root, row.chunk),
            offset=row.offset,
        ) from exc


def _length(root: Path, row: IndexRow) -> int:
    """The bytes of the line ``row`` points at, its newline included."""
    if row.length is not None:
        return row.length
    with open_chunk(root, row.chunk) as f:  # a row prime-rl wrote: the line at its offset
        return after_newline(f, row.offset) - row.offset


def _read_line(root: Path, row: IndexRow, length: int) -> bytes:
    with open_chunk(root, row.chunk) as f:
        f.seek(row.offset)
        data = f.read(length)
        while len(data) < length and (more := f.read(length - len(data))):
            data += more
    if len(data) != length or not data.endswith(b"\n"):
        raise ValueError("the index points past the data")
    return data


def line_at(directory: str | os.PathLike[str], row: IndexRow, *, what: str) -> bytes:
    """The bytes of the line ``row`` points at, its newline included, unparsed (a sealed
    chunk's frames it spans decompressed). Blocking: call it in a worker thread.

    :raises TraceFormatError: The line is not where the row says, a frame it spans is
        damaged, or the chunk is missing.
    """
    root = stream_of(directory)
    try:
        return _read_line(root, row, _length(root, row))
    except FileNotFoundError as exc:
        raise TraceFormatError(
            f"{what}: its chunk is missing", chunk=chunk_path(root, row.chunk).name
        ) from exc
    except (ValueError, DamagedFrame) as exc:
        raise TraceFormatError(
            f"{what} is not where its row says ({exc})",
            chunk=chunk_name(root, row.chunk),
            offset=row.offset,
        ) from exc


def read_record(directory: str | os.PathLike[str], n: int) -> Any:
    """Record ``n`` (negative counts from the end), found through the index; in a sealed
    chunk only the frames the record spans are decompressed.

    :param directory: The stream's directory.
    :param n: The record's number.
    :returns: The record, parsed as ``orjson.loads`` parses it.
    :raises IndexError: The stream holds no record ``n``.
    :raises TraceFormatError: The bytes the index points at are not one complete record.
    """
    return read_at(directory, read_row(directory, n), what=f"record {n}")


def find_row(directory: str | os.PathLike[str], record_id: str) -> tuple[int, IndexRow]:
    """The number and index row of the first record whose ``"id"`` is ``record_id``.

    Only the index is read: its bytes are searched for the row's ``"id":<id>,`` (see
    ``monitors.traces._index``).

    :param directory: The stream's directory.
    :param record_id: The record's ``"id"``.
    :raises KeyError: No record has that id.
    :raises TypeError: ``record_id`` is not a string (records are found by string ids).
    """
    if type(record_id) is not str:
        raise TypeError(f"records are found by a string id, not {type(record_id).__name__}")
    found = find_id(index_path(stream_of(directory)), record_id)
    if found is None:
        raise KeyError(record_id)
    return found


def find_record(directory: str | os.PathLike[str], record_id: str) -> Any:
    """The first record whose ``"id"`` is ``record_id``, found through the index and read as
    ``read_record`` reads it.

    :param directory: The stream's directory.
    :param record_id: The record's ``"id"``.
    :returns: The record, parsed as ``orjson.loads`` parses it.
    :raises KeyError: No record has that id.
    :raises TypeError: ``record_id`` is not a string.
    :raises TraceFormatError: The bytes the index points at are not one complete record.
    """
    n, row = find_row(directory, record_id)
    return read_at(directory, row, what=f"record {n} (id {record_id!r})")
