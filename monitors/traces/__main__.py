"""``python -m monitors.traces cat|stat|verify DIR`` and ``get DIR ID``: look at a trace
stream (plain or sealed chunks) from a shell."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

import ijson

from ..errors import TraceFormatError
from ._layout import INDEX_NAME, ROW_BYTES, chunk_path, decode_row, list_chunks, scan, sealed_path
from ._reader import chunk_name, find_row, iter_spans, parse_span
from ._sealed import DamagedFrame, SealedChunk, chunk_size, open_chunk

_BLOCK = 1 << 20


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
        try:
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
        except BrokenPipeError:
            sys.stderr.close()  # e.g. `| head`: stop quietly
            return 0
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
    by counting lines (sealed chunks are decompressed to count them)."""
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
    index = root / INDEX_NAME
    rows = index.stat().st_size // ROW_BYTES if index.exists() else 0
    sealed = len(set(listing.sealed) - set(listing.plain))
    ratio = f"{sealed_in / sealed_bytes:.2f}x" if sealed_bytes else "-"
    print(f"directory     {root}")
    print(f"records       {records}")
    print(f"index rows    {rows}")
    print(f"chunks        {len(listing.chunks)} ({sealed} sealed)")
    print(f"plain bytes   {plain_bytes}")
    print(f"sealed bytes  {sealed_bytes} (holding {sealed_in} bytes: {ratio})")
    print(f"bytes         {plain_bytes + sealed_in} uncompressed")
    print(f"torn tails    {torn}")
    print(f"damaged       {damaged} (frames or chunks)")
    return 1 if damaged else 0


def verify(root: Path) -> int:
    """Parse every record, check that the index points at each of them, and that every
    frame of every sealed chunk is whole."""
    problems: list[str] = []
    index = root / INDEX_NAME
    rows = index.stat().st_size // ROW_BYTES if index.exists() else 0
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
    with open(index, "rb") as idx, ExitStack() as stack:
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
                if n < rows:
                    idx.seek(n * ROW_BYTES)
                    row = decode_row(idx.read(ROW_BYTES))
                    if (row.chunk, row.offset, row.length) != (
                        span.chunk,
                        span.offset,
                        span.length + 1,
                    ):
                        problems.append(
                            f"index row {n} is {row}, the record is at {span.chunk}:{span.offset}"
                        )
                n += 1
                done += span.length + 1
                progress.update(done)
    if rows != n:
        problems.append(f"{n} records but {rows} index rows")
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{n} records verified, {len(problems)} problems")
    return 1 if problems else 0


def get(root: Path, record_id: str) -> int:
    """The record whose ``"id"`` is ``record_id``, as stored (one line), to stdout; only the
    frames it spans are decompressed."""
    try:
        n, row = find_row(root, record_id)
    except KeyError:
        print(f"no record with id {record_id!r} in {root}", file=sys.stderr)
        return 1
    out = sys.stdout.buffer
    try:
        with open_chunk(root, row.chunk) as f:
            _copy_range(f, out, row.offset, row.length)
    except DamagedFrame as exc:
        raise TraceFormatError(
            f"record {n}: {exc}", chunk=sealed_path(root, row.chunk).name, offset=row.offset
        ) from exc
    except BrokenPipeError:
        sys.stderr.close()
        return 0
    out.flush()
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitors.traces", description=__doc__)
    parser.add_argument("command", choices=["cat", "stat", "verify", "get"])
    parser.add_argument("directory", type=Path)
    parser.add_argument("id", nargs="?", help="get: the record's id")
    args = parser.parse_args(argv)
    root: Path = args.directory
    if not root.is_dir():
        parser.error(f"{root} is not a directory")
    if (args.command == "get") != (args.id is not None):
        parser.error("an ID goes with get, and only with get")
    try:
        if args.command == "get":
            return get(root, args.id)
        command = {"cat": cat, "stat": stat, "verify": verify}[args.command]
        return command(root)
    except TraceFormatError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
