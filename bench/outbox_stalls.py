"""Where the loop was when it stalled while a FileMonitor and an outbox PrimeMonitor share it.

    python -m bench.outbox_stalls [--episodes N]

N production-sized episodes (default 120; lognormal sizes, seed 0) are built first, collected
and frozen out of the garbage collector's way (a driver's own heap, not the monitors'), then
logged one at a time to ``FileMonitor(run)`` and ``PrimeMonitor(outbox=run)`` uploading to a
local ``TracesServer`` (its own process, at nice +10), under ``bench.stalls``' sampler, up to
both ``finalize``. Each stall of the loop over 8 ms is reported with its cause (a step of
ours on the loop's CPU clock, the loop blocked off the CPU, or neither thread running) and
the loop's stack. The run's own numbers are ``bench.prime_monitor``'s; this is for attribution.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from monitors import FileMonitor, PrimeMonitor
from monitors.loadtest._measure import lower_priority
from monitors.testing import TracesServer
from monitors.testing.episodes import lognormal_sizes

from .documents import fresh_episode
from .stalls import StallSampler, summary

KEY = "bench-key"
ROOT = Path(__file__).resolve().parents[1]
#: Episodes written and not yet taken by the outbox before the driver waits.
AHEAD = 2


async def run(episodes: int) -> str:
    """The report of one run of ``episodes`` episodes."""
    sizes = lognormal_sizes(episodes, seed=0)
    values = [fresh_episode(size, index=i) for i, size in enumerate(sizes)]
    gc.collect()
    gc.freeze()
    (ROOT / "build").mkdir(exist_ok=True)
    directory = Path(tempfile.mkdtemp(prefix="bench-outbox-stalls-", dir=ROOT / "build"))
    try:
        async with TracesServer(api_key=KEY) as server:
            lower_priority(server.pid, 10)
            files = FileMonitor(directory)
            prime = PrimeMonitor(
                api_key=KEY,
                traces_url=server.url,
                base_url=server.url,
                run_id="bench",
                outbox=directory,
                drain_timeout=600,
            )
            await files.start()
            await prime.start()
            started = time.perf_counter()
            async with StallSampler() as sampler:
                for i, value in enumerate(values):
                    await files.log_episodes([value], step=i // 4, subset="all")
                    await prime.log_episodes([value], step=i // 4, subset="all")
                    while i + 1 - prime.stats().submitted >= AHEAD:
                        await asyncio.sleep(0.001)
                await prime.finalize()
                await files.finalize()
            seconds = time.perf_counter() - started
    finally:
        shutil.rmtree(directory, ignore_errors=True)
        gc.unfreeze()
    head = (
        f"{episodes} episodes ({sum(sizes) / 1e9:.2f} GB) through FileMonitor and "
        f"PrimeMonitor(outbox) in {seconds:.1f} s: {prime.stats()}"
    )
    return head + "\n" + summary([("the outbox run", s) for s in sampler.stalls], longest=12)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.outbox_stalls", description=__doc__)
    p.add_argument("--episodes", type=int, default=120)
    args = p.parse_args(argv)
    print(asyncio.run(run(args.episodes)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
