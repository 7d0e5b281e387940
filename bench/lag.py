"""The idle loop's own lag, measured the way the benchmarks measure a loop at work."""

from __future__ import annotations

import asyncio

from monitors.lag import LagStats, LoopLagProbe

__all__ = ["LagStats", "LoopLagProbe", "idle_lag", "measure_idle_lag"]


async def idle_lag(duration: float, *, interval: float = 0.001) -> list[float]:
    """Lag samples (ms) of the running loop while it does nothing else for ``duration`` s."""
    async with LoopLagProbe(interval=interval) as probe:
        await asyncio.sleep(duration)
    return probe.samples


def measure_idle_lag(duration: float, *, interval: float = 0.001) -> list[float]:
    """``idle_lag`` on a fresh asyncio loop (for callers outside any loop)."""
    return asyncio.run(idle_lag(duration, interval=interval))
