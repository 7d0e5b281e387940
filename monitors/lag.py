"""Event-loop lag probe: how late a task that asks to wake every millisecond actually wakes.

What tests, benchmarks and the load test use to prove that logging never stalls the loop.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from time import perf_counter
from types import TracebackType

import anyio
from anyio.abc import TaskGroup

__all__ = ["LagStats", "LoopLagProbe"]


@dataclass(frozen=True)
class LagStats:
    """Lag samples summarised, in milliseconds (0 samples gives zeros)."""

    count: int
    p50: float
    p90: float
    p99: float
    max: float

    @classmethod
    def of(cls, samples_ms: list[float]) -> LagStats:
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


#: Per thread, the kernel's time spent on a core and time spent waiting on a runqueue, in ns
#: (Linux, schedstat).
_SCHEDSTAT = "/proc/thread-self/schedstat"


def _open_schedstat() -> int | None:
    try:
        fd = os.open(_SCHEDSTAT, os.O_RDONLY)
    except OSError:
        return None
    try:
        _times(fd)
    except (OSError, ValueError, IndexError):
        os.close(fd)
        return None
    return fd


def _times(fd: int) -> tuple[int, int]:
    """ns this thread has run, and ns it has waited for a core."""
    fields = os.pread(fd, 128, 0).split()
    return int(fields[0]), int(fields[1])


class LoopLagProbe:
    """An async context manager sampling loop lag every ``interval`` seconds while open.

    A sample is how much later than asked the probe's sleep returned. ``stats()`` may be read
    while running or after exit; ``samples`` holds the raw values in ms, with ``times`` (the
    ``perf_counter`` of each wake-up) for plotting lag over time.

    A late wake-up has three causes, told apart where the kernel tells (Linux schedstat):
    the loop's thread was running (a step that ran long, a garbage collection): ``cpu_runs``;
    it was ready but had no core (more runnable threads than cores): ``cpu_waits``; or it did
    neither, asleep past its time (waiting for a GIL another thread held, or woken late by
    the machine). Both lists hold, for each sample, the ms of each meanwhile; elsewhere they
    stay empty.
    """

    def __init__(self, *, interval: float = 0.001) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        self.interval = interval
        self.samples: list[float] = []
        self.times: list[float] = []
        self.cpu_waits: list[float] = []
        self.cpu_runs: list[float] = []
        self._group: TaskGroup | None = None
        self._epoch = 0  # changes on pause() and resume(): a sleep spanning one is no sample
        self._paused = False
        self._sampled = anyio.Event()

    def pause(self) -> None:
        """Stop sampling (say, while the caller builds test data on the loop on purpose)."""
        self._paused = True
        self._epoch += 1

    def resume(self) -> None:
        self._paused = False
        self._epoch += 1

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

    async def _run(self, started: anyio.Event) -> None:
        interval = self.interval
        samples, times, waits, runs = self.samples, self.times, self.cpu_waits, self.cpu_runs
        fd = _open_schedstat()  # in the loop's thread: "thread-self" is that thread
        ran, waited = (0, 0) if fd is None else _times(fd)
        started.set()
        try:
            while True:
                epoch = self._epoch
                asked = perf_counter()
                await anyio.sleep(interval)
                now = perf_counter()
                if fd is not None:
                    ran_before, waited_before = ran, waited
                    ran, waited = _times(fd)
                if epoch != self._epoch or self._paused:
                    continue
                samples.append(max(0.0, (now - asked - interval) * 1000.0))
                times.append(now)
                if fd is not None:
                    waits.append((waited - waited_before) / 1e6)
                    runs.append((ran - ran_before) / 1e6)
                self._sampled.set()
        finally:
            if fd is not None:
                os.close(fd)

    def stats(self) -> LagStats:
        return LagStats.of(self.samples)
