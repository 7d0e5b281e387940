"""Random access through a stream's index on a run of 100,000 episodes (``make bench``).

    python -m bench.index [--rows N] [--lookups K]

Writes an index of ``N`` rows as FileMonitor writes them (prime-rl's ``index_row`` fields of
EpisodeMaker records, variable width) beside an empty stream directory, then times ``K``
lookups of random rows by number (``read_row``: bisection over the index's bytes) and by id
(``find_row``: a search of the bytes for the row's ``"id":...,``), and the readers that
list the run (the whole index parsed, and counted). Prints one Markdown table; nothing
here asserts on time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from pathlib import Path

from monitors.testing import EpisodeMaker
from monitors.traces import find_row, read_row
from monitors.traces._index import count_rows, iter_rows
from monitors.traces._layout import encode_row, index_path
from monitors.traces._summary import episode_row


def build(directory: Path, rows: int) -> list[str]:
    """An index of ``rows`` rows beside ``directory``; returns the ids, in order."""
    maker = EpisodeMaker(seed=1)
    templates = [episode_row(maker.episode(50_000, index=i).to_record()) for i in range(64)]
    directory.mkdir(parents=True)
    ids = []
    offset = chunk = 0
    with open(index_path(directory), "wb") as f:
        for n in range(rows):
            fields = dict(templates[n % len(templates)])
            fields["id"] = f"{n:08x}{random.getrandbits(96):024x}"
            length = 1_000_000 + n % 7_000_000
            if offset + length > 5 << 30:
                chunk, offset = chunk + 1, 0
            fields.update(line=n + 1, offset=offset, chunk=chunk, length=length, step=n // 1000)
            offset += length
            ids.append(fields["id"])
            f.write(encode_row(fields))
    return ids


def timed(calls: list[tuple[object, ...]], fn: object) -> list[float]:
    spent = []
    for args in calls:
        start = time.perf_counter()
        fn(*args)  # type: ignore[operator]
        spent.append(time.perf_counter() - start)
    return spent


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=100_000)
    ap.add_argument("--lookups", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        stream = Path(tmp, "traces", "stream")
        ids = build(stream, args.rows)
        size = index_path(stream).stat().st_size
        rng = random.Random(7)
        picks = [rng.randrange(args.rows) for _ in range(args.lookups)]
        by_line = timed([(stream, n) for n in picks], read_row)
        by_id = timed([(stream, ids[n]) for n in picks], find_row)
        for n in picks[:20]:  # the lookups found the right rows
            assert read_row(stream, n).line == n + 1
            assert find_row(stream, ids[n])[0] == n
        start = time.perf_counter()
        parsed = sum(1 for _ in iter_rows(index_path(stream)))
        parse_all = time.perf_counter() - start
        start = time.perf_counter()
        counted = count_rows(index_path(stream))
        count_all = time.perf_counter() - start
        assert parsed == counted == args.rows

    def ms(values: list[float], q: float) -> str:
        return f"{statistics.quantiles(values, n=100)[int(q) - 1] * 1e3:.3f}"

    print(
        f"Index of {args.rows:,} rows ({size / 2**20:.1f} MiB, {size / args.rows:.0f} B/row), "
        f"{args.lookups} random lookups each\n"
    )
    print("| access | median ms | p99 ms | max ms |")
    print("| --- | ---: | ---: | ---: |")
    for name, values in (
        ("row by number (`read_row`)", by_line),
        ("row by id (`find_row`)", by_id),
    ):
        print(
            f"| {name} | {statistics.median(values) * 1e3:.3f} | {ms(values, 99)} | "
            f"{max(values) * 1e3:.3f} |"
        )
    print(f"| every row parsed (`iter_rows`) | {parse_all * 1e3:.1f} | | |")
    print(f"| rows counted (`count_rows`) | {count_all * 1e3:.1f} | | |")


if __name__ == "__main__":
    main()
