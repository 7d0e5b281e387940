"""Running a load test: episodes, the TracesServer, wandb offline, and each monitor in turn."""

from __future__ import annotations

import bisect
import contextlib
import gc
import importlib.util
import logging
import os
import platform
import shutil
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import anyio
import orjson

from ..base import Monitor
from ..file import FileMonitor
from ..lag import LagStats, LoopLagProbe
from ..prime import PrimeMonitor
from ..testing import wandb_offline_env
from ..testing.episodes import Episode, EpisodeMaker
from ..traces._layout import RUN_STREAM
from ..wandb_monitor import INSTALL_HINT as WANDB_INSTALL_HINT
from ..wandb_monitor import WandbMonitor
from ._config import LoadtestConfig
from ._measure import GcWatch, PeakRss, lower_priority, process_cpu
from ._progress import Bar, Progress
from .errors import LoadtestError, NotEnoughDiskError

__all__ = [
    "Instrument",
    "LoadtestReport",
    "RunResult",
    "RunSpec",
    "make_episodes",
    "run_loadtest",
]

log = logging.getLogger("monitors.loadtest")

KEY = "loadtest-key"
MB = 1_000_000
#: Seconds the idle loop is probed before the runs: the machine's own noise, for reference.
IDLE_SECONDS = 1.0
#: ``orjson.dumps`` calls timed before the runs: the machine's speed that day.
GAUGE_CALLS = 9
#: Seconds per point of ``RunResult.lag_trace`` in the JSON report.
LAG_TRACE_BIN = 0.1
#: Over this (ms), a lag sample counts as a stall in the report.
STALL_MS = 5.0
_TICK = 0.25


@dataclass(frozen=True, kw_only=True)
class RunSpec:
    """One run of a load test: a monitor, or something measured beside the monitors (the
    benchmark's baselines of today's way).

    :param key: the run's short name (``"file"``).
    :param name: its name in the report (``"FileMonitor"``).
    :param make: builds the monitor from the run's directory, the config and the
        TracesServer's URL (None when no run talks HTTP).
    :param http: whether it uploads to the TracesServer.
    :param files: whether it writes trace files (and so needs disk).
    :param ours: whether it is nodewise's, judged against the targets.
    :param in_flight: requests it keeps in flight, where fixed (else the config's).
    :param streams: where it wrote its run (``"run"``) and its stream of episodes
        (``"stream"``), for reading them back.
    :param needs: the optional package its monitor imports (None: only nodewise's own
        dependencies), so that ``nodewise loadtest`` can skip the run when it is missing.
    :param install: how to install that package.
    """

    key: str
    name: str
    make: Callable[[Path, LoadtestConfig, str | None], Monitor]
    http: bool = False
    files: bool = False
    ours: bool = True
    in_flight: int | None = None
    streams: Callable[[Monitor], dict[str, str]] = lambda _: {}
    needs: str | None = None
    install: str = ""

    def missing(self) -> str | None:
        """The package the run needs that is not installed, found without importing it."""
        if self.needs is None:
            return None
        try:
            found = importlib.util.find_spec(self.needs) is not None
        except ValueError:  # imported already, without a spec: there all the same
            found = True
        return None if found else self.needs


def _stream_dirs(monitor: Monitor) -> dict[str, str]:
    if isinstance(monitor, FileMonitor):
        root = monitor.root
    elif isinstance(monitor, WandbMonitor) and monitor.run is not None:
        root = Path(monitor.run.dir)
    else:
        return {}
    return {"run": str(root), "stream": str(root / RUN_STREAM)}


def _prime(root: Path, config: LoadtestConfig, url: str | None) -> Monitor:
    assert url is not None
    return PrimeMonitor(
        api_key=KEY,
        traces_url=url,
        base_url=url,
        team_id="",
        run_id="loadtest",
        max_in_flight=config.in_flight,
        drain_timeout=config.drain_timeout,
    )


#: The monitors a load test can run, by ``LoadtestConfig.monitors`` name.
RUNS: dict[str, RunSpec] = {
    "file": RunSpec(
        key="file",
        name="FileMonitor",
        make=lambda root, config, _: FileMonitor(root / "file", chunk_bytes=config.chunk_bytes),
        files=True,
        streams=_stream_dirs,
    ),
    "prime": RunSpec(key="prime", name="PrimeMonitor", make=_prime, http=True),
    "wandb": RunSpec(
        key="wandb",
        name="WandbMonitor",
        make=lambda root, config, _: WandbMonitor(
            project="nodewise-loadtest",
            name=f"loadtest-{config.episodes}",
            dir=root / "wandb",
            chunk_bytes=config.chunk_bytes,
        ),
        files=True,
        streams=_stream_dirs,
        needs="wandb",
        install=WANDB_INSTALL_HINT,
    ),
}


@dataclass
class RunResult:
    """One run's outcome. Times in seconds, lag in ms, sizes in bytes."""

    run: str
    name: str
    episodes: int
    ours: bool = True
    submitted: int = 0
    delivered: int = 0
    lost: dict[str, int] = field(default_factory=dict)
    #: Records the run is given (``LoadtestConfig.records``).
    records: int = 0
    #: JSON bytes of the records submitted and delivered (newlines not counted).
    json_bytes: int = 0
    delivered_bytes: int = 0
    log_calls: int = 0
    slowest_log: float = 0.0
    slowest_log_subset: str = ""
    #: ms the loop's thread spent on its CPU clock during the slowest log call.
    slowest_log_running: float | None = None
    #: Every log call: when it began (``time.perf_counter()``) and how long it took, and
    #: the JSON bytes of the episodes it was given.
    log_spans: list[tuple[float, float]] = field(default_factory=list, repr=False)
    log_bytes: list[int] = field(default_factory=list, repr=False)
    #: Lag from the first log call to the end of finalize; ``start_lag_max`` during start.
    lag: LagStats = field(default_factory=lambda: LagStats.of([]))
    start_lag_max: float = 0.0
    #: Collections during the run: how many were full, and the longest pause (ms).
    gc_full: int = 0
    gc_longest: float = 0.0
    #: CPU seconds this process and the TracesServer (None: unknown, or no server) spent.
    cpu: float = 0.0
    server_cpu: float | None = None
    wall: float = 0.0
    drain: float = 0.0
    peak_rss: int = 0
    network: str = "-"
    in_flight: int | None = None
    #: The TracesServer's counts after the run (runs that upload).
    server: dict[str, Any] | None = None
    #: Where the records went (``RunSpec.streams``), while kept.
    streams: dict[str, str] = field(default_factory=dict)
    error: str | None = None
    #: The samples of the run, with their times (s from ``started_at``, the
    #: ``perf_counter()`` of the first log call) and the ms the loop's thread ran in each.
    lag_samples: list[float] = field(default_factory=list, repr=False)
    lag_times: list[float] = field(default_factory=list, repr=False)
    lag_running: list[float] = field(default_factory=list, repr=False)
    started_at: float = 0.0
    #: What an ``Instrument`` found, as JSON-ready values.
    details: dict[str, Any] = field(default_factory=dict)

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

    def stalls(self, over_ms: float = STALL_MS) -> tuple[int, float]:
        """How many samples were over ``over_ms``, and the share of their lag during which
        the loop's thread ran (0 without such samples): near 1, the loop's own steps; near
        0, the loop kept off its core by the machine or another thread."""
        slow = [
            (lag, min(ran, lag))
            for lag, ran in zip(self.lag_samples, self.lag_running, strict=True)
            if lag > over_ms
        ]
        total = sum(lag for lag, _ in slow)
        return len(slow), (sum(ran for _, ran in slow) / total if total else 0.0)

    def lag_trace(self, bin_s: float = LAG_TRACE_BIN) -> list[float]:
        """The worst lag sample (ms) in each ``bin_s`` of the run: lag over time, small
        enough to keep (a 1 ms probe takes ~1,000 samples a second)."""
        trace: list[float] = []
        for t, lag in zip(self.lag_times, self.lag_samples, strict=True):
            i = max(0, int(t / bin_s))
            if i >= len(trace):
                trace.extend([0.0] * (i + 1 - len(trace)))
            trace[i] = max(trace[i], lag)
        return [round(x, 3) for x in trace]

    def to_dict(self) -> dict[str, Any]:
        stalls, running = self.stalls()
        return {
            "run": self.run,
            "name": self.name,
            "ours": self.ours,
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
            "slowest_log_running_ms": self.slowest_log_running,
            "lag_ms": {
                "count": self.lag.count,
                "p50": self.lag.p50,
                "p90": self.lag.p90,
                "p99": self.lag.p99,
                "max": self.lag.max,
            },
            "stalls": {"over_ms": STALL_MS, "count": stalls, "running_share": running},
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
            "lag_trace_ms": {"bin_s": LAG_TRACE_BIN, "max": self.lag_trace()},
            **self.details,
        }


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

    @property
    def ours(self) -> list[RunResult]:
        """The results of nodewise's monitors (not of runs measured beside them)."""
        return [r for r in self.results if r.ours]

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
                "runs": [r.run for r in self.results],
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


class Instrument(Protocol):
    """Measurement added to every run, as the benchmarks add theirs (``bench.attribution``).

    ``watch`` wraps each run from before its monitor starts to after it finalizes and gives
    the lag probe to use; ``finished`` is called once the run's result is complete, to add
    what was found (into ``RunResult.details``, which the JSON report includes).
    """

    def watch(
        self, result: RunResult, interval: float
    ) -> contextlib.AbstractAsyncContextManager[LoopLagProbe]: ...

    def finished(self, result: RunResult, probe: LoopLagProbe) -> None: ...


class _Probe:
    """The default instrument: the lag probe, nothing more."""

    def watch(
        self, result: RunResult, interval: float
    ) -> contextlib.AbstractAsyncContextManager[LoopLagProbe]:
        return LoopLagProbe(interval=interval)

    def finished(self, result: RunResult, probe: LoopLagProbe) -> None:
        pass


def orjson_speed(episodes: Sequence[Episode], *, calls: int = GAUGE_CALLS) -> float:
    """MB/s of ``orjson.dumps`` on the run's median-sized episode (median of ``calls``): how
    fast the machine was that day, to set beside the report's numbers."""
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
    """Bytes one file-writing run leaves on disk: every episode once, with its newline and
    index row (a KiB is plenty), the annotations of the shipped cohort, and some room to
    spare."""
    return json_bytes + config.records * (1 + 1024) + (256 << 20)


def check_disk(
    config: LoadtestConfig, json_bytes: int, root: Path, runs: Sequence[RunSpec]
) -> bool:
    """Raise ``NotEnoughDiskError`` if the file-writing ``runs`` cannot fit under ``root``;
    else say whether all their files fit at once (or each run's must go before the next:
    removing many GB at once stalls the next run's start on a VM, docs/design.md D14)."""
    writers = [r.key for r in runs if r.files]
    if not writers:
        return True
    one = disk_needed(config, json_bytes)
    probe = root
    while not probe.exists():
        probe = probe.parent
    free = shutil.disk_usage(probe).free
    needed = one * len(writers) if config.out is not None else one
    if free < needed:
        what = (
            f"{', '.join(writers)} with {config.episodes} episodes "
            f"({json_bytes / 1e9:.1f} GB of JSON, logged {config.records // config.episodes}x)"
        )
        raise NotEnoughDiskError(path=str(probe), needed=needed, free=free, what=what)
    return free >= one * len(writers)


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

    async def _room(self) -> None:
        """Wait while more than ``ahead`` records are pending, as a trainer that runs only
        so far ahead of its uploads would."""
        ahead, monitor = self.config.ahead, self.monitor
        while ahead and monitor.stats().pending > ahead:
            await anyio.sleep(0.002)

    async def _log(self, batch: list[Episode], step: int, subset: Any) -> None:
        await self._room()
        result = self.result
        cpu = time.thread_time_ns()
        t0 = time.perf_counter()
        await self.monitor.log_episodes(batch, step=step, subset=subset)
        spent = time.perf_counter() - t0
        cpu = time.thread_time_ns() - cpu
        size = sum(e.size for e in batch)
        result.log_calls += 1
        result.log_spans.append((t0, spent))
        result.log_bytes.append(size)
        self.submitted_bytes += size
        if spent > result.slowest_log:
            result.slowest_log = spent
            result.slowest_log_subset = f"{subset} ({len(batch)} episode(s))"
            result.slowest_log_running = cpu / 1e6

    async def _log_all(self) -> None:
        """Log every episode as it arrives, then each step's batch; a failure ends the run
        and is its ``error``."""
        k, result = self.config.step_size, self.result
        try:
            for step, first in enumerate(range(0, len(self.episodes), k)):
                batch = list(self.episodes[first : first + k])
                for episode in batch:
                    await self._log([episode], step, "all")
                if self.config.effective:
                    await self._log(batch, step, "effective")
        except Exception as exc:
            result.error = f"log_episodes failed: {exc!r}"
            log.error("%s: %s", result.name, result.error)

    def _show(self, probe: LoopLagProbe) -> None:
        """Bring the progress bar up to date (a few tens of µs on the loop)."""
        samples = probe.samples
        if len(samples) > self._seen:
            self._lag_max = max(self._lag_max, max(samples[self._seen :]))
            self._seen = len(samples)
        stats = self.monitor.stats()
        elapsed = time.perf_counter() - self.started if self.started else 0.0
        done = stats.delivered / stats.submitted if stats.submitted else 0.0
        self.bar.update(
            done=stats.delivered + stats.lost_total,
            submitted=stats.submitted,
            mbps=self.submitted_bytes * done / MB / elapsed if elapsed > 0 else 0.0,
            lag_max=self._lag_max,
        )

    async def _tick(self, probe: LoopLagProbe) -> None:
        while True:
            await anyio.sleep(_TICK)
            self._show(probe)

    async def run(self, instrument: Instrument) -> None:
        config, result, monitor = self.config, self.result, self.monitor
        watch = GcWatch()
        # The probe outside, the ticker inside: leaving the ticker's group cancels only it.
        async with (
            instrument.watch(result, config.lag_interval) as probe,
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
            if config.gc_freeze:  # a one-off pause of its own: not sampled (docs/design.md D7)
                probe.pause()
                gc.collect()
                gc.freeze()
                probe.resume()
            self.started = time.perf_counter()
            try:
                with watch:
                    try:
                        await self._log_all()
                    finally:
                        t_fin = time.perf_counter()
                        await monitor.finalize()
                        t_end = time.perf_counter()
            finally:
                if config.gc_freeze:
                    gc.unfreeze()
                ticker.cancel_scope.cancel()
                self._show(probe)
        result.gc_full, result.gc_longest = watch.full, watch.longest
        result.wall = t_end - self.started
        result.drain = t_end - t_fin
        # Samples come in time order: those of the start, then those of the run.
        times = probe.times
        first, run = bisect.bisect_left(times, t_start), bisect.bisect_left(times, self.started)
        result.lag_samples = probe.samples[run:]
        result.lag_times = [t - self.started for t in times[run:]]
        result.lag_running = probe.running[run:]
        result.lag = LagStats.of(result.lag_samples)
        result.start_lag_max = max(probe.samples[first:run], default=0.0)
        result.started_at = self.started
        instrument.finished(result, probe)


async def _run_one(
    spec: RunSpec,
    *,
    config: LoadtestConfig,
    episodes: Sequence[Episode],
    root: Path,
    server: Any,
    progress: Progress,
    peak: PeakRss,
    instrument: Instrument,
) -> RunResult:
    result = RunResult(
        run=spec.key,
        name=spec.name,
        episodes=len(episodes),
        records=config.records,
        ours=spec.ours,
    )
    server_pid = None
    if spec.http:
        result.network = network_name(config)
        result.in_flight = config.in_flight if spec.in_flight is None else spec.in_flight
        await server.areset()
        server_pid = server.pid
    monitor = spec.make(root, config, server.url if server is not None else None)
    bar = progress.bar(result.name, config.records)
    gc.collect()
    peak.reset()
    cpu0 = process_cpu()
    server_cpu0 = process_cpu(server_pid) if server_pid is not None else None
    try:
        await _Driver(monitor, result, episodes, config, bar).run(instrument)
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
    if stats.submitted:  # exact when everything or nothing was delivered, else pro rata
        result.delivered_bytes = round(result.json_bytes * stats.delivered / config.records)
    result.streams = spec.streams(monitor)
    if spec.http:
        result.server = await server.astats()
    return result


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


@contextlib.asynccontextmanager
async def _server(config: LoadtestConfig, runs: Sequence[RunSpec]) -> AsyncIterator[Any]:
    """A TracesServer in its own process, niced, when a run uploads; else None."""
    if not any(r.http for r in runs):
        yield None
        return
    from ..testing.server import TracesServer

    faults = {"latency": config.latency, "bandwidth": config.bandwidth}
    async with TracesServer(api_key=KEY, faults=faults) as server:
        lower_priority(server.pid, config.server_nice)
        yield server


async def run_loadtest(
    config: LoadtestConfig,
    *,
    extra_runs: Sequence[RunSpec] = (),
    instrument: Instrument | None = None,
) -> LoadtestReport:
    """Run ``config.monitors``, then ``extra_runs``, one after the other.

    Without ``config.out`` everything is written in a temporary directory, removed at the
    end (each run's files right after it where the disk cannot hold them all).

    :param config: what to run.
    :param extra_runs: runs measured beside the monitors (``ours=False`` ones are left out
        of the targets).
    :param instrument: measurement to add to each run; by default, the lag probe alone.
    :raises NotEnoughDiskError: before anything runs, when the trace files cannot fit.
    """
    started = time.perf_counter()
    runs = [RUNS[m] for m in config.monitors] + list(extra_runs)
    if len({r.key for r in runs}) != len(runs):
        raise LoadtestError(f"two runs share a name: {[r.key for r in runs]}")
    # ~1 s of CPU for 1,000 episodes (the bodies are built): not on the caller's loop.
    _, episodes = await anyio.to_thread.run_sync(make_episodes, config)
    json_bytes = sum(e.size for e in episodes)
    temporary = config.out is None
    root = Path(tempfile.mkdtemp(prefix="nodewise-loadtest-")) if temporary else config.out
    assert root is not None
    try:
        fits = check_disk(config, json_bytes, root, runs) if config.check_disk else False
        removed_between_runs = temporary and not fits
        root.mkdir(parents=True, exist_ok=True)
        async with LoopLagProbe(interval=config.lag_interval) as probe:
            await anyio.sleep(IDLE_SECONDS)
        speed = await anyio.to_thread.run_sync(orjson_speed, episodes)
        progress = Progress(enabled=config.progress)
        peak = PeakRss()
        results: list[RunResult] = []
        instrument = instrument or _Probe()
        with wandb_offline(root):
            async with _server(config, runs) as server:
                for spec in runs:
                    result = await _run_one(
                        spec,
                        config=config,
                        episodes=episodes,
                        root=root,
                        server=server,
                        progress=progress,
                        peak=peak,
                        instrument=instrument,
                    )
                    results.append(result)
                    if removed_between_runs and spec.files:
                        await anyio.to_thread.run_sync(_remove, root / spec.key)
                        result.streams = {}
        return LoadtestReport(
            config=config,
            results=results,
            idle_lag=probe.stats(),
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
