"""Event-loop lag probe for asyncio: how late a task that sleeps 1 ms wakes up.

    async with LagProbe() as probe:
        await work()
    print(probe.stats())

Each sample is (actual wake time - intended wake time) in milliseconds, taken with the loop's
own clock; the sleep is re-armed from the wake-up, so there is a sample about every
``interval`` while the loop is free and exactly one per stall while it is not. Leaving the
block waits for one more sample, so a stall at the very end of the work is counted too.

``GcWatch`` records the garbage collections (generation, pause) that happen meanwhile, to tell
a collector pause from the work's own steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import time
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

__all__ = ["GcWatch", "LagProbe", "LagStats", "idle_lag", "measure_idle_lag"]


@dataclass(frozen=True)
class LagStats:
    """Summary of lag samples, in milliseconds."""

    count: int
    p50: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples: list[float]) -> LagStats:
        if not samples:
            return cls(0, float("nan"), float("nan"), float("nan"))
        s = sorted(samples)
        return cls(len(s), _quantile(s, 0.50), _quantile(s, 0.99), s[-1])


def _quantile(ordered: list[float], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default) of sorted samples."""
    pos = q * (len(ordered) - 1)
    lo = int(pos)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


class LagProbe:
    """Async context manager running a task that sleeps ``interval`` seconds in a loop and
    records how late each wake-up is. Samples accumulate across uses of the same probe."""

    def __init__(self, interval: float = 0.001) -> None:
        self.interval = interval
        self.samples: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._sampled: asyncio.Event | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        clock = loop.time
        interval = self.interval
        record = self.samples.append
        sampled = self._sampled
        assert sampled is not None
        while True:
            intended = clock() + interval
            await asyncio.sleep(interval)
            record((clock() - intended) * 1000.0)
            sampled.set()

    async def __aenter__(self) -> LagProbe:
        self._sampled = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._run())
        await asyncio.sleep(0)  # let the probe arm its first sleep before the work starts
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        task, self._task = self._task, None
        if task is not None:
            if exc_type is None and self._sampled is not None:
                self._sampled.clear()
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(self._sampled.wait(), 10 * self.interval + 0.05)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def stats(self) -> LagStats:
        return LagStats.of(self.samples)


async def idle_lag(duration: float, *, interval: float = 0.001) -> list[float]:
    """Lag samples (ms) of the running loop while it does nothing else for ``duration`` s."""
    async with LagProbe(interval) as probe:
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
