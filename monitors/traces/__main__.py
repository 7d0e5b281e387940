"""``nodewise traces cat|stat|verify|ls RUN`` and ``get RUN ID`` (also ``python -m
monitors.traces``): look at a run's trace stream (plain or sealed chunks) from a shell; and
``upload RUN --run-id ID``: send it to the Prime Traces API (``monitors.prime._backfill``).

Each command takes a run's directory (as ``FileMonitor(RUN)`` writes it: its stream is
``RUN/monitors/file/traces/stream``) or a stream's directory, and only reads (``upload``
writes its cursor beside the stream). A path that is neither, a missing index where one is
needed, or an unknown id is one line on stderr and exit status 1; a usage error is
argparse's, status 2.
"""

from __future__ import annotations

import argparse
import functools
import heapq
import itertools
import operator
import os
import sys
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import ijson
import orjson

from ..errors import TraceFormatError, UploadError
from ._index import count_rows, iter_rows
from ._layout import (
    INDEX_SUFFIX,
    RUN_STREAM,
    IndexRow,
    chunk_path,
    decode_row,
    index_path,
    is_stream_file,
    list_chunks,
    scan,
    sealed_path,
    stream_of,
)
from ._reader import (
    LineSpan,
    after_newline,
    chunk_name,
    find_row,
    iter_spans,
    parse_span,
    read_records,
)
from ._sealed import DamagedFrame, SealedChunk, chunk_size, open_chunk

__all__ = ["PROG", "cat", "get", "ls", "main", "parser", "stat", "verify"]

#: The name ``python -m monitors.traces`` goes by; ``nodewise traces`` passes its own.
PROG = "python -m monitors.traces"
_BLOCK = 1 << 20
#: Directories looked into, and how deep, for runs and streams below a path that is neither.
_SEARCH_DIRS = 500
_SEARCH_DEPTH = 6
#: What a stream's directory holds, for the errors that say what to give instead.
_HOLDS = "a stream's directory holds 00000.jsonl or 00000.jsonl.zst, its index beside it"


def _no_index(root: Path) -> str:
    """A stream without its index: what still works, what does not, and the fix."""
    return (
        f"no {index_path(root).name} beside {root}: records read without it (cat, get, "
        "read_records), but ls, read_record and find_record need it; copy it along with the "
        "chunks, or reopen the stream with a TraceWriter to rebuild it (without ids)"
    )


class CommandError(Exception):
    """What stops a command, said in one line (printed after the command's name)."""


class Progress:
    """A one-line progress bar on stderr, shown only when stderr is a terminal and the run
    takes more than a second."""

    def __init__(self, total: int, label: str) -> None:
        self.total = max(total, 1)
        self.label = label
        self.started = time.monotonic()
        self.shown = 0.0
        self.live = sys.stderr.isatty()

    def update(self, done: int) -> None:
        now = time.monotonic()
        if not self.live or now - self.started < 1.0 or now - self.shown < 0.2:
            return
        self.shown = now
        frac = min(done / self.total, 1.0)
        bar = "#" * int(frac * 30)
        rate = done / (now - self.started) / 1e6
        sys.stderr.write(f"\r{self.label} [{bar:<30}] {frac:6.1%} {rate:7.1f} MB/s")
        sys.stderr.flush()

    def close(self) -> None:
        if self.live and self.shown:
            sys.stderr.write("\r" + " " * 70 + "\r")
            sys.stderr.flush()


def _stream_bytes(root: Path) -> int:
    """Uncompressed bytes in the stream."""
    return sum(chunk_size(root, c) for c in list_chunks(root))


def _copy_range(src: BinaryIO | SealedChunk, out: BinaryIO, offset: int, length: int) -> int:
    """Copy ``length`` bytes from ``offset``; return how many there were."""
    src.seek(offset)
    copied = 0
    while copied < length:
        data = src.read(min(_BLOCK, length - copied))
        if not data:
            break
        out.write(data)
        copied += len(data)
    return copied


# -- cat ---------------------------------------------------------------------------------


def cat(root: Path, *, fold: bool = False) -> int:
    """Every complete record line, as stored, to stdout (NDJSON); with ``fold``, each
    record parsed, the annotations beside the stream folded onto its traces (as
    ``read_records(..., fold=True)``) and written again by orjson."""
    if fold:
        return _cat_folded(root)
    out = sys.stdout.buffer
    progress = Progress(_stream_bytes(root), "cat")
    done = 0
    files: dict[int, BinaryIO | SealedChunk] = {}
    with ExitStack() as stack:
        stack.callback(progress.close)
        for span in iter_spans(root):
            if span.lost:
                raise TraceFormatError(
                    f"a damaged zstd frame: {span.lost} records unreadable",
                    chunk=sealed_path(root, span.chunk).name,
                    offset=span.offset,
                )
            if not span.complete:
                break
            if span.data is not None:
                out.write(span.data + b"\n")
                done += span.length + 1
                progress.update(done)
                continue
            if span.chunk not in files:
                f = files[span.chunk] = open_chunk(root, span.chunk)
                stack.callback(f.close)
            _copy_range(files[span.chunk], out, span.offset, span.length)
            out.write(b"\n")
            done += span.length + 1
            progress.update(done)
    out.flush()
    return 0


def _cat_folded(root: Path) -> int:
    out = sys.stdout.buffer
    for record in read_records(root, fold=True):
        out.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
    out.flush()
    return 0


# -- stat --------------------------------------------------------------------------------


def _count_lines(f: BinaryIO | SealedChunk) -> tuple[int, bool, int]:
    """Newlines in the file, whether it ends with one (or is empty), and damaged frames
    (their lines not counted)."""
    lines = damaged = 0
    last = b"\n"
    with f:
        while True:
            try:
                block = f.read(_BLOCK)
            except DamagedFrame as exc:
                damaged += 1
                f.seek(exc.end)
                continue
            if not block:
                break
            lines += block.count(b"\n")
            last = block
    return lines, last.endswith(b"\n"), damaged


def _index_rows(root: Path) -> int | None:
    """Complete rows in the stream's index, or None when it has none."""
    index = index_path(root)
    return count_rows(index) if index.is_file() else None


def stat(root: Path) -> int:
    """Records, chunks (plain and sealed), bytes on disk and uncompressed, and torn tails,
    by counting lines (sealed chunks are decompressed to count them); 1 when a chunk or
    frame is damaged or the index is missing."""
    listing = scan(root)
    records = torn = damaged = 0
    plain_bytes = sealed_bytes = sealed_in = 0
    for chunk in listing.chunks:
        try:
            f = open_chunk(root, chunk)
        except TraceFormatError as exc:
            print(f"problem: {exc}")
            damaged += 1
            continue
        if isinstance(f, SealedChunk):
            sealed_bytes += sealed_path(root, chunk).stat().st_size  # the seek table too
            sealed_in += f.size
        else:
            plain_bytes += chunk_path(root, chunk).stat().st_size
        lines, whole, bad = _count_lines(f)
        records += lines
        torn += not whole
        damaged += bad
    rows = _index_rows(root)
    index = index_path(root)
    if rows is None:
        print(f"problem: {_no_index(root)}")
    sealed = len(set(listing.sealed) - set(listing.plain))
    ratio = f"{sealed_in / sealed_bytes:.2f}x" if sealed_bytes else "-"
    print(f"directory     {root}")
    print(f"index         {index}{' (missing)' if rows is None else ''}")
    print(f"records       {records}")
    print(f"index rows    {f'none (no {index.name})' if rows is None else rows}")
    print(f"chunks        {len(listing.chunks)} ({sealed} sealed)")
    print(f"plain bytes   {plain_bytes}")
    print(f"sealed bytes  {sealed_bytes} (holding {sealed_in} bytes: {ratio})")
    print(f"bytes         {plain_bytes + sealed_in} uncompressed")
    print(f"torn tails    {torn}")
    print(f"damaged       {damaged} (frames or chunks)")
    return 1 if damaged or rows is None else 0


# -- verify ------------------------------------------------------------------------------


class _Rows:
    """The index's rows, one at a time, in order, each parsed or the reason it is not a
    row: unlike ``iter_rows``, a damaged row does not end the rest (verify names each)."""

    def __init__(self, f: BinaryIO | None) -> None:
        self.f = f
        self.taken = 0  # complete rows taken
        self.torn = 0  # bytes of a last row without its newline
        self._next: IndexRow | ValueError | None = None
        self._peeked = False

    def peek(self) -> IndexRow | ValueError | None:
        """The next row (None past the last complete one), not taken."""
        if not self._peeked:
            self._next = self._read()
            self._peeked = True
        return self._next

    def take(self) -> IndexRow | ValueError | None:
        row = self.peek()
        self._peeked = False
        if row is not None:
            self.taken += 1
        return row

    def skip_to(self, chunk: int, end: int | None) -> int:
        """Take the rows of records in ``chunk`` before byte ``end`` (None: the chunk's
        end), the records a damaged frame or chunk made unreadable; return how many."""
        n = 0
        while isinstance(row := self.peek(), IndexRow) and row.chunk == chunk:
            if end is not None and row.offset >= end:
                break
            self.take()
            n += 1
        return n

    def rest(self) -> int:
        """Take the rows left; return how many there were."""
        n = 0
        while self.take() is not None:
            n += 1
        return n

    def _read(self) -> IndexRow | ValueError | None:
        if self.f is None:
            return None
        data = self.f.readline()
        if not data:
            return None
        if not data.endswith(b"\n"):
            self.torn = len(data)
            return None
        try:
            return decode_row(data)
        except ValueError as exc:
            return exc


def _place(chunk: int, offset: int, length: int | None) -> str:
    size = "" if length is None else f", {length} bytes"
    return f"chunk {chunk} byte {offset}{size}"


def _row_problem(row: IndexRow | ValueError, k: int, span: LineSpan, record: Any) -> str | None:
    """What is wrong with index row ``k`` (from 1) for record ``k`` at ``span``, if
    anything: the row must say ``line`` k (when it has a line), point at the record's
    chunk and offset, and give its length (newline included) when it has one, and the
    record's ``id`` when it has one."""
    if isinstance(row, ValueError):
        return f"index row {k} is not a row ({row})"
    if row.line is not None and row.line != k:
        return f"index row {k} says line {row.line}: rows are missing or out of order"
    length = span.length + 1
    if (row.chunk, row.offset) != (span.chunk, span.offset) or (
        row.length is not None and row.length != length
    ):
        return (
            f"index row {k} points at {_place(row.chunk, row.offset, row.length)}, but "
            f"record {k} is at {_place(span.chunk, span.offset, length)}"
        )
    if "id" in row.fields and record is not _UNPARSED:
        own = record.get("id") if isinstance(record, dict) else None
        if own != row.id or type(own) is not type(row.id):
            return f"index row {k} says id {row.id!r}, but record {k} has id {own!r}"
    return None


_UNPARSED = object()


def verify(root: Path) -> int:
    """Parse every record, check that its index row (they are in step: row ``k`` is
    record ``k``, from 1) says its line and points at it, and that every frame of every
    sealed chunk is whole (a missing index is a problem; the records are checked all the
    same)."""
    problems: list[str] = []
    index = index_path(root)
    chunks = list_chunks(root)
    whole: set[int] = set()
    for chunk in chunks:
        try:
            open_chunk(root, chunk).close()
            whole.add(chunk)
        except TraceFormatError as exc:
            problems.append(str(exc))
    progress = Progress(sum(chunk_size(root, c) for c in whole), "verify")
    n = 0
    done = 0
    with ExitStack() as stack:
        has_index = index.is_file()
        rows = _Rows(stack.enter_context(open(index, "rb")) if has_index else None)
        stack.callback(progress.close)
        for chunk in chunks:
            if chunk not in whole:
                n += rows.skip_to(chunk, None)  # its records, unreadable, counted by their rows
                continue
            for span in iter_spans(root, chunks=[chunk]):
                if span.lost:
                    problems.append(
                        f"{sealed_path(root, chunk).name}: a damaged zstd frame, "
                        f"bytes {span.offset} to {span.offset + span.length} unreadable "
                        f"({span.lost} records)"
                    )
                    n += span.lost
                    rows.skip_to(chunk, span.offset + span.length)
                    continue
                if not span.complete:
                    problems.append(
                        f"a torn last line of {span.length} bytes in {chunk_name(root, chunk)} "
                        "(not a record)"
                    )
                    continue
                record: Any = _UNPARSED
                try:
                    record = parse_span(root, span)
                except (ValueError, ijson.JSONError, DamagedFrame) as exc:
                    problems.append(
                        f"{chunk_name(root, chunk)} at byte {span.offset}: not a record ({exc})"
                    )
                n += 1
                row = rows.take()
                if row is not None:
                    problem = _row_problem(row, n, span, record)
                    if problem is not None:
                        problems.append(problem)
                done += span.length + 1
                progress.update(done)
        rows.rest()
        total = rows.taken
    if not has_index:
        problems.append(_no_index(root))
    elif total != n:
        problems.append(f"{n} records but {total} index rows")
    if rows.torn:
        problems.append(f"a torn last row of {rows.torn} bytes in {index.name} (not a row)")
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{n} records verified, {len(problems)} problems")
    return 1 if problems else 0


# -- get ---------------------------------------------------------------------------------


def get(root: Path, record_id: str, *, prog: str = PROG, given: Path | None = None) -> int:
    """The record whose ``"id"`` is ``record_id``, as stored (one line), to stdout; only the
    frames it spans are decompressed. Without an index every record is read in order to
    find it (a note on stderr says so).

    :param prog: The command's name, for the hints in errors.
    :param given: The path the user gave (a run's directory or ``root``), for the hints.
    :raises CommandError: No record has that id, or its row points at no whole line.
    """
    path = root if given is None else given
    index = index_path(root)
    rows = _index_rows(root)
    if rows is None:
        found = _first_with_id(root, record_id)
        if found is None:
            raise CommandError(
                f"no record with id {record_id!r} in {path} (read every record: it has no "
                f"{index.name}; ids match exactly; {prog} cat {path} | jq .id lists them)"
            )
        n, row = found
        print(
            f"{prog} get: note: {path} has no {index.name}: found by reading the records "
            f"in order ({prog} verify {path} says more)",
            file=sys.stderr,
        )
    else:
        try:
            n, row = find_row(root, record_id)
        except KeyError:
            raise CommandError(
                f"no record with id {record_id!r} among the {rows} indexed in {path} (ids "
                f"match exactly; {prog} ls {path} lists them)"
            ) from None
        except ValueError as exc:
            raise CommandError(
                f"{index} is damaged ({exc}): {prog} verify {path} says where"
            ) from exc
    out = sys.stdout.buffer
    try:
        with open_chunk(root, row.chunk) as f:
            end = row.end if row.end is not None else after_newline(f, row.offset)
            size = chunk_size(root, row.chunk)
            # A whole line: it starts the chunk or follows a newline, and ends with one.
            whole = row.offset < end <= size
            if whole and row.offset > 0:
                f.seek(row.offset - 1)
                whole = f.read(1) == b"\n"
            if whole:
                f.seek(end - 1)
                whole = f.read(1) == b"\n"
            if not whole:
                raise CommandError(
                    f"index row {n + 1} of {index} points at no whole line ("
                    f"{_place(row.chunk, row.offset, row.length)} of "
                    f"{chunk_name(root, row.chunk)}, {size} bytes): {prog} verify {path} "
                    "says more"
                )
            _copy_range(f, out, row.offset, end - row.offset)
    except DamagedFrame as exc:
        raise TraceFormatError(
            f"record {n}: {exc}", chunk=sealed_path(root, row.chunk).name, offset=row.offset
        ) from exc
    out.flush()
    return 0


def _first_with_id(root: Path, record_id: str) -> tuple[int, IndexRow] | None:
    """The number and place of the first record whose ``"id"`` is ``record_id``, found by
    reading every record (lines that cannot hold it are not parsed)."""
    encoded = orjson.dumps(record_id)
    n = 0
    for span in iter_spans(root):
        if span.lost or not span.complete:
            n += span.lost
            continue
        n += 1
        # A line holds the id as orjson writes it, unless it escapes characters otherwise.
        if span.data is not None and encoded not in span.data and b"\\" not in span.data:
            continue
        try:
            record = parse_span(root, span)
        except (ValueError, ijson.JSONError, DamagedFrame):
            continue
        if isinstance(record, dict) and record.get("id") == record_id:
            return n - 1, IndexRow(n, span.chunk, span.offset, span.length + 1)
    return None


# -- ls ----------------------------------------------------------------------------------


def _text(value: Any, width: int = 24) -> str:
    """A value as a cell: None as ``-``, a string as it is, anything else as JSON; cut to
    ``width`` characters (the last one an ellipsis)."""
    if value is None:
        return "-"
    text = value if isinstance(value, str) else orjson.dumps(value, default=str).decode()
    return text if len(text) <= width else text[: width - 1] + "…"


def _real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _count(value: Any) -> str:
    return str(value) if type(value) is int else _text(value, 12)


def _decimals(digits: int, unit: str = "") -> Callable[[Any], str]:
    def cell(value: Any) -> str:
        return f"{value:.{digits}f}{unit}" if _real(value) else _text(value, 12)

    return cell


def _yes_no(value: Any) -> str:
    return {True: "yes", False: "no"}.get(value, "-") if type(value) is bool else _text(value, 8)


@dataclass(frozen=True)
class _Column:
    """One column of ``ls``: its title, the row field it shows, how, and its alignment."""

    title: str
    field: str
    cell: Callable[[Any], str]
    right: bool = True


#: ``ls``'s table. An id is kept whole up to 36 characters (a UUID), so it can be given
#: to ``get``; a longer one is cut.
_COLUMNS = (
    _Column("line", "line", _count),
    _Column("step", "step", _count),
    _Column("kind", "kind", lambda v: _text(v, 8), right=False),
    _Column("env", "env", lambda v: _text(v, 20), right=False),
    _Column("ok", "ok", _yes_no, right=False),
    _Column("reward", "reward", _decimals(3)),
    _Column("advantage", "advantage", _decimals(3)),
    _Column("in", "input_tokens", _count),
    _Column("out", "output_tokens", _count),
    _Column("turns", "turns", _count),
    _Column("errors", "num_errors", _count),
    _Column("duration", "duration", _decimals(1, "s")),
    _Column("id", "id", lambda v: _text(v, 36), right=False),
)
#: The fields ``ls --sort`` takes (a leading ``-`` sorts from the largest), and the
#: columns' titles that name other fields.
SORT_FIELDS = (
    "line",
    "step",
    "kind",
    "env",
    "ok",
    "reward",
    "advantage",
    "input_tokens",
    "output_tokens",
    "turns",
    "num_errors",
    "duration",
    "id",
    "cost",
    "branches",
    "chunk",
    "dispatch",
    "arrival",
)
_SORT_ALIASES = {c.title: c.field for c in _COLUMNS if c.title != c.field}


@dataclass(frozen=True)
class SortKey:
    """``ls --sort``: a row field, from the smallest or the largest."""

    field: str
    descending: bool


def sort_key(text: str) -> SortKey:
    """Parse ``--sort``'s value: a field (or a column's title), ``-`` first for largest
    first.

    :raises argparse.ArgumentTypeError: It names no field ``ls`` sorts by.
    """
    descending = text.startswith("-")
    name = text[1:] if descending else text
    name = _SORT_ALIASES.get(name, name)
    if name not in SORT_FIELDS:
        raise argparse.ArgumentTypeError(
            f"cannot sort by {text!r}: choose from {', '.join(SORT_FIELDS)} "
            "(or in, out, errors), - first for largest first"
        )
    return SortKey(name, descending)


def _order(value: Any) -> tuple[int, Any]:
    """A value's place in a sort, for rows of values of different types: numbers (bools
    among them), then strings, then anything else by its JSON."""
    if isinstance(value, (int, float)):
        return 0, value
    if isinstance(value, str):
        return 1, value
    return 2, orjson.dumps(value, default=str)


def _selected(
    index: Path, *, kind: str | None, sort: SortKey | None, limit: int | None, hint: str
) -> Iterator[IndexRow]:
    """The rows ``ls`` shows, in its order: those of ``kind``, sorted (rows without the
    field last, whatever the direction; ties in stream order), the first ``limit``.

    :param hint: What to run to learn more, when a row is damaged.
    :raises CommandError: A row is not a row.
    """
    n = -1

    def rows() -> Iterator[IndexRow]:
        nonlocal n
        for n, row in iter_rows(index):  # noqa: B007 (n says where a damaged row is)
            if kind is None or row.kind == kind:
                yield row

    try:
        if sort is None:
            yield from itertools.islice(rows(), limit)
            return
        unsorted: list[IndexRow] = []  # rows without the field, kept in stream order

        def valued() -> Iterator[tuple[tuple[int, Any], IndexRow]]:
            for row in rows():
                value = row.fields.get(sort.field)
                if value is None:
                    if limit is None or len(unsorted) < limit:
                        unsorted.append(row)
                else:
                    yield _order(value), row

        by = operator.itemgetter(0)
        if limit is None:
            ranked = sorted(valued(), key=by, reverse=sort.descending)
        elif sort.descending:
            ranked = heapq.nlargest(limit, valued(), key=by)
        else:
            ranked = heapq.nsmallest(limit, valued(), key=by)
        yield from itertools.islice(itertools.chain((r for _, r in ranked), unsorted), limit)
    except ValueError as exc:
        raise CommandError(f"{index} is damaged at row {n + 2} ({exc}): {hint}") from exc


def _cells(row: IndexRow) -> list[str]:
    return [column.cell(row.fields.get(column.field)) for column in _COLUMNS]


def _table(rows: Iterable[IndexRow], widths: list[int], out: BinaryIO) -> None:
    for cells in itertools.chain([[c.title for c in _COLUMNS]], map(_cells, rows)):
        line = "  ".join(
            cell.rjust(width) if column.right else cell.ljust(width)
            for cell, width, column in zip(cells, widths, _COLUMNS, strict=True)
        )
        out.write(line.rstrip().encode() + b"\n")


def ls(
    root: Path,
    *,
    kind: str | None = None,
    sort: SortKey | None = None,
    limit: int | None = None,
    as_json: bool = False,
    prog: str = PROG,
    given: Path | None = None,
) -> int:
    """The index's rows as a table, one per record (only the index is read): its line,
    step, kind, env, whether it is ok, reward and advantage (3 decimals), input and output
    tokens, turns, errors, duration (seconds) and id; ``-`` where a row has nothing. With
    ``as_json``, the rows as stored, one JSON object per line.

    :param kind: Only the rows of this kind (``"train"``, ``"eval"``).
    :param sort: The order (default: the stream's).
    :param limit: At most this many rows.
    :param as_json: JSON lines instead of the table.
    :param prog: The command's name, for the hints in errors.
    :param given: The path the user gave (a run's directory or ``root``), for the hints.
    :raises CommandError: The stream has no index, or a row of it is damaged.
    """
    path = root if given is None else given
    index = index_path(root)
    if not index.is_file():
        raise CommandError(
            f"{path} has no index ({index} is missing): ls lists its rows; {prog} cat {path} "
            f"reads the records without it, and {prog} verify {path} checks them"
        )
    out = sys.stdout.buffer

    def selected() -> Iterator[IndexRow]:
        hint = f"{prog} verify {path} says more"
        return _selected(index, kind=kind, sort=sort, limit=limit, hint=hint)

    if as_json:
        for row in selected():
            out.write(orjson.dumps(dict(row.fields), option=orjson.OPT_APPEND_NEWLINE))
        out.flush()
        return 0
    widths = [len(c.title) for c in _COLUMNS]
    if sort is None:
        # Two passes over the index, the first for the widths: no row is held.
        shown = 0
        for row in selected():
            widths = [max(w, len(cell)) for w, cell in zip(widths, _cells(row), strict=True)]
            shown += 1
        _table(itertools.islice(selected(), shown), widths, out)
    else:
        rows = list(selected())
        for row in rows:
            widths = [max(w, len(cell)) for w, cell in zip(widths, _cells(row), strict=True)]
        _table(rows, widths, out)
    out.flush()
    return 0


# -- paths -------------------------------------------------------------------------------


def _is_run(path: Path) -> bool:
    """Whether ``path`` is a run's directory (it holds ``monitors/file/traces/stream``)."""
    return (path / RUN_STREAM).is_dir()


def _stream_problem(path: Path) -> str | None:
    """Why ``path`` is neither a run's directory nor a trace stream's, and what to give
    instead (None when it is one: a run's, or a directory holding a chunk or with an index
    beside it; stray files beside the chunks are the commands' to name)."""
    give = "give a run's directory or a trace stream's"
    if not path.exists():
        return f"{path} does not exist: {give} (RUN/monitors/file/traces/stream)"
    if not path.is_dir():
        if is_stream_file(path.name):
            return f"{path} is a file of a trace stream: give the stream's directory, {path.parent}"
        if path.name.endswith(INDEX_SUFFIX) and len(path.name) > len(INDEX_SUFFIX):
            stream = path.with_name(path.name[: -len(INDEX_SUFFIX)])
            return f"{path} is a trace stream's index: give the stream's directory, {stream}"
        return f"{path} is a file, not a run's directory or a trace stream's ({_HOLDS})"
    if _is_run(path) or index_path(path).is_file():
        return None
    names = os.listdir(path)
    if any(is_stream_file(name) for name in names):
        return None
    if not names:
        return f"{path} is empty: not a run or a trace stream ({_HOLDS})"
    below = _streams_below(path)
    if below:
        more = f" and {len(below) - 3} more" if len(below) > 3 else ""
        shown = ", ".join(str(p) for p in below[:3])
        return f"{path} is not a run or a trace stream but holds some: give one of {shown}{more}"
    return (
        f"{path} is not a run or a trace stream: it holds no chunk (00000.jsonl, "
        "00000.jsonl.zst), no monitors/file/traces/stream and no stream below it; "
        f"{give}"
    )


def _streams_below(root: Path) -> list[Path]:
    """Runs' directories (holding ``monitors/file/traces/stream``) and streams' (holding
    chunks) under ``root``, breadth first, not looking inside one found, giving up after
    ``_SEARCH_DIRS`` directories."""
    found: list[Path] = []
    level = [root]
    budget = _SEARCH_DIRS
    for _ in range(_SEARCH_DEPTH):
        deeper: list[Path] = []
        for directory in level:
            try:
                entries = sorted(e.name for e in os.scandir(directory) if e.is_dir())
            except OSError:
                continue
            for name in entries:
                budget -= 1
                if budget < 0:
                    return found
                path = directory / name
                try:
                    stream = _is_run(path) or any(is_stream_file(n) for n in os.listdir(path))
                except OSError:
                    continue
                (found if stream else deeper).append(path)
        level = deeper
    return found


# -- the command line --------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of rows")
    return value


def parser(*, prog: str = PROG) -> argparse.ArgumentParser:
    """The command line (``prog`` names the command in help and errors)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Look at a run's trace stream (plain or sealed chunks) from a shell, or "
        "upload it to the Prime Traces API. Every command but upload only reads.",
        epilog="DIR is a run's directory (FileMonitor(RUN) keeps its episodes, train and eval, "
        "in one stream, RUN/monitors/file/traces/stream, its index beside it in "
        "stream.index.jsonl) or a stream's directory (numbered chunks: 00000.jsonl, or "
        f"00000.jsonl.zst once sealed). Example: {prog} ls runs/42 --sort -reward --limit 10",
    )
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {
        "cat": "print every complete record, as stored, one per line (NDJSON)",
        "stat": "count records, chunks, bytes (on disk and uncompressed) and torn tails",
        "verify": "parse every record and check the index and every sealed frame",
        "get": "print the record whose id is ID, as stored (through the index)",
        "ls": "list the index's rows as a table: a line per record (only the index is read)",
        "upload": "send the records to the Prime Traces API until each is answered "
        "(resumable), or check them without sending (--dry-run)",
        "serve": "browse runs in a web page: episodes, metrics, one node at a time "
        "(read-only; 127.0.0.1 unless --host)",
    }
    for name, what in helps.items():
        command = commands.add_parser(name, help=what, description=what[0].upper() + what[1:])
        command.add_argument(
            "directory",
            type=Path,
            metavar="DIR",
            nargs="+" if name == "serve" else None,
            help="a run's directory or a stream's" + (" (one or more)" if name == "serve" else ""),
        )
        if name == "serve":
            command.add_argument(
                "--port", type=int, default=7788, help="the port (default 7788; 0: any free one)"
            )
            command.add_argument(
                "--host",
                default="127.0.0.1",
                help="the address to bind (default 127.0.0.1); any other needs the token "
                "printed at start on every request",
            )
        if name == "get":
            command.add_argument("id", metavar="ID", help='the record\'s "id" (a string)')
        if name == "cat":
            command.add_argument(
                "--fold",
                action="store_true",
                help="fold the run's annotations onto each episode's traces (each record "
                "parsed and written again by orjson, not copied as stored)",
            )
        if name == "ls":
            command.add_argument(
                "--kind", choices=("train", "eval"), help="only the records of this kind"
            )
            command.add_argument(
                "--sort",
                type=sort_key,
                metavar="FIELD",
                help="order by a row's field: line, step, reward, advantage, duration, "
                "input_tokens (in), output_tokens (out), turns, num_errors (errors), id, ...; "
                "-FIELD for largest first; rows without it last (the rows sorted are held in "
                "memory, only the first N with --limit)",
            )
            command.add_argument(
                "--limit", type=_positive, metavar="N", help="at most N rows (after sorting)"
            )
            command.add_argument(
                "--json", action="store_true", help="the rows as stored, as JSON lines"
            )
        if name == "upload":
            _upload_options(command, prog=prog)
    return p


def _upload_options(command: argparse.ArgumentParser, *, prog: str) -> None:
    """``upload``'s options, and what it does in its help."""
    command.formatter_class = argparse.RawDescriptionHelpFormatter
    command.description = (
        "Send every record of a finished or interrupted run (nodewise's or prime-rl's, plain\n"
        "or sealed chunks) to the Prime Traces API, each stamped with the run (run.id,\n"
        "run.type), in batches of consecutive records of one kind and step, retried until the\n"
        "service answers: an outage is waited out. What the service answered is kept in a\n"
        "cursor beside the stream (stream.uploads/ID.json): after Ctrl-C, a crash or a\n"
        "refused key, the same command goes on from there and sends nothing confirmed again.\n"
        "\n"
        "Settings come from the environment, else ~/.prime/config.json (prime login):\n"
        "PRIME_API_KEY, PRIME_TEAM_ID, PRIME_TRACES_URL.\n"
        "\n"
        "Progress goes to stderr (bytes of the stream's lines and records, done of what is\n"
        "left, and MB/s; a prime-rl row has no length: its bytes run to the next row's offset\n"
        "or the chunk's end); the summary to stdout: delivered, rejected by the service's code,\n"
        "too large, damaged, pending, and what earlier runs did.\n"
        "\n"
        "exit status: 0 every record stored; 1 records lost for good (by this run or an\n"
        "earlier one), left pending, a refused key, or an error; 2 a usage error; 130 stopped\n"
        "by Ctrl-C (SIGINT), 143 by SIGTERM: run the command again to go on.\n"
        "--dry-run: 0 when every record would be stored, 1 when any would be refused."
    )
    command.epilog = f"Example: PRIME_API_KEY=... {prog} upload runs/42 --run-id 42 --kind eval"
    command.add_argument(
        "--run-id", required=True, metavar="ID", help="the run the records go to (required)"
    )
    command.add_argument(
        "--kind",
        choices=("train", "eval"),
        help="only the records of this kind (a later run without it sends the rest)",
    )
    command.add_argument(
        "--dry-run",
        action="store_true",
        help="send nothing: check each record as it would be sent (readable, one JSON value, "
        "stamped, at most 64 MiB, its request within 32 MiB, what the service's contract "
        "refuses); list what would be refused",
    )


def _sort_joined(argv: Sequence[str]) -> list[str]:
    """``--sort -reward`` as ``--sort=-reward``: argparse takes a value starting with ``-``
    for an option of its own."""
    out: list[str] = []
    for arg in argv:
        if out and out[-1] == "--sort" and arg[:1] == "-" and arg[1:2].isalpha():
            out[-1] = f"--sort={arg}"
        else:
            out.append(arg)
    return out


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Run one command: 0 when it did its job, 1 when it could not or found a problem, 2
    for a usage error, 130 when interrupted.

    :param argv: The arguments (default: the process's).
    :param prog: The name the user typed, for help and errors (``nodewise traces``).
    """
    args = parser(prog=prog).parse_args(_sort_joined(sys.argv[1:] if argv is None else argv))
    where = f"{prog} {args.command}"
    if args.command == "serve":
        return _serve(args.directory, host=args.host, port=args.port, where=where)
    given: Path = args.directory
    try:
        problem = _stream_problem(given)
        if problem is not None:
            raise CommandError(problem)
        root = stream_of(given)
        if args.command == "upload":
            from ..prime._backfill import upload_command

            return upload_command(
                given, run_id=args.run_id, kind=args.kind, dry_run=args.dry_run, prog=prog
            )
        if args.command == "get":
            return get(root, args.id, prog=prog, given=given)
        if args.command == "ls":
            return ls(
                root,
                kind=args.kind,
                sort=args.sort,
                limit=args.limit,
                as_json=args.json,
                prog=prog,
                given=given,
            )
        if args.command == "cat":
            return cat(root, fold=args.fold)
        command = {"stat": stat, "verify": verify}[args.command]
        return command(root)
    except (CommandError, TraceFormatError, UploadError) as exc:
        print(f"{where}: {exc}", file=sys.stderr)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and let nothing flush to it at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        what = exc.strerror or str(exc)
        print(f"{where}: cannot read {exc.filename or given}: {what}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"\n{where}: interrupted", file=sys.stderr)
        return 130
    return 1


def _serve(paths: list[Path], *, host: str, port: int, where: str) -> int:
    from ._browser import serve

    for path in paths:
        problem = _stream_problem(path)
        if problem is not None and not (path / RUN_STREAM.parent.parent).is_dir():
            print(f"{where}: {problem}", file=sys.stderr)
            return 1
    try:
        anyio.run(functools.partial(serve, paths, host=host, port=port))
    except OSError as exc:
        print(f"{where}: cannot serve on {host}:{port}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
