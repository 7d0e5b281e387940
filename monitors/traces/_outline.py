"""Where an episode record's parts lie in its line: each top-level value, trace and node.

The trace browser shows a 1-60 MB record (one line of a trace stream, in verifiers' episode
schema) one node at a time. Parsing the whole line with ``orjson.loads`` would hold the GIL
for ~350 ms on a 60 MB line and the memory of every token list with it, so the browser
outlines the line once instead: the ``[start, end)`` byte span of each top-level value, of
each member of the ``"traces"`` array and its values, and of each member of a trace's
``"nodes"`` array and its values. A request then parses only the slices it shows
(docs/design.md D19).

The scan is pure (no I/O) and resumable: ``OutlineScan.step`` does a bounded amount of work
per call, so ``aoutline`` can drive it on the event loop without holding it; ``outline``
runs it through at once (for a worker thread, or tests). The bulk of a record (the per-token
arrays, ~80% of its bytes, which hold no quotes or brackets) is crossed at C speed with
``bytes.find``: Python runs once per string end, bracket, key or separator at the levels it
walks, and once per bracket or quote inside the values it skips (``_skip.Skipper``, which
the outbox's ``Restamp`` uses too). ``count_items`` counts the
items of a token array at C speed, for token counts without parsing.

What is checked: brackets match, strings end, and the levels it walks (the top object, the
``"traces"`` array, its member objects, their ``"nodes"`` arrays, the member nodes) are
well-formed JSON with nothing but whitespace after the top object. A value at those levels
is only skipped over: its scalars and the commas and colons inside it are not validated, nor
is a string's UTF-8 or escapes (a key's are: keys are decoded). Anything malformed that the
scan does check raises ``ValueError`` naming the byte offset.
"""

from __future__ import annotations

import mmap
import re
from dataclasses import dataclass
from typing import Final, TypeAlias

import anyio
import orjson

from ._skip import Skipper

__all__ = [
    "STEP_BYTES",
    "NodeOutline",
    "Outline",
    "OutlineScan",
    "Span",
    "TraceOutline",
    "aoutline",
    "count_items",
    "outline",
]

#: ``[start, end)`` byte offsets into the line of one JSON value.
Span: TypeAlias = tuple[int, int]
#: What a line may be given as.
_Line: TypeAlias = bytes | bytearray | memoryview | mmap.mmap

#: A step's default budget: well under a millisecond of scanning.
STEP_BYTES: Final = 1 << 17
#: A token handled in Python (a key, a bracket, a string's end) costs as much of a step's
#: budget as this many bytes crossed in C.
_TOKEN_BYTES: Final = 1024
#: The budget ``outline`` steps with: large, so that its steps cost nothing.
_WHOLE_BYTES: Final = 1 << 28

_QUOTE: Final = 0x22
_OPEN_ARRAY: Final = 0x5B
_CLOSE_ARRAY: Final = 0x5D
_OPEN_OBJECT: Final = 0x7B
_CLOSE_OBJECT: Final = 0x7D
_COMMA: Final = 0x2C
_COLON: Final = 0x3A
_WHITESPACE: Final = b" \t\n\r"

_BLANK: Final = re.compile(rb"[ \t\n\r]*")
_SCALAR: Final = re.compile(
    rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null"
)
_EMPTY_ARRAY: Final = re.compile(rb"\[[ \t\n\r]*\]")

# What the scan expects next at the levels it walks.
_START, _KEY_FIRST, _KEY, _COLON_NEXT, _VALUE, _OBJECT_NEXT = range(6)
_ITEM_FIRST, _ITEM, _ARRAY_NEXT, _END, _DONE = range(6, 11)

# The levels walked are a chain, so a frame's depth says what it is: 0 the top object, 1 its
# "traces" array, 2 a trace, 3 its "nodes" array, 4 a node. The key whose array is walked:
_WALKED_KEY: Final = ("traces", None, "nodes", None, None)
_NODE_DEPTH: Final = 4


@dataclass(frozen=True, slots=True)
class NodeOutline:
    """One member of a trace's ``"nodes"``: its span, and its keys' value spans (empty when
    the member is not an object)."""

    span: Span
    fields: dict[str, Span]


@dataclass(frozen=True, slots=True)
class TraceOutline:
    """One member of ``"traces"``: its span, its keys' value spans (``"nodes"`` among them),
    and its nodes (empty when ``"nodes"`` is missing or not an array, or the member is not an
    object)."""

    span: Span
    fields: dict[str, Span]
    nodes: list[NodeOutline]


@dataclass(frozen=True, slots=True)
class Outline:
    """A record's outline: ``size`` is the length of the line as given (every span lies
    within it), ``fields`` the top-level keys' value spans (``"traces"`` among them),
    ``traces`` the members of the ``"traces"`` array (empty when it is missing or not an
    array). Keys are decoded; a repeated key's last value wins, as with ``orjson.loads``."""

    size: int
    fields: dict[str, Span]
    traces: list[TraceOutline]


class _Frame:
    """An object or array at a walked level: where it starts, its fields and latest key (an
    object's), and its traces or nodes (an array's members, or an object's latest
    ``"traces"`` or ``"nodes"`` array's)."""

    __slots__ = ("fields", "key", "nodes", "start", "traces")

    def __init__(self, start: int) -> None:
        self.start = start
        self.fields: dict[str, Span] = {}
        self.key: str | None = None
        self.traces: list[TraceOutline] = []
        self.nodes: list[NodeOutline] = []


class OutlineScan:
    """Outline one record's line, a bounded step at a time.

    Call ``step`` until it returns the ``Outline``. The line may end in whitespace (its
    newline); it must not change while the scan runs. It may be an anonymous ``mmap`` (the
    browser reads a large record into one). A ``memoryview`` over part of a buffer is copied
    once (spans are offsets into the view either way).

    :raises ValueError: From ``step``: the line is not one JSON object, or is malformed at a
        level the scan walks (the message names the byte offset). Raised again by later calls.
    """

    def __init__(self, line: _Line) -> None:
        self._line = _buffer(line)
        self._n = len(self._line)
        self._pos = 0
        self._state = _START
        self._frames: list[_Frame] = []
        self._value_start = 0  # where the key or value being skipped began
        self._inside = Skipper(self._line, _bad)  # a string or containers being skipped
        self._keys: dict[bytes, str] = {}
        self._outline: Outline | None = None  # built when the top object closes
        self._result: Outline | None = None  # handed out once the line is done
        self._error: ValueError | None = None

    def step(self, budget: int = STEP_BYTES) -> Outline | None:
        """Scan about ``budget`` more bytes: at most that many crossed at C speed, and about
        ``budget / 1024`` tokens handled in Python. The outline once the line is done, else
        None.

        :raises ValueError: The line is malformed (see the class).
        """
        if self._error is not None:
            raise self._error
        if self._result is None:
            budget = max(budget, 1)
            try:
                self._scan(min(self._n, self._pos + budget), max(budget // _TOKEN_BYTES, 1))
            except ValueError as exc:
                self._error = exc
                self._frames.clear()
                raise
        return self._result

    def _scan(self, end: int, tokens: int) -> None:
        """Go on up to byte ``end``, or for ``tokens`` tokens."""
        line, n = self._line, self._n
        while tokens > 0 and self._result is None:
            if self._inside:
                if self._pos >= end:
                    if end >= n:
                        what = "a string" if self._inside.in_string else "a value"
                        raise _bad(n, f"the line ends inside {what}")
                    return
                self._pos, tokens = self._inside.skip(self._pos, end, tokens)
                if not self._inside:
                    self._ended(self._value_start, self._pos)
                continue
            pos = self._pos
            if pos < end and line[pos] in _WHITESPACE:
                blank = _BLANK.match(line, pos, end)
                assert blank is not None  # "*" matches the empty string
                pos = self._pos = blank.end()
            if pos >= end:
                if end < n:
                    return
                if self._state != _END:
                    raise _bad(n, "the line ends before its value does")
                self._state, self._result = _DONE, self._outline
                return
            tokens -= 1
            byte = line[pos]
            state = self._state
            if state in (_VALUE, _ITEM):
                self._begin(byte, pos)
            elif state == _OBJECT_NEXT:
                if byte == _COMMA:
                    self._pos, self._state = pos + 1, _KEY
                elif byte == _CLOSE_OBJECT:
                    self._close_object(pos)
                else:
                    raise _bad(pos, "expected ',' or '}'")
            elif state == _ARRAY_NEXT:
                if byte == _COMMA:
                    self._pos, self._state = pos + 1, _ITEM
                elif byte == _CLOSE_ARRAY:
                    self._close_array(pos)
                else:
                    raise _bad(pos, "expected ',' or ']'")
            elif state in (_KEY, _KEY_FIRST):
                if byte == _QUOTE:
                    self._value_start, self._pos = pos, pos + 1
                    self._inside.in_string = True
                elif byte == _CLOSE_OBJECT and state == _KEY_FIRST:
                    self._close_object(pos)
                else:
                    raise _bad(pos, "expected a key")
            elif state == _COLON_NEXT:
                if byte != _COLON:
                    raise _bad(pos, "expected ':'")
                self._pos, self._state = pos + 1, _VALUE
            elif state == _ITEM_FIRST:
                if byte == _CLOSE_ARRAY:
                    self._close_array(pos)
                else:
                    self._begin(byte, pos)
            elif state == _START:
                if byte != _OPEN_OBJECT:
                    raise _bad(pos, "the record is not a JSON object")
                self._frames.append(_Frame(pos))
                self._pos, self._state = pos + 1, _KEY_FIRST
            else:
                raise _bad(pos, "more after the record's object")

    def _begin(self, byte: int, pos: int) -> None:
        """A value begins at ``pos`` in an object or array walked: a walked array or object is
        entered; any other value is skipped (a scalar matched at once)."""
        self._value_start = pos
        frames = self._frames
        depth = len(frames) - 1
        if self._state == _VALUE:
            walked = _WALKED_KEY[depth]
            if byte == _OPEN_ARRAY and walked is not None and frames[-1].key == walked:
                frames.append(_Frame(pos))
                self._pos, self._state = pos + 1, _ITEM_FIRST
                return
        elif byte == _OPEN_OBJECT:  # a member of "traces" or "nodes"
            frames.append(_Frame(pos))
            self._pos, self._state = pos + 1, _KEY_FIRST
            return
        if byte == _QUOTE:
            self._pos = pos + 1
            self._inside.in_string = True
        elif byte == _OPEN_ARRAY:
            self._pos = pos + 1
            self._inside.deep.append(_CLOSE_ARRAY)
        elif byte == _OPEN_OBJECT:
            self._pos = pos + 1
            self._inside.deep.append(_CLOSE_OBJECT)
        else:
            scalar = _SCALAR.match(self._line, pos)
            if scalar is None:
                raise _bad(pos, "expected a value")
            self._pos = scalar.end()
            self._ended(pos, self._pos)

    def _ended(self, start: int, end: int) -> None:
        """The key or value skipped from ``start`` ended before ``end``."""
        frame = self._frames[-1]
        state = self._state
        if state == _VALUE:
            key = frame.key
            assert key is not None
            frame.fields[key] = (start, end)
            if key == _WALKED_KEY[len(self._frames) - 1]:
                # Not an array: no traces or nodes (the last of a repeated key wins).
                frame.traces, frame.nodes = [], []
            self._state = _OBJECT_NEXT
        elif state in (_KEY, _KEY_FIRST):
            frame.key = self._key(start, end)
            self._state = _COLON_NEXT
        else:  # a member of "traces" or "nodes" that is not an object
            if len(self._frames) == 2:
                frame.traces.append(TraceOutline((start, end), {}, []))
            else:
                frame.nodes.append(NodeOutline((start, end), {}))
            self._state = _ARRAY_NEXT

    def _key(self, start: int, end: int) -> str:
        """The key written at [start, end), quotes included, decoded."""
        raw = bytes(self._line[start:end])
        key = self._keys.get(raw)
        if key is None:
            try:
                if b"\\" in raw:
                    key = orjson.loads(raw)
                    assert isinstance(key, str)
                else:
                    key = raw[1:-1].decode()
            except (orjson.JSONDecodeError, UnicodeDecodeError) as exc:
                raise _bad(start, f"a key that does not decode ({exc})") from None
            self._keys[raw] = key
        return key

    def _close_object(self, pos: int) -> None:
        """The walked object on top closes at ``pos``."""
        frame = self._frames.pop()
        span = (frame.start, pos + 1)
        self._pos = pos + 1
        depth = len(self._frames)
        if depth == 0:
            self._outline = Outline(self._n, frame.fields, frame.traces)
            self._state = _END
        elif depth == _NODE_DEPTH:
            self._frames[-1].nodes.append(NodeOutline(span, frame.fields))
            self._state = _ARRAY_NEXT
        else:
            self._frames[-1].traces.append(TraceOutline(span, frame.fields, frame.nodes))
            self._state = _ARRAY_NEXT

    def _close_array(self, pos: int) -> None:
        """The walked array on top (``"traces"`` or a trace's ``"nodes"``) closes at ``pos``:
        the value of its object's latest key."""
        array = self._frames.pop()
        frame = self._frames[-1]
        assert frame.key is not None
        frame.fields[frame.key] = (array.start, pos + 1)
        frame.traces, frame.nodes = array.traces, array.nodes
        self._pos, self._state = pos + 1, _OBJECT_NEXT


def _buffer(line: _Line) -> bytes | bytearray | mmap.mmap:
    """``line`` as something ``find`` and ``re`` work on, with the same offsets: itself, the
    bytes a whole view is of, or else a copy."""
    whole = _whole(line)
    return whole if whole is not None else bytes(line)


def _whole(line: _Line) -> bytes | bytearray | mmap.mmap | None:
    """``line`` as bytes or bytearray with the same offsets, without a copy; None for a view
    of part of a buffer (or of anything but bytes)."""
    if not isinstance(line, memoryview):
        return line
    whole = line.obj
    if isinstance(whole, bytes) and line.c_contiguous and line.nbytes == len(whole):
        return whole
    return None


def _bad(pos: int, what: str) -> ValueError:
    return ValueError(f"not an episode record's JSON at byte {pos}: {what}")


def outline(line: _Line) -> Outline:
    """The outline of ``line``, scanned at once (in a worker thread, or where a stall of
    ~1 ms per MB does not matter).

    :raises ValueError: The line is malformed (see ``OutlineScan``).
    """
    scan = OutlineScan(line)
    while True:
        done = scan.step(_WHOLE_BYTES)
        if done is not None:
            return done


async def aoutline(line: _Line, *, budget: int = STEP_BYTES) -> Outline:
    """The outline of ``line``, scanned on the event loop a step of ``budget`` at a time,
    giving control back (``await anyio.sleep(0)``) between steps.

    :raises ValueError: The line is malformed (see ``OutlineScan``).
    """
    scan = OutlineScan(line)
    while True:
        done = scan.step(budget)
        if done is not None:
            return done
        await anyio.sleep(0)


def count_items(line: _Line, span: Span) -> int:
    """The number of items of the JSON array of scalars (numbers, booleans, null) at
    ``span`` in ``line``: 0 for ``[]``, else its commas plus one, counted in C.

    :raises ValueError: The span holds no array, or one with a string or a container in it.
    """
    start, end = span
    data = _whole(line)
    base = 0
    if data is None or isinstance(data, mmap.mmap):  # a part of a buffer, or a mapping
        if not 0 <= start < end <= len(line):  # (which has no count): copy the span only
            raise _bad(start, f"no array at {span}")
        data, base = bytes(line[start:end]), start
    lo, hi = start - base, end - base
    if not (0 <= lo < hi <= len(data) and data[lo] == _OPEN_ARRAY and data[hi - 1] == _CLOSE_ARRAY):
        raise _bad(start, f"no array at {span}")
    for needle in (b'"', b"[", b"{"):
        inner = data.find(needle, lo + 1, hi - 1)
        if inner >= 0:
            raise _bad(inner + base, f"not an array of scalars at {span}")
    if _EMPTY_ARRAY.fullmatch(data, lo, hi):
        return 0
    return data.count(b",", lo, hi) + 1
