"""Append deterministic records to a trace stream until killed (used by test_traces_crash.py).

``python trace_crash_writer.py DIR [CHUNK_BYTES [plain|sealed]]``: reopens the stream (mending
what an earlier kill left), prints ``open <records>`` and then, after each append returns, the
record's ``n``. With ``sealed``, full chunks are sealed in the background as they roll.
Record ``n`` is always ``record(n)``, so a reader can check every record it finds.
"""

from __future__ import annotations

import random
import sys
from typing import Any

import anyio

from monitors.traces import TraceWriter

_WORDS = ["alpha", "βeta", "漢字", "🙂", 'quo"te', "back\\slash", "new\nline", "\x00", "tab\t"]
_SIZES = [100, 2_000, 50_000, 400_000, 1_500_000, 3_000_000]


def record(n: int) -> dict[str, Any]:
    """Record ``n``: up to ~3 MB of JSON, mostly one text built from a few shared words."""
    rng = random.Random(n)
    size = rng.choice(_SIZES)
    piece = " ".join(rng.choice(_WORDS) for _ in range(16))
    return {
        "n": n,
        "size": size,
        "text": piece * max(1, size // len(piece)),
        "floats": [rng.random() for _ in range(min(size // 100, 5_000))],
        "tail": {"n": n, "end": True},
    }


async def main(directory: str, chunk_bytes: int, compress: bool) -> None:
    async with TraceWriter(directory, chunk_bytes=chunk_bytes, compress=compress) as writer:
        n = writer.records
        print(f"open {n}", flush=True)
        while True:
            await writer.append(record(n), step=n)
            print(n, flush=True)
            n += 1


if __name__ == "__main__":
    chunk_bytes = int(sys.argv[2]) if len(sys.argv) > 2 else 8 << 20
    anyio.run(main, sys.argv[1], chunk_bytes, sys.argv[3:] == ["sealed"])
