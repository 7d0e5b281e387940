"""verifiers episode objects: nodewise's walk of them against ``to_record()`` + ``orjson.dumps``.

    python -m bench.objects [--quick]

A report (nothing here asserts on time) in three Markdown tables, on verifiers 0.4.0
``WireEpisode`` objects made as users make them: ``WireEpisode.model_validate(record)`` of a
production-like record (``monitors.testing.EpisodeMaker``, the benchmarks' maker).

1. CPU time (``time.process_time``, median of 3 runs, rounds interleaved) per episode size
   and for the production mix (episodes of production's size distribution, summed) of
   ``to_record()`` alone; ``orjson.dumps(to_record())`` (prime-rl's way today); nodewise's
   ``b"".join(encoder.iterencode(obj, float_decimals=4))``; ``encoder.aiterencode(obj,
   float_decimals=4)`` drained in ``asyncio.run``; and ``orjson.dumps(record)`` of a record
   built beforehand (the floor). Every run gets a fresh object, built and ``gc.collect()``-ed
   outside the timed region, the collector left enabled. Once per size nodewise's bytes
   (``iterencode`` and ``aiterencode``) are compared with ``orjson.dumps(obj.to_record())``.
2. Garbage: collections by generation and their pauses (``gc.callbacks``) while one 60 MB
   episode is turned into bytes each way.
3. Through the monitors: ``FileMonitor`` (a temporary directory) and ``PrimeMonitor`` (a
   ``TracesServer`` on 127.0.0.1, at nice +10 as in ``bench.prime_monitor``), both with
   ``float_decimals=4``, logging five episodes of 1 to 35 MB one call each, then one of 60 MB,
   while a probe samples the event loop every 1 ms (``LoopLagProbe``, paused while the next
   object is built). FileMonitor's objects are kept alive until it stops, then freed and
   timed apart; PrimeMonitor's are dropped once logged, so that its queue holds their last
   reference. What each wrote or stored is read back and compared with
   ``orjson.dumps(to_record())`` of the same episode.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import logging
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import orjson
from prime_runs.sinks import stamp_run
from verifiers.v1.episode import WireEpisode  # type: ignore[import-untyped]

import encoder
from monitors import FileMonitor, LagStats, LoopLagProbe, Monitor, PrimeMonitor
from monitors.loadtest._measure import GcWatch, lower_priority
from monitors.testing import TracesServer
from monitors.testing.episodes import lognormal_sizes
from monitors.traces import TraceReader

from .__main__ import _f, _log, table
from .documents import MB, MIX_INDEX, MIX_SEED, episode_maker, fresh_episode
from .lag import measure_idle_lag
from .stalls import Stall, StallSampler, summary

#: verifiers' default (``RECORD_FLOAT_DECIMALS``), and the monitors'.
DECIMALS = 4
KEY = "bench-objects-key"
RUN_ID = "bench-objects"
SERVER_NICE = 10
#: ``--stalls``: each stall of the loop over this is attributed (``bench.stalls``).
STALL_MS = 5.0
#: An episode's spec: (target bytes, index); its object is rebuilt fresh from it.
Spec = tuple[int, int]


@dataclass(frozen=True)
class Config:
    runs: int
    sizes: tuple[tuple[str, int], ...]  # (label, bytes) of the single episodes
    mix_episodes: int  # 0: no production mix
    gc_bytes: int  # the episode of the garbage table
    five: tuple[int, ...]  # the monitors' run of several episodes
    big: int  # the monitors' one big episode
    idle_seconds: float


FULL = Config(
    runs=3,
    sizes=(("1", 1 * MB), ("6.4", 6_400_000), ("30", 30 * MB), ("60", 60 * MB)),
    mix_episodes=10,
    gc_bytes=60 * MB,
    five=(1 * MB, 4 * MB, 10 * MB, 20 * MB, 35 * MB),
    big=60 * MB,
    idle_seconds=2.0,
)
QUICK = Config(
    runs=1,
    sizes=(("1", 1 * MB), ("6.4", 6_400_000)),
    mix_episodes=0,
    gc_bytes=6_400_000,
    five=(500_000, 1 * MB, 2 * MB, 3 * MB, 4 * MB),
    big=8 * MB,
    idle_seconds=1.0,
)


def fresh_object(spec: Spec) -> Any:
    """A new ``WireEpisode`` made from a fresh copy of the maker's record (it shares no str,
    list or dict with anything encoded before: orjson caches UTF-8 inside non-ASCII strs)."""
    size, index = spec
    return WireEpisode.model_validate(fresh_episode(size, index=index))


def episode_bytes(spec: Spec) -> int:
    size, index = spec
    return episode_maker().episode(size, index=index).size


# -- 1. CPU time --------------------------------------------------------------------------


def _built(spec: Spec) -> Any:
    obj = fresh_object(spec)
    gc.collect()
    return obj


def cpu_to_record(spec: Spec) -> float:
    obj = _built(spec)
    c0 = time.process_time()
    obj.to_record(float_decimals=DECIMALS)  # the record freed inside, as a caller's would be
    return time.process_time() - c0


def cpu_to_record_dumps(spec: Spec) -> float:
    obj = _built(spec)
    c0 = time.process_time()
    data = orjson.dumps(obj.to_record(float_decimals=DECIMALS))
    seconds = time.process_time() - c0
    del data
    return seconds


def cpu_iter(spec: Spec) -> float:
    obj = _built(spec)
    c0 = time.process_time()
    data = b"".join(encoder.iterencode(obj, float_decimals=DECIMALS))
    seconds = time.process_time() - c0
    del data
    return seconds


async def _drain(obj: Any) -> tuple[float, list[bytes]]:
    """``aiterencode`` into a list, as a sink would take the chunks; CPU seconds inside the
    loop (not its creation) and the chunks."""
    chunks: list[bytes] = []
    c0 = time.process_time()
    async for chunk in encoder.aiterencode(obj, float_decimals=DECIMALS):
        chunks.append(chunk)
    return time.process_time() - c0, chunks


def cpu_aiter(spec: Spec) -> float:
    obj = _built(spec)
    seconds, chunks = asyncio.run(_drain(obj))
    del chunks
    return seconds


def cpu_dumps(spec: Spec) -> float:
    obj = fresh_object(spec)
    record = obj.to_record(float_decimals=DECIMALS)
    del obj
    gc.collect()
    c0 = time.process_time()
    data = orjson.dumps(record)
    seconds = time.process_time() - c0
    del data, record
    return seconds


METHODS: dict[str, Callable[[Spec], float]] = {
    "to_record": cpu_to_record,
    "to_record + dumps": cpu_to_record_dumps,
    "nodewise iter": cpu_iter,
    "nodewise aiter": cpu_aiter,
    "orjson.dumps": cpu_dumps,
}
BASE, ITER, AITER, FLOOR = "to_record + dumps", "nodewise iter", "nodewise aiter", "orjson.dumps"


@dataclass
class Doc:
    name: str
    parts: list[Spec]
    nbytes: int = 0
    seconds: dict[str, list[float]] = field(default_factory=dict)  # per run, parts summed
    check: str = ""  # "yes", or what differs

    def median(self, method: str) -> float:
        return statistics.median(self.seconds[method])

    def ratio(self, method: str, peer: str) -> float:
        return self.median(method) / self.median(peer)


def documents(cfg: Config) -> list[Doc]:
    docs = [Doc(f"episode {label} MB", [(size, 0)]) for label, size in cfg.sizes]
    if cfg.mix_episodes:
        sizes = lognormal_sizes(cfg.mix_episodes, seed=MIX_SEED)
        parts = [(size, MIX_INDEX + i) for i, size in enumerate(sizes)]
        docs.append(Doc(f"production mix ({len(parts)} eps)", parts))
    for doc in docs:
        doc.nbytes = sum(map(episode_bytes, doc.parts))
    return docs


def time_doc(doc: Doc, runs: int) -> None:
    """``runs`` rounds, each timing every method once on fresh objects of every part (one at
    a time, so only one is alive), starting at a different method each round."""
    names = list(METHODS)
    doc.seconds = {n: [] for n in names}
    for r in range(runs):
        order = names[r % len(names) :] + names[: r % len(names)]
        totals = dict.fromkeys(names, 0.0)
        for spec in doc.parts:
            for name in order:
                totals[name] += METHODS[name](spec)
        for name in names:
            doc.seconds[name].append(totals[name])


def _first_difference(a: bytes, b: bytes) -> int:
    return next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )


def _difference(what: str, out: bytes, expected: bytes) -> str:
    at = _first_difference(out, expected)
    return (
        f"{what}: {len(out)} bytes vs {len(expected)}, first difference at {at}: "
        f"{out[max(0, at - 30) : at + 30]!r} vs {expected[max(0, at - 30) : at + 30]!r}"
    )


def check_doc(doc: Doc) -> None:
    """nodewise's bytes (``iterencode`` and ``aiterencode``) against
    ``orjson.dumps(obj.to_record())`` of the same object, each part once."""
    problems = []
    for spec in doc.parts:
        obj = fresh_object(spec)
        try:
            out = b"".join(encoder.iterencode(obj, float_decimals=DECIMALS))
            _, chunks = asyncio.run(_drain(obj))
            aout = b"".join(chunks)
            del chunks
            expected = orjson.dumps(obj.to_record())
        except Exception as exc:
            problems.append(f"episode {spec}: {type(exc).__name__}: {exc}")
            continue
        if out != expected:
            problems.append(_difference(f"iterencode, episode {spec}", out, expected))
        if aout != expected:
            problems.append(_difference(f"aiterencode, episode {spec}", aout, expected))
        del obj, out, aout, expected
    doc.check = "yes" if not problems else "no: " + "; ".join(problems)


def cpu_table(docs: list[Doc]) -> str:
    headers = [
        "document",
        "MB",
        "to_record",
        "to_record + dumps",
        "iter",
        "aiter",
        "orjson.dumps",
        "iter / (to_record + dumps)",
        "aiter / (to_record + dumps)",
        "iter / dumps",
        "aiter / dumps",
        "bytes equal",
    ]
    rows = []
    for d in docs:
        rows.append(
            [
                d.name,
                _f(d.nbytes / MB, 1),
                *(_f(d.median(m) * 1e3, 1) for m in METHODS),
                f"{d.ratio(ITER, BASE):.2f}x",
                f"{d.ratio(AITER, BASE):.2f}x",
                f"{d.ratio(ITER, FLOOR):.2f}x",
                f"{d.ratio(AITER, FLOOR):.2f}x",
                "yes" if d.check == "yes" else "no",
            ]
        )
    return table(headers, rows)


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def cpu_targets(docs: list[Doc]) -> list[str]:
    lines = []
    for goal, peer, limit in (
        ("target", BASE, 0.5),
        ("stretch", FLOOR, 1.5),
    ):
        for method in (ITER, AITER):
            worst, name = max((d.ratio(method, peer), d.name) for d in docs)
            lines.append(
                f"- {goal}: {method.removeprefix('nodewise ')} / ({peer}) <= {limit:g}x on "
                f"every row: worst {worst:.2f}x ({name}), {_verdict(worst <= limit)}"
            )
    return lines


# -- 2. garbage ---------------------------------------------------------------------------


@dataclass
class GcRow:
    way: str
    cpu: float
    collections: list[tuple[int, float]]


def gc_rows(spec: Spec) -> list[GcRow]:
    def prime_rl(obj: Any) -> None:
        data = orjson.dumps(obj.to_record(float_decimals=DECIMALS))
        del data

    def iterencode(obj: Any) -> None:
        data = b"".join(encoder.iterencode(obj, float_decimals=DECIMALS))
        del data

    def aiterencode(obj: Any) -> None:
        _, chunks = asyncio.run(_drain(obj))
        del chunks

    ways: list[tuple[str, Callable[[Any], None]]] = [
        ("to_record() + orjson.dumps", prime_rl),
        ("nodewise iterencode", iterencode),
        ("nodewise aiterencode", aiterencode),
    ]
    rows = []
    for way, run in ways:
        obj = _built(spec)
        c0 = time.process_time()
        with GcWatch() as watch:
            run(obj)
        rows.append(GcRow(way, time.process_time() - c0, watch.collections))
        del obj
    return rows


def gc_table(rows: list[GcRow]) -> str:
    headers = ["way", "CPU ms", "gen 0", "gen 1", "gen 2", "GC pause total ms", "longest ms"]
    body = [
        [
            r.way,
            _f(r.cpu * 1e3, 0),
            *(str(sum(g == gen for g, _ in r.collections)) for gen in range(3)),
            _f(sum(p for _, p in r.collections), 1),
            _f(max((p for _, p in r.collections), default=0.0), 1),
        ]
        for r in rows
    ]
    return table(headers, body)


# -- 3. through the monitors --------------------------------------------------------------


@dataclass
class MonitorRun:
    monitor: str
    scenario: str
    specs: list[Spec]
    nbytes: int = 0
    submitted: int = 0
    delivered: int = 0
    lost: dict[str, int] = field(default_factory=dict)
    degraded: dict[str, int] = field(default_factory=dict)
    slowest_log: float = 0.0
    wall: float = 0.0  # first log call to the end of finalize, minus building
    lag: LagStats = field(default_factory=lambda: LagStats.of([]))
    longest_step: float = 0.0  # ms
    lag_at_longest: float = 0.0  # ms
    free_ms: float = 0.0  # the longest time freeing one of the objects took, after the run
    collections: list[tuple[int, float]] = field(default_factory=list)
    check: str = ""
    error: str | None = None
    stalls: list[Stall] = field(default_factory=list)  # with --stalls


async def drive(
    monitor: Monitor, run: MonitorRun, *, stalls: bool = False, keep: bool = True
) -> None:
    """Start the monitor, log a fresh object of each spec (one ``log_episodes`` call each,
    subset "all"), finalize; the probe samples from the first log call to the end of
    finalize, paused while each object is built. ``keep``: the objects are kept until the
    probe has stopped, as a trainer holding its batch would (freeing one is an O(size) step on
    whichever thread drops the last reference, timed after: ``free_ms``); else each is dropped
    as soon as it is logged, so the monitor holds its last reference (PrimeMonitor, whose
    queue does, lets go of it a piece per step)."""
    watch = GcWatch()
    building = 0.0
    built: list[tuple[float, float]] = []  # when objects were built (no stall of ours)
    kept: list[Any] = []
    sampler = StallSampler(threshold_ms=STALL_MS) if stalls else None
    async with contextlib.AsyncExitStack() as stack:
        if sampler is not None:
            await stack.enter_async_context(sampler)
        probe = await stack.enter_async_context(LoopLagProbe())
        await monitor.start()
        first = len(probe.samples)
        start = time.perf_counter()
        try:
            with watch:
                for spec in run.specs:
                    probe.pause()
                    t0 = time.perf_counter()
                    seen = len(watch.collections)
                    obj = fresh_object(spec)
                    gc.collect()
                    del watch.collections[seen:]  # the build's, and the collect's own
                    building += time.perf_counter() - t0
                    built.append((t0, time.perf_counter()))
                    probe.resume()
                    await asyncio.sleep(0.002)  # a sample between episodes
                    t0 = time.perf_counter()
                    await monitor.log_episodes([obj], step=0, subset="all")
                    run.slowest_log = max(run.slowest_log, time.perf_counter() - t0)
                    run.nbytes += episode_bytes(spec)
                    if keep:
                        kept.append(obj)
                    del obj
        finally:
            await monitor.finalize()
        run.wall = time.perf_counter() - start - building
    if sampler is not None:
        run.stalls = [
            stall
            for stall in sampler.stalls
            if not any(a - 0.002 <= stall.start <= b for a, b in built)
        ]
    run.free_ms = -1.0 if not keep else 0.0
    while kept:
        c0 = time.thread_time()
        kept.pop()
        run.free_ms = max(run.free_ms, (time.thread_time() - c0) * 1e3)
    samples, running = probe.samples[first:], probe.running[first:]
    run.lag = LagStats.of(samples)
    if running:
        at = max(range(len(running)), key=running.__getitem__)
        run.longest_step, run.lag_at_longest = running[at], samples[at]
    run.collections = watch.collections
    stats = monitor.stats()
    run.submitted, run.delivered = stats.submitted, stats.delivered
    run.lost, run.degraded = dict(stats.lost), dict(stats.degraded)


def expected_line(spec: Spec, stamp: bool) -> bytes:
    record = fresh_object(spec).to_record()
    if stamp:
        record = stamp_run(record, RUN_ID, "train")
    return orjson.dumps(record)


def compare_lines(lines: Sequence[bytes], run: MonitorRun, stamp: bool) -> str:
    """Each stored line against ``orjson.dumps(to_record())`` of its episode (stamped with
    the run as PrimeMonitor stamps it), matched by the episode's id."""
    by_id: dict[str, bytes] = {}
    for stored in lines:
        by_id[orjson.loads(stored)["id"]] = stored
    problems = []
    for spec in run.specs:
        expected = expected_line(spec, stamp)
        episode_id = orjson.loads(expected)["id"]
        line = by_id.pop(episode_id, None)
        if line is None:
            problems.append(f"episode {spec} missing")
        elif line != expected:
            problems.append(_difference(f"episode {spec}", line, expected))
    if by_id:
        problems.append(f"{len(by_id)} unexpected lines")
    return "yes" if not problems else "no: " + "; ".join(problems)


async def file_run(run: MonitorRun, root: Path, stalls: bool) -> None:
    directory = root / run.scenario.replace(" ", "-")
    monitor = FileMonitor(directory, float_decimals=DECIMALS)
    await drive(monitor, run, stalls=stalls)
    reader = TraceReader(monitor.stream_dir, big_line=1 << 40)
    run.check = compare_lines([orjson.dumps(record) for record in reader], run, stamp=False)
    shutil.rmtree(directory, ignore_errors=True)


async def prime_run(run: MonitorRun, stalls: bool) -> None:
    async with TracesServer(api_key=KEY, keep_lines=True) as server:
        lower_priority(server.pid, SERVER_NICE)
        monitor = PrimeMonitor(
            api_key=KEY,
            traces_url=server.url,
            base_url=server.url,
            run_id=RUN_ID,
            float_decimals=DECIMALS,
        )
        await drive(monitor, run, stalls=stalls, keep=False)
        lines = await server.alines()
    run.check = compare_lines(lines, run, stamp=True)


def monitor_runs(cfg: Config, t0: float, *, stalls: bool = False) -> list[MonitorRun]:
    scenarios = [
        (f"{len(cfg.five)} episodes", [(size, 100 + i) for i, size in enumerate(cfg.five)]),
        (f"one {cfg.big / MB:g} MB", [(cfg.big, 200)]),
    ]
    runs = []
    root = Path(tempfile.mkdtemp(prefix="nodewise-objects-"))
    try:
        for name in ("FileMonitor", "PrimeMonitor"):
            for scenario, specs in scenarios:
                _log(t0, f"{name}: {scenario}")
                run = MonitorRun(name, scenario, specs)
                try:
                    if name == "FileMonitor":
                        asyncio.run(file_run(run, root, stalls))
                    else:
                        asyncio.run(prime_run(run, stalls))
                except Exception as exc:
                    run.error = f"{type(exc).__name__}: {exc}"
                    logging.getLogger("bench.objects").exception("%s, %s", name, scenario)
                runs.append(run)
                gc.collect()
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return runs


def _sizes(specs: Sequence[Spec]) -> str:
    return ", ".join(f"{size / MB:g}" for size, _ in specs)


def _gc(collections: Sequence[tuple[int, float]]) -> str:
    counts = "/".join(str(sum(g == gen for g, _ in collections)) for gen in range(3))
    return f"{counts} ({max((p for _, p in collections), default=0.0):.1f})"


def monitor_table(runs: list[MonitorRun], idle: LagStats) -> str:
    headers = [
        "monitor",
        "episodes (MB)",
        "delivered",
        "lost",
        "lag p50",
        "lag p99",
        "lag max",
        "lag n",
        "longest step of ours",
        "freeing an object",
        "slowest log",
        "wall s",
        "gc 0/1/2 (longest ms)",
        "bytes equal",
    ]
    rows = []
    for r in runs:
        if r.error is not None:
            rows.append([r.monitor, _sizes(r.specs), "CRASHED", r.error[:60], *[""] * 10])
            continue
        lost = ", ".join(f"{k}: {v}" for k, v in sorted(r.lost.items()) if v) or "-"
        rows.append(
            [
                r.monitor,
                _sizes(r.specs),
                f"{r.delivered} / {r.submitted}",
                lost,
                _f(r.lag.p50),
                _f(r.lag.p99),
                _f(r.lag.max),
                str(r.lag.count),
                _f(r.longest_step),
                _f(r.free_ms) if r.free_ms >= 0 else "by the monitor",
                _f(r.slowest_log * 1e3),
                _f(r.wall, 1),
                _gc(r.collections),
                "yes" if r.check == "yes" else "no",
            ]
        )
    rows.append(
        [
            "idle loop (reference)",
            "",
            "",
            "",
            _f(idle.p50),
            _f(idle.p99),
            _f(idle.max),
            str(idle.count),
            *[""] * 6,
        ]
    )
    return table(headers, rows, left=2)


# -- the report ---------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.objects", description=__doc__)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="1 and 6.4 MB only, one run each, the monitors with smaller episodes",
    )
    parser.add_argument(
        "--stalls",
        action="store_true",
        help=f"only the monitors, each stall of the loop over {STALL_MS:g} ms attributed "
        "(bench.stalls' sampler: a diagnosis, it loads the process a little)",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    t0 = time.perf_counter()
    if args.stalls:
        return stalls_main(cfg, t0)

    _log(t0, "warming up (imports, the maker's bodies)")
    warm = (16_000, 0)
    for run in METHODS.values():
        run(warm)
    docs = documents(cfg)
    results = []
    for doc in docs:
        _log(t0, f"{doc.name}: {doc.nbytes / MB:.1f} MB, checking bytes")
        check_doc(doc)
        _log(t0, f"{doc.name}: timing")
        time_doc(doc, cfg.runs)
        results.append(doc)
    _log(t0, f"garbage: {cfg.gc_bytes / MB:g} MB")
    garbage = gc_rows((cfg.gc_bytes, 0))
    idle = LagStats.of(measure_idle_lag(cfg.idle_seconds))
    runs = monitor_runs(cfg, t0)
    elapsed = time.perf_counter() - t0

    out = [
        f"nodewise on verifiers episode objects ({'quick' if args.quick else 'full'} run, "
        f"{elapsed:.0f} s): Python {platform.python_version()}, verifiers "
        f"{version('verifiers')}, pydantic {version('pydantic')}, orjson {orjson.__version__}, "
        f"{platform.machine()}",
        "",
        f"1. CPU ms (time.process_time, median of {cfg.runs}; float_decimals={DECIMALS} "
        "everywhere)",
        "",
        cpu_table(results),
        "",
        "- Each run: a fresh WireEpisode.model_validate(record) (record = EpisodeMaker(seed=1)"
        ".episode(size, index).to_record(fresh=True)), gc.collect(), then timed, the collector "
        "enabled; the mix sums its episodes, built and timed one at a time. to_record = "
        "obj.to_record(float_decimals=4), the record freed inside the timing; to_record + dumps "
        "= orjson.dumps(obj.to_record(float_decimals=4)) (prime-rl's way); iter = b''.join("
        "encoder.iterencode(obj, float_decimals=4)); aiter = encoder.aiterencode(obj, "
        "float_decimals=4) drained into a list inside asyncio.run (timed inside the loop); "
        "orjson.dumps = orjson.dumps(record) of a record built before the timing (the floor).",
        "- bytes equal: iterencode's and aiterencode's bytes == orjson.dumps(obj.to_record()) "
        "of the same object, every episode of the row once.",
        *cpu_targets(results),
        *(f"- MISMATCH in {d.name}: {d.check}" for d in results if d.check != "yes"),
        "",
        f"2. Garbage collections turning one {cfg.gc_bytes / MB:g} MB episode into bytes "
        "(one fresh object each, gc.callbacks)",
        "",
        gc_table(garbage),
        "",
        f"3. Through the monitors (float_decimals={DECIMALS}), one log_episodes call per episode",
        "",
        monitor_table(runs, idle),
        "",
        "- FileMonitor writes to a temporary directory (default settings: zstd sealing at "
        "finalize); PrimeMonitor uploads to a TracesServer on 127.0.0.1 in its own process (at "
        f"nice +{SERVER_NICE}), 8 requests in flight, no added network time.",
        "- lag p50/p99/max in ms, n samples: a task asking to wake every 1 ms, from the first "
        "log call to the end of finalize, paused while the next object is built (outside the "
        "monitors). longest step of ours: the most CPU time (ms, the loop thread's clock) the "
        "loop's thread ran between two of the probe's wake-ups, a bound on any one step the "
        "monitor (or a collection) took on the loop. freeing an object: the most CPU ms "
        "dropping the last reference to one of the run's objects took, after the run (the "
        "objects are kept alive until the probe stops, as a trainer holding its batch would, for "
        "FileMonitor; PrimeMonitor's are dropped once logged, its queue holding the last "
        "reference, and it lets go of them a piece per step; "
        "freed on the loop, that is a step of its own). slowest log: ms inside one log_episodes "
        "call (FileMonitor's awaits the write; PrimeMonitor's only queues). wall: first log to "
        "the end of finalize, minus building. gc: collections during it by generation, "
        "longest pause.",
        "- bytes equal: each written (read back with TraceReader) or stored (TracesServer "
        "keep_lines) line == orjson.dumps(obj.to_record()) of a fresh object of the same "
        "episode (for PrimeMonitor stamped with the run, prime_runs.sinks.stamp_run).",
    ]
    for r in runs:
        if r.error is not None:
            out.append(f"- CRASH {r.monitor}, {r.scenario}: {r.error}")
        if r.check not in ("yes", ""):
            out.append(f"- MISMATCH {r.monitor}, {r.scenario}: {r.check}")
        if r.degraded:
            out.append(f"- {r.monitor}, {r.scenario}: degraded {r.degraded}")
        if r.error is None and r.lost:
            out.append(f"- {r.monitor}, {r.scenario}: lost {r.lost}")
    print("\n".join(out))
    bad = any(d.check != "yes" for d in results) or any(
        r.error is not None or r.check != "yes" for r in runs
    )
    return 1 if bad else 0


def stalls_main(cfg: Config, t0: float) -> int:
    """``--stalls``: the monitor runs under ``bench.stalls``' sampler, each stall attributed."""
    idle = LagStats.of(measure_idle_lag(cfg.idle_seconds))
    runs = monitor_runs(cfg, t0, stalls=True)
    out = [
        f"nodewise on verifiers episode objects, the monitors under bench.stalls' sampler "
        f"({time.perf_counter() - t0:.0f} s)",
        "",
        monitor_table(runs, idle),
        "",
    ]
    for r in runs:
        found = [(f"{r.monitor}, {r.scenario}", stall) for stall in r.stalls]
        out += [f"{r.monitor}, {r.scenario}:", summary(found, threshold_ms=STALL_MS), ""]
    print("\n".join(out))
    return 1 if any(r.error is not None or r.check != "yes" for r in runs) else 0


if __name__ == "__main__":
    raise SystemExit(main())
