"""Benchmark of ``monitors.prime.PrimeMonitor`` against an uploader shaped like the SDK's.

    python -m bench.prime_monitor [--episodes N] [--quick] [--server-nice N]

N production-sized episodes (production's lognormal sizes; default 200, ``--quick``: 30)
go to a local ``TracesServer`` (its own process), one ``log_episodes([ep], step=i,
subset="all")`` call per episode, with (a) no added network time and (b) 100 ms latency and
100 MB/s bandwidth per request, while a probe samples the event loop every 1 ms:

- ours: ``PrimeMonitor`` at 1, 4 and 8 requests in flight (``--quick``: 1 and 8);
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
many are queued, as a trainer busy elsewhere would; without it the driver would just pile up
built episodes in memory. Time = wall clock from the first ``log`` to the end of ``finalize``
minus the time spent building episodes (the loop is blocked then; worker threads and the
server keep going, which flatters both sides a little).

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
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import hashlib
import json
import logging
import resource
import subprocess
import sys
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
from monitors import LoopLagProbe, Monitor
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


def _uploader(kind: str, url: str, in_flight: int) -> Monitor:
    if kind == "prime":
        return PrimeMonitor(
            api_key=KEY,
            traces_url=url,
            base_url=url,
            run_id="bench",
            max_in_flight=in_flight,
            drain_timeout=DRAIN_TIMEOUT,
        )
    # Its log call blocks while AHEAD episodes wait, however long.
    return SdkLikeUploader(
        url=url, api_key=KEY, queue_records=AHEAD, put_timeout=None, drain_timeout=DRAIN_TIMEOUT
    )


async def _wait_room(monitor: Monitor) -> None:
    """Ours: wait while AHEAD episodes are queued (private, for the benchmark only)."""
    if isinstance(monitor, PrimeMonitor):
        send = monitor._send
        assert send is not None
        while send.statistics().current_buffer_used >= AHEAD:
            await asyncio.sleep(0.001)


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
    uploader, network, in_flight_text = config.split(":")
    in_flight = int(in_flight_text)
    async with TracesServer(api_key=KEY, faults=NETWORKS[network]) as server:
        lower_priority(server.pid, server_nice)
        sink = _uploader(uploader, server.url, in_flight)
        building = 0.0
        building_cpu = 0.0
        slowest = 0.0
        nbytes = 0
        async with LoopLagProbe() as probe:
            await sink.start()
            server_cpu0 = process_cpu(server.pid)
            stall0 = cpu_stall_seconds()
            cpu0 = time.process_time()
            start = time.perf_counter()
            for i, size in enumerate(sizes):
                await _wait_room(sink)
                probe.pause()
                t0, c0 = time.perf_counter(), time.process_time()
                episode = fresh_episode(size, index=i)
                gc.collect()
                building += time.perf_counter() - t0
                building_cpu += time.process_time() - c0
                probe.resume()
                await asyncio.sleep(0.002)  # let the probe take a sample between episodes
                t0 = time.perf_counter()
                await sink.log_episodes([episode], step=i, subset="all")
                slowest = max(slowest, time.perf_counter() - t0)
                nbytes += size
                del episode
            t0 = time.perf_counter()
            await sink.finalize()
            end = time.perf_counter()
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
        uploader="PrimeMonitor" if uploader == "prime" else "SDK-like baseline",
        network=network,
        in_flight=in_flight,
        episodes=len(sizes),
        nbytes=nbytes,
        seconds=end - start - building,
        wall=0.0,
        slowest_log=slowest,
        drain=end - t0,
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
    )


def run_one(config: str, n: int, server_nice: int) -> Result:
    t0 = time.perf_counter()
    sizes = lognormal_sizes(n, seed=0)
    for i, size in enumerate(sizes):  # build the bodies outside the measurement
        episode_maker().episode(size, index=i)
    gc.collect()
    result = asyncio.run(_measure(config, sizes, server_nice))
    result.rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    result.wall = time.perf_counter() - t0
    return result


def spawn(config: str, n: int, server_nice: int) -> Result:
    """``run_one`` in a fresh interpreter, so its peak RSS is its own."""
    cmd = [sys.executable, "-m", "bench.prime_monitor", "--one", config, "--episodes", str(n)]
    cmd += ["--server-nice", str(server_nice)]
    proc = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, check=True)
    line = proc.stdout.decode().strip().splitlines()[-1]
    return Result(**json.loads(line))


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
    rule = "| --- | --- | ---: | ---: | ---: | ---: | --- |" + " ---: |" * 8
    rows = []
    for r in results:
        lost = ", ".join(f"{k}: {v}" for k, v in sorted(r.lost.items()) if v) or "-"
        rows.append(
            f"| {r.uploader} | {NETWORK_NAMES[r.network]} | {r.in_flight} | {r.eps:.2f} | "
            f"{r.mbps:.1f} | {r.delivered} / {r.submitted} | {lost} | "
            f"{r.slowest_log * 1e3:.2f} | {r.lag_p99:.2f} | {r.lag_max:.2f} | "
            f"{r.rss / MIB:.0f} | {r.drain:.1f} | {r.cpu_per_gb()} | "
            + ("?" if r.pressure is None else f"{r.pressure:.0%}")
            + " |"
        )
    return "\n".join([head, rule, *rows])


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
    for r in results:
        if r.stored != r.delivered:
            print(f"note: {r.config}: the server stored {r.stored} lines, {r.delivered} counted")
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
    parser.add_argument("--one", metavar="CONFIG", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
        print(json.dumps(asdict(run_one(args.one, args.episodes, args.server_nice))))
        return 0
    n = 30 if args.quick else args.episodes
    in_flight = (1, 8) if args.quick else (1, 4, 8)
    configs = [f"prime:{net}:{k}" for net in NETWORKS for k in in_flight]
    configs.append("sdk:wan:1")
    t0 = time.perf_counter()
    results = []
    for config in configs:
        result = spawn(config, n, args.server_nice)
        print(f"{config}: done in {result.wall:.0f} s", file=sys.stderr, flush=True)
        results.append(result)
    cpu = ceilings(rounds=3 if args.quick else 5, server_nice=args.server_nice)
    report(results, cpu, n, args.server_nice)
    print()
    print(f"(benchmark wall time {time.perf_counter() - t0:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
