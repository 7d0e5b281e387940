"""Record event-loop lag over time while a 60 MB episode is encoded three ways (``make docs-data``).

    python docs/record_lag.py [--bytes N] [--out docs/data/lag_trace.json]

One asyncio loop, one ``LoopLagProbe`` (a task asking to wake every 1 ms), and in turn, with a
short idle gap between them: ``orjson.dumps`` on the loop, ``orjson.dumps`` in
``asyncio.to_thread`` (orjson holds the GIL, so the loop waits all the same), and
``encoder.aiterencode`` at its default budget streaming to a sink that keeps the chunks.
Each way encodes its own freshly built copy (built before the probe starts), so no run
benefits from the UTF-8 copies orjson caches inside strings. The JSON written here is what
``docs/gen_plots.py`` draws as the "loop lag over time" plot.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script from anywhere: find encoder, monitors, bench
    sys.path.insert(0, str(ROOT))

import encoder  # noqa: E402
from monitors import LoopLagProbe  # noqa: E402
from monitors.testing.episodes import Episode, EpisodeMaker  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "lag_trace.json"
GAP = 0.25  # seconds of idle loop before, between and after the three ways


async def _on_loop(value: Any) -> None:
    orjson.dumps(value)


async def _in_thread(value: Any) -> None:
    await asyncio.to_thread(orjson.dumps, value)


async def _aiterencode(value: Any) -> None:
    chunks = [chunk async for chunk in encoder.aiterencode(value)]
    del chunks


WAYS: list[tuple[str, Callable[[Any], Awaitable[None]]]] = [
    ("orjson.dumps on the loop", _on_loop),
    ("orjson.dumps in asyncio.to_thread", _in_thread),
    (f"aiterencode (budget {encoder.DEFAULT_BUDGET * 1000:g} ms)", _aiterencode),
]


async def record(episode: Episode) -> dict[str, Any]:
    copies = [episode.to_record(fresh=True) for _ in WAYS]
    gc.collect()
    phases = []
    async with LoopLagProbe() as probe:
        t0 = time.perf_counter()
        await asyncio.sleep(GAP)
        for (name, way), value in zip(WAYS, copies, strict=True):
            start = time.perf_counter()
            await way(value)
            end = time.perf_counter()
            phases.append({"name": name, "start": start - t0, "end": end - t0})
            await asyncio.sleep(GAP)
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "orjson": orjson.__version__,
        "episode_bytes": episode.size,
        "default_budget_s": encoder.DEFAULT_BUDGET,
        "phases": phases,
        "samples": [
            [round(t - t0, 6), round(lag, 4)]
            for t, lag in zip(probe.times, probe.samples, strict=True)
            if t >= t0
        ],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python docs/record_lag.py", description=__doc__)
    parser.add_argument("--bytes", type=int, default=60_000_000, help="episode size")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    episode = EpisodeMaker(seed=0).episode(args.bytes, index=0)  # builds the bodies
    trace = asyncio.run(record(episode))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(trace) + "\n")
    for phase in trace["phases"]:
        print(f"{phase['name']}: {1000 * (phase['end'] - phase['start']):.0f} ms")
    print(f"wrote {args.out} ({len(trace['samples'])} samples)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
