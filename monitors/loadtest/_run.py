"""Running a load test: episodes, the TracesServer, wandb offline, and each monitor in turn."""

from __future__ import annotations

import bisect
import contextlib
import gc
import logging
import os
import platform
import resource
import shutil
import subprocess
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import orjson

from ..base import Monitor
from ..file import FileMonitor
from ..lag import LagStats, LoopLagProbe, _open_schedstat, _waited
from ..prime import PrimeMonitor
from ..testing import wandb_offline_env
from ..testing.episodes import Episode, EpisodeMaker
from ..traces._layout import ROW_BYTES
from ..wandb_monitor import WandbMonitor
from ._baseline import OrjsonFileBaseline, SdkLikeUploader
from ._config import LoadtestConfig
from ._memory import PeakRss
from ._progress import Bar, Progress
from ._witness import Stall, Witnesses, core_ms, machine_ms, witnesses
from .errors import LoadtestError, NotEnoughDiskError

__all__ = ["LoadtestReport", "RunResult", "make_episodes", "run_loadtest"]

log = logging.getLogger("monitors.loadtest")

KEY = "loadtest-key"
MB = 1_000_000
#: What each run is called in the report.
NAMES = {
    "file": "FileMonitor",
    "prime": "PrimeMonitor",
    "wandb": "WandbMonitor",
    "baseline-file": "orjson + to_thread (file)",
    "baseline-sdk": "SDK-like uploader",
}
_WRITES_FILES = ("file", "wandb", "baseline-file")
_TALKS_HTTP = ("prime", "baseline-sdk")
#: Seconds the idle loop is probed before the runs, as a reference for the machine's noise.
IDLE_SECONDS = 1.0
#: ``orjson.dumps`` calls timed before the runs, as a gauge of the machine's speed that day.
GAUGE_CALLS = 9
_TICK = 0.25


@dataclass
class RunResult:
    """One monitor's (or baseline's) run. Times in seconds, lag in ms, sizes in bytes."""

    run: str
    name: str
    episodes: int
    submitted: int = 0
    delivered: int = 0
    lost: dict[str, int] = field(default_factory=dict)
    #: Records each run is given (``LoadtestConfig.records``).
    records: int = 0
    #: JSON bytes of the records submitted and delivered (newlines not counted).
    json_bytes: int = 0
    delivered_bytes: int = 0
    log_calls: int = 0
    slowest_log: float = 0.0
    slowest_log_subset: str = ""
    #: During the slowest log call, the ms the loop's thread waited for a core and ran
    #: (Linux schedstat; None elsewhere): a call that only queues, yet took long, was most
    #: likely its thread off its core.
    slowest_log_waiting: float | None = None
    slowest_log_running: float | None = None
    #: Every log call: when it began (``time.perf_counter()``) and how long it took.
    log_spans: list[tuple[float, float]] = field(default_factory=list, repr=False)
    #: Lag from the first log call to the end of finalize; ``start_lag_max`` during start.
    lag: LagStats = field(default_factory=lambda: LagStats.of([]))
    start_lag_max: float = 0.0
    #: Garbage collections from the first log call to the end of finalize: how many were
    #: full (generation 2), and the longest pause of any, in ms (a stall the probe also sees).
    gc_full: int = 0
    gc_longest: float = 0.0
    #: CPU seconds (user + system) this process and the TracesServer (None: not known or
    #: no server) spent during the run: where the cores went.
    cpu: float = 0.0
    server_cpu: float | None = None
    wall: float = 0.0
    drain: float = 0.0
    peak_rss: int = 0
    network: str = "-"
    in_flight: int | None = None
    #: The TracesServer's counts after the run (Prime and the SDK-like uploader).
    server: dict[str, Any] | None = None
    #: Where the records went: subset -> trace stream directory (or JSONL file), while kept.
    streams: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    lag_samples: list[float] = field(default_factory=list, repr=False)
    lag_times: list[float] = field(default_factory=list, repr=False)
    #: ``time.perf_counter()`` at the first log call, which ``lag_times`` count from: the
    #: samples' place on the machine's monotonic clock, to set beside what other processes
    #: saw meanwhile.
    started_at: float = 0.0
    #: Per lag sample, the ms the loop's thread was ready but waiting for a core, and the ms
    #: it ran (Linux schedstat; empty elsewhere): what share of a stall the machine's cores
    #: caused, and what share the loop's own work.
    lag_cpu_waits: list[float] = field(default_factory=list, repr=False)
    lag_cpu_runs: list[float] = field(default_factory=list, repr=False)
    #: Per lag sample, of the running, the ms in the kernel and the page faults taken
    #: (``LoopLagProbe.cpu_kernel`` and ``faults``; empty where the kernel does not tell).
    lag_cpu_kernel: list[float] = field(default_factory=list, repr=False)
    lag_faults: list[int] = field(default_factory=list, repr=False)
    #: Per lag sample at least 1 ms late, the times a thread on the machine reclaimed or
    #: compacted memory itself to allocate (``LoopLagProbe.reclaims``).
    lag_reclaims: list[int] = field(default_factory=list, repr=False)
    #: Per lag sample, the ms the loop's core lost to the hypervisor meanwhile (steal time,
    #: to the kernel's tick; ``LoopLagProbe.stolen``): the core stood still.
    lag_stolen: list[float] = field(default_factory=list, repr=False)
    #: Per lag sample at least 1 ms late, the cores the loop's thread was on
    #: (``LoopLagProbe.cores``; empty where the kernel does not tell).
    lag_cores: list[tuple[int, int]] = field(default_factory=list, repr=False)
    #: The witness processes' cores and, per witness, the moments it stood still during the
    #: run (``_witness``: its core stopped, whatever the loop did); empty where the witnesses
    #: could not run.
    witness_cores: list[int] = field(default_factory=list, repr=False)
    witness_stalls: list[list[Stall]] = field(default_factory=list, repr=False)

    def cpu_wait(self, over_ms: float = 5.0) -> dict[str, float] | None:
        """Of the lag samples over ``over_ms``: how many, and what share of their lag the
        loop's thread spent waiting for a core (``share``), running (``running_share``) and
        stopped with its core (``stolen_share``, the hypervisor's steal); the rest
        it was asleep past its time. The same for the worst sample, and of its running the ms
        in the kernel and the page faults taken (``worst_kernel_ms``, ``worst_faults``) and
        the machine's direct reclaims and compactions meanwhile (``worst_reclaims``), where
        the kernel tells, and the ms of it the witness on the loop's core stood still too
        (``worst_witnessed_ms``, where witnesses ran). None where the kernel does not tell.

        A sample's window is its interval plus its lag, so its parts may add up to more than
        the lag: stolen counts first (the kernel counts a thread's wait for a stolen core as
        waiting), then waiting, then running, up to the lag.
        """
        parts = self._lag_parts()
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
        if len(self.lag_cpu_kernel) == len(self.lag_faults) == len(parts):
            causes["worst_kernel_ms"] = min(self.lag_cpu_kernel[at], worst[2])
            causes["worst_faults"] = self.lag_faults[at]
        if len(self.lag_reclaims) == len(parts):
            causes["worst_reclaims"] = self.lag_reclaims[at]
        if self.witness_stalls:
            causes["worst_witnessed_ms"] = self.witnessed()[at]
        return causes

    def _lag_parts(self) -> list[tuple[float, float, float, float]] | None:
        """Per sample: lag, and of it the ms waiting, running and stolen (see ``cpu_wait``)."""
        n = len(self.lag_samples)
        if not n or len(self.lag_cpu_waits) != n or len(self.lag_cpu_runs) != n:
            return None
        stolen = self.lag_stolen if len(self.lag_stolen) == n else [0.0] * n
        parts = []
        for lag, wait, run, took in zip(
            self.lag_samples, self.lag_cpu_waits, self.lag_cpu_runs, stolen, strict=True
        ):
            took = min(took, lag)
            wait = min(wait, lag - took)
            parts.append((lag, wait, min(run, lag - took - wait), took))
        return parts

    def witnessed(self) -> list[float]:
        """Per lag sample, the ms of its lateness during which the witness on the loop's
        core stood still too (see ``core_ms``; all zeros without witnesses)."""
        n = len(self.lag_samples)
        if not self.witness_stalls:
            return [0.0] * n
        seen = Witnesses(cores=self.witness_cores, stalls=self.witness_stalls)
        cores = self.lag_cores if len(self.lag_cores) == n else [(-1, -1)] * n
        times = [self.started_at + t for t in self.lag_times]
        return core_ms(times, self.lag_samples, cores, seen)

    def _net(self, witnessed: list[float]) -> list[float]:
        n = len(self.lag_samples)
        stolen = self.lag_stolen if len(self.lag_stolen) == n else [0.0] * n
        return [
            lag - min(lag, max(took, seen))
            for lag, took, seen in zip(self.lag_samples, stolen, witnessed, strict=True)
        ]

    def lag_net(self) -> LagStats:
        """Lag with each sample's share of the machine's stalls taken off: the larger of the
        steal time of the loop's core and the time that core's witness stood still. What is
        left is the loop's own work, this machine's other threads, and late wake-ups no
        witness shared."""
        return LagStats.of(self._net(self.witnessed()))

    def worst_net(self) -> dict[str, float] | None:
        """The sample with the most lag left net of the machine's stalls: when (s into the
        run), its lag and what is left, and what the kernel (ms waiting, running, stolen,
        where it tells) and the witnesses (the one on the loop's core; any one) said of it.
        None without samples."""
        witnessed = self.witnessed()
        net = self._net(witnessed)
        if not net:
            return None
        at = max(range(len(net)), key=net.__getitem__)
        lag = self.lag_samples[at]
        worst = {"at_s": self.lag_times[at], "lag_ms": lag, "net_ms": net[at]}
        parts = self._lag_parts()
        if parts is not None:
            _, worst["wait_ms"], worst["running_ms"], worst["stolen_ms"] = parts[at]
        if self.witness_stalls:
            worst["witnessed_ms"] = witnessed[at]
            t = self.started_at + self.lag_times[at]
            worst["any_witness_ms"] = machine_ms([t], [lag], self.witness_stalls)[0]
        return worst

    @property
    def lost_total(self) -> int:
        return sum(self.lost.values())

    @property
    def mbps(self) -> float:
        """JSON MB delivered per second of wall time."""
        return self.delivered_bytes / MB / self.wall if self.wall > 0 else 0.0

    @property
    def all_delivered(self) -> bool:
        return self.error is None and self.delivered == self.submitted == self.records

    def to_dict(self) -> dict[str, Any]:
        net = self.lag_net()  # sorts every sample once
        return {
            "run": self.run,
            "name": self.name,
            "episodes": self.episodes,
            "records": self.records,
            "submitted": self.submitted,
            "delivered": self.delivered,
            "lost": dict(self.lost),
            "json_bytes": self.json_bytes,
            "delivered_bytes": self.delivered_bytes,
            "log_calls": self.log_calls,
            "slowest_log_ms": self.slowest_log * 1e3,
            "slowest_log_subset": self.slowest_log_subset,
            "slowest_log_waiting_ms": self.slowest_log_waiting,
            "slowest_log_running_ms": self.slowest_log_running,
            "lag_ms": {
                "count": self.lag.count,
                "p50": self.lag.p50,
                "p90": self.lag.p90,
                "p99": self.lag.p99,
                "max": self.lag.max,
            },
            "start_lag_max_ms": self.start_lag_max,
            "gc_full_collections": self.gc_full,
            "gc_longest_pause_ms": self.gc_longest,
            "cpu_s": self.cpu,
            "server_cpu_s": self.server_cpu,
            "wall_s": self.wall,
            "drain_s": self.drain,
            "mb_per_s": self.mbps,
            "peak_rss_bytes": self.peak_rss,
            "network": self.network,
            "in_flight": self.in_flight,
            "server": self.server,
            "streams": dict(self.streams),
            "error": self.error,
            "lag_trace_ms": {"bin_s": LAG_TRACE_BIN, "max": self.lag_trace(LAG_TRACE_BIN)},
            "lag_cpu_wait": self.cpu_wait(),
            "lag_net_ms": {
                "p99": net.p99,
                "max": net.max,
            },
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

    def lag_trace(self, bin_s: float = 0.1) -> list[float]:
        """The worst lag sample (ms) in each ``bin_s`` of the run, from its first log call:
        lag over time, small enough to keep (a 1 ms probe takes ~1,000 samples a second)."""
        trace: list[float] = []
        for t, lag in zip(self.lag_times, self.lag_samples, strict=True):
            i = max(0, int(t / bin_s))
            if i >= len(trace):
                trace.extend([0.0] * (i + 1 - len(trace)))
            if lag > trace[i]:
                trace[i] = lag
        return [round(x, 3) for x in trace]


#: Seconds per point of ``RunResult.lag_trace`` in the JSON report.
LAG_TRACE_BIN = 0.1


@dataclass
class LoadtestReport:
    """Every run's result, the idle loop's own lag (for reference) and where it ran."""

    config: LoadtestConfig
    results: list[RunResult]
    idle_lag: LagStats
    json_bytes: int
    rss_per_run: bool
    machine: dict[str, Any]
    seconds: float
    #: Whether each file-writing run's files were removed before the next run started (a
    #: temporary directory on a disk too small to keep them all until the end).
    removed_between_runs: bool = False

    def result(self, run: str) -> RunResult:
        for r in self.results:
            if r.run == run:
                return r
        raise KeyError(run)

    def to_dict(self) -> dict[str, Any]:
        c = self.config
        return {
            "config": {
                "monitors": list(c.monitors),
                "episodes": c.episodes,
                "records_per_monitor": c.records,
                "size": c.size,
                "size_median": c.size_median,
                "size_p90": c.size_p90,
                "size_cap": c.size_cap,
                "step_size": c.step_size,
                "effective": c.effective,
                "ahead": c.ahead,
                "seed": c.seed,
                "latency_s": c.latency,
                "bandwidth_bytes_per_s": c.bandwidth,
                "in_flight": c.in_flight,
                "server_nice": c.server_nice,
                "gc_freeze": c.gc_freeze,
                "drain_timeout_s": c.drain_timeout,
                "chunk_bytes": c.chunk_bytes,
                "baseline": c.baseline,
            },
            "episode_json_bytes": self.json_bytes,
            "removed_between_runs": self.removed_between_runs,
            "idle_lag_ms": {
                "p50": self.idle_lag.p50,
                "p99": self.idle_lag.p99,
                "max": self.idle_lag.max,
            },
            "peak_rss_per_run": self.rss_per_run,
            "machine": self.machine,
            "seconds": self.seconds,
            "results": [r.to_dict() for r in self.results],
        }


def orjson_speed(episodes: Sequence[Episode], *, calls: int = GAUGE_CALLS) -> float:
    """MB/s of ``orjson.dumps`` on the run's median-sized episode (median of ``calls``).

    The same code runs up to twice as slow on a day the virtual machine's host is busy, and
    steal time does not show all of that; this number, next to the encoder benchmark's, says
    which kind of day a report comes from.
    """
    episode = sorted(episodes, key=lambda e: e.size)[len(episodes) // 2]
    value = episode.to_record()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        n = len(orjson.dumps(value))
        times.append(time.perf_counter() - t)
    return n / sorted(times)[calls // 2] / MB


def make_episodes(config: LoadtestConfig) -> tuple[EpisodeMaker, list[Episode]]:
    """The run's episodes (seeded: the same config gives the same episodes)."""
    maker = EpisodeMaker(seed=config.seed)
    episodes = maker.episodes(
        config.episodes,
        size=config.size,
        median=config.size_median,
        p90=config.size_p90,
        cap=config.size_cap,
    )
    return maker, episodes


def network_name(config: LoadtestConfig) -> str:
    if not config.latency and not config.bandwidth:
        return "none"
    parts = []
    if config.latency:
        parts.append(f"{config.latency * 1e3:g} ms")
    if config.bandwidth:
        parts.append(f"{config.bandwidth / MB:g} MB/s")
    return " + ".join(parts)


def disk_needed(config: LoadtestConfig, json_bytes: int) -> int:
    """Bytes one file-writing run leaves on disk: every record twice ("all" and
    "effective"), with newlines and index rows, and some room to spare."""
    records = config.records
    copies = records // config.episodes
    return copies * json_bytes + records * (1 + ROW_BYTES) + (256 << 20)


def check_disk(config: LoadtestConfig, json_bytes: int, root: Path) -> bool:
    """Raise ``NotEnoughDiskError`` if the file-writing runs cannot fit under ``root``;
    else say whether every run's files fit at once (or must go before the next run).

    Kept (--out), every run's files stay. In a temporary directory they are kept until the
    end too where the disk holds them all: removing many GB frees that much page cache, and
    on a VM that hands free memory back to its host (most likely what this Firecracker VM,
    with virtio_balloon, does), the next run pays for memory the host must back again.
    Measured at 1,000 episodes with the Prime run right after the file run's 17 GB were
    removed: bursts of ~30 ms loop stalls once per step for its first ~20 s (lag max 43-52
    ms), none with the files kept (max 14 ms) or with the Prime run alone (max 14 ms);
    touching fresh memory after freeing 12 GB took 1.9 s a GB, against 0.5 s steady.
    """
    runs = [r for r in config.runs() if r in _WRITES_FILES]
    if not runs:
        return True
    one = disk_needed(config, json_bytes)
    probe = root
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    needed = one * len(runs) if config.out is not None else one
    if free < needed:
        what = f"{', '.join(runs)} with {config.episodes} episodes ({json_bytes / 1e9:.1f} GB of JSON, logged twice)"
        raise NotEnoughDiskError(path=str(probe), needed=needed, free=free, what=what)
    return free >= one * len(runs)


@contextlib.contextmanager
def wandb_offline(root: Path) -> Iterator[str]:
    """wandb offline with every file under ``root``, unless the user set ``WANDB_MODE``
    (then it is theirs to decide, credentials included). Yields the mode in force."""
    if os.environ.get("WANDB_MODE"):
        yield os.environ["WANDB_MODE"]
        return
    env = wandb_offline_env(root / "wandb-home")
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield "offline"
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


# -- one run ------------------------------------------------------------------------------


class _GcWatch:
    """Counts full collections and the longest pause while installed (``gc.callbacks``)."""

    def __init__(self) -> None:
        self.full = 0
        self.longest = 0.0
        self._t0 = 0.0
        self.active = False

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self.active:
            return
        if phase == "start":
            self._t0 = time.perf_counter()
            return
        self.longest = max(self.longest, (time.perf_counter() - self._t0) * 1e3)
        if info.get("generation") == 2:
            self.full += 1


class _Driver:
    """Logs the episodes into one monitor the way an orchestrator does, and measures."""

    def __init__(
        self,
        monitor: Monitor,
        result: RunResult,
        episodes: Sequence[Episode],
        config: LoadtestConfig,
        bar: Bar,
    ) -> None:
        self.monitor = monitor
        self.result = result
        self.episodes = episodes
        self.config = config
        self.bar = bar
        self.started = 0.0
        self.submitted_bytes = 0
        self._seen = 0
        self._lag_max = 0.0
        self._schedstat: int | None = None  # this thread's, while run() runs

    async def _room(self) -> None:
        ahead = self.config.ahead
        if not ahead:
            return
        monitor = self.monitor
        while monitor.stats().pending > ahead:
            await anyio.sleep(0.002)

    async def _log(self, batch: list[Episode], step: int, subset: Any) -> None:
        await self._room()
        result = self.result
        fd = self._schedstat
        waited = 0 if fd is None else _waited(fd)
        cpu = time.thread_time_ns()
        t0 = time.perf_counter()
        await self.monitor.log_episodes(batch, step=step, subset=subset)
        spent = time.perf_counter() - t0
        cpu = time.thread_time_ns() - cpu
        result.log_calls += 1
        result.log_spans.append((t0, spent))
        self.submitted_bytes += sum(e.size for e in batch)
        if spent > result.slowest_log:
            result.slowest_log = spent
            result.slowest_log_subset = f"{subset} ({len(batch)} episode(s))"
            if fd is not None:
                result.slowest_log_running = cpu / 1e6
                result.slowest_log_waiting = (_waited(fd) - waited) / 1e6

    def _show(self, probe: LoopLagProbe) -> None:
        """Bring the progress bar up to date (a few tens of µs on the loop)."""
        samples = probe.samples
        if len(samples) > self._seen:
            self._lag_max = max(self._lag_max, max(samples[self._seen :]))
            self._seen = len(samples)
        stats = self.monitor.stats()
        elapsed = time.perf_counter() - self.started if self.started else 0.0
        done_bytes = self.submitted_bytes * (
            stats.delivered / stats.submitted if stats.submitted else 0.0
        )
        self.bar.update(
            done=stats.delivered + stats.lost_total,
            submitted=stats.submitted,
            mbps=done_bytes / MB / elapsed if elapsed > 0 else 0.0,
            lag_max=self._lag_max,
        )

    async def _tick(self, probe: LoopLagProbe) -> None:
        while True:
            await anyio.sleep(_TICK)
            self._show(probe)

    async def run(self) -> None:
        config, result, monitor = self.config, self.result, self.monitor
        episodes = self.episodes
        # The probe outside, the ticker inside: leaving the ticker's group cancels only it.
        async with (
            LoopLagProbe(interval=config.lag_interval) as probe,
            anyio.create_task_group() as ticker,
        ):
            ticker.start_soon(self._tick, probe)
            # start and finalize in this task, in the same scope (see PrimeMonitor.start).
            t_start = time.perf_counter()
            try:
                await monitor.start()
            except Exception as exc:
                result.error = f"start failed: {exc}"
                log.error("%s: %s", result.name, result.error)
                with contextlib.suppress(Exception):
                    await monitor.finalize()  # whatever start opened
                ticker.cancel_scope.cancel()
                return
            if config.gc_freeze:  # a one-off pause of its own: not sampled
                probe.pause()
                gc.collect()
                gc.freeze()
                probe.resume()
            self.started = time.perf_counter()
            self._schedstat = _open_schedstat()
            watch = _GcWatch()
            gc.callbacks.append(watch)
            watch.active = True
            try:
                k = config.step_size
                for step, first in enumerate(range(0, len(episodes), k)):
                    batch = list(episodes[first : first + k])
                    for episode in batch:
                        await self._log([episode], step, "all")
                    if config.effective:
                        await self._log(batch, step, "effective")
            except Exception as exc:
                result.error = f"log_episodes failed: {exc!r}"
                log.error("%s: %s", result.name, result.error)
            finally:
                t_fin = time.perf_counter()
                await monitor.finalize()
                t_end = time.perf_counter()
                watch.active = False
                gc.callbacks.remove(watch)
                if self._schedstat is not None:
                    os.close(self._schedstat)
                    self._schedstat = None
                if config.gc_freeze:
                    gc.unfreeze()
                ticker.cancel_scope.cancel()
                self._show(probe)
        result.gc_full, result.gc_longest = watch.full, watch.longest
        result.wall = t_end - self.started
        result.drain = t_end - t_fin
        # Samples come in time order: those of the start, then those of the run.
        samples, times = probe.samples, probe.times
        first, run = bisect.bisect_left(times, t_start), bisect.bisect_left(times, self.started)
        during = samples[run:]
        result.lag_cpu_waits = probe.cpu_waits[run:]
        result.lag_cpu_runs = probe.cpu_runs[run:]
        result.lag_cpu_kernel = probe.cpu_kernel[run:]
        result.lag_faults = probe.faults[run:]
        result.lag_reclaims = probe.reclaims[run:]
        result.lag_stolen = probe.stolen[run:]
        result.lag_cores = probe.cores[run:]
        result.lag = LagStats.of(during)
        result.start_lag_max = max(samples[first:run], default=0.0)
        result.lag_samples = during
        result.lag_times = [t - self.started for t in times[run:]]
        result.started_at = self.started


def _monitor(run: str, root: Path, config: LoadtestConfig, url: str | None) -> Monitor:
    if run == "file":
        return FileMonitor(root / "file", chunk_bytes=config.chunk_bytes)
    if run == "wandb":
        return WandbMonitor(
            project="nodewise-loadtest",
            name=f"loadtest-{config.episodes}",
            dir=root / "wandb",
            chunk_bytes=config.chunk_bytes,
        )
    if run == "baseline-file":
        return OrjsonFileBaseline(root / "baseline-file")
    assert url is not None
    if run == "prime":
        return PrimeMonitor(
            api_key=KEY,
            traces_url=url,
            base_url=url,
            team_id="",
            run_id="loadtest",
            max_in_flight=config.in_flight,
            drain_timeout=config.drain_timeout,
        )
    if run == "baseline-sdk":
        return SdkLikeUploader(url=url, api_key=KEY, drain_timeout=config.drain_timeout)
    raise LoadtestError(f"unknown run {run!r}")


def _streams(run: str, monitor: Monitor) -> dict[str, str]:
    if isinstance(monitor, FileMonitor | WandbMonitor):
        if isinstance(monitor, WandbMonitor) and monitor.run is None:
            return {}
        return {s: str(monitor.stream_dir("train", s)) for s in ("all", "effective")}
    if isinstance(monitor, OrjsonFileBaseline):
        return {s: str(monitor.path("train", s)) for s in ("all", "effective")}
    return {}


async def _run_one(
    run: str,
    *,
    config: LoadtestConfig,
    episodes: Sequence[Episode],
    root: Path,
    server: Any,
    progress: Progress,
    peak: PeakRss,
) -> RunResult:
    result = RunResult(run=run, name=NAMES[run], episodes=len(episodes), records=config.records)
    if run in _TALKS_HTTP:
        result.network = network_name(config)
        result.in_flight = config.in_flight if run == "prime" else 1
        await server.areset()
    monitor = _monitor(run, root, config, server.url if server is not None else None)
    bar = progress.bar(result.name, config.records)
    gc.collect()
    peak.reset()
    cpu0 = process_cpu()
    server_pid = server.pid if server is not None and run in _TALKS_HTTP else None
    server_cpu0 = process_cpu(server_pid) if server_pid is not None else None
    try:
        async with _witnessed(result):
            await _Driver(monitor, result, episodes, config, bar).run()
    finally:
        bar.close()
    result.cpu = (process_cpu() or 0.0) - (cpu0 or 0.0)
    if server_pid is not None and server_cpu0 is not None:
        server_cpu1 = process_cpu(server_pid)
        result.server_cpu = None if server_cpu1 is None else server_cpu1 - server_cpu0
    result.peak_rss = peak.peak()
    stats = monitor.stats()
    result.submitted = stats.submitted
    result.delivered = stats.delivered
    result.lost = {k: v for k, v in stats.lost.items() if v}
    result.json_bytes = config.records // len(episodes) * sum(e.size for e in episodes)
    # Bytes delivered: exact when everything or nothing was, else pro rata.
    if stats.submitted:
        result.delivered_bytes = round(result.json_bytes * stats.delivered / config.records)
    result.streams = _streams(run, monitor)
    if run in _TALKS_HTTP:
        result.server = await server.astats()
    return result


@contextlib.asynccontextmanager
async def _witnessed(result: RunResult) -> AsyncIterator[None]:
    """Witnesses (``_witness``) on every core while the block runs; their stalls during
    the run go to ``result`` (started and stopped in a worker thread: each takes a few ms
    to tens of ms). A run goes on without them, and says so, where they cannot run."""
    cm = witnesses()
    try:
        seen = await anyio.to_thread.run_sync(cm.__enter__)
    except (OSError, RuntimeError) as exc:
        log.warning("%s: no witness processes (%s); lag is net of steal only", result.name, exc)
        yield
        return
    try:
        yield
    finally:
        with anyio.CancelScope(shield=True):
            try:
                await anyio.to_thread.run_sync(cm.__exit__, None, None, None)
            except (OSError, RuntimeError, subprocess.SubprocessError) as exc:
                log.warning("%s: the witness processes failed (%s)", result.name, exc)
            else:
                start = result.started_at - 1.0  # a sample's lag reaches back before it
                result.witness_cores = seen.cores
                result.witness_stalls = [
                    [(due, now) for due, now in stalls if now >= start] for stalls in seen.stalls
                ]


def lower_priority(pid: int, nice: int) -> None:
    """Run process ``pid`` at ``nice`` above this process (best effort; 0 leaves it)."""
    if nice > 0 and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        except OSError as exc:
            log.warning("the TracesServer's priority was not lowered: %s", exc)


def process_cpu(pid: int | None = None) -> float | None:
    """CPU seconds (user + system) used so far by this process (``pid`` None) or by process
    ``pid`` (None where ``/proc`` cannot tell)."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


async def run_loadtest(config: LoadtestConfig) -> LoadtestReport:
    """Run ``config.runs()`` one after the other and return their results.

    Without ``config.out`` everything is written in a temporary directory, removed at the
    end; each run's files are removed as soon as that run ends only where the disk cannot
    hold them all (see ``check_disk``). Raises ``NotEnoughDiskError`` before anything runs
    when the trace files cannot fit.
    """
    started = time.perf_counter()
    # ~1 s of CPU for 1,000 episodes (the bodies are built): not on the caller's loop.
    _, episodes = await anyio.to_thread.run_sync(make_episodes, config)
    json_bytes = sum(e.size for e in episodes)
    temporary = config.out is None
    if config.out is None:
        root = Path(tempfile.mkdtemp(prefix="nodewise-loadtest-"))
    else:
        root = Path(config.out)
    try:
        fits = check_disk(config, json_bytes, root) if config.check_disk else False
        removed_between_runs = temporary and not fits
        root.mkdir(parents=True, exist_ok=True)
        async with LoopLagProbe(interval=config.lag_interval) as probe:
            await anyio.sleep(IDLE_SECONDS)
        idle = probe.stats()
        speed = await anyio.to_thread.run_sync(orjson_speed, episodes)
        progress = Progress(enabled=config.progress)
        peak = PeakRss()
        runs = config.runs()
        results: list[RunResult] = []
        server_cm: Any = contextlib.nullcontext(None)
        if any(r in _TALKS_HTTP for r in runs):
            from ..testing.server import TracesServer

            faults: dict[str, float] = {"latency": config.latency, "bandwidth": config.bandwidth}
            server_cm = TracesServer(api_key=KEY, faults=faults)
        with wandb_offline(root):
            async with server_cm as server:
                if server is not None:
                    lower_priority(server.pid, config.server_nice)
                for run in runs:
                    result = await _run_one(
                        run,
                        config=config,
                        episodes=episodes,
                        root=root,
                        server=server,
                        progress=progress,
                        peak=peak,
                    )
                    results.append(result)
                    if removed_between_runs and run in _WRITES_FILES:
                        await anyio.to_thread.run_sync(_remove, root / run)
                        result.streams = {}
        return LoadtestReport(
            config=config,
            results=results,
            idle_lag=idle,
            json_bytes=json_bytes,
            rss_per_run=peak.resettable,
            machine={
                "cpus": os.cpu_count(),
                "python": platform.python_version(),
                "platform": platform.platform(terse=True),
                "orjson_mb_s": speed,
            },
            seconds=time.perf_counter() - started,
            removed_between_runs=removed_between_runs,
        )
    finally:
        if temporary:  # even when cancelled (Ctrl-C): the files may be many GB
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(_remove, root)
