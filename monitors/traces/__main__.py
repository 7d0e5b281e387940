"""``python -m monitors.traces cat|stat|verify DIR``: look at a trace stream from a shell."""

from __future__ import annotations

import argparse
import sys
import time
from contextlib import ExitStack
from pathlib import Path
from typing import BinaryIO

from ..errors import TraceFormatError
from ._layout import INDEX_NAME, ROW_BYTES, chunk_path, decode_row, list_chunks
from ._reader import TraceReader, iter_spans

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
    return sum(chunk_path(root, c).stat().st_size for c in list_chunks(root))


def _copy_range(src: BinaryIO, out: BinaryIO, offset: int, length: int) -> None:
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
    files: dict[int, BinaryIO] = {}
    with ExitStack() as stack:
        stack.callback(progress.close)
        try:
            for span in iter_spans(root):
                if not span.complete:
                    break
                if span.data is not None:
                    out.write(span.data + b"\n")
                    done += span.length + 1
                    progress.update(done)
                    continue
                if span.chunk not in files:
                    files[span.chunk] = stack.enter_context(
                        open(chunk_path(root, span.chunk), "rb")
                    )
                _copy_range(files[span.chunk], out, span.offset, span.length)
                out.write(b"\n")
                done += span.length + 1
                progress.update(done)
        except BrokenPipeError:
            sys.stderr.close()  # e.g. `| head`: stop quietly
            return 0
    out.flush()
    return 0


def stat(root: Path) -> int:
    """Records, chunks, bytes and torn tails, by counting lines."""
    chunks = list_chunks(root)
    records = 0
    torn = 0
    total = 0
    for chunk in chunks:
        path = chunk_path(root, chunk)
        size = path.stat().st_size
        total += size
        last = b""
        with open(path, "rb") as f:
            while block := f.read(_BLOCK):
                records += block.count(b"\n")
                last = block
        if size and not last.endswith(b"\n"):
            torn += 1
    index = root / INDEX_NAME
    rows = index.stat().st_size // ROW_BYTES if index.exists() else 0
    print(f"directory   {root}")
    print(f"records     {records}")
    print(f"index rows  {rows}")
    print(f"chunks      {len(chunks)}")
    print(f"bytes       {total}")
    print(f"torn tails  {torn}")
    return 0


def verify(root: Path) -> int:
    """Parse every record and check that the index points at each of them."""
    reader = TraceReader(root)
    progress = Progress(_stream_bytes(root), "verify")
    problems: list[str] = []
    index = root / INDEX_NAME
    rows = index.stat().st_size // ROW_BYTES if index.exists() else 0
    spans = iter_spans(root)
    n = 0
    done = 0
    try:
        with open(index, "rb") as idx:
            for _record in reader:
                span = next(spans)
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
    except TraceFormatError as exc:
        problems.append(str(exc))
    finally:
        progress.close()
    if rows != n:
        problems.append(f"{n} records but {rows} index rows")
    if reader.torn_tail_bytes:
        problems.append(f"a torn last line of {reader.torn_tail_bytes} bytes (not a record)")
    for problem in problems:
        print(f"problem: {problem}")
    print(f"{n} records verified, {len(problems)} problems")
    return 1 if problems else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m monitors.traces", description=__doc__)
    parser.add_argument("command", choices=["cat", "stat", "verify"])
    parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    root: Path = args.directory
    if not root.is_dir():
        parser.error(f"{root} is not a directory")
    command = {"cat": cat, "stat": stat, "verify": verify}[args.command]
    return command(root)


if __name__ == "__main__":
    sys.exit(main())
