"""Benchmark of ``monitors.FileMonitor`` against what an orchestrator does today.

    python -m bench.file_monitor [--episodes N] [--quick]

Both sides log the same production-sized episodes (production's lognormal sizes), one
``log`` call per episode, while a probe samples the event loop every 1 ms:

- ours: ``FileMonitor.log_episodes`` (cooperative encoding on the loop, writes in a thread);
- ``WandbMonitor.log_episodes`` in wandb's offline mode (a temporary ``WANDB_DIR``): the same
  trace writer inside the run's files directory, plus handing sealed chunks to W&B (when
  wandb is installed: ``pip install 'nodewise[wandb]'``);
- baseline: ``orjson.dumps`` then ``write`` in ``asyncio.to_thread`` (orjson holds the GIL,
  so the loop stalls for the whole encode of each episode).

Every episode is built fresh before it is logged (outside the timed region) so that neither
side benefits from the UTF-8 copies orjson caches inside strings it has encoded before.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from monitors import FileMonitor, LagStats, LoopLagProbe, Monitor, WandbMonitor
from monitors.testing import wandb_offline_env
from monitors.testing.episodes import lognormal_sizes

from .baselines import OrjsonFileBaseline
from .documents import episode_maker, fresh_episode

MB = 1_000_000


@dataclass
class Run:
    name: str
    episodes: int
    nbytes: int
    seconds: float  # inside log calls, summed
    slowest: float
    lag: LagStats

    @property
    def mbps(self) -> float:
        return self.nbytes / MB / self.seconds


async def _drive(name: str, monitor: Monitor, sizes: list[int]) -> Run:
    """Log a fresh episode of each size, one ``log_episodes`` call each, timing the calls
    and probing the loop while they run (not while the next episode is built)."""
    nbytes = 0
    busy = 0.0
    slowest = 0.0
    async with monitor, LoopLagProbe() as probe:
        for i, size in enumerate(sizes):
            probe.pause()
            episode = fresh_episode(size, index=i)
            gc.collect()
            probe.resume()
            await asyncio.sleep(0.002)  # let the probe take a sample between episodes
            t0 = time.perf_counter()
            await monitor.log_episodes([episode], step=0, subset="all")
            spent = time.perf_counter() - t0
            busy += spent
            slowest = max(slowest, spent)
            nbytes += size
            del episode
    assert monitor.stats().delivered == len(sizes), monitor.stats()
    return Run(name, len(sizes), nbytes, busy, slowest, probe.stats())


async def run_ours(sizes: list[int], root: Path) -> Run:
    return await _drive("FileMonitor", FileMonitor(root / "ours"), sizes)


async def run_wandb(sizes: list[int], root: Path) -> Run:
    # Everything wandb writes (run, logs, cache) goes under root, removed at the end.
    for name, value in wandb_offline_env(root / "wandb-home").items():
        os.environ.setdefault(name, value)
    monitor = WandbMonitor(project="nodewise-bench", mode="offline", dir=root / "wandb")
    return await _drive("WandbMonitor (offline)", monitor, sizes)


async def run_baseline(sizes: list[int], root: Path) -> Run:
    return await _drive("orjson + write in to_thread", OrjsonFileBaseline(root / "baseline"), sizes)


def table(runs: list[Run], base: Run) -> str:
    head = (
        "| monitor | episodes | MB | MB/s | vs baseline | slowest log (ms) | lag p50 | lag p99 "
        "| lag max |"
    )
    rule = "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
    rows = [
        f"| {r.name} | {r.episodes} | {r.nbytes / MB:.0f} | {r.mbps:.0f} | "
        f"{r.mbps / base.mbps:.2f}x | {r.slowest * 1e3:.1f} | {r.lag.p50:.2f} | "
        f"{r.lag.p99:.2f} | {r.lag.max:.2f} |"
        for r in runs
    ]
    return "\n".join([head, rule, *rows])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.file_monitor")
    parser.add_argument("--episodes", type=int, default=100)
    parser.add_argument("--quick", action="store_true", help="20 episodes")
    args = parser.parse_args(argv)
    n = 20 if args.quick else args.episodes
    sizes = lognormal_sizes(n, seed=0)
    for i, size in enumerate(sizes):  # build the episodes' bodies outside the measurement
        episode_maker().episode(size, index=i)
    root = Path(tempfile.mkdtemp(prefix="nodewise-bench-"))
    try:
        ours = asyncio.run(run_ours(sizes, root))
        runs = [ours]
        if importlib.util.find_spec("wandb") is not None:
            runs.append(asyncio.run(run_wandb(sizes, root)))
        base = asyncio.run(run_baseline(sizes, root))
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"file monitor: {n} production-sized episodes (lognormal, median 6.4 MB, cap 60 MB)")
    print()
    print(table([*runs, base], base))
    if len(runs) == 1:
        print("(no WandbMonitor row: wandb is not installed)")
    print()
    print(
        "MB/s = JSON bytes / time spent inside the log calls; lag = a task asking to wake "
        "every 1 ms, sampled only while episodes are logged (not while the next one is built)."
    )
    met = ours.mbps >= 0.8 * base.mbps and ours.lag.p99 <= 5
    print(f"target (>= 0.8x baseline throughput, lag p99 <= 5 ms): {'met' if met else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
