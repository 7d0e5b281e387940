"""Benchmark of the trace browser (``nodewise traces serve``) against issue 38's targets.

    python -m bench.browser [--run DIR] [--episodes N] [--rows N] [--quick] [--json PATH]
                            [--stalls] [--profile PATH] [--write-mb-s X]

Three runs, served by one server (``bench.browser_server``: the app ``make_app`` builds, run
by aiohttp's ``AppRunner`` in its own process with a ``LoopLagProbe`` on its loop):

- **production**: the production load test's run, written as it writes it
  (``monitors.loadtest.run_loadtest`` with the file monitor alone: ``N`` episodes of
  ``EpisodeMaker``'s lognormal sizes, default 1,000, ~8.5 GB with two at the 60 MB cap,
  5 GiB chunks that roll and seal). ``--run DIR`` keeps it in ``DIR`` and reuses it on the
  next call (writing it takes minutes; name a scratch directory, never the repository): a
  run directory given as ``DIR`` is read as it is.
- **synthetic**: an index of ``--rows`` rows (default 100,000) written directly, shaped as
  ``_summary.episode_row`` and the writer make them, with varied step, kind, env, reward,
  advantage, tokens and errors; they point, in order, at 16 small real records of one chunk
  (FileMonitor wrote them; offsets repeat).
- **live**: a run a writer process (this module, ``--writer``) appends production-sized
  episodes to at ``--write-mb-s`` (default 30 MB/s: a step of 1,000 episodes every ~5
  minutes), with 256 MiB chunks, so chunks roll and seal while the server serves.

Then, in order, with the server's RSS sampled every 50 ms by a thread of this process:

1. reading the indexes: from the server's start until ``/status`` counts every row of the
   production and synthetic runs (the time and the loop's lag meanwhile);
2. the idle server: ``--idle-seconds`` with no request and no writer (its loop's own lag);
3. the writer starts; while it writes (and a task polls the live run's status and first
   page every 2 s, as the page does): the first page sorted by reward on the synthetic run
   (the first list request the server gets), again warm, filtered by kind and env, at a deep
   offset, and on the production run; the outline of the production run's largest episode,
   first open then cached; and ~50 of its nodes, its largest included, one request each;
   then the writer and the polls go on until 30 s have passed since it started;
4. the writer stops, then the server; its lag samples are split by phase.

Each request is timed by the client (send to last body byte read, over loopback) and by the
server (a middleware around the handler). Lag is judged as docs/design.md judges it on these
shared machines: p99 against the idle loop, and every sample over 5 ms attributed by where the
server's CPU went meanwhile: the loop's thread on its CPU clock for at least half of it (the
server's own code held the loop), else the server's other threads (a worker holding the GIL),
else neither (the machine ran something else). ``--stalls`` adds ``bench.stalls``' sampler in the
server (the loop's stack at each stall over 8 ms; it adds load: diagnosis, not numbers), and
``--profile PATH`` cProfiles the server, printing the top functions.

Prints one Markdown table with each target and whether it was met, then the details;
``--json`` (default ``bench/results/browser.json``) has the raw numbers. A report from a
shared 2-core machine: nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import json
import os
import platform
import pstats
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

import aiohttp

from monitors import FileMonitor
from monitors.lag import LagStats
from monitors.loadtest import LoadtestConfig, run_loadtest
from monitors.testing.episodes import EpisodeMaker, lognormal_sizes
from monitors.traces._index import count_rows, iter_rows
from monitors.traces._layout import RUN_STREAM, encode_row, index_path, scan

from .__main__ import _f, _log, table
from .browser_server import vm_hwm

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "bench" / "results" / "browser.json"
MB = 1_000_000
MIB = 2**20
#: Written beside a production run this bench wrote, once it is whole.
MARKER = "bench-browser-run.json"
#: The targets (issue 38), in ms and bytes.
FIRST_PAGE_MS = 300.0
OUTLINE_MS = 1000.0
OUTLINE_CACHED_MS = 50.0
NODE_MS = 100.0
RSS_BYTES = 300 * MIB
LAG_MS = 5.0
#: Small real records the synthetic rows point at.
SYNTHETIC_RECORDS = 16
ENVS = ("math-python", "wiki-search", "swe-lite", "code-contests", "tool-use", "long-context")
#: The page polls a live run's status this often (seconds).
POLL_S = 2.0
RSS_EVERY_S = 0.05


@dataclass(frozen=True)
class Config:
    episodes: int
    rows: int
    nodes: int  # node requests on the largest episode
    cached: int  # outline requests after the first
    warm: int  # repeats of the sorted first page
    idle_seconds: float
    serve_seconds: float  # the writer and the page's polls go on at least this long
    write_mb_s: float
    live_chunk_bytes: int
    #: Episode sizes of the production run and of the live writer: (median, p90, cap);
    #: None: production's.
    sizes: tuple[int, int, int] | None
    chunk_bytes: int | None  # the production run's (None: the default 5 GiB)


FULL = Config(
    episodes=1_000,
    rows=100_000,
    nodes=50,
    cached=10,
    warm=5,
    idle_seconds=3.0,
    serve_seconds=30.0,
    write_mb_s=30.0,
    live_chunk_bytes=256 * MIB,
    sizes=None,
    chunk_bytes=None,
)
QUICK = Config(
    episodes=6,
    rows=1_000,
    nodes=10,
    cached=3,
    warm=2,
    idle_seconds=0.5,
    serve_seconds=0.0,
    write_mb_s=2.0,
    live_chunk_bytes=400_000,
    sizes=(60_000, 200_000, 600_000),
    chunk_bytes=500_000,
)


# -- the runs ---------------------------------------------------------------------------


def _size_options(cfg: Config) -> dict[str, int]:
    if cfg.sizes is None:
        return {}
    median, p90, cap = cfg.sizes
    return {"size_median": median, "size_p90": p90, "size_cap": cap}


def production_run(directory: Path, cfg: Config) -> tuple[Path, bool]:
    """The production-like run in ``directory``: reused when it holds one (a run directory
    itself, or one this bench finished writing), else written there by the load test's own
    code. Returns the run's directory and whether it was written now."""
    if (directory / RUN_STREAM).is_dir():
        return directory, False
    run = directory / "file"  # where run_loadtest puts the file monitor's run
    if (directory / MARKER).exists() and (run / RUN_STREAM).is_dir():
        return run, False
    if directory.exists() and any(directory.iterdir()):
        raise SystemExit(
            f"bench.browser: {directory} holds something that is not a finished run "
            "(an interrupted write?): remove it, or name another directory"
        )
    options: dict[str, Any] = _size_options(cfg)
    if cfg.chunk_bytes is not None:
        options["chunk_bytes"] = cfg.chunk_bytes
    config = LoadtestConfig(
        monitors=("file",), episodes=cfg.episodes, out=directory, progress=False, **options
    )
    t0 = time.perf_counter()
    report = asyncio.run(run_loadtest(config))
    result = report.result("file")
    if not result.all_delivered:
        raise SystemExit(f"bench.browser: the load test lost records: {result.lost}")
    (directory / MARKER).write_text(
        json.dumps(
            {
                "episodes": cfg.episodes,
                "json_bytes": report.json_bytes,
                "seconds": time.perf_counter() - t0,
            }
        )
    )
    return run, True


async def _write_records(run: Path, sizes: Sequence[int], *, seed: int) -> None:
    maker = EpisodeMaker(seed=seed)
    monitor = FileMonitor(run)
    await monitor.start()
    for i, size in enumerate(sizes):
        await monitor.log_episodes([maker.episode(size, index=i)], step=0, subset="all")
    await monitor.finalize()


def synthetic_run(run: Path, rows: int, *, seed: int = 5) -> None:
    """A run whose index has ``rows`` rows pointing, in order, at ``SYNTHETIC_RECORDS`` small
    real records (FileMonitor writes those; their rows are the templates)."""
    rng = random.Random(seed)
    sizes = [int(20_000 * 1.25**k) for k in range(SYNTHETIC_RECORDS)]  # 20 kB .. ~570 kB
    asyncio.run(_write_records(run, sizes, seed=seed))
    path = index_path(run / RUN_STREAM)
    templates = [dict(row.fields) for _, row in iter_rows(path)]
    group = ""
    with open(path, "wb") as f:
        for n in range(rows):
            fields = dict(templates[n * len(templates) // rows])
            if n % 8 == 0:
                group = f"{rng.getrandbits(128):032x}"
            errors = rng.choice((1, 2, 5)) if rng.random() < 0.03 else 0
            inputs = int(rng.lognormvariate(8.5, 1.0))
            fields.update(
                line=n + 1,
                step=n // 1_000,
                id=f"{n:08x}{rng.getrandbits(96):024x}",
                kind="eval" if rng.random() < 0.15 else "train",
                env=rng.choice(ENVS),
                group=group,
                ok=errors == 0,
                num_errors=errors,
                reward=None if rng.random() < 0.05 else round(rng.betavariate(2, 3) * 1.2, 5),
                advantage=None if rng.random() < 0.1 else round(rng.gauss(0, 0.3), 5),
                input_tokens=inputs,
                output_tokens=int(inputs * rng.uniform(0.2, 3.0)),
                turns=rng.randint(1, 40),
                duration=round(rng.uniform(2, 600), 3),
            )
            f.write(encode_row(fields))


# -- the writer process -----------------------------------------------------------------


async def write_live(run: Path, cfg: Config, *, seed: int = 11) -> dict[str, Any]:
    """Append episodes to ``run`` at ``cfg.write_mb_s``: one small episode, ``ready`` on
    stdout, then on a ``go`` line on stdin episodes until a ``stop`` line (or EOF)."""
    loop = asyncio.get_running_loop()
    go, stop = asyncio.Event(), asyncio.Event()

    def commands() -> None:
        for line in sys.stdin:
            if line.strip() == "go":
                loop.call_soon_threadsafe(go.set)
            elif line.strip() == "stop":
                break
        loop.call_soon_threadsafe(go.set)
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=commands, name="commands", daemon=True).start()
    maker = EpisodeMaker(seed=seed)
    sizes = lognormal_sizes(
        10_000,
        seed=seed,
        **(
            {} if cfg.sizes is None else dict(zip(("median", "p90", "cap"), cfg.sizes, strict=True))
        ),
    )
    monitor = FileMonitor(run, chunk_bytes=cfg.live_chunk_bytes)
    await monitor.start()
    await monitor.log_episodes([maker.episode(20_000, index=0)], step=0, subset="all")
    await monitor.log_metrics({"loss": 1.0, "reward": 0.0}, step=0)
    print("ready", flush=True)
    await go.wait()
    written = episodes = 0
    t0 = time.perf_counter()
    for i, size in enumerate(sizes, start=1):
        if stop.is_set():
            break
        episode = maker.episode(size, index=i)
        step = 1 + (i - 1) // 16
        await monitor.log_episodes([episode], step=step, subset="all")
        written += episode.size
        episodes += 1
        if i % 16 == 0:
            await monitor.log_metrics(
                {"loss": 1.0 / step, "reward": min(1.0, step / 50)}, step=step
            )
        ahead = written / (cfg.write_mb_s * MB) - (time.perf_counter() - t0)
        if ahead > 0:
            with_stop = asyncio.ensure_future(stop.wait())
            await asyncio.wait([with_stop], timeout=ahead)
            with_stop.cancel()
    seconds = time.perf_counter() - t0
    before = scan(run / RUN_STREAM)  # finalize seals the live chunk too
    await monitor.finalize()
    stats = monitor.stats()
    return {
        "chunks": {"sealed": len(before.sealed), "plain": len(before.plain)},
        "episodes": episodes,
        "bytes": written,
        "seconds": seconds,
        "delivered": stats.delivered,
        "submitted": stats.submitted,
    }


class Writer:
    """The writer process: ``start()`` has it create the live run, ``go()`` starts the
    episodes, ``stop()`` finalizes it and returns what it wrote."""

    def __init__(self, run: Path, *, quick: bool, write_mb_s: float) -> None:
        command = [sys.executable, "-m", "bench.browser", "--writer", str(run)]
        command += ["--write-mb-s", str(write_mb_s)] + (["--quick"] if quick else [])
        self.proc = subprocess.Popen(
            command, cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.started = self.stopped = 0.0

    def ready(self) -> None:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if line.strip() != "ready":
            self.proc.kill()
            raise SystemExit(f"bench.browser: the writer did not start ({line!r})")

    def _say(self, word: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(word + "\n")
        self.proc.stdin.flush()

    def go(self) -> None:
        self.started = time.perf_counter()
        self._say("go")

    def stop(self) -> dict[str, Any]:
        self.stopped = time.perf_counter()
        self._say("stop")
        out, _ = self.proc.communicate(timeout=600)
        if self.proc.returncode != 0:
            raise SystemExit(f"bench.browser: the writer failed (exit {self.proc.returncode})")
        result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


# -- the server process -----------------------------------------------------------------


class Server:
    """``bench.browser_server`` in its own process; ``stop()`` returns its measurements."""

    def __init__(
        self, runs: Sequence[Path], work: Path, *, stalls: bool, profile: Path | None
    ) -> None:
        self.out = work / "server.json"
        command = [sys.executable, "-m", "bench.browser_server", "--out", str(self.out)]
        command += (["--stalls"] if stalls else []) + (
            ["--profile", str(profile)] if profile else []
        )
        self.spawned = time.perf_counter()
        self.proc = subprocess.Popen(
            [*command, *map(str, runs)], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("{"):
            self.proc.kill()
            raise SystemExit(f"bench.browser: the server did not start ({line!r})")
        hello = json.loads(line)
        self.url: str = hello["url"]
        self.pid: int = hello["pid"]
        self.listening: float = hello["listening"]
        self.started: float = hello["started"]

    def stop(self) -> dict[str, Any]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.communicate(timeout=120)
        if self.proc.returncode != 0:
            raise SystemExit(f"bench.browser: the server failed (exit {self.proc.returncode})")
        result: dict[str, Any] = json.loads(self.out.read_text())
        return result

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.communicate()


class RssWatch:
    """Samples a process's RSS (VmRSS) every ``RSS_EVERY_S`` in a thread: the largest, and
    how many samples."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.peak = 0
        self.count = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="rss", daemon=True)

    def _run(self) -> None:
        pattern = re.compile(rb"^VmRSS:\s+(\d+)\s+kB", re.MULTILINE)
        while not self._stop.wait(RSS_EVERY_S):
            try:
                with open(f"/proc/{self.pid}/status", "rb") as f:
                    found = pattern.search(f.read())
            except OSError:
                return
            if found:
                self.peak = max(self.peak, int(found.group(1)) * 1024)
                self.count += 1

    def __enter__(self) -> RssWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# -- the client -------------------------------------------------------------------------


@dataclass
class Timed:
    """One request: what it asked, how long the client waited for the whole body (ms)."""

    name: str
    path: str
    start: float
    ms: float
    bytes: int
    status: int
    server_ms: float | None = None  # the handler's wall time, as the server saw it
    server_cpu_ms: float | None = None


@dataclass
class Measured:
    runs: dict[str, dict[str, Any]] = field(default_factory=dict)
    requests: list[Timed] = field(default_factory=list)
    index_read_s: dict[str, float] = field(default_factory=dict)  # from the server's start
    index_read_listening_s: dict[str, float] = field(default_factory=dict)
    phases: dict[str, tuple[float, float]] = field(default_factory=dict)
    largest: dict[str, Any] = field(default_factory=dict)
    nodes: list[dict[str, Any]] = field(default_factory=list)
    first_versions: dict[str, Any] = field(default_factory=dict)
    live: list[tuple[float, int]] = field(default_factory=list)  # (time, rows the server saw)

    def named(self, name: str) -> list[Timed]:
        return [r for r in self.requests if r.name == name]


class Client:
    def __init__(self, session: aiohttp.ClientSession, base: str, m: Measured) -> None:
        self.session, self.base, self.m = session, base, m

    async def get(self, name: str, path: str, *, keep: bool = True) -> Any:
        """GET ``path``; its JSON. Timed (send to the body's last byte) and kept when
        ``keep``."""
        t0 = time.perf_counter()
        async with self.session.get(self.base + path) as response:
            body = await response.read()
            ms = (time.perf_counter() - t0) * 1e3
            status = response.status
        if keep:
            self.m.requests.append(Timed(name, path, t0, ms, len(body), status))
        if status != 200:
            raise SystemExit(f"bench.browser: GET {path}: {status} {body[:300]!r}")
        return json.loads(body)


def _episodes(run: str, **query: Any) -> str:
    return f"/api/runs/{quote(run)}/episodes?{urlencode(query)}"


def pick_nodes(outline: dict[str, Any], n: int) -> list[tuple[int, int, int]]:
    """``n`` nodes of an outline as (trace, node, bytes): the largest fifth of ``n`` by
    bytes, the rest spread evenly over the episode, in the episode's order."""
    every = [
        (t["index"], node["index"], int(node.get("bytes") or 0))
        for t in outline["traces"]
        for node in t["nodes"]
    ]
    biggest = sorted(every, key=lambda x: -x[2])[: max(1, n // 5)]
    rest = [x for x in every if x not in biggest]
    spread = [rest[i * len(rest) // max(1, n - len(biggest))] for i in range(n - len(biggest))]
    picked = sorted(set(biggest) | set(spread[: len(rest)]))
    return picked


async def _poll_live(client: Client, live: str, stop: asyncio.Event) -> None:
    """What the page does on a live run: its status every ``POLL_S``, and its first page."""
    while not stop.is_set():
        status = await client.get("live status", f"/api/runs/{quote(live)}/status")
        client.m.live.append((time.perf_counter(), int(status["episodes"])))
        await client.get("live first page", _episodes(live, sort="-reward", limit=100))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), POLL_S)


async def measure(
    server: Server,
    writer: Writer,
    cfg: Config,
    paths: dict[str, Path],
    expected: dict[str, int],
) -> Measured:
    """The requests of the docstring's steps 1-3, in order."""
    m = Measured()
    timeout = aiohttp.ClientTimeout(total=600)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        client = Client(session, server.url, m)
        listed = await client.get("runs", "/api/runs", keep=False)
        by_path = {str(Path(r["path"]).resolve()): r["name"] for r in listed["runs"]}
        names = {key: by_path[str(p.resolve())] for key, p in paths.items()}
        m.runs = {key: {"name": names[key], "path": str(paths[key])} for key in paths}
        # 1. reading the indexes
        waiting = dict(expected)
        while waiting:
            for key in list(waiting):
                status = await client.get(
                    "status", f"/api/runs/{quote(names[key])}/status", keep=False
                )
                if int(status["episodes"]) >= waiting[key]:
                    now = time.perf_counter()
                    m.index_read_s[key] = now - server.started
                    m.index_read_listening_s[key] = now - server.listening
                    del waiting[key]
            await asyncio.sleep(0.01)
        m.phases["reading the indexes"] = (server.started, time.perf_counter())
        # 2. the idle server
        t0 = time.perf_counter()
        await asyncio.sleep(cfg.idle_seconds)
        m.phases["idle"] = (t0, time.perf_counter())
        # 3. while the writer writes
        live_index = index_path(paths["live"] / RUN_STREAM)
        before = count_rows(live_index)
        writer.go()
        t_go = time.perf_counter()
        while count_rows(live_index) <= before and time.perf_counter() - t_go < 120:
            await asyncio.sleep(0.05)
        stop = asyncio.Event()
        poller = asyncio.ensure_future(_poll_live(client, names["live"], stop))
        syn, prod = names["synthetic"], names["production"]
        first = await client.get("first page by reward", _episodes(syn, sort="-reward", limit=100))
        m.first_versions["synthetic"] = {k: first[k] for k in ("total", "matched", "version")}
        for _ in range(cfg.warm):
            await client.get(
                "first page by reward, again", _episodes(syn, sort="-reward", limit=100)
            )
        kind, env = "train", ENVS[0]
        await client.get(
            "filtered (kind, env) by reward",
            _episodes(syn, sort="-reward", kind=kind, env=env, limit=100),
        )
        await client.get(
            "deep offset by reward",
            _episodes(syn, sort="-reward", offset=cfg.rows // 2, limit=100),
        )
        page = await client.get(
            "production first page by reward", _episodes(prod, sort="-reward", limit=100)
        )
        m.first_versions["production"] = {k: page[k] for k in ("total", "matched", "version")}
        biggest = await client.get("largest episode", _episodes(prod, sort="-bytes", limit=1))
        row = biggest["rows"][0]
        line = int(row["line"])
        outline_path = f"/api/runs/{quote(prod)}/episodes/{line}"
        outline = await client.get("outline, first open", outline_path)
        m.largest = {"line": line, "bytes": row.get("bytes"), "server_ms": outline.get("ms")}
        for _ in range(cfg.cached):
            again = await client.get("outline, cached", outline_path)
            m.largest.setdefault("cached_server_ms", []).append(again.get("ms"))
        for t, n, size in pick_nodes(outline, cfg.nodes):
            path = f"{outline_path}/traces/{t}/nodes/{n}"
            await client.get("one node", path)
            m.nodes.append({"trace": t, "node": n, "bytes": size, "ms": m.requests[-1].ms})
        left = cfg.serve_seconds - (time.perf_counter() - t_go)
        if left > 0:
            await asyncio.sleep(left)
        stop.set()
        await poller
        m.phases["serving while the run writes"] = (t_go, time.perf_counter())
    return m


# -- the report -------------------------------------------------------------------------


def _attach_server_times(m: Measured, served: list[dict[str, Any]]) -> None:
    """Each client request's handler time, matched by path and order."""
    queue: dict[str, list[dict[str, Any]]] = {}
    for s in served:
        queue.setdefault(s["path"], []).append(s)
    for r in m.requests:
        found = queue.get(r.path)
        if found:
            s = found.pop(0)
            r.server_ms, r.server_cpu_ms = s["wall_ms"], s["cpu_ms"]


def _split(lag: dict[str, list[float]], start: float, end: float) -> dict[str, list[float]]:
    keep = [i for i, t in enumerate(lag["times"]) if start <= t <= end]
    return {k: [v[i] for i in keep] for k, v in lag.items()}


def _stats(samples: list[float]) -> dict[str, float]:
    s = LagStats.of(samples)
    return {"count": s.count, "p50": s.p50, "p90": s.p90, "p99": s.p99, "max": s.max}


#: What held a late sample, by where the server's CPU went meanwhile (``_cause``).
LOOP, THREAD, MACHINE = "loop ran", "another server thread ran", "server barely ran"


def _cause(sample: float, running: float, process: float) -> str:
    """What held the loop for a late ``sample`` (ms): its thread on its CPU clock for at
    least half of it (the server's code on the loop); else the server's other threads for
    at least half (a worker holding the GIL, or the loop thread waiting for a core while
    they ran); else the process barely ran at all (the machine ran something else)."""
    if running >= sample / 2:
        return LOOP
    if process - running >= sample / 2:
        return THREAD
    return MACHINE


def _over(lag: dict[str, list[float]], ms: float) -> dict[str, int]:
    """How many samples are over ``ms``, by cause."""
    out = dict.fromkeys((LOOP, THREAD, MACHINE), 0)
    for s, r, p in zip(lag["samples"], lag["running"], lag["process"], strict=True):
        if s > ms:
            out[_cause(s, r, p)] += 1
    return out


def _causes(counts: dict[str, int]) -> str:
    return f"{sum(counts.values())}: " + ", ".join(f"{k} {v}" for k, v in counts.items())


def _open_requests(server: dict[str, Any], at: float, sample: float) -> list[str]:
    """The paths of the requests the server was answering during a ``sample`` ms late
    wake-up at ``at``."""
    return [
        r["path"]
        for r in server["requests"]
        if r["start"] <= at and at - sample / 1e3 <= r["start"] + r["wall_ms"] / 1e3
    ]


def late_samples(m: Measured, server: dict[str, Any]) -> list[dict[str, Any]]:
    """Every lag sample over ``LAG_MS``: when, in which phase, its cause, what was open."""
    lag, out = server["lag"], []
    for sample, running, process, at in zip(
        lag["samples"], lag["running"], lag["process"], lag["times"], strict=True
    ):
        if sample > LAG_MS:
            phases = [name for name, (a, b) in m.phases.items() if a <= at <= b]
            out.append(
                {
                    "at_s": at - server["started"],
                    "phase": phases[0] if phases else None,
                    "lag_ms": sample,
                    "loop_cpu_ms": running,
                    "process_cpu_ms": process,
                    "cause": _cause(sample, running, process),
                    "requests": _open_requests(server, at, sample),
                }
            )
    return out


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else "met" if ok else "NOT met"


def _ms(values: Sequence[float]) -> str:
    return f"{statistics.median(values):.1f} / {max(values):.1f}" if values else "-"


@dataclass
class Target:
    what: str
    run: str
    value: str
    goal: str
    met: bool | None
    numbers: dict[str, Any] = field(default_factory=dict)


def targets(
    m: Measured, server: dict[str, Any], rss: RssWatch, cfg: Config, rows_of: dict[str, int]
) -> list[Target]:
    out: list[Target] = []
    syn = f"synthetic ({rows_of['synthetic']:,} rows)"
    prod = f"production ({rows_of['production']:,} episodes)"
    for key, label in (("synthetic", syn), ("production", prod)):
        out.append(
            Target(
                "reading the index (server start -> every row read)",
                label,
                f"{m.index_read_s[key] * 1e3:.0f} ms",
                "-",
                None,
                {"s": m.index_read_s[key], "from_listening_s": m.index_read_listening_s[key]},
            )
        )
    for name, label in (
        ("first page by reward", syn),
        ("first page by reward, again", syn),
        ("filtered (kind, env) by reward", syn),
        ("deep offset by reward", syn),
        ("production first page by reward", prod),
    ):
        ms = [r.ms for r in m.named(name)]
        shown = f"{ms[0]:.1f} ms" if len(ms) == 1 else f"{_ms(ms)} ms (median / max of {len(ms)})"
        out.append(
            Target(
                name.removeprefix("production "),
                label,
                shown,
                f"<= {FIRST_PAGE_MS:.0f} ms",
                max(ms) <= FIRST_PAGE_MS,
                {"ms": ms, "server_ms": [r.server_ms for r in m.named(name)]},
            )
        )
    big = f"production, line {m.largest['line']} ({(m.largest['bytes'] or 0) / MB:.1f} MB)"
    first = m.named("outline, first open")[0].ms
    out.append(
        Target(
            "largest episode's outline, first open",
            big,
            f"{first:.0f} ms",
            f"<= {OUTLINE_MS:.0f} ms",
            first <= OUTLINE_MS,
            {"ms": first, "server_reported_ms": m.largest.get("server_ms")},
        )
    )
    cached = [r.ms for r in m.named("outline, cached")]
    out.append(
        Target(
            "outline, cached",
            big,
            f"{_ms(cached)} ms (median / max of {len(cached)})",
            f"<= {OUTLINE_CACHED_MS:.0f} ms",
            max(cached) <= OUTLINE_CACHED_MS,
            {"ms": cached},
        )
    )
    node_ms = [n["ms"] for n in m.nodes]
    worst = max(m.nodes, key=lambda n: n["ms"])
    largest_node = max(m.nodes, key=lambda n: n["bytes"])
    out.append(
        Target(
            "one node (median / max)",
            f"{big}: {len(node_ms)} nodes, the largest {largest_node['bytes'] / MB:.2f} MB",
            f"{_ms(node_ms)} ms",
            f"<= {NODE_MS:.0f} ms",
            max(node_ms) <= NODE_MS,
            {"nodes": m.nodes, "slowest": worst},
        )
    )
    hwm = server["vm_hwm_client"] or server["vm_hwm"]
    out.append(
        Target(
            "server RSS, peak (VmHWM)",
            "all three runs",
            f"{hwm / MIB:.0f} MiB",
            f"<= {RSS_BYTES // MIB} MiB",
            hwm <= RSS_BYTES,
            {"vm_hwm": hwm},
        )
    )
    out.append(
        Target(
            f"server RSS, largest of {rss.count} samples",
            "all three runs",
            f"{rss.peak / MIB:.0f} MiB",
            f"<= {RSS_BYTES // MIB} MiB",
            rss.peak <= RSS_BYTES,
            {"peak": rss.peak, "samples": rss.count},
        )
    )
    lag = server["lag"]
    serving = _split(lag, *m.phases["serving while the run writes"])
    idle = _split(lag, *m.phases["idle"])
    s, i = _stats(serving["samples"]), _stats(idle["samples"])
    over = _over(serving, LAG_MS)
    out.append(
        Target(
            "loop lag while the run writes and the requests run, p50 / p99 / max",
            f"idle server: {i['p50']:.2f} / {i['p99']:.2f} / {i['max']:.2f} ms",
            f"{s['p50']:.2f} / {s['p99']:.2f} / {s['max']:.2f} ms",
            f"max <= {LAG_MS:g} ms",
            s["max"] <= LAG_MS,
            {"serving": s, "idle": i},
        )
    )
    out.append(
        Target(
            f"of its samples over {LAG_MS:g} ms, those with the loop on its CPU clock",
            f"over {LAG_MS:g} ms {_causes(over)}",
            f"{over[LOOP]}",
            "0",
            over[LOOP] == 0,
            {"over": over},
        )
    )
    return out


def details(
    m: Measured,
    server: dict[str, Any],
    writer: dict[str, Any],
    cfg: Config,
    profile: Path | None,
) -> list[str]:
    lag = server["lag"]
    lines = [
        f"The server listened {(server['listening'] - server['started']) * 1e3:.0f} ms after "
        "its start (the index reads above count from its start).",
        "",
        "Loop lag of the server by phase (ms; a probe waking every 1 ms on its loop):",
        "",
    ]
    rows = []
    for phase, (start, end) in m.phases.items():
        part = _split(lag, start, end)
        st = _stats(part["samples"])
        over = _over(part, LAG_MS)
        rows.append(
            [
                phase,
                f"{end - start:.1f}",
                str(st["count"]),
                _f(st["p50"]),
                _f(st["p99"]),
                _f(st["max"]),
                *(str(v) for v in over.values()),
            ]
        )
    lines.append(
        table(
            [
                "phase",
                "s",
                "samples",
                "p50",
                "p99",
                "max",
                f"> {LAG_MS:g} ms: {LOOP}",
                THREAD,
                MACHINE,
            ],
            rows,
        )
    )
    serving = _split(lag, *m.phases["serving while the run writes"])
    late = sorted(
        zip(
            serving["samples"],
            serving["running"],
            serving["process"],
            serving["times"],
            strict=True,
        ),
        key=lambda x: -x[0],
    )[:10]
    if late and late[0][0] > LAG_MS:
        lines += ["", "The longest samples while serving, and what the server was answering then:"]
        for sample, running, process, at in late:
            if sample <= LAG_MS:
                break
            during = _open_requests(server, at, sample)
            lines.append(
                f"- {sample:.1f} ms: the loop's thread on its CPU clock {running:.1f} ms, the "
                f"server's other threads {max(0.0, process - running):.1f} ms "
                f"({_cause(sample, running, process)}); requests open: "
                f"{', '.join(during) or 'none'}"
            )
    stalls = server.get("stalls")
    if stalls is not None:

        def phase_of(at: float) -> str:
            found = [name for name, (a, b) in m.phases.items() if a <= at <= b]
            return found[0] if found else "between phases"

        busy = [s for s in stalls if phase_of(s["start"]) == "serving while the run writes"]
        lines += [
            "",
            f"Stalls of the server's loop over 8 ms (bench.stalls' sampler in the server): "
            f"{len(stalls)}, {len(busy)} of them while serving; "
            + ", ".join(
                f"{kind}: {sum(s['kind'] == kind for s in stalls)}"
                for kind in (
                    "loop on its CPU clock",
                    "neither thread ran",
                    "loop blocked off the CPU",
                )
            ),
        ]
        for s in sorted(stalls, key=lambda s: -s["wall_ms"])[:12]:
            lines.append(
                f"- {s['wall_ms']:.1f} ms {phase_of(s['start'])}: the loop's thread "
                f"{s['cpu_ms']:.1f} ms on its CPU clock, the sampler at most "
                f"{s['sampler_late_ms']:.1f} ms late ({s['kind']})"
            )
            for stack in s["stacks"][-2:]:
                lines.extend("    " + x for x in stack.rstrip().splitlines())
    lines += ["", "Requests, client ms (server's handler ms):"]
    for name in dict.fromkeys(r.name for r in m.requests):
        rs = m.named(name)
        client = [r.ms for r in rs]
        handler = [r.server_ms for r in rs if r.server_ms is not None]
        lines.append(
            f"- {name}: {len(rs)}, median {statistics.median(client):.1f}, max {max(client):.1f}"
            + (f" ({statistics.median(handler):.1f}, {max(handler):.1f})" if handler else "")
            + f"; {statistics.median(r.bytes for r in rs) / 1e3:.1f} kB median body"
        )
    if m.live:
        lines += [
            "",
            f"The live run while it wrote: the server counted {m.live[0][1]} -> {m.live[-1][1]} "
            f"episodes over {m.live[-1][0] - m.live[0][0]:.1f} s of polls; the writer wrote "
            f"{writer['episodes']} episodes ({writer['bytes'] / 1e9:.2f} GB) in "
            f"{writer['seconds']:.0f} s ({writer['bytes'] / MB / max(writer['seconds'], 1e-9):.0f}"
            f" MB/s asked {cfg.write_mb_s:g}), {writer['delivered']} of {writer['submitted']} "
            "delivered; its chunks before finalize sealed the last: "
            f"{writer['chunks']['sealed']} sealed, {writer['chunks']['plain']} plain",
        ]
    if profile is not None and profile.exists():
        lines += ["", f"cProfile of the server ({profile}), top 25 by cumulative time:", "```"]
        text = io.StringIO()
        pstats.Stats(str(profile), stream=text).sort_stats("cumulative").print_stats(25)
        lines += [*text.getvalue().strip().splitlines()[4:], "```"]
    return lines


# -- main -------------------------------------------------------------------------------


def run(args: argparse.Namespace, cfg: Config, t0: float) -> dict[str, Any]:
    work = Path(tempfile.mkdtemp(prefix="nodewise-bench-browser-"))
    writer: Writer | None = None
    server: Server | None = None
    try:
        _log(t0, "production run: " + (f"in {args.run}" if args.run else "temporary"))
        production, written = production_run(args.run or work / "production", cfg)
        _log(t0, f"production run {'written' if written else 'reused'}: {production}")
        synthetic = work / f"synthetic-{cfg.rows}"
        synthetic_run(synthetic, cfg.rows)
        _log(t0, f"synthetic index of {cfg.rows:,} rows written")
        live = work / "live"
        writer = Writer(live, quick=args.quick, write_mb_s=cfg.write_mb_s)
        writer.ready()
        paths = {"production": production, "synthetic": synthetic, "live": live}
        expected = {
            key: count_rows(index_path(paths[key] / RUN_STREAM))
            for key in ("production", "synthetic")
        }
        _log(t0, "starting the server")
        server = Server(list(paths.values()), work, stalls=args.stalls, profile=args.profile)
        with RssWatch(server.pid) as rss:
            m = asyncio.run(measure(server, writer, cfg, paths, expected))
            _log(t0, "stopping the writer")
            wrote = writer.stop()
            hwm = vm_hwm(server.pid)
            served = server.stop()
        served["vm_hwm_client"] = hwm
        served["listening"] = server.listening
        _attach_server_times(m, served["requests"])
        ts = targets(m, served, rss, cfg, expected)
        return {
            "measured": m,
            "server": served,
            "writer": wrote,
            "targets": ts,
            "expected": expected,
            "rss": rss,
            "production_written": written,
        }
    finally:
        if writer is not None:
            writer.kill()
        if server is not None:
            server.kill()
        shutil.rmtree(work, ignore_errors=True)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.browser", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument(
        "--run",
        type=Path,
        metavar="DIR",
        help="keep the production run here and reuse it next time (a run directory given "
        "is read as it is); default: a temporary one, removed",
    )
    parser.add_argument("--episodes", type=int, help="episodes of the production run (1,000)")
    parser.add_argument("--rows", type=int, help="rows of the synthetic index (100,000)")
    parser.add_argument("--quick", action="store_true", help="a tiny run of everything")
    parser.add_argument("--write-mb-s", type=float, help="the live writer's rate (30 MB/s)")
    parser.add_argument("--stalls", action="store_true", help="attribute the loop's stalls")
    parser.add_argument("--profile", type=Path, metavar="PATH", help="cProfile the server")
    parser.add_argument(
        "--json", type=Path, default=DEFAULT_JSON, metavar="PATH", help="the raw numbers"
    )
    parser.add_argument("--writer", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    given = {"episodes": args.episodes, "rows": args.rows, "write_mb_s": args.write_mb_s}
    cfg = Config(**{**cfg.__dict__, **{k: v for k, v in given.items() if v is not None}})
    if args.writer is not None:
        print(json.dumps(asyncio.run(write_live(args.writer, cfg))), flush=True)
        return 0
    t0 = time.perf_counter()
    r = run(args, cfg, t0)
    m: Measured = r["measured"]
    ts: list[Target] = r["targets"]
    elapsed = time.perf_counter() - t0
    lines = [
        f"nodewise trace browser benchmark ({'quick' if args.quick else 'full'} run, "
        f"{elapsed:.0f} s): Python {platform.python_version()}, {os.cpu_count()} cores; "
        f"the server in its own process, a writer appending to a live run at "
        f"{cfg.write_mb_s:g} MB/s meanwhile",
        "",
        table(
            ["measure", "run", "measured", "target", ""],
            [[t.what, t.run, t.value, t.goal, _verdict(t.met)] for t in ts],
            left=2,
        ),
        "",
        *details(m, r["server"], r["writer"], cfg, args.profile),
    ]
    print("\n".join(lines))
    lag = r["server"]["lag"]
    payload = {
        "mode": "quick" if args.quick else "full",
        "elapsed_s": elapsed,
        "config": cfg.__dict__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "runs": m.runs,
        "rows": r["expected"],
        "production_written": r["production_written"],
        "first_versions": m.first_versions,
        "targets": [t.__dict__ for t in ts],
        "requests": [r.__dict__ for r in m.requests],
        "largest": m.largest,
        "phases": {
            name: {"seconds": end - start, "lag_ms": _stats(_split(lag, start, end)["samples"])}
            for name, (start, end) in m.phases.items()
        },
        "live": m.live,
        "late_samples": late_samples(m, r["server"]),
        "writer": r["writer"],
        "server": {
            "vm_hwm": r["server"]["vm_hwm"],
            "vm_hwm_client": r["server"]["vm_hwm_client"],
            "stalls": r["server"]["stalls"],
        },
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(payload, indent=2) + "\n")
    _log(t0, f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
