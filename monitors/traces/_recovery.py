"""Make a stream that a crash left mid-write whole again before appending to it (blocking I/O).

A process killed while writing leaves at most: a torn last line in the last chunk, a torn
last index row, index rows for data that never reached the disk, complete records whose
index rows were never written, and a seal cut short (a ``.zst.tmp`` file, or a chunk both
plain and sealed). A machine that went down (power, kernel) can also leave a torn last line
in an earlier plain chunk, one that rolled while its fsync was still running. Torn bytes are
cut off; rows pointing at them are dropped; missing rows are rebuilt from the data; a seal
cut short is finished or undone, and the chunks still to seal are listed (docs/design.md D9).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

import ijson

from .._files import last_newline_end
from ..errors import TraceFormatError
from ._index import count_rows, last_row
from ._layout import (
    IndexRow,
    chunk_path,
    decode_row,
    encode_row,
    index_path,
    mending_path,
    scan,
    sealed_path,
    sealing_path,
)
from ._reader import LineSpan, after_newline, parse_span
from ._sealed import DamagedFrame, SealedChunk, open_chunk
from ._summary import Summary, episode_row

log = logging.getLogger("monitors.traces")

__all__ = ["Recovery", "recover"]

_BLOCK = 1 << 20


@dataclass(frozen=True)
class Recovery:
    """What reopening a stream found and mended (``TraceWriter.recovery``).

    :param chunk: The chunk appends continue in.
    :param chunk_size: Its size in bytes.
    :param records: Index rows after recovery.
    :param torn_bytes: Bytes of torn last lines cut from the chunks.
    :param torn_row_bytes: Bytes of a torn last index row cut.
    :param dropped_rows: Index rows dropped because they pointed past the data.
    :param rebuilt_rows: Index rows rebuilt for complete records that had none.
    :param index_size: The index's size in bytes after recovery.
    """

    chunk: int  # the chunk appends continue in
    chunk_size: int  # its size in bytes
    records: int  # index rows after recovery
    torn_bytes: int = 0  # bytes of torn last lines cut from the chunks
    torn_row_bytes: int = 0  # bytes of a torn last index row cut
    dropped_rows: int = 0  # index rows that pointed past the data
    rebuilt_rows: int = 0  # complete records that had no index row
    index_size: int = 0
    #: Seals a crash cut short: leftovers removed, or plain chunks removed once sealed.
    seals_undone: int = 0
    seals_finished: int = 0
    #: Full plain chunks (not the one appends go on in), to seal.
    unsealed: list[int] = field(default_factory=list)

    @property
    def mended(self) -> bool:
        """Whether anything was cut, dropped, rebuilt, or a seal finished or undone."""
        return bool(
            self.torn_bytes
            or self.torn_row_bytes
            or self.dropped_rows
            or self.rebuilt_rows
            or self.seals_undone
            or self.seals_finished
        )


def _line_spans(f: BinaryIO | SealedChunk, start: int, stop: int) -> list[tuple[int, int]]:
    """(offset, length) of each complete line in ``f[start:stop]``."""
    spans = []
    line_start = start
    with f:
        f.seek(start)
        pos = start
        while pos < stop:
            block = f.read(min(_BLOCK, stop - pos))
            if not block:
                break
            at = block.find(b"\n")
            while at >= 0:
                end = pos + at + 1
                spans.append((line_start, end - line_start))
                line_start = end
                at = block.find(b"\n", at + 1)
            pos += len(block)
    return spans


def _ends_a_line(path: Path, size: int) -> bool:
    with open(path, "rb") as f:
        f.seek(max(0, size - 1))
        return size == 0 or f.read(1) == b"\n"


def _valid(row: IndexRow | None, sizes: dict[int, int]) -> bool:
    if row is None or row.chunk not in sizes:
        return False
    end = row.end
    return row.offset < sizes[row.chunk] if end is None else end <= sizes[row.chunk]


def _decode(data: bytes) -> IndexRow | None:
    try:
        return decode_row(data)
    except ValueError:
        return None


def _rows(index: Path) -> list[bytes]:
    """The index's complete rows (a torn last one left out)."""
    data = index.read_bytes()
    return data[: data.rfind(b"\n") + 1].splitlines(keepends=True)


def _drop_rows_at_end(directory: Path, sizes: dict[int, int]) -> tuple[int, int, IndexRow | None]:
    """Rows kept, rows dropped and the last kept row, the last rows that point past the data
    (or do not parse) cut off the index; the common case, where only the last chunk was
    cut, which reads only the last row when it is good. A row that does not parse before a
    good one is left in its place (readers skip it), so that every row keeps its line."""
    index = index_path(directory)
    try:
        row = last_row(index)
    except ValueError:
        row = None
    if _valid(row, sizes):
        assert row is not None
        return (row.line if row.line is not None else count_rows(index)), 0, row
    rows = _rows(index)
    n = len(rows)
    while n and not _valid(_decode(rows[n - 1]), sizes):
        n -= 1
    os.truncate(index, sum(map(len, rows[:n])))
    return n, len(rows) - n, _decode(rows[n - 1]) if n else None


def _rows_by_place(
    directory: Path, sizes: dict[int, int]
) -> tuple[dict[tuple[int, int], IndexRow], int]:
    """The rows that point at data, by (chunk, offset), and how many rows the index held:
    what a rebuild of the whole index keeps of it."""
    rows = _rows(index_path(directory))
    kept: dict[tuple[int, int], IndexRow] = {}
    for raw in rows:
        row = _decode(raw)
        if row is not None and _valid(row, sizes):
            kept.setdefault((row.chunk, row.offset), row)
    return kept, len(rows)


def _summary_of(directory: Path, span: LineSpan, summary: Summary) -> dict[str, Any]:
    """A rebuilt row's fields: the record read back and summarized (Nones if it is no
    JSON record)."""
    try:
        return dict(summary(parse_span(directory, span), None))
    except (ValueError, ijson.JSONError, DamagedFrame):
        return dict(summary(None, None))


def _settle_seals(directory: Path) -> tuple[list[int], list[int], int, int]:
    """Finish or undo what a crash left of seals; return the plain and sealed chunks and
    how many seals were undone and finished.

    :raises TraceFormatError: The directory holds a file that belongs to no stream.
    """
    listing = scan(directory)
    undone = finished = 0
    for chunk in listing.sealing:  # never renamed into place: the plain chunk is whole
        sealing_path(directory, chunk).unlink()
        undone += 1
    plain = set(listing.plain)
    for chunk in set(listing.plain) & set(listing.sealed):
        # Renamed into place (so fsynced whole) before the plain one was unlinked; a sealed
        # file that does not hold the plain one's bytes is not ours to trust: sealed again.
        plain_size = chunk_path(directory, chunk).stat().st_size
        try:
            with SealedChunk(sealed_path(directory, chunk)) as copy:
                whole = copy.size == plain_size
        except TraceFormatError:
            whole = False
        if whole:
            chunk_path(directory, chunk).unlink()
            plain.discard(chunk)
            finished += 1
        else:
            sealed_path(directory, chunk).unlink()
            undone += 1
    sealed = sorted(set(listing.sealed) - plain)
    mending_path(directory).unlink(missing_ok=True)  # an index rewrite a crash cut short
    return sorted(plain), sealed, undone, finished


def recover(directory: Path, summary: Summary = episode_row) -> Recovery:
    """Cut what a crash tore, settle seals cut short, rebuild missing index rows (their
    fields from ``summary`` of each record read back); return where appends go on.

    :raises TraceFormatError: The directory holds a file that belongs to no stream, or a
        sealed chunk without an intact seek table.
    :raises OSError: The directory or its files cannot be read or written.
    """
    directory.mkdir(parents=True, exist_ok=True)
    index = index_path(directory)
    index.touch(exist_ok=True)
    plain, sealed, undone, finished = _settle_seals(directory)
    if undone or finished:
        log.warning(
            "trace stream %s: %d seals cut short by a crash finished, %d undone",
            directory,
            finished,
            undone,
        )
    chunks = sorted(plain + sealed)
    if not chunks or chunks[-1] in sealed:  # appends go on in a fresh plain chunk
        fresh = chunks[-1] + 1 if chunks else 0
        chunk_path(directory, fresh).touch()
        plain.append(fresh)
        chunks.append(fresh)

    # Every plain chunk ends with a complete line, or its torn tail is cut off; a sealed
    # chunk was whole when it was renamed into place.
    last = chunks[-1]
    sizes: dict[int, int] = {}
    torn = 0
    torn_before_last = False
    for chunk in sealed:
        with SealedChunk(sealed_path(directory, chunk)) as f:
            sizes[chunk] = f.size
    for chunk in plain:
        path = chunk_path(directory, chunk)
        size = path.stat().st_size
        keep = size if _ends_a_line(path, size) else last_newline_end(path, size)
        if keep < size:
            os.truncate(path, keep)
            torn += size - keep
            torn_before_last |= chunk != last
        sizes[chunk] = keep

    # The index holds whole rows, each pointing at data that exists.
    index_size = index.stat().st_size
    whole = last_newline_end(index, index_size)
    torn_row = index_size - whole
    if torn_row:
        os.truncate(index, whole)
    # After an earlier chunk was cut, the index is rebuilt whole from the data, keeping
    # the rows that still point at a record (their lines renumbered); else the rows past
    # the data are cut off its end. Either way complete records without a row get one.
    reuse: dict[tuple[int, int], IndexRow] = {}
    if torn_before_last:
        reuse, held = _rows_by_place(directory, sizes)
        rows, last_kept = 0, None
    else:
        rows, dropped, last_kept = _drop_rows_at_end(directory, sizes)
    start_chunk, start = chunks[0], 0
    if last_kept is not None:
        start_chunk, start = last_kept.chunk, last_kept.end or 0
        if last_kept.end is None:  # a row prime-rl wrote: the record is the line at offset
            with open_chunk(directory, last_kept.chunk) as f:
                start = after_newline(f, last_kept.offset)
    written: list[bytes] = []
    rebuilt = 0
    for chunk in chunks:
        if chunk < start_chunk:
            continue
        begin = start if chunk == start_chunk else 0
        try:
            spans = _line_spans(open_chunk(directory, chunk), begin, sizes[chunk])
        except DamagedFrame as exc:
            raise TraceFormatError(
                f"cannot rebuild the index rows of a sealed chunk: {exc}",
                chunk=exc.path.name,
                offset=exc.start,
            ) from exc
        for offset, length in spans:
            old = reuse.pop((chunk, offset), None)
            kept = old is not None and old.length in (None, length)
            if kept:
                assert old is not None
                fields = dict(old.fields)
            else:
                span = LineSpan(chunk, offset, length - 1, True, None)
                fields = _summary_of(directory, span, summary)
                rebuilt += 1
            fields.update(line=rows + len(written) + 1, offset=offset, chunk=chunk, length=length)
            if not kept:
                fields["step"] = None  # after length, as the writer's rows have it
            written.append(encode_row(fields))
    if torn_before_last:
        dropped = held - (len(written) - rebuilt)
        mending = mending_path(directory)
        with open(mending, "wb") as f:  # a crash now leaves the old index, mended next time
            f.write(b"".join(written))
            f.flush()
            os.fsync(f.fileno())
        os.replace(mending, index)
    elif written:
        with open(index, "ab") as f:
            f.write(b"".join(written))
            f.flush()
            os.fsync(f.fileno())
    return Recovery(
        chunk=last,
        chunk_size=sizes[last],
        records=rows + len(written),
        torn_bytes=torn,
        torn_row_bytes=torn_row,
        dropped_rows=dropped,
        rebuilt_rows=rebuilt,
        seals_undone=undone,
        seals_finished=finished,
        unsealed=[c for c in plain if c != last],
        index_size=index.stat().st_size,
    )
