"""``nodewise traces cat|stat|verify DIR`` and ``get DIR ID`` (also ``python -m
monitors.traces``): look at a trace stream (plain or sealed chunks) from a shell.

Each command only reads. A path that is not a stream's directory, a missing index where one
is needed, or an unknown id is one line on stderr and exit status 1; a usage error is
argparse's, status 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import ijson
import orjson

from ..errors import TraceFormatError
from ._layout import (
    INDEX_NAME,
    ROW_BYTES,
    IndexRow,
    chunk_path,
    decode_row,
    is_stream_file,
    list_chunks,
    scan,
    sealed_path,
)
from ._reader import LineSpan, chunk_name, find_row, iter_spans, parse_span
from ._sealed import DamagedFrame, SealedChunk, chunk_size, open_chunk

__all__ = ["PROG", "cat", "get", "main", "parser", "stat", "verify"]

#: The name ``python -m monitors.traces`` goes by; ``nodewise traces`` passes its own.
PROG = "python -m monitors.traces"
_BLOCK = 1 << 20
#: Directories looked into, and how deep, for streams below a path that is not one.
_SEARCH_DIRS = 500
_SEARCH_DEPTH = 6
#: A stream without its index: what still works, what does not, and the fix.
NO_INDEX = (
    f"no {INDEX_NAME}: records read without it (cat, get, read_records), but read_record "
    "and find_record need it; copy it along with the chunks, or reopen the stream with a "
    "TraceWriter to rebuild it (without ids)"
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


def _copy_range(src: BinaryIO | SealedChunk, out: BinaryIO, offset: int, length: int) -> None:
    src.seek(offset)
    while length > 0:
        data = src.read(min(_BLOCK, length))
        if not data:
            return
        out.write(data)
        length -= len(data)


def cat(root: Path) -> int:
    """Every complete record line, as stored, to stdout (NDJSON)."""
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
    if rows is None:
        print(f"problem: {NO_INDEX}")
    sealed = len(set(listing.sealed) - set(listing.plain))
    ratio = f"{sealed_in / sealed_bytes:.2f}x" if sealed_bytes else "-"
    print(f"directory     {root}")
    print(f"records       {records}")
    print(f"index rows    {f'none (no {INDEX_NAME})' if rows is None else rows}")
    print(f"chunks        {len(listing.chunks)} ({sealed} sealed)")
    print(f"plain bytes   {plain_bytes}")
    print(f"sealed bytes  {sealed_bytes} (holding {sealed_in} bytes: {ratio})")
    print(f"bytes         {plain_bytes + sealed_in} uncompressed")
    print(f"torn tails    {torn}")
    print(f"damaged       {damaged} (frames or chunks)")
    return 1 if damaged or rows is None else 0


def _index_rows(root: Path) -> int | None:
    """Whole rows in the index, or None when the stream has none."""
    try:
        return (root / INDEX_NAME).stat().st_size // ROW_BYTES
    except FileNotFoundError:
        return None


def _row_problem(idx: BinaryIO, n: int, span: LineSpan) -> str | None:
    """What is wrong with index row ``n`` for the record at ``span``, if anything."""
    idx.seek(n * ROW_BYTES)
    try:
        row = decode_row(idx.read(ROW_BYTES))
    except ValueError as exc:
        return f"index row {n} is not a row ({exc})"
    if (row.chunk, row.offset, row.length) != (span.chunk, span.offset, span.length + 1):
        return f"index row {n} is {row}, the record is at {span.chunk}:{span.offset}"
    return None


def verify(root: Path) -> int:
    """Parse every record, check that the index points at each of them, and that every
    frame of every sealed chunk is whole (a missing index is a problem; the records are
    checked all the same)."""
    problems: list[str] = []
    rows = _index_rows(root)
    chunks = list_chunks(root)
    whole: list[int] = []
    for chunk in chunks:
        try:
            open_chunk(root, chunk).close()
            whole.append(chunk)
        except TraceFormatError as exc:
            problems.append(str(exc))
    progress = Progress(sum(chunk_size(root, c) for c in whole), "verify")
    n = 0
    done = 0
    with ExitStack() as stack:
        idx = None if rows is None else stack.enter_context(open(root / INDEX_NAME, "rb"))
        stack.callback(progress.close)
        for chunk in whole:
            for span in iter_spans(root, chunks=[chunk]):
                if span.lost:
                    problems.append(
                        f"{sealed_path(root, chunk).name}: a damaged zstd frame, "
                        f"bytes {span.offset} to {span.offset + span.length} unreadable "
                        f"({span.lost} records)"
                    )
                    n += span.lost
                    continue
                if not span.complete:
                    problems.append(
                        f"a torn last line of {span.length} bytes in {chunk_name(root, chunk)} "
                        "(not a record)"
                    )
                    continue
                try:
                    parse_span(root, span)
                except (ValueError, ijson.JSONError, DamagedFrame) as exc:
                    problems.append(
                        f"{chunk_name(root, chunk)} at byte {span.offset}: not a record ({exc})"
                    )
                if idx is not None and rows is not None and n < rows:
                    problem = _row_problem(idx, n, span)
                    if problem is not None:
                        problems.append(problem)
                n += 1
                done += span.length + 1
                progress.update(done)
    if rows is None:
        problems.append(NO_INDEX)
    elif rows != n:
        problems.append(f"{n} records but {rows} index rows")
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{n} records verified, {len(problems)} problems")
    return 1 if problems else 0


def get(root: Path, record_id: str, *, prog: str = PROG) -> int:
    """The record whose ``"id"`` is ``record_id``, as stored (one line), to stdout; only the
    frames it spans are decompressed. Without an index every record is read in order to
    find it (a note on stderr says so).

    :param prog: The command's name, for the hints in errors.
    :raises CommandError: No record has that id, or the index is damaged.
    """
    rows = _index_rows(root)
    if rows is None:
        found = _first_with_id(root, record_id)
        if found is None:
            raise CommandError(
                f"no record with id {record_id!r} in {root} (read every record: it has no "
                f"{INDEX_NAME}; ids match exactly; {prog} cat {root} | jq .id lists them)"
            )
        n, row = found
        print(
            f"{prog} get: note: {root} has no {INDEX_NAME}: found by reading the records "
            f"in order ({prog} verify {root} says more)",
            file=sys.stderr,
        )
    else:
        try:
            n, row = find_row(root, record_id)
        except KeyError:
            raise CommandError(
                f"no record with id {record_id!r} among the {rows} indexed in {root} (ids "
                f"match exactly; {prog} cat {root} | jq .id lists them)"
            ) from None
        except ValueError as exc:
            raise CommandError(
                f"{root / INDEX_NAME} is damaged ({exc}): {prog} verify {root} says where"
            ) from exc
    out = sys.stdout.buffer
    try:
        with open_chunk(root, row.chunk) as f:
            _copy_range(f, out, row.offset, row.length)
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
            return n - 1, IndexRow(span.chunk, span.offset, span.length + 1)
    return None


def _stream_problem(root: Path) -> str | None:
    """Why ``root`` is not a trace stream's directory, and what to give instead (None when
    it holds a chunk or an index: stray files beside them are the commands' to name)."""
    if not root.exists():
        return f"{root} does not exist: give a trace stream's directory (RUN/traces/KIND/SUBSET)"
    if not root.is_dir():
        if is_stream_file(root.name):
            return f"{root} is a file of a trace stream: give the stream's directory, {root.parent}"
        return (
            f"{root} is a file, not a trace stream's directory (one holding 00000.jsonl or "
            f"00000.jsonl.zst and {INDEX_NAME})"
        )
    names = os.listdir(root)
    if any(is_stream_file(name) for name in names):
        return None
    if not names:
        return (
            f"{root} is empty: not a trace stream (a stream's directory holds 00000.jsonl "
            f"or 00000.jsonl.zst and {INDEX_NAME})"
        )
    below = _streams_below(root)
    if below:
        more = f" and {len(below) - 3} more" if len(below) > 3 else ""
        shown = ", ".join(str(p) for p in below[:3])
        return f"{root} is not a trace stream but holds streams: give one of {shown}{more}"
    return (
        f"{root} is not a trace stream: it holds no chunk (00000.jsonl, 00000.jsonl.zst), no "
        f"{INDEX_NAME} and no stream below it; give a stream's directory"
    )


def _streams_below(root: Path) -> list[Path]:
    """Stream directories under ``root`` (a FileMonitor run holds its streams in
    traces/KIND/SUBSET), breadth first, giving up after ``_SEARCH_DIRS`` directories."""
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
                    stream = any(is_stream_file(n) for n in os.listdir(path))
                except OSError:
                    continue
                (found if stream else deeper).append(path)
        level = deeper
    return found


def parser(*, prog: str = PROG) -> argparse.ArgumentParser:
    """The command line (``prog`` names the command in help and errors)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description="Look at a trace stream (plain or sealed chunks) from a shell. Every "
        "command only reads.",
        epilog="A stream's directory holds numbered chunks (00000.jsonl, or 00000.jsonl.zst "
        f"once sealed) and {INDEX_NAME}; a FileMonitor run keeps one per kind and subset, "
        f"in RUN/traces/KIND/SUBSET. Example: {prog} stat runs/42/traces/train/all",
    )
    commands = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    helps = {
        "cat": "print every complete record, as stored, one per line (NDJSON)",
        "stat": "count records, chunks, bytes (on disk and uncompressed) and torn tails",
        "verify": "parse every record and check the index and every sealed frame",
        "get": "print the record whose id is ID, as stored (through the index)",
    }
    for name, what in helps.items():
        command = commands.add_parser(name, help=what, description=what[0].upper() + what[1:])
        command.add_argument("directory", type=Path, metavar="DIR", help="the stream's directory")
        if name == "get":
            command.add_argument("id", metavar="ID", help='the record\'s "id" (a string)')
    return p


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """Run one command: 0 when it did its job, 1 when it could not or found a problem, 2
    for a usage error, 130 when interrupted.

    :param argv: The arguments (default: the process's).
    :param prog: The name the user typed, for help and errors (``nodewise traces``).
    """
    args = parser(prog=prog).parse_args(argv)
    root: Path = args.directory
    where = f"{prog} {args.command}"
    try:
        problem = _stream_problem(root)
        if problem is not None:
            raise CommandError(problem)
        if args.command == "get":
            return get(root, args.id, prog=prog)
        command = {"cat": cat, "stat": stat, "verify": verify}[args.command]
        return command(root)
    except (CommandError, TraceFormatError) as exc:
        print(f"{where}: {exc}", file=sys.stderr)
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly, and let nothing flush to it at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except OSError as exc:
        what = exc.strerror or str(exc)
        print(f"{where}: cannot read {exc.filename or root}: {what}", file=sys.stderr)
    except KeyboardInterrupt:
        print(f"\n{where}: interrupted", file=sys.stderr)
        return 130
    return 1


if __name__ == "__main__":
    sys.exit(main())
