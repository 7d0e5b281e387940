"""Stamp a stored line with the run, as ``Stamp`` stamps a record while the monitor encodes it.

In outbox mode the monitor uploads records already on disk as JSON lines. Parsing a 60 MB
line (with orjson, on the loop or in a thread, where it holds the GIL) would stall the event
loop for 100+ ms, so ``Restamp`` edits the bytes instead: it finds the top-level ``"run"``
value (or the object's closing brace), the top-level ``"traces"`` array and each member's
``"run"`` value (or closing brace), and splices the new run objects in. Every other byte is
passed on as a slice of the line. For a line orjson or the encoder wrote, the result is byte
for byte what the in-memory path (``Records.value(..., edit=Stamp(...))`` then
``encoder.encode``) makes of the parsed line; elsewhere (whitespace, a key spelled with
escapes) the bytes not stamped stay as given.

The bulk is crossed at C speed (``bytes.find`` for quotes and brackets, by the
``traces._skip.Skipper`` the trace browser's outline uses too): Python runs only per string
and bracket, and each ``step`` stops after about ``budget`` bytes or a
proportional number of those tokens, so no call holds the loop long. ``restamp`` drives it
on the event loop.

What is checked: brackets match, strings end, and the levels it edits (the top object, the
``"traces"`` array, its member objects) are well-formed JSON; a value inside those is only
skipped over, its scalars unchecked. A line holds no newline before its end. Anything else
raises ``ValueError`` naming the byte offset (the caller counts the record damaged).
"""

from __future__ import annotations

import re
import time
from typing import Final, TypeAlias

import anyio
import orjson

import encoder

from ..traces._skip import Skipper
from ._batch import PIECE_BYTES
from ._stamp import _rekey

__all__ = ["Restamp", "restamp"]

#: Bytes the driver scans between two looks at the clock (well under a millisecond).
_STEP_BYTES: Final = 1 << 17
#: A token (string, bracket, key, separator) handled in Python costs as much of a step's
#: budget as this many bytes crossed in C.
_TOKEN_BYTES: Final = 1024
#: Original slices up to this long are copied into the new bytes beside them rather than
#: passed on as a view of their own.
_COPY_BYTES: Final = 256
#: New bytes are handed on once this many are gathered.
_FLUSH_BYTES: Final = 1 << 14

_QUOTE: Final = 0x22
_OPEN_OBJECT: Final = 0x7B
_CLOSE_OBJECT: Final = 0x7D
_OPEN_ARRAY: Final = 0x5B
_CLOSE_ARRAY: Final = 0x5D
_COMMA: Final = 0x2C
_COLON_BYTE: Final = 0x3A

#: Whitespace within a line (a newline would end it), and after its value.
_WS: Final = re.compile(rb"[ \t\r]*")
_TRAILING: Final = re.compile(rb"[ \t\r\n]*")
_SCALAR: Final = re.compile(
    rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null"
)
_EMPTY_ARRAY: Final = re.compile(rb"\[[ \t\r]*\]")
#: Longest key, escapes and quotes included, that can decode to "run" or "traces".
_KEY_BYTES: Final = 2 + 6 * len("traces")

# Where the scan is: what it expects next at the levels it edits.
_START, _KEY_FIRST, _KEY, _COLON, _VALUE, _OBJECT_NEXT = range(6)
_ITEM_FIRST, _ITEM, _ARRAY_NEXT, _END, _BUILD, _DONE = range(6, 12)
# What the key just read names.
_OTHER, _RUN, _TRACES = range(3)

#: A splice: the original bytes [start, end) become ``prefix`` then the run's bytes (None:
#: the episode's run, known only once the top object closes).
_Splice: TypeAlias = "tuple[int, int, bytes, bytes | None]"


class _Object:
    """The top object or a member trace being scanned: its ``"run"`` values' spans so far,
    whether it has a key, and what the latest key names."""

    __slots__ = ("empty", "key", "member", "runs")

    def __init__(self, *, member: bool) -> None:
        self.member = member
        self.runs: list[tuple[int, int]] = []
        self.empty = True
        self.key = _OTHER


class Restamp:
    """Stamp one stored line (bytes of one JSON value, with or without its trailing newline)
    as ``Stamp`` stamps a record while encoding it.

    Call ``step`` until it returns True; then ``pieces`` is the stamped line, in order,
    ending with ``b"\\n"``: slices of the original as ``memoryview`` (no copy, each at most
    ``PIECE_BYTES``), new bytes (and short original slices) as ``bytes``, the last piece a
    ``bytes`` ending in the newline. ``length`` is their total size, ``traces`` whether the
    top-level object has a ``"traces"`` key (``Stamp.traces``: the line format).

    A top-level value that is not an object is passed on unchanged. Whitespace before and
    after the value is dropped; whitespace inside it stays as given.

    :raises ValueError: From ``step``: the line is not one JSON value (the message names the
        byte offset), or a run value there orjson cannot parse.
    """

    def __init__(self, line: bytes, *, run_id: str, run_type: str) -> None:
        self.pieces: list[bytes | memoryview] = []
        self.length = 0
        self.traces = False
        self._line = line
        self._view = memoryview(line)
        self._n = len(line)
        self._run_id = run_id
        self._run_type = run_type
        self._bare = encoder.encode(_rekey(None, run_id, run_type))  # a run from a non-object
        self._pos = 0
        self._state = _START
        self._frames: list[_Object | None] = []  # None: the "traces" array
        self._inside = Skipper(line, _bad)  # a string or containers being skipped
        self._value_start = 0  # where the key or value being skipped began
        self._start = self._stop = -1  # the top value's span
        self._episode = b""
        self._top: list[_Splice] = []
        self._members: list[_Splice] = []
        # The pieces, built after the scan: where in each splice list, and in the line.
        self._top_at = self._member_at = 0
        self._at = 0
        self._buf = bytearray()
        self._error: ValueError | None = None

    def step(self, *, budget: int = 1 << 20) -> bool:
        """Scan about ``budget`` more bytes (bounded work per call, even inside a 10 MB string
        or a 10 MB array of numbers); True once done.

        :raises ValueError: The line is not one JSON value (raised again by later calls).
        """
        if self._error is not None:
            raise self._error
        if self._state == _DONE:
            return True
        budget = max(budget, 1)
        tokens = max(budget // _TOKEN_BYTES, 4)
        try:
            if self._state != _BUILD:
                start = self._pos
                tokens = self._scan(min(self._n, start + budget), tokens)
                # Strings and skipped values are not looked into: a newline there is found here.
                stop = self._stop if self._stop >= 0 else self._pos
                newline = self._line.find(b"\n", start, stop)
                if newline >= 0:
                    raise _bad(newline, "a newline inside the value: not one line")
            if self._state == _BUILD:
                self._build(tokens)
        except ValueError as exc:
            self._error = exc
            raise
        return self._state == _DONE

    # -- the scan ----------------------------------------------------------------------------

    def _scan(self, end: int, tokens: int) -> int:
        """Scan up to ``end`` or for ``tokens`` tokens; the tokens left."""
        line, n = self._line, self._n
        while tokens > 0 and self._state != _BUILD:
            if self._inside:
                self._pos, tokens = self._inside.skip(self._pos, end, tokens)
                if self._inside:
                    if self._pos >= n:
                        what = "a string" if self._inside.in_string else "a container"
                        raise _bad(n, f"the line ends inside {what}")
                    return tokens
                self._ended(self._value_start, self._pos)
                continue
            tokens -= 1
            state = self._state
            pos = self._pos
            if pos < end:
                blank = (_TRAILING if state == _END else _WS).match(line, pos, end)
                assert blank is not None  # "*" matches the empty string
                pos = self._pos = blank.end()
            if pos >= end:
                if end < n:
                    return tokens
                if state != _END:
                    raise _bad(n, "the line ends before its value does")
                self._state = _BUILD
                self._at = self._start
                break
            byte = line[pos]
            if state in (_START, _VALUE, _ITEM, _ITEM_FIRST):
                if state == _ITEM_FIRST and byte == _CLOSE_ARRAY:
                    self._close_array(pos)
                else:
                    self._value(byte, pos)
            elif state in (_KEY_FIRST, _KEY):
                if byte == _QUOTE:
                    self._value_start, self._pos = pos, pos + 1
                    self._inside.in_string = True
                elif state == _KEY_FIRST and byte == _CLOSE_OBJECT:
                    self._close_object(pos)
                else:
                    raise _bad(pos, "expected a key")
            elif state == _COLON:
                if byte != _COLON_BYTE:
                    raise _bad(pos, "expected ':'")
                self._pos, self._state = pos + 1, _VALUE
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
            else:
                raise _bad(pos, "more after the value")
        return tokens

    def _value(self, byte: int, pos: int) -> None:
        """A value begins at ``pos``: an object or array the scan edits is entered, any other
        skipped (or matched, for a scalar)."""
        self._value_start = pos
        state = self._state
        frame = self._frames[-1] if state == _VALUE else None
        if byte == _OPEN_OBJECT and state != _VALUE:
            # The top object, or a member of the "traces" array (the only array entered).
            if state == _START:
                self._start = pos
            self._frames.append(_Object(member=state != _START))
            self._pos, self._state = pos + 1, _KEY_FIRST
        elif (
            byte == _OPEN_ARRAY and frame is not None and frame.key == _TRACES and not frame.member
        ):
            self._frames.append(None)
            self._pos, self._state = pos + 1, _ITEM_FIRST
        elif byte == _QUOTE:
            self._pos = pos + 1
            self._inside.in_string = True
        elif byte == _OPEN_OBJECT:
            self._pos = pos + 1
            self._inside.deep.append(_CLOSE_OBJECT)
        elif byte == _OPEN_ARRAY:
            self._pos = pos + 1
            self._inside.deep.append(_CLOSE_ARRAY)
        else:
            match = _SCALAR.match(self._line, pos)
            if match is None:
                raise _bad(pos, "expected a value")
            self._pos = match.end()
            self._ended(pos, self._pos)

    def _ended(self, start: int, end: int) -> None:
        """The key or value begun at ``start`` ended before ``end``."""
        state = self._state
        if state in (_KEY_FIRST, _KEY):
            frame = self._frames[-1]
            assert frame is not None
            frame.empty = False
            frame.key = self._key(start, end)
            if frame.key == _TRACES and not frame.member:
                self.traces = True
            self._state = _COLON
        elif state == _VALUE:
            frame = self._frames[-1]
            assert frame is not None
            if frame.key == _RUN:
                frame.runs.append((start, end))
            self._state = _OBJECT_NEXT
        elif state in (_ITEM, _ITEM_FIRST):
            self._state = _ARRAY_NEXT
        else:  # a top-level value that is not an object
            self._start, self._stop, self._state = start, end, _END

    def _key(self, start: int, end: int) -> int:
        """What the key string at [start, end) names, decoded where it has escapes."""
        line = self._line
        size = end - start
        if size == 5 and line.startswith(b'"run"', start):
            return _RUN
        if size == 8 and line.startswith(b'"traces"', start):
            return _TRACES
        if size <= _KEY_BYTES and line.find(b"\\", start, end) >= 0:
            key = self._load(start, end)
            return _RUN if key == "run" else _TRACES if key == "traces" else _OTHER
        return _OTHER

    def _close_object(self, pos: int) -> None:
        """The top object or a member closes at ``pos``: its run's splices."""
        frame = self._frames.pop()
        assert frame is not None
        if frame.member:
            run = self._member_run(frame.runs[-1]) if frame.runs else None
            self._members.extend(self._splices(frame, pos, run))
            self._pos, self._state = pos + 1, _ARRAY_NEXT
        else:
            self._episode = self._top_run(frame.runs[-1]) if frame.runs else self._bare
            self._top.extend(self._splices(frame, pos, self._episode))
            self._pos, self._stop, self._state = pos + 1, pos + 1, _END

    def _close_array(self, pos: int) -> None:
        """The "traces" array closes at ``pos``: the top object's value for it ended."""
        self._frames.pop()
        self._pos, self._state = pos + 1, _OBJECT_NEXT

    def _splices(self, frame: _Object, pos: int, run: bytes | None) -> list[_Splice]:
        """Every "run" value of ``frame`` replaced (a parser keeping the first or the last of
        repeated keys sees the same run), or the run added before its brace at ``pos``."""
        if frame.runs:
            return [(start, end, b"", run) for start, end in frame.runs]
        return [(pos, pos, b'"run":' if frame.empty else b',"run":', run)]

    def _top_run(self, span: tuple[int, int]) -> bytes:
        """The episode's run: ``_rekey`` of the (last) top-level "run" value."""
        start, end = span
        if self._line[start] != _OPEN_OBJECT:
            return self._bare
        return self._dump(self._load(start, end))

    def _member_run(self, span: tuple[int, int]) -> bytes | None:
        """A member's run: ``_rekey(m.get("run") or run)``; None where its (last) "run" value
        is falsy and the episode's run takes its place."""
        start, end = span
        line = self._line
        byte = line[start]
        if byte == _OPEN_OBJECT:
            run = self._load(start, end)
            return self._dump(run) if run else None
        if byte == _OPEN_ARRAY:
            return None if _EMPTY_ARRAY.fullmatch(line, start, end) else self._bare
        if byte == _QUOTE:
            return None if end - start == 2 else self._bare
        if byte in b"fn":  # false, null
            return None
        if byte == ord("t") or self._load(start, end) != 0:  # a number: 0, -0.0, 1e-400
            return self._bare
        return None

    def _load(self, start: int, end: int) -> object:
        """orjson's value of the bytes [start, end): the same value the in-memory path has."""
        try:
            return orjson.loads(self._view[start:end])
        except orjson.JSONDecodeError as exc:
            raise _bad(start, f"a value orjson refuses ({exc})") from None

    def _dump(self, run: object) -> bytes:
        """The bytes of ``_rekey(run)``, as the encoder writes the stamped record."""
        return encoder.encode(_rekey(run, self._run_id, self._run_type))

    # -- the pieces --------------------------------------------------------------------------

    def _build(self, tokens: int) -> None:
        """Lay out the pieces, ``tokens`` splices at most per call."""
        top, members = self._top, self._members
        while tokens > 0:
            tokens -= 1
            if self._top_at < len(top) and (
                self._member_at >= len(members)
                or top[self._top_at][0] < members[self._member_at][0]
            ):
                splice = top[self._top_at]
                self._top_at += 1
            elif self._member_at < len(members):
                splice = members[self._member_at]
                self._member_at += 1
            else:
                self._emit(self._at, self._stop - 1)
                self._buf += self._view[self._stop - 1 : self._stop]
                self._buf += b"\n"
                self._flush()
                self._state = _DONE
                return
            start, end, prefix, run = splice
            self._emit(self._at, start)
            self._buf += prefix
            self._buf += self._episode if run is None else run
            self._at = end
            if len(self._buf) >= _FLUSH_BYTES:
                self._flush()

    def _emit(self, start: int, end: int) -> None:
        """The original bytes [start, end): copied if short, else views of the line."""
        if end - start <= _COPY_BYTES:
            self._buf += self._view[start:end]
            return
        self._flush()
        for at in range(start, end, PIECE_BYTES):
            piece = self._view[at : min(end, at + PIECE_BYTES)]
            self.pieces.append(piece)
            self.length += len(piece)

    def _flush(self) -> None:
        """Hand on the new bytes gathered, in pieces of at most ``PIECE_BYTES``."""
        buf = self._buf
        for at in range(0, len(buf), PIECE_BYTES):
            piece = bytes(buf[at : at + PIECE_BYTES])
            self.pieces.append(piece)
            self.length += len(piece)
        buf.clear()


def _bad(pos: int, what: str) -> ValueError:
    return ValueError(f"not one JSON value at byte {pos}: {what}")


async def restamp(line: bytes, *, run_id: str, run_type: str, budget_s: float = 0.001) -> Restamp:
    """Run ``Restamp`` to the end on the event loop, giving control back
    (``await anyio.sleep(0)``) whenever ``budget_s`` seconds of scanning have passed, so no
    step holds the loop longer than about that.

    :raises ValueError: The line is not one JSON value (the caller counts it damaged).
    """
    scan = Restamp(line, run_id=run_id, run_type=run_type)
    since = time.perf_counter()
    while not scan.step(budget=_STEP_BYTES):
        if time.perf_counter() - since >= budget_s:
            await anyio.sleep(0)
            since = time.perf_counter()
    return scan
