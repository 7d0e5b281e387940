"""Benchmark of ``monitors.prime.PrimeMonitor`` against an uploader shaped like the SDK's.

    python -m bench.prime_monitor [--episodes N] [--quick] [--server-nice N]
                                  [--outage SECONDS] [--outage-queue BYTES]

N production-sized episodes (production's lognormal sizes; default 200, ``--quick``: 30)
go to a local ``TracesServer`` (its own process), one ``log_episodes([ep], step=i,
subset="all")`` call per episode, with (a) no added network time and (b) 100 ms latency and
100 MB/s bandwidth per request, while a probe samples the event loop every 1 ms:

- ours: ``PrimeMonitor`` at 1, 4 and 8 requests in flight (``--quick``: 1 and 8);
- ours in outbox mode (docs/design.md D18), at 8 in flight (``--quick``: under (b) only):
  a ``FileMonitor`` writes each episode to a run directory on the repository's disk, then
  ``PrimeMonitor(outbox=that directory).log_episodes`` only wakes the uploader, which reads
  the lines back from the stream. "slowest log" times the Prime call alone; the file
  monitor's time is reported apart, and the time runs until both finalize returned;
- baseline (under (b) only: it is bound by gzip level 9, not the network), shaped like the
  prime-traces SDK we improve on (``bench.baselines.SdkLikeUploader``): ``await queue.put``
  on a bounded ``asyncio.Queue`` (a full queue blocks the caller), an uploader task that
  encodes each episode with ``orjson.dumps`` in ``asyncio.to_thread`` (orjson holds the GIL,
  so the loop stalls meanwhile), batches up to 30 MiB, gzips at level 9 in a thread and posts
  one request at a time (the same multipart body and headers, so the server accepts it).

Every configuration runs in a fresh subprocess (``--one CONFIG``), so each peak RSS
(``ru_maxrss``, a process's high-water mark) is that configuration's own. Each episode is built
fresh right before it is logged (the bodies built before the measurement) while the probe is
paused. Both sides keep at most ``AHEAD`` episodes waiting: the baseline's queue holds that
many (its ``log`` blocks beyond), and for ours the driver waits, outside ``log``, while that
many are queued (in outbox mode: written and not yet taken from the stream), as a trainer
busy elsewhere would; without it the driver would just pile up built episodes in memory.
Time = wall clock from the first ``log`` to the end of ``finalize`` minus the time spent
building episodes (the loop is blocked then; worker threads and the server keep going,
which flatters both sides a little).

The server stands in for a remote service, but here it shares the 2 cores, and it spends as
much CPU per byte as the client (it gunzips, hashes and parses every line: ~6.3 CPU-s per GB
of JSON against the client's ~6-8). So it runs at ``--server-nice`` (default 10) above the
benchmark's priority: it still gets every idle cycle, but when the cores are contended
the uploader's event loop is scheduled first, as it would be with the server elsewhere;
``--server-nice 0`` runs it at the same priority. CPU seconds per GB of JSON are reported for
both sides.

Then, for the limits: encoding alone (``aiterencode``), gzip alone (isal and zlib level 1, and
zlib level 9 for the baseline) and SHA-256 on one fresh episode, and the transport + server
alone: one pre-compressed ~30 MiB batch posted again and again (the server checks a replay as
fully as a first upload) at 1 and 8 in flight, under both networks.

Last, what an outage costs each mode, each in its own process: the server stopped for
``--outage`` seconds (default 60, ``--quick``: 10) right after the monitors start, while
production-sized episodes adding up to twice ``--outage-queue`` (both modes' ``queue_bytes``;
default 256 MiB, ``--quick``: 64 MiB) are logged at a fixed rate over the outage; then it
starts again on its port and finalize is called at once. Reported: records delivered, lost
by reason and pending, the seconds from the server's return to the first delivery and to
finalize's return, the slowest log, lag and peak RSS.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import logging
import resource
import shutil
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import orjson
from isal import isal_zlib

import encoder
from monitors import FileMonitor, LoopLagProbe, Monitor
from monitors.loadtest._measure import lower_priority, process_cpu
from monitors.prime import TRACES_PATH, PrimeMonitor, _gzip
from monitors.prime._body import frame, new_boundary
from monitors.testing import TracesServer
from monitors.testing.episodes import MEDIAN_BYTES, lognormal_sizes

from .baselines import SdkLikeUploader
from .documents import episode_maker, fresh_episode
from .lag import LagStats, measure_idle_lag

MB = 1_000_000
MIB = 2**20
KEY = "bench-key"
#: Episodes that may wait in either uploader's queue before the driver (ours) or the
#: ``log`` call (baseline) waits.
AHEAD = 2
DRAIN_TIMEOUT = 600.0
BATCH_BYTES = 30 * MIB
NETWORKS: dict[str, dict[str, float]] = {
    "none": {},
    "wan": {"latency": 0.1, "bandwidth": 100e6},
}
NETWORK_NAMES = {"none": "none", "wan": "100 ms + 100 MB/s"}
UPLOADER_NAMES = {
    "prime": "PrimeMonitor",
    "outbox": "PrimeMonitor, outbox",
    "sdk": "SDK-like baseline",
}
ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Result:
    config: str
    uploader: str
    network: str
    in_flight: int
    episodes: int
    nbytes: int
    seconds: float  # wall clock minus episode building
    wall: float  # the whole child, building the bodies and starting the server included
    slowest_log: float
    drain: float
    lag_p99: float
    lag_max: float
    lag_samples: int
    submitted: int
    delivered: int
    lost: dict[str, int] = field(default_factory=dict)
    stored: int = 0  # lines the server stored
    rss: int = 0  # bytes
    client_cpu: float = 0.0  # CPU seconds of this process over ``seconds`` (all threads)
    server_cpu: float | None = None  # CPU seconds of the server process (Linux), same span
    pressure: float | None = None  # share of the span some task waited for a core (Linux PSI)
    pending: int = 0  # records still pending after finalize (outbox: left on the disk)
    # Outbox mode: the FileMonitor writing the stream, which is not the Prime monitor's time.
    file_seconds: float = 0.0  # its log_episodes calls, in all
    file_slowest: float = 0.0  # its slowest log_episodes call
    file_finalize: float = 0.0  # its finalize (fsync, and the live chunk sealed with zstd)

    @property
    def mbps(self) -> float:
        return self.nbytes / MB / self.seconds

    @property
    def eps(self) -> float:
        return self.episodes / self.seconds

    def cpu_per_gb(self) -> str:
        """CPU seconds per GB of JSON: ours / the server's."""
        gb = self.nbytes / 1e9
        server = "?" if self.server_cpu is None else f"{self.server_cpu / gb:.1f}"
        return f"{self.client_cpu / gb:.1f} / {server}"


# -- the two uploaders ------------------------------------------------------------------


def _uploader(
    kind: str, url: str, in_flight: int, outbox: Path | None = None, **settings: Any
) -> Monitor:
    """The uploader of configuration kind ``kind``: "prime" (in memory), "outbox" (from the
    stream a ``FileMonitor(outbox)`` writes) or "sdk" (the baseline)."""
    if kind in ("prime", "outbox"):
        return PrimeMonitor(
            api_key=KEY,
            traces_url=url,
            base_url=url,
            run_id="bench",
            max_in_flight=in_flight,
            drain_timeout=settings.pop("drain_timeout", DRAIN_TIMEOUT),
            outbox=outbox if kind == "outbox" else None,
            **settings,
        )
    # Its log call blocks while AHEAD episodes wait, however long.
    return SdkLikeUploader(
        url=url, api_key=KEY, queue_records=AHEAD, put_timeout=None, drain_timeout=DRAIN_TIMEOUT
    )


async def _wait_room(monitor: Monitor, logged: int) -> None:
    """Ours: wait while AHEAD episodes are queued, in memory (private, for the benchmark
    only), or in outbox mode logged but not yet taken from the stream (``stats().submitted``
    counts the rows the monitor has taken: the same point of its pipeline, before the line is
    stamped and batched, as an in-memory episode taken by the encoder)."""
    if not isinstance(monitor, PrimeMonitor):
        return
    if monitor.outbox is not None:
        while logged - monitor.stats().submitted >= AHEAD:
            await asyncio.sleep(0.001)
        return
    send = monitor._send
    assert send is not None
    while send.statistics().current_buffer_used >= AHEAD:
        await asyncio.sleep(0.001)


def scratch_dir() -> Path:
    """A fresh directory for an outbox run, on the repository's disk (``build/``, which git
    ignores), never a tmpfs: the outbox reads its lines back from the disk the file monitor
    wrote them to, and a RAM disk would hide that cost. The caller removes it."""
    parent = ROOT / "build"
    parent.mkdir(exist_ok=True)
    return Path(tempfile.mkdtemp(prefix="bench-prime-outbox-", dir=parent))


# -- one configuration (in its own process) ----------------------------------------------


def cpu_stall_seconds() -> float | None:
    """Seconds in which some task on the machine waited for a core ("some" in
    /proc/pressure/cpu; None where the kernel does not report it)."""
    try:
        with open("/proc/pressure/cpu") as f:
            return int(f.readline().rsplit("total=", 1)[1]) / 1e6
    except (OSError, IndexError, ValueError):
        return None


async def _measure(config: str, sizes: list[int], server_nice: int) -> Result:
    uploader = config.split(":")[0]
    outbox = scratch_dir() if uploader == "outbox" else None
    try:
        return await _measure_in(config, sizes, server_nice, outbox)
    finally:
        if outbox is not None:
            shutil.rmtree(outbox, ignore_errors=True)


async def _measure_in(
    config: str, sizes: list[int], server_nice: int, outbox: Path | None
) -> Result:
    """One configuration. In outbox mode a ``FileMonitor(outbox)`` writes each episode to the
    run's stream first, then ``PrimeMonitor(outbox=outbox).log_episodes`` only wakes the
    uploader; "slowest log" times the Prime call alone, the file monitor's calls and its
    finalize are kept apart (``file_*``), and the time runs until both finalize returned."""
    uploader, network, in_flight_text = config.split(":")
    in_flight = int(in_flight_text)
    async with TracesServer(api_key=KEY, faults=NETWORKS[network]) as server:
        lower_priority(server.pid, server_nice)
        file = None if outbox is None else FileMonitor(outbox)
        sink = _uploader(uploader, server.url, in_flight, outbox)
        building = 0.0
        building_cpu = 0.0
        slowest = 0.0
        file_seconds = file_slowest = file_finalize = 0.0
        nbytes = 0
        async with LoopLagProbe() as probe:
            if file is not None:
                await file.start()
            await sink.start()
            server_cpu0 = process_cpu(server.pid)
            stall0 = cpu_stall_seconds()
            cpu0 = time.process_time()
            start = time.perf_counter()
            for i, size in enumerate(sizes):
                await _wait_room(sink, i)
                probe.pause()
                t0, c0 = time.perf_counter(), time.process_time()
                episode = fresh_episode(size, index=i)
                gc.collect()
                building += time.perf_counter() - t0
                building_cpu += time.process_time() - c0
                probe.resume()
                await asyncio.sleep(0.002)  # let the probe take a sample between episodes
                if file is not None:
                    t0 = time.perf_counter()
                    await file.log_episodes([episode], step=i, subset="all")
                    seconds = time.perf_counter() - t0
                    file_seconds += seconds
                    file_slowest = max(file_slowest, seconds)
                t0 = time.perf_counter()
                await sink.log_episodes([episode], step=i, subset="all")
                slowest = max(slowest, time.perf_counter() - t0)
                nbytes += size
                del episode
            t0 = time.perf_counter()
            # The Prime monitor first: every row is written (file.log_episodes returned), and
            # the live chunk's seal at the file monitor's finalize would compete with its tail.
            await sink.finalize()
            drained = time.perf_counter()
            if file is not None:
                await file.finalize()
            end = time.perf_counter()
            file_finalize = end - drained
            client_cpu = time.process_time() - cpu0 - building_cpu
            server_cpu1 = process_cpu(server.pid)
            stall1 = cpu_stall_seconds()
        stored = (await server.astats())["lines_stored"]
    server_cpu = None if server_cpu0 is None or server_cpu1 is None else server_cpu1 - server_cpu0
    pressure = None if stall0 is None or stall1 is None else (stall1 - stall0) / (end - start)
    stats = sink.stats()
    lag = probe.stats()
    return Result(
        config=config,
        uploader=UPLOADER_NAMES[uploader],
        network=network,
        in_flight=in_flight,
        episodes=len(sizes),
        nbytes=nbytes,
        seconds=end - start - building,
        wall=0.0,
        slowest_log=slowest,
        drain=drained - t0,
        lag_p99=lag.p99,
        lag_max=lag.max,
        lag_samples=lag.count,
        submitted=stats.submitted,
        delivered=stats.delivered,
        lost=dict(stats.lost),
        stored=stored,
        client_cpu=client_cpu,
        server_cpu=server_cpu,
        pressure=pressure,
        pending=stats.pending,
        file_seconds=file_seconds,
        file_slowest=file_slowest,
        file_finalize=file_finalize,
    )


def _prebuild(sizes: list[int]) -> None:
    """Build the episodes' bodies outside the measurement (the maker keeps them)."""
    for i, size in enumerate(sizes):
        episode_maker().episode(size, index=i)
    gc.collect()


def run_one(config: str, n: int, server_nice: int) -> Result:
    t0 = time.perf_counter()
    sizes = lognormal_sizes(n, seed=0)
    _prebuild(sizes)
    result = asyncio.run(_measure(config, sizes, server_nice))
    result.rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    result.wall = time.perf_counter() - t0
    return result


def _child(args: list[str]) -> dict[str, Any]:
    """Run ``python -m bench.prime_monitor --one ...`` in a fresh interpreter, so its peak
    RSS is its own; its result is the last line it prints."""
    cmd = [sys.executable, "-m", "bench.prime_monitor", "--one", *args]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, check=True)
    value: dict[str, Any] = json.loads(proc.stdout.decode().strip().splitlines()[-1])
    return value


def spawn(config: str, n: int, server_nice: int) -> Result:
    """``run_one`` in a fresh interpreter."""
    return Result(**_child([config, "--episodes", str(n), "--server-nice", str(server_nice)]))


# -- an outage ----------------------------------------------------------------------------

OUTAGE_IN_FLIGHT = 8
#: The outage run calls finalize as the server answers again, with a drain of this many times
#: the outage, and at least a minute (the backoff alone may reach 45 s): the catch-up.
CATCH_UP_FACTOR = 3.0
CATCH_UP_MIN = 60.0
OUTAGE_MODES = {"memory": "in memory", "outbox": "outbox"}


@dataclass
class OutageResult:
    mode: str  # "memory" or "outbox"
    outage: float  # seconds asked for
    down: float  # seconds from stop() returning to start() returning (the server answers)
    queue_bytes: int  # the same in both modes
    rate: float  # bytes of JSON logged per second while the server is down
    episodes: int
    nbytes: int
    late: float  # seconds the driver's latest log came after its time (it fell behind)
    submitted: int
    delivered: int
    lost: dict[str, int]
    pending: int  # after finalize (outbox: left on the disk)
    first_delivery: float | None  # seconds from the server's return to the first delivery
    caught_up: float | None  # ... to finalize's return (None: its drain, catch_up_limit, ran out)
    catch_up_limit: float
    slowest_log: float  # the Prime monitor's log_episodes
    file_slowest: float  # outbox mode: the FileMonitor's log_episodes
    lag_p99: float
    lag_max: float
    stored: int  # lines the restarted server stored
    rss: int = 0
    wall: float = 0.0


def catch_up_limit(outage: float) -> float:
    """The drain of the outage run's finalize, called as the server answers again."""
    return max(CATCH_UP_MIN, CATCH_UP_FACTOR * outage)


def outage_sizes(queue_bytes: int) -> list[int]:
    """Production-sized episodes (the lognormal sizes, seed 0) adding up to twice
    ``queue_bytes`` of JSON: what an outage holds when it outlasts the bound twice over.

    Outbox mode stalls for good when a batch still open and the next line together pass
    ``queue_bytes`` (the reader waits for room that the open batch frees only once it sees
    that line; see the report), so the bound must exceed any two consecutive episodes here:
    with seed 0, from 64 MiB on it does (the largest pair is 43 MB at 256 MiB).
    """
    sizes: list[int] = []
    for size in lognormal_sizes(max(16, 8 * queue_bytes // MEDIAN_BYTES), seed=0):
        if sum(sizes) >= 2 * queue_bytes:
            break
        sizes.append(size)
    return sizes


async def _outage(mode: str, outage: float, queue_bytes: int, server_nice: int) -> OutageResult:
    outbox = scratch_dir() if mode == "outbox" else None
    try:
        return await _outage_in(mode, outage, queue_bytes, server_nice, outbox)
    finally:
        if outbox is not None:
            shutil.rmtree(outbox, ignore_errors=True)


async def _outage_in(
    mode: str, outage: float, queue_bytes: int, server_nice: int, outbox: Path | None
) -> OutageResult:
    """The server stopped right after the monitors start; ``outage_sizes(queue_bytes)``
    logged at a fixed rate spread over ``outage`` seconds; the server started again on its
    port; then finalize at once, which waits (``catch_up_limit(outage)`` at most) until every
    episode is answered. Finalize, not a wait for the counts: in outbox mode a step's last
    batch closes at the next step's first row or at finalize (D18), and no row comes after
    the outage here."""
    sizes = outage_sizes(queue_bytes)
    _prebuild(sizes)
    rate = sum(sizes) / outage
    limit = catch_up_limit(outage)
    async with TracesServer(api_key=KEY) as server:
        lower_priority(server.pid, server_nice)
        file = None if outbox is None else FileMonitor(outbox)
        kind = "prime" if outbox is None else "outbox"
        prime = _uploader(
            kind,
            server.url,
            OUTAGE_IN_FLIGHT,
            outbox,
            queue_bytes=queue_bytes,
            drain_timeout=limit,
        )
        slowest = file_slowest = late = 0.0
        first: float | None = None
        caught_up: float | None = None
        async with LoopLagProbe() as probe:
            if file is not None:
                await file.start()
            await prime.start()
            await asyncio.to_thread(server.stop)
            down = time.perf_counter()
            logged = 0
            for i, size in enumerate(sizes):
                due = down + logged / rate
                wait = due - time.perf_counter()
                if wait > 0:
                    await asyncio.sleep(wait)
                late = max(late, time.perf_counter() - due)
                probe.pause()
                episode = fresh_episode(size, index=i)
                gc.collect()
                probe.resume()
                if file is not None:
                    t0 = time.perf_counter()
                    await file.log_episodes([episode], step=i, subset="all")
                    file_slowest = max(file_slowest, time.perf_counter() - t0)
                t0 = time.perf_counter()
                await prime.log_episodes([episode], step=i, subset="all")
                slowest = max(slowest, time.perf_counter() - t0)
                logged += size
                del episode
            rest = down + outage - time.perf_counter()
            if rest > 0:
                await asyncio.sleep(rest)
            await asyncio.to_thread(server.start)  # on the same port: the service is back
            back = time.perf_counter()
            lower_priority(server.pid, server_nice)

            async def first_delivery() -> None:
                nonlocal first
                while not prime.stats().delivered:
                    await asyncio.sleep(0.01)
                first = time.perf_counter() - back

            watch = asyncio.create_task(first_delivery())
            await prime.finalize()
            drained = time.perf_counter() - back
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
            if drained < limit:  # else its drain ran out and counted the rest
                caught_up = drained
            if file is not None:
                await file.finalize()
        stored = (await server.astats())["lines_stored"]
    stats = prime.stats()
    lag = probe.stats()
    return OutageResult(
        mode=mode,
        outage=outage,
        down=back - down,
        queue_bytes=queue_bytes,
        rate=rate,
        episodes=len(sizes),
        nbytes=sum(sizes),
        late=late,
        submitted=stats.submitted,
        delivered=stats.delivered,
        lost=dict(stats.lost),
        pending=stats.pending,
        first_delivery=first,
        caught_up=caught_up,
        catch_up_limit=limit,
        slowest_log=slowest,
        file_slowest=file_slowest,
        lag_p99=lag.p99,
        lag_max=lag.max,
        stored=stored,
    )


def run_outage(mode: str, outage: float, queue_bytes: int, server_nice: int) -> OutageResult:
    t0 = time.perf_counter()
    result = asyncio.run(_outage(mode, outage, queue_bytes, server_nice))
    result.rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    result.wall = time.perf_counter() - t0
    return result


def spawn_outage(mode: str, outage: float, queue_bytes: int, server_nice: int) -> OutageResult:
    """``run_outage`` in a fresh interpreter."""
    args = [f"outage:{mode}", "--outage", str(outage), "--outage-queue", str(queue_bytes)]
    return OutageResult(**_child([*args, "--server-nice", str(server_nice)]))


# -- the limits: each stage alone -------------------------------------------------------


@dataclass
class Ceilings:
    nbytes: int
    encode: float  # MB/s, aiterencode on the loop
    gzip: dict[str, tuple[float, float]]  # name -> (MB/s, compressed / uncompressed)
    sha256: float  # MB/s
    transport: dict[str, float]  # "network:in_flight" -> MB/s of JSON through transport + server
    server_cpu: float | None  # the server's CPU seconds per GB of JSON, checking uploads
    idle: LagStats  # the idle loop's own lag, for reference

    @property
    def ours(self) -> str:
        """The gzip ``PrimeMonitor`` uses (its default level, 1)."""
        return "isal-1"

    @property
    def serial(self) -> float:
        """MB/s of encode, then hash and gzip, one after the other (as the monitor does)."""
        return 1 / (1 / self.encode + 1 / self.gzip[self.ours][0] + 1 / self.sha256)


async def _aiterencode_seconds(episode: dict[str, Any]) -> tuple[float, bytes]:
    chunks: list[bytes] = []
    t0 = time.perf_counter()
    async for chunk in encoder.aiterencode(episode, option=encoder.OPT_APPEND_NEWLINE):
        chunks.append(chunk)
    return time.perf_counter() - t0, b"".join(chunks)


def _best_seconds(fn: Any, repeat: int = 3) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def _gzip_speed(
    data: bytes, level: int, compressobj: Callable[..., _gzip.Compressor]
) -> tuple[float, float]:
    pieces = [data[i : i + MIB] for i in range(0, len(data), MIB)]  # as the monitor hands over
    size = 0

    def run() -> None:
        nonlocal size
        gz = compressobj(level, zlib.DEFLATED, 31)  # a gzip member, as the monitor writes
        size = sum(len(gz.compress(piece)) for piece in pieces) + len(gz.flush())

    seconds = _best_seconds(run, 2 if level > 1 else 3)
    return len(data) / MB / seconds, size / len(data)


async def _post_again_and_again(
    url: str, body: Any, key: str, in_flight: int, posts: int
) -> tuple[float, int]:
    """Post one batch ``posts`` times, ``in_flight`` at once: (seconds, successes)."""
    headers = {
        "Authorization": f"Bearer {KEY}",
        "Content-Type": body.content_type,
        "Content-Length": str(body.size),
        "Idempotency-Key": key,
        "X-Prime-Line-Format": "episode",
    }
    done = 0
    todo = iter(range(posts))
    connector = aiohttp.TCPConnector(limit=in_flight)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def poster() -> None:
            nonlocal done
            for _ in todo:
                async with session.post(url, data=body.stream(), headers=headers) as response:
                    await response.read()
                    done += response.status == 200

        t0 = time.perf_counter()
        await asyncio.gather(*(poster() for _ in range(in_flight)))
        return time.perf_counter() - t0, done


def _transport(data: bytes, rounds: int, server_nice: int) -> tuple[dict[str, float], float | None]:
    """JSON MB/s through transport + server alone, per network and in-flight count (each
    of ``rounds`` rounds posts the batch once per request in flight)."""
    gz = _gzip.compressor(1)
    compressed = gz.compress(data) + gz.flush()
    key = "sha256:" + hashlib.sha256(data).hexdigest()
    metadata = orjson.dumps({"schema_version": 1, "context": {"run_id": "bench-transport"}})
    body = frame(metadata, [compressed], boundary=new_boundary())
    speeds: dict[str, float] = {}
    cpu_per_gb: list[float] = []
    for network in NETWORKS:
        with TracesServer(api_key=KEY, faults=NETWORKS[network]) as server:
            lower_priority(server.pid, server_nice)
            for in_flight in (1, 8):
                posts = rounds * in_flight
                cpu0 = process_cpu(server.pid)
                seconds, ok = asyncio.run(
                    _post_again_and_again(server.url + TRACES_PATH, body, key, in_flight, posts)
                )
                cpu1 = process_cpu(server.pid)
                if ok != posts:
                    print(f"note: transport {network}:{in_flight}: {ok}/{posts} posts committed")
                speeds[f"{network}:{in_flight}"] = len(data) * ok / MB / seconds
                if cpu0 is not None and cpu1 is not None and ok:
                    cpu_per_gb.append((cpu1 - cpu0) / (len(data) * ok / 1e9))
    return speeds, (min(cpu_per_gb) if cpu_per_gb else None)


def ceilings(*, rounds: int, server_nice: int) -> Ceilings:
    episode = fresh_episode(MEDIAN_BYTES, index=0)
    seconds, data = asyncio.run(_aiterencode_seconds(episode))
    del episode
    gzip = {
        "isal-1": _gzip_speed(data, 1, isal_zlib.compressobj),
        "zlib-1": _gzip_speed(data, 1, zlib.compressobj),
        "zlib-9": _gzip_speed(data, 9, zlib.compressobj),
    }
    sha256 = len(data) / MB / _best_seconds(lambda: hashlib.sha256(data).digest())
    # A batch as the monitor closes it: episodes up to 30 MiB of JSON, each its own (the
    # server refuses an episode or trace id twice in one upload, as the service does).
    batch = [data]
    while sum(map(len, batch)) + len(data) <= BATCH_BYTES:
        batch.append(orjson.dumps(fresh_episode(MEDIAN_BYTES, index=len(batch))) + b"\n")
    transport, server_cpu = _transport(b"".join(batch), rounds, server_nice)
    idle = LagStats.of(measure_idle_lag(2.0))
    return Ceilings(
        nbytes=len(data),
        encode=len(data) / MB / seconds,
        gzip=gzip,
        sha256=sha256,
        transport=transport,
        server_cpu=server_cpu,
        idle=idle,
    )


# -- the report --------------------------------------------------------------------------


def table(results: list[Result]) -> str:
    head = (
        "| uploader | network | in flight | episodes/s | MB/s | delivered | lost | "
        "slowest log (ms) | lag p99 (ms) | lag max (ms) | peak RSS (MiB) | drain (s) | "
        "CPU s/GB ours / server | CPU pressure |"
    )
    rule = "| --- | --- | ---: | ---: | ---: | ---: | --- |" + " ---: |" * 7
    rows = []
    for r in results:
        lost = lost_cell(r.lost, r.pending)
        rows.append(
            f"| {r.uploader} | {NETWORK_NAMES[r.network]} | {r.in_flight} | {r.eps:.2f} | "
            f"{r.mbps:.1f} | {r.delivered} / {r.submitted} | {lost} | "
            f"{r.slowest_log * 1e3:.2f} | {r.lag_p99:.2f} | {r.lag_max:.2f} | "
            f"{r.rss / MIB:.0f} | {r.drain:.1f} | {r.cpu_per_gb()} | "
            + ("?" if r.pressure is None else f"{r.pressure:.0%}")
            + " |"
        )
    return "\n".join([head, rule, *rows])


def lost_cell(lost: dict[str, int], pending: int) -> str:
    """Records lost by reason, and those still pending (outbox: left on the disk)."""
    parts = [f"{k}: {v}" for k, v in sorted(lost.items()) if v]
    if pending:
        parts.append(f"pending: {pending}")
    return ", ".join(parts) or "-"


def verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def report(results: list[Result], cpu: Ceilings, n: int, server_nice: int) -> None:
    total = sum(r.nbytes for r in results) / len(results) / 1e9
    print(
        f"Prime monitor: {n} production-sized episodes ({total:.2f} GB of JSON; lognormal, "
        "median 6.4 MB, cap 60 MB) to a local TracesServer, each configuration in a fresh process"
    )
    print()
    print(table(results))
    print()
    where = (
        f"at nice +{server_nice} (it stands in for a remote service)"
        if server_nice > 0
        else "at the benchmark's own priority"
    )
    print(
        "episodes/s and MB/s (JSON) = over the wall clock from the first log call to the end of "
        "finalize, minus the time spent building episodes; delivered = committed by the server "
        f"within the drain (timeout {DRAIN_TIMEOUT:.0f} s); lag = a task asking to wake every "
        "1 ms, all run long except while episodes are built; peak RSS = the child's ru_maxrss "
        f"(the server is another process, run {where}); CPU s/GB = CPU seconds per GB of JSON "
        "over the same span (ours: all threads, episode building excluded); CPU pressure = "
        "share of the run in which some task on the machine (ours, the server's or anyone "
        "else's) waited for a core (/proc/pressure/cpu): the higher, the more the 2 cores were "
        "oversubscribed, which shows in lag and throughput; at most "
        f"{AHEAD} episodes wait in either queue."
    )
    gzip = ", ".join(
        f"{name} {speed:.0f} MB/s (ratio {ratio:.3f})" for name, (speed, ratio) in cpu.gzip.items()
    )
    print(
        f"Each stage alone, on one fresh {cpu.nbytes / MB:.1f} MB episode: aiterencode "
        f"{cpu.encode:.0f} MB/s; gzip {gzip}; SHA-256 {cpu.sha256:.0f} MB/s. PrimeMonitor gzips "
        f"with {cpu.ours} and encodes, then hashes and gzips, one after the other: "
        f"1 / (1/{cpu.encode:.0f} + 1/{cpu.gzip[cpu.ours][0]:.0f} + 1/{cpu.sha256:.0f}) = "
        f"{cpu.serial:.0f} MB/s."
    )
    transport = "; ".join(
        f"{NETWORK_NAMES[network]}: "
        + ", ".join(
            f"{cpu.transport[f'{network}:{k}']:.0f} MB/s at {k} in flight"
            for k in (1, 8)
            if f"{network}:{k}" in cpu.transport
        )
        for network in NETWORKS
    )
    server_cpu = (
        ""
        if cpu.server_cpu is None
        else f" (the server spends {cpu.server_cpu:.1f} CPU-s per GB of JSON checking them)"
    )
    print(
        "Transport + server alone (one pre-compressed batch posted again and again), in MB/s "
        f"of JSON: {transport}{server_cpu}. The idle loop's own lag (2 s, no server): "
        f"p99 {cpu.idle.p99:.2f} ms, max {cpu.idle.max:.2f} ms."
    )
    big = sum(size > BATCH_BYTES for size in lognormal_sizes(n, seed=0))
    if big and any(reason.startswith("rejected") for r in results for reason in r.lost):
        print(
            f"{big} of the {n} episodes are over 30 MiB of JSON by themselves (each goes alone "
            "in a batch); 'rejected' above means the server refused such a batch (see stderr)."
        )
    outbox = [r for r in results if r.config.startswith("outbox:")]
    if outbox:
        print(
            "Outbox rows: a FileMonitor writes each episode to the run's stream on a disk "
            "(its defaults: fsync, 5 GiB chunks, the live chunk sealed with zstd at its "
            "finalize), then PrimeMonitor(outbox=...).log_episodes only wakes the uploader, "
            "which reads the lines back from the disk; at most "
            f"{AHEAD} episodes are written and not yet taken (stats().submitted) before the "
            "driver waits. slowest log times the Prime call alone; MB/s, CPU s/GB (ours) and "
            "lag include the FileMonitor's work (encoding each episode on the loop, writing "
            "it); drain is the Prime monitor's finalize, which comes first. The FileMonitor's "
            "share, inside the time: "
            + "; ".join(
                f"{NETWORK_NAMES[r.network]}, {r.in_flight} in flight: log_episodes "
                f"{r.file_seconds:.1f} s in all (slowest {r.file_slowest * 1e3:.0f} ms), "
                f"finalize {r.file_finalize:.1f} s"
                for r in outbox
            )
            + "."
        )
    for r in results:
        if r.stored != r.delivered:
            print(f"note: {r.config}: the server stored {r.stored} lines, {r.delivered} counted")
        if r.uploader != UPLOADER_NAMES["sdk"] and r.delivered != r.episodes:
            print(f"note: {r.config}: {r.delivered} of {r.episodes} episodes delivered")
    print()
    ours = [r for r in results if r.uploader == "PrimeMonitor"]
    slowest = max(r.slowest_log for r in ours) * 1e3
    p99 = max(r.lag_p99 for r in ours)
    lag_max = max(r.lag_max for r in ours)
    at8 = [r for r in ours if r.in_flight == 8]
    print("Targets (PrimeMonitor, every configuration):")
    print(f"- slowest log() <= 1 ms: {slowest:.2f} ms, {verdict(slowest <= 1)}")
    print(
        f"- loop lag p99 <= 5 ms: {p99:.2f} ms, {verdict(p99 <= 5)} (max {lag_max:.2f} ms: "
        "judged by where the loop was, python -m bench.stalls)"
    )
    print(
        "- all delivered at 8 in flight: "
        + ", ".join(f"{NETWORK_NAMES[r.network]} {r.delivered}/{r.submitted}" for r in at8)
        + f", {verdict(bool(at8) and all(r.delivered == r.submitted for r in at8))}"
    )
    if outbox:
        slowest = max(r.slowest_log for r in outbox) * 1e3
        p99 = max(r.lag_p99 for r in outbox)
        print(
            "The same targets in outbox mode (its lag includes the FileMonitor's encoding on "
            f"the loop): slowest log() {slowest:.2f} ms, {verdict(slowest <= 1)}; lag p99 "
            f"{p99:.2f} ms, {verdict(p99 <= 5)}; all delivered: "
            + ", ".join(
                f"{NETWORK_NAMES[r.network]} {r.in_flight} in flight {r.delivered}/{r.episodes}"
                for r in outbox
            )
            + f", {verdict(all(r.delivered == r.episodes for r in outbox))}"
        )
    print()
    print(limit_sentence(ours, cpu))


def limit_sentence(ours: list[Result], cpu: Ceilings) -> str:
    top = max(r.in_flight for r in ours)
    parts = []
    over = False
    for network in NETWORKS:
        run = next(r for r in ours if r.network == network and r.in_flight == top)
        wire = cpu.transport.get(f"{network}:{top}", float("inf"))
        bound = min(cpu.serial, wire)
        stage = "encode + gzip" if cpu.serial <= wire else "transport + server"
        over = over or run.mbps > bound
        parts.append(
            f"{NETWORK_NAMES[network]}: {run.mbps:.0f} MB/s, {run.mbps / bound:.0%} of the "
            f"tighter limit, {stage} ({bound:.0f} MB/s)"
        )
    note = (
        " (Over 100%: the server goes on checking uploads while the driver builds episodes, "
        "time that MB/s leaves out.)"
        if over
        else ""
    )
    return (
        f"Throughput at {top} in flight against the limits (encode + gzip "
        f"{cpu.serial:.0f} MB/s on one core; transport + server as measured above): "
        + "; ".join(parts)
        + ". Below the limit, the difference is the 2 cores' contention: the server (CPU s/GB "
        "above) and the uploader share them, with whatever else runs on the machine (CPU "
        f"pressure).{note}"
    )


def _seconds(value: float | None, limit: str) -> str:
    return limit if value is None else f"{value:.1f}"


def outage_report(results: list[OutageResult], server_nice: int) -> None:
    """The outage section: one row per mode, and what the columns mean."""
    r0 = results[0]
    print(
        f"What a {r0.outage:.0f} s outage costs each mode: the TracesServer stopped (connection "
        f"refused) for {r0.outage:.0f} s while the driver logs {r0.episodes} production-sized "
        f"episodes ({r0.nbytes / MB:.0f} MB of JSON, {r0.nbytes / r0.queue_bytes:.1f}x "
        f"queue_bytes = {r0.queue_bytes / MIB:.0f} MiB in both modes) at a fixed "
        f"{r0.rate / MB:.1f} MB/s ({r0.episodes / r0.outage:.2f} episodes/s), then it comes "
        f"back on its port; {OUTAGE_IN_FLIGHT} in flight, no added network time, each mode "
        "in a fresh process. server down = from stop() to the restarted server answering."
    )
    print()
    head = (
        "| mode | server down (s) | logged | delivered | lost | pending at the end | "
        "first delivery after the return (s) | all answered after the return (s) | "
        "slowest log (ms) | lag p99 (ms) | lag max (ms) | peak RSS (MiB) |"
    )
    rule = "| --- | ---: | ---: | ---: | --- |" + " ---: |" * 7
    rows = []
    limit = f"> {r0.catch_up_limit:.0f}"
    for r in results:
        rows.append(
            f"| {OUTAGE_MODES[r.mode]} | {r.down:.1f} | {r.episodes} | {r.delivered} | "
            f"{lost_cell(r.lost, 0)} | {r.pending} | {_seconds(r.first_delivery, limit)} | "
            f"{_seconds(r.caught_up, limit)} | {r.slowest_log * 1e3:.2f} | "
            f"{r.lag_p99:.2f} | {r.lag_max:.2f} | {r.rss / MIB:.0f} |"
        )
    print("\n".join([head, rule, *rows]))
    print()
    where = f"at nice +{server_nice}" if server_nice > 0 else "at the benchmark's own priority"
    print(
        "Both modes run the Prime monitor's default retries: a jittered backoff from 1 s, "
        "doubled up to 30 s (x0.5-1.5), so the first delivery after the return waits for the "
        "backoff each batch in flight had reached; in memory a batch is given up after "
        "retry_for (300 s), in outbox mode never. all answered = until every logged episode "
        "is answered: finalize is called as the server answers again, and returns once every "
        "episode is delivered or counted lost (its drain_timeout, "
        f"{r0.catch_up_limit:.0f} s, counts the rest: '> {r0.catch_up_limit:.0f}'); in outbox "
        "mode the last step's batch closes at finalize (batches close at a step's end, "
        "never for time). lag = the 1 ms probe over the whole "
        "run but episode building; peak RSS = the child's ru_maxrss (episode bodies built "
        f"before the run included; the server, {where}, is another process). Outbox: a "
        "FileMonitor writes each episode first (its slowest log_episodes "
        + ", ".join(f"{r.file_slowest * 1e3:.0f} ms" for r in results if r.mode == "outbox")
        + ", not in slowest log)."
    )
    for r in results:
        if r.submitted != r.episodes:
            print(
                f"note: {OUTAGE_MODES[r.mode]}: the monitor counts {r.submitted} records "
                f"submitted for the {r.episodes} episodes logged"
            )
        if r.late > 1.0:
            print(
                f"note: {OUTAGE_MODES[r.mode]}: the driver fell behind its rate, its latest "
                f"log {r.late:.1f} s after its time"
            )
        if r.stored != r.delivered:
            print(
                f"note: {OUTAGE_MODES[r.mode]}: the server stored {r.stored} lines, "
                f"{r.delivered} counted"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.prime_monitor")
    parser.add_argument("--episodes", type=int, default=200)
    parser.add_argument("--quick", action="store_true", help="30 episodes, 1 and 8 in flight")
    parser.add_argument(
        "--server-nice",
        type=int,
        default=10,
        help="run the TracesServer this much lower in priority (0: the same)",
    )
    parser.add_argument(
        "--outage",
        type=float,
        help="seconds the server is down in the outage section (default 60, --quick: 10; "
        "0 skips it)",
    )
    parser.add_argument(
        "--outage-queue",
        type=int,
        help="queue_bytes of both modes in the outage section, in bytes (default 256 MiB, "
        "--quick: 64 MiB); twice this much is logged during the outage",
    )
    parser.add_argument("--one", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    outage = args.outage if args.outage is not None else 10.0 if args.quick else 60.0
    outage_queue = args.outage_queue or (64 if args.quick else 256) * MIB
    if args.one:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        if args.one.startswith("outage:"):
            mode = args.one.split(":", 1)[1]
            result: Any = run_outage(mode, outage, outage_queue, args.server_nice)
        else:
            result = run_one(args.one, args.episodes, args.server_nice)
        print(json.dumps(asdict(result)))
        return 0
    n = 30 if args.quick else args.episodes
    in_flight = (1, 8) if args.quick else (1, 4, 8)
    configs = []
    for net in NETWORKS:
        configs += [f"prime:{net}:{k}" for k in in_flight]
        if net == "wan" or not args.quick:  # --quick: outbox under the WAN only
            configs.append(f"outbox:{net}:8")
    configs.append("sdk:wan:1")
    t0 = time.perf_counter()
    results = []
    for config in configs:
        result = spawn(config, n, args.server_nice)
        print(f"{config}: done in {result.wall:.0f} s", file=sys.stderr, flush=True)
        results.append(result)
    outages = []
    for mode in OUTAGE_MODES if outage > 0 else ():
        run = spawn_outage(mode, outage, outage_queue, args.server_nice)
        print(f"outage:{mode}: done in {run.wall:.0f} s", file=sys.stderr, flush=True)
        outages.append(run)
    cpu = ceilings(rounds=3 if args.quick else 5, server_nice=args.server_nice)
    report(results, cpu, n, args.server_nice)
    if outages:
        print()
        outage_report(outages, args.server_nice)
    print()
    print(f"(benchmark wall time {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
