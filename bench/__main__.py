"""Benchmark of the ``encoder`` package against orjson, msgspec and the stdlib (``make bench``).

    python -m bench [--quick] [--json PATH]

Prints one table (fixed-width, valid Markdown) of throughput, ratios, event-loop lag and peak
memory per document, the targets with whether each was met, and a budget
sweep of ``aiterencode`` on the 60 MB episode. Numbers are medians of several runs on a noisy
machine: this is a report, nothing here asserts on time.

Every timed run encodes a freshly built (episodes) or freshly parsed (corpus) copy, because
orjson and msgspec cache a UTF-8 copy inside each non-ASCII ``str`` they encode; the copy is
made and ``gc.collect()`` run outside the timed region, with the collector left enabled.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import platform
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from importlib.metadata import version
from pathlib import Path
from typing import Any

import msgspec
import orjson

import encoder
from monitors.loadtest._measure import GcWatch

from . import memory
from .documents import MB, Document, Part, documents
from .lag import LagStats, LoopLagProbe, idle_lag

DEFAULT_JSON = Path(__file__).resolve().parent / "results" / "encoder.json"
BUDGETS = (0.0001, 0.00015, 0.00025, 0.0005, 0.001, 0.002)
BIG = 50 * MB  # documents at least this large get ``slow_runs`` of the slow peers


@dataclass(frozen=True)
class Config:
    runs: int  # timed runs per cell
    slow_runs: int  # json / json iter on documents of BIG or more
    lag_runs: int  # probe sessions per document
    batch_bytes: int  # a run or session encodes fresh copies of a small document up to this
    mix_episodes: int
    sweep_runs: int
    idle_seconds: float  # measured twice: at the start and at the end


FULL = Config(
    runs=5,
    slow_runs=3,
    lag_runs=5,
    batch_bytes=16 * MB,
    mix_episodes=20,
    sweep_runs=3,
    idle_seconds=2.0,
)
QUICK = Config(
    runs=3,
    slow_runs=1,
    lag_runs=2,
    batch_bytes=4 * MB,
    mix_episodes=6,
    sweep_runs=2,
    idle_seconds=1.0,
)

# -- the encoders ---------------------------------------------------------------------------

_json_kwargs: dict[str, Any] = {"ensure_ascii": False, "separators": (",", ":")}


def _orjson(v: Any) -> object:
    return orjson.dumps(v)


def _msgspec(v: Any) -> object:
    return msgspec.json.encode(v)


def _json(v: Any) -> object:
    return json.dumps(v, **_json_kwargs).encode()


def _json_iter(v: Any) -> object:
    return "".join(json.JSONEncoder(**_json_kwargs).iterencode(v)).encode()


def _encode(v: Any) -> object:
    return encoder.encode(v)


def _iter(v: Any) -> object:
    # Chunks collected as a sink would take them (as aiter does): a streaming encoder's
    # output is never joined into one bytes, so no 50 MB join is timed.
    return list(encoder.iterencode(v))


def _timed(fn: Callable[[Any], object]) -> Callable[[Sequence[Any]], float]:
    def run(values: Sequence[Any]) -> float:
        gc.collect()
        t0 = time.perf_counter()
        for v in values:
            fn(v)
        return time.perf_counter() - t0

    return run


async def _aiter_timed(values: Sequence[Any], budget: float) -> float:
    t0 = time.perf_counter()
    for v in values:
        chunks: list[bytes] = []
        async for chunk in encoder.aiterencode(v, budget=budget):
            chunks.append(chunk)
        del chunks
    return time.perf_counter() - t0


def _aiter(values: Sequence[Any], budget: float = encoder.DEFAULT_BUDGET) -> float:
    gc.collect()
    return asyncio.run(_aiter_timed(values, budget))


ENCODERS: dict[str, Callable[[Sequence[Any]], float]] = {
    "orjson": _timed(_orjson),
    "msgspec": _timed(_msgspec),
    "json": _timed(_json),
    "json iter": _timed(_json_iter),
    "encode": _timed(_encode),
    "iter": _timed(_iter),
    "aiter": _aiter,
}
SLOW = frozenset({"json", "json iter"})
OURS = ("encode", "iter", "aiter")


def warm_up() -> None:
    """First calls import and cache things (anyio's asyncio backend: ~70 ms): not timed."""
    tiny = {"a": ["\u00e9" * 10, 1.5, list(range(5000))], "b": "x" * 100_000}
    for run in ENCODERS.values():
        run([tiny])
    _aiter([tiny], budget=1e-9)  # a checkpoint after every piece


# -- measurements ---------------------------------------------------------------------------


@dataclass
class LagResult:
    stats: LagStats
    sessions: int
    seconds: list[float]  # per session, parts summed
    gc: dict[str, Any]


@dataclass
class Result:
    doc: Document
    seconds: dict[str, list[float]] = field(default_factory=dict)  # per run, all parts summed
    lag: LagResult | None = None
    mem: dict[str, dict[str, float | None]] = field(default_factory=dict)

    def median(self, name: str) -> float:
        return statistics.median(self.seconds[name])

    def mbps(self, name: str) -> float:
        return self.doc.nbytes / MB / self.median(name)

    def ratio(self, name: str, peer: str = "orjson") -> float:
        """Our throughput over the peer's (time of peer / time of ours)."""
        return self.median(peer) / self.median(name)


def copies(doc: Document, cfg: Config) -> int:
    """Fresh copies of a small single-part document encoded back to back in one timed run or
    lag session (about ``batch_bytes``), so it measures a program encoding many such documents,
    not one call after ``gc.collect()`` has left the caches cold."""
    if len(doc.parts) > 1:
        return 1
    return max(1, round(cfg.batch_bytes / doc.nbytes))


def time_document(doc: Document, cfg: Config) -> dict[str, list[float]]:
    """Interleaved rounds: each round times every encoder once on fresh copies of every part
    (a batch of them for a small document; time per copy), starting at a different encoder
    each round."""
    names = list(ENCODERS)
    n_copies = copies(doc, cfg)
    runs = {n: cfg.slow_runs if n in SLOW and doc.nbytes >= BIG else cfg.runs for n in names}
    seconds: dict[str, list[float]] = {n: [] for n in names}
    for r in range(max(runs.values())):
        order = names[r % len(names) :] + names[: r % len(names)]
        totals = dict.fromkeys(names, 0.0)
        for part in doc.parts:
            for n in order:
                if r < runs[n]:
                    values = [part.build() for _ in range(n_copies)]
                    totals[n] += ENCODERS[n](values) / n_copies
                    del values
        for n in names:
            if r < runs[n]:
                seconds[n].append(totals[n])
    return seconds


async def _null_sink(chunk: bytes) -> None:
    return None


async def _lag_session(values: Sequence[Any], probe: LoopLagProbe, budget: float) -> float:
    """Stream each value through ``aiterencode`` to a no-op async sink under the probe."""
    t0 = time.perf_counter()
    async with probe:
        for i, v in enumerate(values):
            if i:
                await asyncio.sleep(0)  # between records, as a sink doing real I/O would
            async for chunk in encoder.aiterencode(v, budget=budget):
                await _null_sink(chunk)
    return time.perf_counter() - t0


def lag_document(doc: Document, cfg: Config, budget: float, sessions: int) -> LagResult:
    """Loop lag while ``aiterencode`` encodes the document, pooled over ``sessions``.

    A session encodes one fresh copy of each part (one ``asyncio.run`` per part); a small
    single-part document is encoded as a batch of fresh copies of about ``batch_bytes``,
    all built before the probe starts.
    """
    probe = LoopLagProbe()
    per_session: list[float] = []
    n_copies = copies(doc, cfg)
    collections: list[tuple[int, float]] = []  # during the sessions, not the builds
    for _ in range(sessions):
        total = 0.0
        for part in doc.parts:
            values = [part.build() for _ in range(n_copies)]
            gc.collect()
            with GcWatch() as watch:
                total += asyncio.run(_lag_session(values, probe, budget))
            collections += watch.collections
            del values
        per_session.append(total)
    gcs = {
        "collections_by_generation": [sum(g == gen for g, _ in collections) for gen in range(3)],
        "longest_pause_ms": max((pause for _, pause in collections), default=0.0),
    }
    return LagResult(probe.stats(), sessions, per_session, gcs)


def memory_document(doc: Document) -> dict[str, dict[str, float | None]]:
    """Extra peak memory per way of encoding, each in a fresh subprocess (see bench.memory);
    for the mix, its largest episode."""
    part: Part = doc.largest()
    return {m: memory.measure(part, m) for m in memory.METHODS}


@dataclass
class SweepRow:
    budget: float
    lag: LagResult
    mbps: float  # without the probe
    mbps_probe: float  # with the probe running


def budget_sweep(doc: Document, cfg: Config) -> list[SweepRow]:
    rows = []
    for budget in BUDGETS:
        plain: list[float] = []
        for _ in range(cfg.sweep_runs):
            total = 0.0
            for part in doc.parts:
                total += _aiter([part.build()], budget)
            plain.append(total)
        lag = lag_document(doc, cfg, budget, cfg.sweep_runs)
        rows.append(
            SweepRow(
                budget,
                lag,
                doc.nbytes / MB / statistics.median(plain),
                doc.nbytes / MB / statistics.median(lag.seconds),
            )
        )
    return rows


# -- output ---------------------------------------------------------------------------------


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], left: int = 1) -> str:
    """A fixed-width table that is also valid Markdown; the first ``left`` columns are
    left-aligned, the rest right-aligned."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:
        padded = [
            c.ljust(w) if i < left else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ]
        return "| " + " | ".join(padded) + " |"

    rule = ["-" * w if i < left else "-" * (w - 1) + ":" for i, w in enumerate(widths)]
    return "\n".join([line(headers), line(rule), *(line(r) for r in rows)])


def _f(x: float | None, digits: int = 2) -> str:
    return "" if x is None or x != x else f"{x:.{digits}f}"


def _mem(cell: dict[str, float | None] | None) -> str:
    if not cell:
        return ""
    return f"{_f(cell.get('rss_mib'), 1) or 'n/a'} / {_f(cell.get('traced_mib'), 1)}"


def _mem_worst(cell: dict[str, float | None]) -> float:
    """The larger of the two measures (RSS may be unavailable)."""
    return max(v for v in cell.values() if v is not None)


def main_table(results: list[Result], idle: LagStats) -> str:
    headers = [
        "document",
        "MB",
        "orjson",
        "msgspec",
        "json",
        "json iter",
        "encode",
        "iter",
        "aiter",
        "encode/orjson",
        "iter/orjson",
        "aiter/orjson",
        "iter vs json iter",
        "aiter vs json iter",
        "orjson vs json iter",
        "lag p50",
        "lag p99",
        "lag max",
        "lag n",
        "mem orjson",
        "mem iter",
        "mem aiter",
    ]
    rows = []
    for res in results:
        lag = res.lag.stats if res.lag else None
        rows.append(
            [
                res.doc.name,
                _f(res.doc.nbytes / MB, 1 if res.doc.nbytes >= MB else 3),
                *(f"{res.mbps(n):.0f}" for n in ENCODERS),
                *(f"{res.ratio(n):.2f}x" for n in OURS),
                f"{res.ratio('iter', 'json iter'):.1f}x",
                f"{res.ratio('aiter', 'json iter'):.1f}x",
                f"{res.ratio('orjson', 'json iter'):.1f}x",
                _f(lag.p50 if lag else None),
                _f(lag.p99 if lag else None),
                _f(lag.max if lag else None),
                str(lag.count) if lag else "",
                *(_mem(res.mem.get(m)) for m in memory.METHODS),
            ]
        )
    blank = [""] * (len(headers) - 8)
    idle_lag_cells = [_f(idle.p50), _f(idle.p99), _f(idle.max), str(idle.count)]
    rows.append(["idle loop (reference)", *blank, *idle_lag_cells, "", "", ""])
    return table(headers, rows)


@dataclass
class Target:
    what: str
    goal: str
    values: dict[str, str]  # driver -> measured value
    met: dict[str, bool | None]  # driver -> met (None: does not apply)


def targets(results: list[Result]) -> list[Target]:
    by_kind = {k: [r for r in results if r.doc.kind == k] for k in ("episode", "mix", "corpus")}
    big = next(r for r in by_kind["episode"] if r.doc.nbytes >= BIG)
    drivers = ("iter", "aiter")

    def ratio(what: str, rows: list[Result], minimum: float, peer: str) -> Target:
        values: dict[str, str] = {}
        met: dict[str, bool | None] = {}
        for d in drivers:
            value, name = min((r.ratio(d, peer), r.doc.name) for r in rows)
            digits = 2 if peer == "orjson" else 1
            values[d] = f"{value:.{digits}f}x" + (f" ({name})" if len(rows) > 1 else "")
            met[d] = value >= minimum
        return Target(what, f">= {minimum:g}x", values, met)

    lag = big.lag.stats if big.lag else LagStats.of([])
    blocking = "n/a (blocking)"
    return [
        ratio("throughput vs orjson, production mix", by_kind["mix"], 0.9, "orjson"),
        ratio("throughput vs orjson, each of 1 / 6.4 / 60 MB", by_kind["episode"], 0.75, "orjson"),
        ratio("throughput vs orjson, each corpus file", by_kind["corpus"], 0.5, "orjson"),
        Target(
            "loop lag p99, 60 MB episode, default budget",
            "<= 1.5 ms",
            {"iter": blocking, "aiter": f"{lag.p99:.2f} ms"},
            {"iter": None, "aiter": lag.p99 <= 1.5},
        ),
        Target(
            "loop lag max, 60 MB episode, default budget",
            "<= 3 ms",
            {"iter": blocking, "aiter": f"{lag.max:.2f} ms"},
            {"iter": None, "aiter": lag.max <= 3.0},
        ),
        Target(
            "extra peak memory streaming 60 MB (RSS / traced)",
            "<= 16 MiB",
            {d: f"{_mem(big.mem[d])} MiB" for d in drivers},
            {d: bool(_mem_worst(big.mem[d]) <= 16) for d in drivers},
        ),
    ]


def _verdict(met: bool | None) -> str:
    return "-" if met is None else ("met" if met else "NOT met")


def targets_table(ts: list[Target]) -> str:
    headers = ["target", "goal", "iterencode", "", "aiterencode", ""]
    rows = [
        [
            t.what,
            t.goal,
            t.values["iter"],
            _verdict(t.met["iter"]),
            t.values["aiter"],
            _verdict(t.met["aiter"]),
        ]
        for t in ts
    ]
    return table(headers, rows, left=2)


def sweep_table(rows: list[SweepRow], idle: LagStats) -> str:
    headers = [
        "budget",
        "lag p50",
        "lag p99",
        "lag max",
        "lag n",
        "aiter MB/s",
        "MB/s with probe",
        "gc (gen 0/1/2)",
    ]
    body = []
    for r in rows:
        default = " (default)" if r.budget == encoder.DEFAULT_BUDGET else ""
        stats = r.lag.stats
        body.append(
            [
                f"{r.budget * 1000:g} ms{default}",
                _f(stats.p50),
                _f(stats.p99),
                _f(stats.max),
                str(stats.count),
                f"{r.mbps:.0f}",
                f"{r.mbps_probe:.0f}",
                "/".join(map(str, r.lag.gc["collections_by_generation"])),
            ]
        )
    body.append(
        ["idle loop", _f(idle.p50), _f(idle.p99), _f(idle.max), str(idle.count), "", "", ""]
    )
    return table(headers, body)


def footer(cfg: Config, results: list[Result]) -> list[str]:
    big = next(r for r in results if r.doc.kind == "episode" and r.doc.nbytes >= BIG)
    gcs = big.lag.gc if big.lag else {"collections_by_generation": [], "longest_pause_ms": 0.0}
    return [
        "- MB = 10^6 bytes of orjson output (all episodes summed for the mix). orjson .. aiter: "
        f"MB/s, median of {cfg.runs} runs per cell ({cfg.slow_runs} for json and json iter on "
        f"documents of {BIG // MB} MB or more), rounds interleaved; each run encodes a freshly "
        "built episode or a corpus file freshly parsed with orjson.loads, gc.collect() before "
        "the timing, GC enabled during it. A single document smaller than "
        f"{cfg.batch_bytes // MB} MB is timed as a batch of fresh copies (~{cfg.batch_bytes // MB}"
        " MB) encoded back to back, time per copy: one call of 50 us right after gc.collect() "
        "measures cold caches more than the encoder.",
        "- json = json.dumps(v, ensure_ascii=False, separators=(',', ':')).encode(); json iter = "
        "''.join(json.JSONEncoder(same).iterencode(v)).encode() (the pure-Python streaming "
        "encoder). encode = encoder.encode; iter = list(encoder.iterencode(v)); aiter = "
        "chunks of encoder.aiterencode(v) appended to a list, timed inside asyncio.run.",
        "- x/orjson = orjson time / our time (higher is better); vs json iter = stdlib "
        "iterencode time / our time; orjson vs json iter is the ceiling of that ratio.",
        "- lag p50/p99/max in ms, n samples: a task sleeping 1 ms on the same asyncio loop while "
        f"aiterencode (default budget {encoder.DEFAULT_BUDGET * 1000:g} ms) streams the "
        f"document to an async sink that does nothing; pooled over {cfg.lag_runs} sessions; "
        f"a small document is encoded as a batch of fresh copies (~{cfg.batch_bytes // MB} "
        "MB) per session with one asyncio.sleep(0) between copies. The idle row is the same "
        f"probe on an empty loop ({cfg.idle_seconds:g} s at the start and at the end of the run)."
        f" GC during the 60 MB lag sessions: collections by generation "
        f"{gcs['collections_by_generation']}, longest pause {gcs['longest_pause_ms']:.2f} ms.",
        "- mem: extra peak memory in MiB, 'RSS / traced', each in a fresh subprocess "
        "(bench/memory.py), the document built first: RSS = VmHWM (reset through "
        "/proc/self/clear_refs, after malloc_trim) minus VmRSS before the call, what was really "
        "touched; traced = "
        "tracemalloc peak minus traced memory before, on another fresh copy, which counts "
        "allocated but untouched capacity (orjson reserves its output buffer ahead of what it "
        "writes). orjson keeps its whole output; iter/aiter stream to a sink that drops each "
        "chunk; both "
        "include the UTF-8 copies cached inside non-ASCII strs. For the mix: its largest "
        "episode. Targets use the larger of the two.",
    ]


def _log(t0: float, message: str) -> None:
    print(f"[{time.perf_counter() - t0:6.1f}s] {message}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer runs and a smaller mix")
    parser.add_argument(
        "--json",
        type=Path,
        default=DEFAULT_JSON,
        metavar="PATH",
        help=f"also write the results here (default: {DEFAULT_JSON})",
    )
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    t0 = time.perf_counter()

    warm_up()
    _log(t0, "idle loop lag (start)")
    idle_samples = asyncio.run(idle_lag(cfg.idle_seconds))
    _log(t0, "building documents (the first builds make the episode bodies)")
    docs = documents(cfg.mix_episodes)
    results = []
    for doc in docs:
        _log(t0, f"{doc.name}: {doc.nbytes / MB:.1f} MB, timing")
        res = Result(doc, seconds=time_document(doc, cfg))
        _log(t0, f"{doc.name}: loop lag")
        res.lag = lag_document(doc, cfg, encoder.DEFAULT_BUDGET, cfg.lag_runs)
        _log(t0, f"{doc.name}: peak memory")
        res.mem = memory_document(doc)
        results.append(res)
    big = next(d for d in docs if d.kind == "episode" and d.nbytes >= BIG)
    _log(t0, f"budget sweep on {big.name}")
    sweep = budget_sweep(big, cfg)
    _log(t0, "idle loop lag (end)")
    idle_samples += asyncio.run(idle_lag(cfg.idle_seconds))
    idle = LagStats.of(idle_samples)
    ts = targets(results)
    elapsed = time.perf_counter() - t0

    lines = [
        f"nodewise encoder benchmark ({'quick' if args.quick else 'full'} run, "
        f"{elapsed:.0f} s): Python {platform.python_version()}, orjson {orjson.__version__}, "
        f"msgspec {msgspec.__version__}, {platform.machine()}",
        "",
        main_table(results, idle),
        "",
        *footer(cfg, results),
        "",
        targets_table(ts),
        "",
        f"aiterencode budget sweep on the {big.name} ({big.nbytes / MB:.1f} MB): lag as above, "
        f"{cfg.sweep_runs} sessions per budget; MB/s is the median of {cfg.sweep_runs} runs "
        "without the probe, and of the probe sessions with it; gc = collections during the "
        "probe sessions.",
        "",
        sweep_table(sweep, idle),
    ]
    print("\n".join(lines))

    payload = {
        "mode": "quick" if args.quick else "full",
        "elapsed_s": elapsed,
        "config": cfg.__dict__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": {p: version(p) for p in ("orjson", "msgspec", "anyio", "numpy")},
        "default_budget_s": encoder.DEFAULT_BUDGET,
        "idle_lag_ms": idle.__dict__,
        "documents": [
            {
                "name": r.doc.name,
                "kind": r.doc.kind,
                "parts": [p.spec for p in r.doc.parts],
                "bytes": r.doc.nbytes,
                "part_bytes": r.doc.sizes,
                "seconds": r.seconds,
                "mb_per_s": {n: r.mbps(n) for n in ENCODERS},
                "ratio_to_orjson": {n: r.ratio(n) for n in OURS},
                "x_vs_json_iter": {n: r.ratio(n, "json iter") for n in ("iter", "aiter")},
                "lag_ms": r.lag.stats.__dict__ if r.lag else None,
                "lag_sessions": r.lag.sessions if r.lag else 0,
                "lag_gc": r.lag.gc if r.lag else None,
                "extra_peak_mib": r.mem,
            }
            for r in results
        ],
        "targets": [t.__dict__ for t in ts],
        "budget_sweep": [
            {
                "budget_s": s.budget,
                "lag_ms": s.lag.stats.__dict__,
                "lag_gc": s.lag.gc,
                "mb_per_s": s.mbps,
                "mb_per_s_with_probe": s.mbps_probe,
            }
            for s in sweep
        ],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    _log(t0, f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
