"""Read a trace stream back: every record of every chunk, in order, in bounded memory."""

from __future__ import annotations

import itertools
import math
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any, BinaryIO, Literal

import anyio
import ijson
import orjson

from ..errors import TraceFormatError
from ._layout import INDEX_NAME, ROW_BYTES, IndexRow, chunk_path, decode_row, list_chunks

__all__ = ["LineSpan", "TraceReader", "aread_records", "iter_spans", "read_record", "read_records"]

_BLOCK = 1 << 20
#: Lines longer than this are parsed by ijson straight from the file instead of being read
#: into memory and parsed there (which would hold the record twice).
BIG_LINE = 16 << 20
_INT_MIN = -(1 << 63)  # orjson.loads reads ints in [i64 min, u64 max] as ints, others as floats
_UINT_MAX = (1 << 64) - 1
#: Read after a long line (see ``_parse_span``); random, so no line can forge it.
_SENTINEL = secrets.randbits(60) | 1 << 60

OnError = Literal["raise", "skip"]


class LineSpan:
    """One line of one chunk: where it is, and whether it ends with a newline."""

    __slots__ = ("chunk", "complete", "data", "length", "offset")

    def __init__(
        self, chunk: int, offset: int, length: int, complete: bool, data: bytes | None
    ) -> None:
        self.chunk = chunk
        self.offset = offset
        self.length = length  # without the newline
        self.complete = complete
        self.data = data  # the line's bytes, or None for a line longer than BIG_LINE


def _spans_of(path: Path, chunk: int, *, big_line: int) -> Iterator[LineSpan]:
    """Split one chunk file into lines, reading at most ~``big_line`` bytes at a time."""
    with open(path, "rb") as f:
        buf = bytearray()
        start = 0  # index in buf of the current line's first byte
        pos = 0  # file offset of buf[0]
        while True:
            nl = buf.find(b"\n", start)
            if nl >= 0:
                yield LineSpan(chunk, pos + start, nl - start, True, bytes(buf[start:nl]))
                start = nl + 1
                continue
            if len(buf) - start > big_line:
                # A long line: find where it ends without keeping it.
                line_offset = pos + start
                scanned = len(buf) - start
                buf.clear()
                while True:
                    block = f.read(_BLOCK)
                    if not block:
                        yield LineSpan(chunk, line_offset, scanned, False, None)
                        return
                    at = block.find(b"\n")
                    if at >= 0:
                        yield LineSpan(chunk, line_offset, scanned + at, True, None)
                        buf += block[at + 1 :]
                        pos = line_offset + scanned + at + 1
                        start = 0
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


def iter_spans(
    directory: str | os.PathLike[str], *, big_line: int = BIG_LINE
) -> Iterator[LineSpan]:
    """Every line of every chunk of the stream, in order."""
    root = Path(directory)
    for chunk in list_chunks(root):
        yield from _spans_of(chunk_path(root, chunk), chunk, big_line=big_line)


class _Range:
    """A read-only file-like view of ``path[offset:offset+length]`` for ijson, followed by
    ``tail``."""

    def __init__(self, f: BinaryIO, offset: int, length: int, tail: bytes = b"") -> None:
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


def _parse_span(path: Path, span: LineSpan) -> Any:
    if span.data is not None:
        return orjson.loads(span.data)
    with open(path, "rb") as f:
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
    """Iterates the records of a trace stream, in order.

    A last line without its newline (a writer still at work, or a crash not yet mended) is
    not a record: it is counted in ``torn_tail_bytes`` and never returned. Any other line
    that is not one complete JSON value raises ``TraceFormatError`` naming the chunk and
    offset, or with ``on_error="skip"`` is skipped and counted in ``skipped``.

    :param directory: The stream's directory.
    :param on_error: ``"raise"`` or ``"skip"`` for a line that is not a record.
    :param big_line: Lines longer than this many bytes are parsed from the file, not memory.
    :raises ValueError: ``on_error`` is something else.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        on_error: OnError = "raise",
        big_line: int = BIG_LINE,
    ) -> None:
        if on_error not in ("raise", "skip"):
            raise ValueError(f"on_error must be 'raise' or 'skip', not {on_error!r}")
        self.directory = Path(directory)
        self.on_error = on_error
        self.records = 0
        self.skipped = 0
        self.torn_tail_bytes = 0
        self._lines = self._records(big_line)

    def __next__(self) -> Any:
        return next(self._lines)

    def _records(self, big_line: int) -> Iterator[Any]:
        chunks = list_chunks(self.directory)
        for chunk in chunks:
            path = chunk_path(self.directory, chunk)
            for span in _spans_of(path, chunk, big_line=big_line):
                if not span.complete and chunk == chunks[-1]:
                    self.torn_tail_bytes += span.length
                    return
                try:
                    if not span.complete:
                        raise ValueError("a line without its newline before the last chunk")
                    record = _parse_span(path, span)
                except (ValueError, ijson.JSONError) as exc:
                    if self.on_error == "skip":
                        self.skipped += 1
                        continue
                    raise TraceFormatError(
                        f"not a complete JSON record ({exc})", chunk=path.name, offset=span.offset
                    ) from exc
                self.records += 1
                yield record


def read_records(directory: str | os.PathLike[str], *, on_error: OnError = "raise") -> TraceReader:
    """Every record of the stream in ``directory``, in order, streamed (see ``TraceReader``).

    :param directory: The stream's directory.
    :param on_error: ``"raise"`` ``TraceFormatError`` on a line that is not a record, or
        ``"skip"`` it.
    :returns: A ``TraceReader``: iterate it for the records.
    """
    return TraceReader(directory, on_error=on_error)


async def aread_records(
    directory: str | os.PathLike[str], *, on_error: OnError = "raise"
) -> AsyncIterator[Any]:
    """``read_records`` with the reading and parsing done in a worker thread.

    :param directory: The stream's directory.
    :param on_error: ``"raise"`` ``TraceFormatError`` on a line that is not a record, or
        ``"skip"`` it.
    :returns: An async iterator of the records.
    """
    reader = TraceReader(directory, on_error=on_error)
    done = object()
    while True:
        record = await anyio.to_thread.run_sync(next, reader, done)
        if record is done:
            return
        yield record


def read_row(directory: str | os.PathLike[str], n: int) -> IndexRow:
    """Index row ``n`` (negative counts from the end).

    :param directory: The stream's directory.
    :param n: The record's number.
    :returns: Where record ``n`` lives.
    :raises IndexError: The stream holds no record ``n``.
    """
    index = Path(directory) / INDEX_NAME
    rows = index.stat().st_size // ROW_BYTES
    at = n + rows if n < 0 else n
    if not 0 <= at < rows:
        raise IndexError(f"record {n} out of range: the stream holds {rows}")
    with open(index, "rb") as f:
        f.seek(at * ROW_BYTES)
        return decode_row(f.read(ROW_BYTES))


def read_record(directory: str | os.PathLike[str], n: int) -> Any:
    """Record ``n`` (negative counts from the end), found through the index.

    :param directory: The stream's directory.
    :param n: The record's number.
    :returns: The record, parsed as ``orjson.loads`` parses it.
    :raises IndexError: The stream holds no record ``n``.
    :raises TraceFormatError: The bytes the index points at are not one complete record.
    """
    row = read_row(directory, n)
    path = chunk_path(Path(directory), row.chunk)
    span = LineSpan(row.chunk, row.offset, row.length - 1, True, None)
    try:
        if row.length - 1 <= BIG_LINE:
            with open(path, "rb") as f:
                f.seek(row.offset)
                data = f.read(row.length)
            if len(data) != row.length or not data.endswith(b"\n"):
                raise ValueError("the index points past the data")
            span.data = data[:-1]
        return _parse_span(path, span)
    except (ValueError, ijson.JSONError) as exc:
        raise TraceFormatError(
            f"record {n} is not a complete JSON record ({exc})", chunk=path.name, offset=row.offset
        ) from exc
