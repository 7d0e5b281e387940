"""Event-loop lag probe: how late a task that asks to wake every millisecond wakes.

Put one in an orchestrator to see whether anything stalls its loop::

    async with LoopLagProbe() as probe:
        await train()
    print(probe.stats())  # lag p50 0.11 ms, p90 0.20 ms, p99 0.80 ms, max 3.10 ms (...)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from time import perf_counter, thread_time_ns
from types import TracebackType

import anyio
from anyio.abc import TaskGroup

__all__ = ["LagStats", "LoopLagProbe"]


@dataclass(frozen=True)
class LagStats:
    """Lag samples summarised, in milliseconds (no samples: zeros).

    :param count: how many samples.
    :param p50: the median.
    :param p90: the 90th percentile.
    :param p99: the 99th percentile.
    :param max: the largest.
    """

    count: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples_ms: list[float]) -> LagStats:
        """The summary of ``samples_ms`` (nearest-rank percentiles)."""
        if not samples_ms:
            return cls(0, 0.0, 0.0, 0.0, 0.0)
        ordered = sorted(samples_ms)

        def pick(q: float) -> float:
            return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

        return cls(len(ordered), pick(0.5), pick(0.9), pick(0.99), ordered[-1])

    def __str__(self) -> str:
        return (
            f"lag p50 {self.p50:.2f} ms, p90 {self.p90:.2f} ms, p99 {self.p99:.2f} ms, "
            f"max {self.max:.2f} ms ({self.count} samples)"
        )


class LoopLagProbe:
    """Samples the running loop's lag while open: ``async with LoopLagProbe() as probe``.

    A sample is how much later than asked the probe's sleep returned. ``samples`` holds them
    in ms, ``times`` the ``perf_counter()`` of each wake-up, and ``running`` the ms the
    loop's thread spent on its CPU clock since the wake-up before: a late sample whose
    thread barely ran was the loop kept off its core or waiting for the GIL, not a long
    step of its own. ``stats()`` may be read while the probe runs or after.

    :param interval: seconds between the wake-ups asked for.
    """

    def __init__(self, *, interval: float = 0.001) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        self.interval = interval
        self.samples: list[float] = []
        self.times: list[float] = []
        self.running: list[float] = []
        self._group: TaskGroup | None = None
        self._epoch = 0  # changes on pause() and resume(): a sleep spanning one is no sample
        self._paused = False
        self._sampled = anyio.Event()

    def pause(self) -> None:
        """Stop sampling (say, while the caller blocks the loop on purpose)."""
        self._paused = True
        self._epoch += 1

    def resume(self) -> None:
        """Sample again after ``pause()``."""
        self._paused = False
        self._epoch += 1

    def stats(self) -> LagStats:
        """The samples so far, summarised."""
        return LagStats.of(self.samples)

    @property
    def cpu_runs(self) -> list[float]:
        """``running``, by the name it had before 0.1.0."""
        return self.running

    async def __aenter__(self) -> LoopLagProbe:
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        started = anyio.Event()
        self._group.start_soon(self._run, started)
        await started.wait()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        assert self._group is not None
        if exc_type is None and not self._paused:
            # One more sample, so that a stall just before leaving is measured too.
            self._sampled = anyio.Event()
            await self._sampled.wait()
        self._group.cancel_scope.cancel()
        return await self._group.__aexit__(exc_type, exc, tb)

    # Hooks for subclasses that measure more at each wake-up (``bench.attribution``); each
    # runs on the loop's thread.

    def _open(self) -> None:
        """Called once before the first sleep."""

    def _note(self, lag_ms: float, now: float, *, kept: bool) -> None:
        """Called at every wake-up, ``kept`` False for one that is not a sample (paused)."""

    def _close(self) -> None:
        """Called once when sampling ends."""

    async def _run(self, started: anyio.Event) -> None:
        interval = self.interval
        samples, times, running = self.samples, self.times, self.running
        self._open()
        try:
            cpu = thread_time_ns()
            started.set()
            while True:
                epoch = self._epoch
                asked = perf_counter()
                await anyio.sleep(interval)
                now = perf_counter()
                cpu_before, cpu = cpu, thread_time_ns()
                lag = max(0.0, (now - asked - interval) * 1000.0)
                kept = epoch == self._epoch and not self._paused
                self._note(lag, now, kept=kept)
                if not kept:
                    continue
                samples.append(lag)
                times.append(now)
                running.append((cpu - cpu_before) / 1e6)
                self._sampled.set()
        finally:
            self._close()
