"""Benchmark helpers around ``monitors.lag.LoopLagProbe`` (the probe tests, benchmarks and the
load test share): the idle loop's own lag, and ``GcWatch``, which records the garbage
collections (generation, pause) that happen meanwhile, to tell a collector pause from the
work's own steps.
"""

from __future__ import annotations

import asyncio
import gc
import time
from dataclasses import dataclass, field
from typing import Any

from monitors.lag import LagStats, LoopLagProbe

__all__ = ["GcWatch", "LagStats", "LoopLagProbe", "idle_lag", "measure_idle_lag"]


async def idle_lag(duration: float, *, interval: float = 0.001) -> list[float]:
    """Lag samples (ms) of the running loop while it does nothing else for ``duration`` s."""
    async with LoopLagProbe(interval=interval) as probe:
        await asyncio.sleep(duration)
    return probe.samples


def measure_idle_lag(duration: float, *, interval: float = 0.001) -> list[float]:
    """``idle_lag`` on a fresh asyncio loop (for callers outside any loop)."""
    return asyncio.run(idle_lag(duration, interval=interval))


@dataclass
class GcWatch:
    """Context manager recording each garbage collection: (generation, pause in ms)."""

    collections: list[tuple[int, float]] = field(default_factory=list)
    _started: float = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.perf_counter()
        else:
            pause = (time.perf_counter() - self._started) * 1000.0
            self.collections.append((int(info["generation"]), pause))

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    def summary(self) -> dict[str, Any]:
        by_gen = [sum(1 for g, _ in self.collections if g == gen) for gen in range(3)]
        longest = max((p for _, p in self.collections), default=0.0)
        return {"collections_by_generation": by_gen, "longest_pause_ms": longest}
