"""Where a load test's loop lag came from: the loop's own work, or the machine.

The benchmarks' ``Instrument`` for ``monitors.loadtest.run_loadtest`` (``Attribution``): each
run gets an ``AttributedProbe``, which reads at every late wake-up what the kernel says the
loop's thread did meanwhile (Linux: schedstat, the thread's CPU clock and page faults, the
steal time of its core, the machine's direct reclaims), and a witness process on every core
(``bench.witness``), which notes when its core stood still whatever the loop did. From those
each run's ``RunAttribution`` splits lag into waiting for a core, running, stolen and
neither, and takes off each sample the machine's share: what is left is the loop's own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Callable, Iterable
from dataclasses import dataclass, field
from time import perf_counter
from typing import Any

import anyio

from monitors.lag import LagStats, LoopLagProbe
from monitors.loadtest import LoadtestReport, RunResult

from .witness import Stall, Witnesses, core_ms, machine_ms, witnesses

__all__ = [
    "NET",
    "AttributedProbe",
    "Attribution",
    "RunAttribution",
    "lag_causes",
]

log = logging.getLogger("bench.attribution")

#: Per thread, time on a core and time waiting on a runqueue, in ns (Linux schedstat).
_SCHEDSTAT = "/proc/thread-self/schedstat"
#: Per core, the time a hypervisor ran something else while the core had work (steal, the
#: eighth number of each ``cpuN`` line), in clock ticks (Linux).
_STAT = "/proc/stat"
#: Per thread, its state and counters; the 39th field is the core it last ran on (Linux).
_THREAD_STAT = "/proc/thread-self/stat"
#: The machine's memory counters; of them, the times an allocation had to reclaim or
#: compact memory itself ("allocstall_*", "compact_stall"): kernel work no fault shows.
_VMSTAT = "/proc/vmstat"
#: A sample at least this late (ms) reads the steal counters; between such samples they
#: are read every ``_STEAL_EVERY`` s so that a stall is compared with recent counts (a read
#: costs ~30 us on the loop).
_STEAL_OVER_MS = 1.0
_STEAL_EVERY = 0.02
#: What ``RunAttribution.lag_net`` leaves out, as the reports say it.
NET = (
    "net of the moments the loop's core stood still (taken off each sample: the larger of "
    "the hypervisor's steal on the core the loop's thread was on and the time a witness "
    "process on that core woke late)"
)


def _open_checked(path: str, check: Callable[[int], object]) -> int | None:
    """``path`` opened for reading if ``check`` can read what it needs from it; else None
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


def _waited(fd: int) -> int:
    """ns this thread has waited for a core."""
    return int(os.pread(fd, 128, 0).split()[1])


def _core(fd: int) -> int:
    """The core this thread is on (it runs: it is reading)."""
    data = os.pread(fd, 1024, 0)
    return int(data[data.rindex(b")") + 2 :].split()[36])


def steal(fd: int) -> list[int]:
    """Each core's steal ticks so far, from an open ``/proc/stat``."""
    return [
        int(line.split()[8])
        for line in os.pread(fd, 1 << 16, 0).splitlines()
        if line.startswith(b"cpu") and line[3:4].isdigit()
    ]


def _some_steal(fd: int) -> None:
    if not steal(fd):
        raise ValueError("no steal counters")


def _stalls(fd: int) -> int:
    """Direct reclaims and compactions on the machine so far."""
    return sum(
        int(line.split()[1])
        for line in os.pread(fd, 1 << 16, 0).splitlines()
        if line.startswith((b"allocstall_", b"compact_stall "))
    )


def _thread_usage() -> Callable[[], tuple[float, int]] | None:
    """A reader of this thread's kernel CPU time (ms) and page faults so far, or None where
    the platform does not count them per thread."""
    if sys.platform != "linux":
        return None
    import resource

    who, usage = resource.RUSAGE_THREAD, resource.getrusage

    def read() -> tuple[float, int]:
        u = usage(who)
        return u.ru_stime * 1000.0, u.ru_minflt + u.ru_majflt

    return read


class AttributedProbe(LoopLagProbe):
    """A ``LoopLagProbe`` that also says, per sample, what the loop's thread did meanwhile.

    Where the kernel tells (each list stays empty elsewhere): ``cpu_waits``, the ms it was
    ready but had no core; ``cpu_kernel`` and ``faults``, of its running, the ms in the
    kernel and the page faults taken; and for samples at least 1 ms late (0 or ``(-1, -1)``
    for others) ``stolen``, the steal time of the core it was on, to the kernel's tick (where
    it moved, the lesser of the two cores'; where the core is unknown, the least of any);
    ``cores``, the cores it was on when the counters were read before and at the sample;
    ``reclaims``, the machine's direct reclaims and compactions meanwhile.
    """

    def __init__(self, *, interval: float = 0.001) -> None:
        super().__init__(interval=interval)
        self.cpu_waits: list[float] = []
        self.cpu_kernel: list[float] = []
        self.faults: list[int] = []
        self.reclaims: list[int] = []
        self.stolen: list[float] = []
        self.cores: list[tuple[int, int]] = []

    def _open(self) -> None:
        # In the loop's thread: "thread-self" is that thread.
        self._schedstat = _open_checked(_SCHEDSTAT, _waited)
        self._waited = 0 if self._schedstat is None else _waited(self._schedstat)
        self._usage = _thread_usage()
        self._in_kernel, self._faulted = (0.0, 0) if self._usage is None else self._usage()
        self._stat = _open_checked(_STAT, _some_steal)
        self._vmstat = _open_checked(_VMSTAT, _stalls) if self._stat is not None else None
        self._reclaimed = 0 if self._vmstat is None else _stalls(self._vmstat)
        self._tick_ms = 1000.0 / os.sysconf("SC_CLK_TCK") if self._stat is not None else 0.0
        self._steal = [] if self._stat is None else steal(self._stat)
        self._core_fd = _open_checked(_THREAD_STAT, _core) if self._stat is not None else None
        self._core = -1 if self._core_fd is None else _core(self._core_fd)
        self._steal_read = perf_counter()

    def _note(self, lag_ms: float, now: float, *, kept: bool) -> None:
        if self._schedstat is not None:
            waited_before, self._waited = self._waited, _waited(self._schedstat)
        if self._usage is not None:
            kernel_before, faulted_before = self._in_kernel, self._faulted
            self._in_kernel, self._faulted = self._usage()
        took, on, reclaims = 0.0, (-1, -1), 0
        if self._stat is not None and (
            lag_ms >= _STEAL_OVER_MS or now - self._steal_read >= _STEAL_EVERY
        ):
            steal_before, self._steal = self._steal, steal(self._stat)
            if self._vmstat is not None:
                reclaimed_before, self._reclaimed = self._reclaimed, _stalls(self._vmstat)
                reclaims = self._reclaimed - reclaimed_before
            self._steal_read = now
            cores: Iterable[int] = range(len(self._steal))
            if self._core_fd is not None:
                core_before, self._core = self._core, _core(self._core_fd)
                cores = {core_before, self._core}
                on = (core_before, self._core)
            took = self._tick_ms * min(
                (self._steal[c] - steal_before[c] for c in cores if c < len(self._steal)),
                default=0,
            )
        if not kept:
            return
        late = lag_ms >= _STEAL_OVER_MS
        if self._schedstat is not None:
            self.cpu_waits.append((self._waited - waited_before) / 1e6)
        if self._usage is not None:
            self.cpu_kernel.append(self._in_kernel - kernel_before)
            self.faults.append(self._faulted - faulted_before)
        if self._stat is not None:
            self.stolen.append(took if late else 0.0)
            self.cores.append(on if late else (-1, -1))
            if self._vmstat is not None:
                self.reclaims.append(reclaims if late else 0)

    def _close(self) -> None:
        for fd in (self._schedstat, self._stat, self._vmstat, self._core_fd):
            if fd is not None:
                os.close(fd)


@dataclass
class RunAttribution:
    """One run's lag samples with what the kernel and the witnesses said of each (ms)."""

    samples: list[float]
    #: Seconds from ``started_at`` (a ``perf_counter()``: one clock for every process).
    times: list[float]
    started_at: float = 0.0
    waits: list[float] = field(default_factory=list)
    runs: list[float] = field(default_factory=list)
    kernel: list[float] = field(default_factory=list)
    faults: list[int] = field(default_factory=list)
    reclaims: list[int] = field(default_factory=list)
    stolen: list[float] = field(default_factory=list)
    cores: list[tuple[int, int]] = field(default_factory=list)
    #: The witnesses' cores and, per witness, the moments it stood still.
    witness_cores: list[int] = field(default_factory=list)
    witness_stalls: list[list[Stall]] = field(default_factory=list)

    def parts(self) -> list[tuple[float, float, float, float]] | None:
        """Per sample: lag, and of it the ms waiting, running and stolen. Stolen counts
        first (the kernel counts a wait for a stolen core as waiting), then waiting, then
        running, up to the lag. None where the kernel does not tell."""
        n = len(self.samples)
        if not n or len(self.waits) != n or len(self.runs) != n:
            return None
        stolen = self.stolen if len(self.stolen) == n else [0.0] * n
        out = []
        for lag, wait, run, took in zip(self.samples, self.waits, self.runs, stolen, strict=True):
            took = min(took, lag)
            wait = min(wait, lag - took)
            out.append((lag, wait, min(run, lag - took - wait), took))
        return out

    def cpu_wait(self, over_ms: float = 5.0) -> dict[str, float] | None:
        """Of the samples over ``over_ms``: how many, and the share of their lag the loop's
        thread spent waiting for a core (``share``), running (``running_share``) and stopped
        with its core (``stolen_share``); the rest it was asleep past its time. The same for
        the worst sample, with what the kernel and the witnesses said of it where they
        tell. None where the kernel does not tell."""
        parts = self.parts()
        if parts is None:
            return None
        slow = [p for p in parts if p[0] > over_ms]
        lag_sum = sum(p[0] for p in slow)
        at = max(range(len(parts)), key=lambda i: parts[i][0])
        worst = parts[at]

        def share(k: int) -> float:
            return sum(p[k] for p in slow) / lag_sum if lag_sum else 0.0

        causes: dict[str, float] = {
            "over_ms": over_ms,
            "samples": len(slow),
            "share": share(1),
            "running_share": share(2),
            "stolen_share": share(3),
            "worst_lag_ms": worst[0],
            "worst_wait_ms": worst[1],
            "worst_running_ms": worst[2],
            "worst_stolen_ms": worst[3],
        }
        if len(self.kernel) == len(self.faults) == len(parts):
            causes["worst_kernel_ms"] = min(self.kernel[at], worst[2])
            causes["worst_faults"] = self.faults[at]
        if len(self.reclaims) == len(parts):
            causes["worst_reclaims"] = self.reclaims[at]
        if self.witness_stalls:
            causes["worst_witnessed_ms"] = self.witnessed()[at]
        return causes

    def witnessed(self) -> list[float]:
        """Per sample, the ms of its lateness during which the witness on the loop's core
        stood still too (all zeros without witnesses)."""
        n = len(self.samples)
        if not self.witness_stalls:
            return [0.0] * n
        seen = Witnesses(cores=self.witness_cores, stalls=self.witness_stalls)
        cores = self.cores if len(self.cores) == n else [(-1, -1)] * n
        times = [self.started_at + t for t in self.times]
        return core_ms(times, self.samples, cores, seen)

    def _net(self, witnessed: list[float]) -> list[float]:
        n = len(self.samples)
        stolen = self.stolen if len(self.stolen) == n else [0.0] * n
        return [
            lag - min(lag, max(took, seen))
            for lag, took, seen in zip(self.samples, stolen, witnessed, strict=True)
        ]

    def lag_net(self) -> LagStats:
        """Lag with each sample's share of the machine's stalls taken off: the larger of the
        steal on the loop's core and the time that core's witness stood still."""
        return LagStats.of(self._net(self.witnessed()))

    def worst_net(self) -> dict[str, float] | None:
        """The sample with the most lag left net of the machine's stalls: when (s into the
        run), its lag and what is left, and what the kernel and the witnesses said of it."""
        witnessed = self.witnessed()
        net = self._net(witnessed)
        if not net:
            return None
        at = max(range(len(net)), key=net.__getitem__)
        lag = self.samples[at]
        worst = {"at_s": self.times[at], "lag_ms": lag, "net_ms": net[at]}
        parts = self.parts()
        if parts is not None:
            _, worst["wait_ms"], worst["running_ms"], worst["stolen_ms"] = parts[at]
        if self.witness_stalls:
            worst["witnessed_ms"] = witnessed[at]
            t = self.started_at + self.times[at]
            worst["any_witness_ms"] = machine_ms([t], [lag], self.witness_stalls)[0]
        return worst

    def to_dict(self) -> dict[str, Any]:
        net = self.lag_net()
        return {
            "lag_cpu_wait": self.cpu_wait(),
            "lag_net_ms": {"p99": net.p99, "max": net.max},
            "lag_net_worst": self.worst_net(),
            "witness_stalls": {
                "cores": list(self.witness_cores),
                "count": [len(s) for s in self.witness_stalls],
                "longest_ms": [
                    max(((now - due) * 1e3 for due, now in s), default=0.0)
                    for s in self.witness_stalls
                ],
            },
        }


class Attribution:
    """The ``Instrument``: an ``AttributedProbe`` and witnesses on every core for each run;
    ``runs`` holds each run's ``RunAttribution`` by its key, and its summary goes into the
    run's JSON (``RunResult.details``)."""

    def __init__(self, *, use_witnesses: bool = True) -> None:
        self.use_witnesses = use_witnesses
        self.runs: dict[str, RunAttribution] = {}
        self._seen: dict[str, Witnesses] = {}

    @contextlib.asynccontextmanager
    async def watch(self, result: RunResult, interval: float) -> AsyncIterator[LoopLagProbe]:
        async with (
            self._witnessed(result.run, result.name),
            AttributedProbe(interval=interval) as probe,
        ):
            yield probe

    @contextlib.asynccontextmanager
    async def _witnessed(self, run: str, name: str) -> AsyncIterator[None]:
        """Witnesses while the block runs, started and stopped in a worker thread (each
        takes a few to tens of ms); a run goes on without them where they cannot start."""
        if not self.use_witnesses:
            yield
            return
        cm = witnesses()
        try:
            seen = await anyio.to_thread.run_sync(cm.__enter__)
        except (OSError, RuntimeError) as exc:
            log.warning("%s: no witness processes (%s); lag is net of steal only", name, exc)
            yield
            return
        try:
            yield
        finally:
            with anyio.CancelScope(shield=True):
                try:
                    await anyio.to_thread.run_sync(cm.__exit__, None, None, None)
                except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                    log.warning("%s: the witness processes failed (%s)", name, exc)
                else:
                    self._seen[run] = seen

    def finished(self, result: RunResult, probe: LoopLagProbe) -> None:
        assert isinstance(probe, AttributedProbe)
        first = len(probe.samples) - len(result.lag_samples)  # the run's are the last ones
        att = RunAttribution(
            samples=result.lag_samples,
            times=result.lag_times,
            started_at=result.started_at,
            waits=probe.cpu_waits[first:],
            runs=result.lag_running,
            kernel=probe.cpu_kernel[first:],
            faults=probe.faults[first:],
            reclaims=probe.reclaims[first:],
            stolen=probe.stolen[first:],
            cores=probe.cores[first:],
        )
        seen = self._seen.pop(result.run, None)  # the witnesses stopped with the watch
        if seen is not None:
            start = result.started_at - 1.0  # a sample's lag reaches back before it
            att.witness_cores = seen.cores
            att.witness_stalls = [[s for s in stalls if s[1] >= start] for stalls in seen.stalls]
        self.runs[result.run] = att
        result.details = att.to_dict()

    def paragraphs(self, report: LoadtestReport) -> list[str]:
        """``--verbose``'s extra lines: where lag over 5 ms came from, and each run's worst
        sample net of the machine's stalls."""
        said = []
        for r in report.results:
            if r.run not in self.runs:
                continue
            w = self.runs[r.run].cpu_wait()
            if w is not None:
                said.append(lag_causes(r.name, w))
        if not said:
            return []
        return [
            "Where lag over 5 ms came from (Linux schedstat, for the loop's thread: waiting "
            "for a core; running, as its CPU clock counts it; stolen, its core stopped by the "
            "hypervisor; or neither, asleep past its time: the GIL, or woken late; and how "
            "long the witness process on its core, which only sleeps 1 ms at a time, stood "
            "still with it): " + "; ".join(said) + "."
        ]


def in_kernel(w: dict[str, float]) -> str:
    """Of a worst sample's running, what the kernel did, as far as it tells."""
    said = []
    if "worst_faults" in w:
        said += [
            f"{w['worst_kernel_ms']:.1f} in the kernel",
            f"{w['worst_faults']:.0f} page faults",
        ]
    if "worst_reclaims" in w:
        said.append(f"{w['worst_reclaims']:.0f} direct reclaims or compactions on the machine")
    return f" ({', '.join(said)})" if said else ""


def lag_causes(name: str, w: dict[str, float]) -> str:
    """One run's part of the "where lag came from" sentence."""
    worst = (
        f"worst {w['worst_lag_ms']:.1f} ms: {w['worst_wait_ms']:.1f} waiting, "
        f"{w['worst_running_ms']:.1f} running{in_kernel(w)}, {w['worst_stolen_ms']:.1f} stolen"
    )
    if "worst_witnessed_ms" in w:
        worst += f" (its core's witness stood still {w['worst_witnessed_ms']:.1f})"
    if not w["samples"]:
        return f"{name} no samples over 5 ms, {worst}"
    neither = max(0.0, 1 - w["share"] - w["running_share"] - w["stolen_share"])
    return (
        f"{name} {w['samples']:.0f} samples over 5 ms, of their lag {w['share']:.0%} waiting, "
        f"{w['running_share']:.0%} running, {w['stolen_share']:.0%} stolen, "
        f"{neither:.0%} neither; {worst}"
    )
