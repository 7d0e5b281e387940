"""Event-loop lag probe: how late a task that asks to wake every millisecond actually wakes.

What tests, benchmarks and the load test use to prove that logging never stalls the loop.
"""

from __future__ import annotations

import math
import os
import sys
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from time import perf_counter, thread_time_ns
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
#: (Linux, schedstat; only the wait is read from it, see ``_times``).
_SCHEDSTAT = "/proc/thread-self/schedstat"


def _open_checked(path: str, check: Callable[[int], object]) -> int | None:
    """``path`` opened for reading, if ``check`` can read what it needs from it; else None
    (not Linux, or a kernel without that file or field)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        check(fd)
    except (OSError, ValueError, IndexError):
        os.close(fd)
        return None
    return fd


def _open_schedstat() -> int | None:
    return _open_checked(_SCHEDSTAT, _times)


def _waited(fd: int) -> int:
    """ns this thread has waited for a core."""
    return int(os.pread(fd, 128, 0).split()[1])


def _times(fd: int) -> tuple[int, int]:
    """ns this thread has run, and ns it has waited for a core.

    The run time is the thread's CPU clock, exact to the call; schedstat's own first field
    is only brought up to date at the scheduler's next tick or switch (up to a few ms late
    for a thread that is running)."""
    waited = _waited(fd)
    return thread_time_ns(), waited


#: Per core, the time a hypervisor ran something else while the core had work (steal time,
#: the eighth number of each ``cpuN`` line), in clock ticks (Linux).
_STAT = "/proc/stat"
#: A sample at least this late (ms) reads the steal counters, so that its stall is measured;
#: between such samples they are read every ``_STEAL_EVERY`` seconds, so that what a stall
#: is compared with is recent (steal just before a sample's own wait is counted with it:
#: the kernel's tick, 10 ms, is coarser anyway). A read costs ~30 us on the loop.
_STEAL_OVER_MS = 1.0
_STEAL_EVERY = 0.02


def _some_steal(fd: int) -> None:
    if not _steal(fd):
        raise ValueError("no steal counters")


#: Per thread, its state and counters; the 39th field is the core it last ran on (Linux).
_THREAD_STAT = "/proc/thread-self/stat"


def _core(fd: int) -> int:
    """The core this thread is on (it runs: it is reading)."""
    data = os.pread(fd, 1024, 0)
    return int(data[data.rindex(b")") + 2 :].split()[36])


def _steal(fd: int) -> list[int]:
    """Each core's steal ticks so far."""
    return [
        int(line.split()[8])
        for line in os.pread(fd, 1 << 16, 0).splitlines()
        if line.startswith(b"cpu") and line[3:4].isdigit()
    ]


#: The machine's memory counters (Linux); of them, the times an allocation had to reclaim
#: or compact memory itself before it could go on ("allocstall_*", "compact_stall"): work
#: in the kernel, on the allocating thread, that no page fault count shows.
_VMSTAT = "/proc/vmstat"


def _stalls(fd: int) -> int:
    """Direct reclaims and compactions on the machine so far."""
    return sum(
        int(line.split()[1])
        for line in os.pread(fd, 1 << 16, 0).splitlines()
        if line.startswith((b"allocstall_", b"compact_stall "))
    )


def _thread_usage() -> Callable[[], tuple[float, int]] | None:
    """A reader of this thread's kernel CPU time (ms) and page faults so far, or None where
    the platform does not count them per thread (``getrusage(RUSAGE_THREAD)``, Linux)."""
    if sys.platform != "linux":
        return None
    import resource

    who = resource.RUSAGE_THREAD
    usage = resource.getrusage

    def read() -> tuple[float, int]:
        u = usage(who)
        return u.ru_stime * 1000.0, u.ru_minflt + u.ru_majflt

    return read


class LoopLagProbe:
    """An async context manager sampling loop lag every ``interval`` seconds while open.

    A sample is how much later than asked the probe's sleep returned. ``stats()`` may be read
    while running or after exit; ``samples`` holds the raw values in ms, with ``times`` (the
    ``perf_counter`` of each wake-up) for plotting lag over time.

    A late wake-up has three causes, told apart where the kernel tells (Linux schedstat, and
    the thread's CPU clock): the loop's thread was running (a step that ran long, a garbage
    collection): ``cpu_runs``;
    it was ready but had no core (more runnable threads than cores): ``cpu_waits``; or it did
    neither, asleep past its time (waiting for a GIL another thread held, or woken late by
    the machine). Both lists hold, for each sample, the ms of each meanwhile; elsewhere they
    stay empty. Of the running, ``cpu_kernel`` holds the ms the thread spent in the kernel
    (to the kernel's tick, the split of an exact total) and ``faults`` the page faults it
    took: a stall spent in the kernel faulting pages in is memory being touched afresh, not
    a long step of Python or C code (Linux; empty elsewhere). ``reclaims`` holds, read with
    the steal counters, the times any thread on the machine had to reclaim or compact memory
    itself to allocate (Linux ``/proc/vmstat``): kernel work that takes no page fault, such
    as finding room for a socket buffer when the page cache has filled memory.

    On a virtual machine a core may stand still: the hypervisor runs something else on it,
    and the thread on it neither runs nor is queued (Linux counts it as steal time).
    ``stolen`` holds, for each sample at least 1 ms late, the steal time of the core the
    loop's thread is on since the counters were last read (at most ``_STEAL_EVERY`` seconds
    before the sample), in ms and to the kernel's tick (10 ms on most machines); where the
    thread moved to another core meanwhile, the lesser of the two cores' steal; 0 for other
    samples. Where the kernel does not say which core the thread is on, the least steal of
    any core (the moments the whole machine stood still). Empty where the kernel does not
    tell. ``cores`` holds, for each sample at least 1 ms late, the cores the thread was on
    when the counters were read before and at the sample (``(-1, -1)`` where not known, or
    for other samples), so that what else saw those cores stand still can be set beside it.
    """

    def __init__(self, *, interval: float = 0.001) -> None:
        if not interval > 0:
            raise ValueError(f"interval must be positive, not {interval!r}")
        self.interval = interval
        self.samples: list[float] = []
        self.times: list[float] = []
        self.cpu_waits: list[float] = []
        self.cpu_runs: list[float] = []
        self.cpu_kernel: list[float] = []
        self.faults: list[int] = []
        self.reclaims: list[int] = []
        self.stolen: list[float] = []
        self.cores: list[tuple[int, int]] = []
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
        stolen, kernel, faults, on = self.stolen, self.cpu_kernel, self.faults, self.cores
        fd = _open_schedstat()  # in the loop's thread: "thread-self" is that thread
        ran, waited = (0, 0) if fd is None else _times(fd)
        usage = _thread_usage()  # likewise
        in_kernel, faulted = (0.0, 0) if usage is None else usage()
        stat = _open_checked(_STAT, _some_steal)
        vmstat = _open_checked(_VMSTAT, _stalls) if stat is not None else None
        stalls = 0 if vmstat is None else _stalls(vmstat)
        reclaims = self.reclaims
        tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK") if stat is not None else 0.0
        steal = [] if stat is None else _steal(stat)
        core_fd = _open_checked(_THREAD_STAT, _core) if stat is not None else None
        core = -1 if core_fd is None else _core(core_fd)
        steal_read = perf_counter()
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
                if usage is not None:
                    in_kernel_before, faulted_before = in_kernel, faulted
                    in_kernel, faulted = usage()
                lag = max(0.0, (now - asked - interval) * 1000.0)
                took = 0.0
                cores_now = (-1, -1)
                if stat is not None and (lag >= _STEAL_OVER_MS or now - steal_read >= _STEAL_EVERY):
                    steal_before, steal = steal, _steal(stat)
                    if vmstat is not None:
                        stalls_before, stalls = stalls, _stalls(vmstat)
                    steal_read = now
                    cores: Iterable[int] = range(len(steal))
                    if core_fd is not None:
                        core_before, core = core, _core(core_fd)
                        cores = {core_before, core}
                        cores_now = (core_before, core)
                    took = tick_ms * min(
                        (steal[c] - steal_before[c] for c in cores if c < len(steal)), default=0
                    )
                if epoch != self._epoch or self._paused:
                    continue
                samples.append(lag)
                times.append(now)
                if fd is not None:
                    waits.append((waited - waited_before) / 1e6)
                    runs.append((ran - ran_before) / 1e6)
                if usage is not None:
                    kernel.append(in_kernel - in_kernel_before)
                    faults.append(faulted - faulted_before)
                if stat is not None:
                    stolen.append(took if lag >= _STEAL_OVER_MS else 0.0)
                    on.append(cores_now if lag >= _STEAL_OVER_MS else (-1, -1))
                    if vmstat is not None:
                        reclaims.append(stalls - stalls_before if lag >= _STEAL_OVER_MS else 0)
                self._sampled.set()
        finally:
            if fd is not None:
                os.close(fd)
            if stat is not None:
                os.close(stat)
            if vmstat is not None:
                os.close(vmstat)
            if core_fd is not None:
                os.close(core_fd)

    def stats(self) -> LagStats:
        return LagStats.of(self.samples)
