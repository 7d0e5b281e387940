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
from typing import Any, BinaryIO, Literal, Protocol

import anyio
import ijson
import orjson

from ..errors import TraceFormatError
from ._layout import (
    ID_BYTES,
    INDEX_NAME,
    ROW_BYTES,
    IndexRow,
    chunk_path,
    decode_row,
    id_hash,
    list_chunks,
    sealed_path,
)
from ._sealed import DamagedFrame, open_chunk

__all__ = [
    "LineSpan",
    "TraceReader",
    "aread_records",
    "chunk_name",
    "find_record",
    "find_row",
    "iter_spans",
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


def _after_newline(f: _Readable, offset: int) -> int:
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
                nxt = _after_newline(f, exc.end)
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
        self.damaged = 0
        self.torn_tail_bytes = 0
        self._lines = self._records(big_line)

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


def _index_rows(directory: Path) -> int:
    try:
        return (directory / INDEX_NAME).stat().st_size // ROW_BYTES
    except FileNotFoundError:
        return 0


def _row_at(f: BinaryIO, n: int) -> IndexRow | None:
    f.seek(n * ROW_BYTES)
    try:
        return decode_row(f.read(ROW_BYTES))
    except ValueError:
        return None


def _chunk_rows(directory: Path, chunk: int) -> list[IndexRow]:
    """The index rows of one chunk (rows are in (chunk, offset) order: found by bisection;
    an unreadable row on the way ends the search)."""
    rows = _index_rows(directory)
    found: list[IndexRow] = []
    if not rows:
        return found
    with open(directory / INDEX_NAME, "rb") as f:
        lo, hi = 0, rows
        while lo < hi:
            mid = (lo + hi) // 2
            row = _row_at(f, mid)
            if row is None:
                return found
            if row.chunk < chunk:
                lo = mid + 1
            else:
                hi = mid
        while lo < rows:
            row = _row_at(f, lo)
            if row is None or row.chunk != chunk:
                break
            found.append(row)
            lo += 1
    return found


def _index_resync(directory: Path, chunk: int) -> Resync:
    """Find the next record after a damaged frame through the index (read only then)."""

    def resync(line_start: int, frame_end: int) -> tuple[int | None, int]:
        rows = _chunk_rows(directory, chunk)
        later = [r.offset for r in rows if r.offset >= frame_end]
        nxt = later[0] if later else None
        if nxt is None and rows and rows[-1].end >= frame_end:
            nxt = rows[-1].end  # the chunk's last indexed record ends past the frame
        lost = sum(1 for r in rows if line_start <= r.offset < (nxt or frame_end))
        return nxt, lost

    return resync


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


def read_at(directory: str | os.PathLike[str], row: IndexRow, *, what: str) -> Any:
    """The record ``row`` points at, decompressing only the frames it spans when its chunk
    is sealed, and streamed through ijson when it is longer than ``BIG_LINE``.

    :raises TraceFormatError: The bytes are not one complete record, a frame they span is
        damaged, or the chunk is missing.
    """
    root = Path(directory)
    span = LineSpan(row.chunk, row.offset, row.length - 1, True, None)
    try:
        if row.length - 1 <= BIG_LINE:
            with open_chunk(root, row.chunk) as f:
                f.seek(row.offset)
                data = f.read(row.length)
                while len(data) < row.length and (more := f.read(row.length - len(data))):
                    data += more
            if len(data) != row.length or not data.endswith(b"\n"):
                raise ValueError("the index points past the data")
            span.data = data[:-1]
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

    Rows keep string ids (a long one as its hash), so only the index is read, a megabyte at
    a time; a hashed id is checked against the record itself.

    :param directory: The stream's directory.
    :param record_id: The record's ``"id"``.
    :raises KeyError: No record has that id.
    :raises TypeError: ``record_id`` is not a string (only string ids are indexed).
    """
    if type(record_id) is not str:
        raise TypeError(f"records are found by a string id, not {type(record_id).__name__}")
    root = Path(directory)
    encoded = orjson.dumps(record_id)
    hashed = len(encoded) > ID_BYTES
    digest = id_hash(record_id)
    needle = b'"idh":"%s"' % digest.encode() if hashed else b'"id":%s}' % encoded
    block_rows = _BLOCK // ROW_BYTES
    with open(root / INDEX_NAME, "rb") as f:
        first = 0
        while block := f.read(block_rows * ROW_BYTES):
            at = block.find(needle)
            while at >= 0:
                n = first + at // ROW_BYTES
                row = decode_row(block[(n - first) * ROW_BYTES : (n - first + 1) * ROW_BYTES])
                if hashed:
                    if row.idh == digest and _record_id(root, row) == record_id:
                        return n, row
                elif row.id == record_id:
                    return n, row
                at = block.find(needle, (n - first + 1) * ROW_BYTES)
            first += len(block) // ROW_BYTES
    raise KeyError(record_id)


def _record_id(root: Path, row: IndexRow) -> Any:
    record = read_at(root, row, what="a record with a hashed id")
    return record.get("id") if isinstance(record, dict) else None


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
