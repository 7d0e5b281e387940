"""Find rows in a stream's index without reading it whole (blocking I/O).

Rows are one JSON object per line, of any width, in stream order: row ``n`` (from 0) has
``"line": n + 1`` and rows go up in ``(chunk, offset)``. So a row is found by bisecting the
file's bytes: each probe skips to the next newline and parses one row, about 20 probes
of a few hundred bytes for 100,000 rows (docs/design.md D9). A row by the record's id is
found by searching the file's bytes for ``"id":<id>,`` (memchr speed), each hit checked by
parsing its row.
"""

from __future__ import annotations

import mmap
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import orjson

from ._layout import IndexRow, decode_row

__all__ = [
    "Growing",
    "count_rows",
    "find_id",
    "first_at_least",
    "iter_rows",
    "last_row",
    "rows_of_chunk",
]

_BLOCK = 1 << 20


class Growing:
    """A JSON-lines file (an index, ``metrics.jsonl``) read as it grows, ``block`` bytes at
    most a read: a line is taken once its newline is written. A file replaced or cut
    meanwhile (a writer's recovery rewrites an index) is read again from its start."""

    def __init__(self, path: Path, *, block: int = _BLOCK) -> None:
        self.path = path
        self.block = block
        self.offset = 0  # bytes taken
        self._inode: int | None = None

    def read(self) -> tuple[bool, list[bytes]]:
        """(whether the file was read again from its start, the whole lines added since the
        last read: none when nothing new is complete)."""
        try:
            f = open(self.path, "rb")  # noqa: SIM115 (closed by the with below)
        except FileNotFoundError:
            return False, []
        with f:
            status = os.fstat(f.fileno())
            restarted = self._inode is not None and (
                status.st_ino != self._inode or status.st_size < self.offset
            )
            if restarted or self._inode is None:
                self._inode, self.offset = status.st_ino, 0
            f.seek(self.offset)
            data = f.read(self.block)
            end = data.rfind(b"\n") + 1
            if end == 0 and len(data) == self.block:  # one line over a block: read it whole
                f.seek(self.offset)
                data = f.readline()
                end = len(data) if data.endswith(b"\n") else 0
        self.offset += end
        return restarted, data[:end].splitlines()


def count_rows(path: Path) -> int:
    """Complete rows in the index (0 when there is none)."""
    n = 0
    try:
        with open(path, "rb") as f:
            while block := f.read(_BLOCK):
                n += block.count(b"\n")
    except FileNotFoundError:
        return 0
    return n


def iter_rows(path: Path) -> Iterator[tuple[int, IndexRow]]:
    """``(n, row)`` for each complete row, in order; one that does not parse raises
    ValueError."""
    try:
        f = open(path, "rb")  # noqa: SIM115 (a generator holds it)
    except FileNotFoundError:
        return
    with f:
        for n, data in enumerate(f):
            if not data.endswith(b"\n"):
                return  # a torn last row: not a row
            yield n, decode_row(data)


def _row_from(f: BinaryIO, pos: int) -> tuple[int, bytes]:
    """The first complete row starting at or after byte ``pos``: its start and bytes
    (``b""`` past the last one)."""
    if pos == 0:
        f.seek(0)
    else:
        f.seek(pos - 1)
        f.readline()  # the rest of the row holding byte pos - 1
    start = f.tell()
    data = f.readline()
    return start, data if data.endswith(b"\n") else b""


def _good_row_from(f: BinaryIO, pos: int) -> tuple[int, int, IndexRow | None, bool]:
    """The first row starting at or after byte ``pos`` that parses: its start, its end and
    the row (``None`` past the last one), and whether rows that do not parse came first."""
    start, data = _row_from(f, pos)
    skipped = False
    while data:
        try:
            return start, start + len(data), decode_row(data), skipped
        except ValueError:
            skipped = True
            start += len(data)
            data = f.readline()
            if not data.endswith(b"\n"):
                data = b""
    return start, start, None, skipped


def first_at_least(
    f: BinaryIO, size: int, key: Callable[[IndexRow], Any], target: Any
) -> tuple[int, IndexRow | None]:
    """The first row whose ``key`` is at least ``target`` (rows going up in ``key``): its
    start and the row, or ``(size, None)``. Rows that do not parse (a bad disk) are passed
    over, so the rows around them are still found.

    :raises ValueError: A row that does not parse stands where the row sought may be: just
        before the first row whose key is at least ``target``, when that key is not
        ``target`` itself (or no such row follows).
    """
    lo, hi = 0, size
    while lo < hi:
        mid = (lo + hi) // 2
        _, end, row, _ = _good_row_from(f, mid)
        if row is None or key(row) >= target:
            hi = mid
        else:
            lo = end
    start, _, row, skipped = _good_row_from(f, lo)
    if skipped and (row is None or key(row) != target):
        raise ValueError(f"a bad index row stands where the row for {target!r} may be")
    return (start, row) if row is not None else (size, None)


def row_by_line(path: Path, line: int) -> IndexRow | None:
    """The row of record ``line`` (from 1), or None.

    :raises ValueError: A row that does not parse stands where that row may be (rows that
        do not parse elsewhere are passed over).
    """
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        _, row = first_at_least(f, size, lambda r: r.line or 0, line)
    return row if row is not None and row.line == line else None


def last_row(path: Path) -> IndexRow | None:
    """The last complete row, or None (no index, or no complete row).

    :raises ValueError: It does not parse.
    """
    try:
        f = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return None
    with f:
        end = os.fstat(f.fileno()).st_size
        tail = b""
        while end > 0:
            start = max(0, end - 4096)
            f.seek(start)
            tail = f.read(end - start) + tail
            end = start
            cut = tail.rfind(b"\n")  # the last complete row ends at the last newline
            if cut < 0:
                continue
            before = tail.rfind(b"\n", 0, cut)
            if before >= 0 or end == 0:
                return decode_row(tail[before + 1 : cut + 1])
        return None


def rows_of_chunk(path: Path, chunk: int) -> list[IndexRow]:
    """The rows of one chunk, found by bisection; an unreadable row ends the list."""
    found: list[IndexRow] = []
    try:
        f = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return found
    with f:
        size = os.fstat(f.fileno()).st_size
        try:
            start, row = first_at_least(f, size, lambda r: r.chunk, chunk)
        except ValueError:
            return found
        f.seek(start)
        for data in f:
            try:
                row = decode_row(data)
            except ValueError:
                break
            if row.chunk != chunk or not data.endswith(b"\n"):
                break
            found.append(row)
    return found


def find_id(path: Path, record_id: Any) -> tuple[int, IndexRow] | None:
    """The number and row of the first record whose ``"id"`` is ``record_id``, or None.

    :raises ValueError: The id cannot be a JSON value.
    """
    try:
        needle = b'"id":' + orjson.dumps(record_id) + b","
    except TypeError as exc:
        raise ValueError(f"{record_id!r} is not an id a record can have") from exc
    try:
        f = open(path, "rb")  # noqa: SIM115
    except FileNotFoundError:
        return None
    with f:
        if os.fstat(f.fileno()).st_size == 0:
            return None
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
            at = data.find(needle)
            while at >= 0:
                start = data.rfind(b"\n", 0, at) + 1
                end = data.find(b"\n", at)
                if end < 0:
                    return None  # in a torn last row
                try:
                    row = decode_row(data[start : end + 1])
                except ValueError:
                    row = None
                if row is not None and row.id == record_id and type(row.id) is type(record_id):
                    n = row.line - 1 if row.line is not None else data[:start].count(b"\n")
                    return n, row
                at = data.find(needle, end)
    return None
