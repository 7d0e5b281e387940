"""Benchmark of sealed trace chunks: how much disk they save, what sealing costs a run, and
how fast one record comes back out of one.

    python -m bench.seal [--quick] [--episodes N] [--parts 1,2,3] [--json PATH] [--md PATH]

A trace stream seals each chunk it rolls past: a background thread compresses
``NNNNN.jsonl`` into ``NNNNN.jsonl.zst`` in zstd's seekable format (frames of 4 MiB of input,
checksums on) and removes the plain chunk. Three parts, on production-like episodes
(``EpisodeMaker``: verifiers' record schema, ~80% of the bytes per-token arrays):

1. Compression alone, on one JSONL buffer of the production mix (a few hundred MB): ratio
   (plain bytes / sealed bytes), compression speed per core (process CPU time, all threads,
   so zstd's own workers count) and wall, and decompression speed, at levels 1, 3 and 6, and
   at level 3 with two zstd worker threads (its default job size, then 1 MiB jobs: at level 3
   a default job is 8 MiB, more than a frame, so each frame is one job and the workers take
   turns rather than share it). Then, at level 3, the ratio of the text-heavy episodes
   (``bench.text_episodes``) and of the mix with its token ids and logprobs drawn afresh.
   That last row is there because the maker's per-token arrays are slices of one
   64 Ki-token pool (and its text of a few text pools), so a frame holds repeats that real
   records do not; drawing every id uniformly from the 151 k vocabulary is the other extreme
   (real ids follow a Zipf-like law, with far less entropy). The real ratio lies between.
2. ``FileMonitor(compress=True)`` against ``compress=False``, logging the same episodes one
   ``log_episodes`` call each (as ``bench.file_monitor`` does) with a small ``chunk_bytes``
   so that several chunks roll and seal during the run, while a probe samples the event
   loop every 1 ms: throughput, lag, how long ``finalize`` takes after the last log (it
   waits for the last seals), the disk used at the end, and the most full plain chunks seen
   waiting to be sealed (a thread lists the stream's directory every 10 ms: every plain
   ``NNNNN.jsonl`` but the highest-numbered, live one).
3. One record out of a single 5 GiB chunk (``--quick``: 256 MiB), sealed and plain:
   ``find_record`` (by id, through the index) and ``read_record`` (by number) for the first,
   middle and last record, the median of three calls each. The page cache is not dropped
   (that needs root and would disturb the rest of the machine): the chunk was just written,
   so the disk is warm; each call opens the chunk and decompresses what it needs anew.

Numbers come from a shared 2-core machine: this is a report, nothing here asserts on time.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import gc
import json
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from importlib.metadata import version
from pathlib import Path
from typing import Any

import numpy as np
import orjson
from pyzstd import CParameter, SeekableZstdFile, zstd_version

from monitors import FileMonitor, LagStats, LoopLagProbe
from monitors.loadtest.cli import parse_bytes
from monitors.testing.episodes import _VOCAB, Episode, lognormal_sizes
from monitors.traces import TraceWriter, find_record, read_record
from monitors.traces._reader import BIG_LINE

from .__main__ import _log, table
from .documents import MIX_INDEX, episode_maker, fresh_episode
from .lag import measure_idle_lag
from .prime_monitor import cpu_stall_seconds
from .text_episodes import MIN_BYTES as TEXT_MIN_BYTES
from .text_episodes import make_episode

MB = 1_000_000
MIB = 2**20
GIB = 2**30
#: Input bytes per zstd frame, as the trace streams seal.
FRAME_BYTES = 4 * MIB
#: Bytes handed to the compressor at once (as a sealer copying a chunk in blocks does).
PIECE = MIB
#: The level the monitor runs of part 2 and the big chunk of part 3 are sealed at.
LEVEL = 3
#: Part 1's settings: (row name, level, zstd worker threads (0: compress in the caller),
#: zstd's job size (0: its default, larger than a frame at level 3)).
SETTINGS: tuple[tuple[str, int, int, int], ...] = (
    ("level 1", 1, 0, 0),
    ("level 3", 3, 0, 0),
    ("level 6", 6, 0, 0),
    ("level 3, 2 zstd workers", 3, 2, 0),
    ("level 3, 2 zstd workers, 1 MiB jobs", 3, 2, MIB),
)
#: Where the lookup of part 3 must finish: this, plus the record's bytes at decompression
#: speed.
LOOKUP_SECONDS = 0.1
#: Calls timed per record, copy and function in part 3 (the median is reported).
CALLS = 3
#: Bytes of part 3's sealed chunk decompressed to measure the speed the allowance takes.
SPEED_SPAN = 128 * MIB
LAG_P99_MS = 5.0
RATIO_TARGET = 4.0
#: Free disk part 3 needs, per byte of its chunk: the plain copy, the sealed stream's plain
#: chunk until its seal removes it, and the sealed file; plus a margin.
DISK_PER_BYTE = 2.4
DISK_MARGIN = GIB
SMALLEST_BIG = 64 * MIB
#: Episode numbers of part 3's records (apart from the other parts' ids).
BIG_INDEX = 100_000
_PLAIN = re.compile(r"(\d{5,})\.jsonl\Z")
ROOT = Path(__file__).resolve().parents[1]
DEFAULT_JSON = ROOT / "bench" / "results" / "seal.json"
DEFAULT_MD = ROOT / "docs" / "data" / "seal.md"


@dataclass(frozen=True)
class Config:
    """What one run measures, and at what size.

    :param mix_bytes: part 1's buffer of production-mix JSONL (at least this many bytes).
    :param side_bytes: part 1's text-heavy and redrawn buffers (the mix's first episodes).
    :param repeats: timed runs per compression setting (the fastest is kept).
    :param episodes: part 2's episodes.
    :param size: every episode of every part this size (None: production's sizes).
    :param chunk_bytes: part 2's chunk size.
    :param big_bytes: part 3's chunk.
    :param parts: which parts to run.
    """

    mix_bytes: int = 400 * MB
    side_bytes: int = 100 * MB
    repeats: int = 2
    episodes: int = 100
    size: int | None = None
    chunk_bytes: int = 256 * MIB
    big_bytes: int = 5 * GIB
    parts: frozenset[int] = frozenset({1, 2, 3})


FULL = Config()
QUICK = Config(
    mix_bytes=120 * MB,
    side_bytes=40 * MB,
    repeats=1,
    episodes=20,
    chunk_bytes=48 * MIB,
    big_bytes=256 * MIB,
)


def _sizes(total: int, size: int | None, *, seed: int) -> list[int]:
    """Episode sizes adding up to at least ``total`` bytes: all ``size``, or production's."""
    if size is not None:
        return [size] * max(1, -(-total // size))
    sizes: list[int] = []
    while sum(sizes) < total:
        sizes = lognormal_sizes(2 * len(sizes) + 16, seed=seed)
    out: list[int] = []
    for s in sizes:
        if sum(out) >= total:
            break
        out.append(s)
    return out


# -- part 1: compression alone ------------------------------------------------------------


@dataclass
class Compression:
    """One buffer compressed with one setting: sizes, and the best run's times."""

    data: str
    setting: str
    level: int
    workers: int
    job: int
    plain: int
    sealed: int
    cpu_s: float  # process CPU seconds (all threads) writing the sealed file
    wall_s: float
    read_s: float  # wall seconds reading it all back (the decompressor runs in the caller)

    @property
    def ratio(self) -> float:
        return self.plain / self.sealed

    @property
    def mbps_cpu(self) -> float:
        return self.plain / MB / self.cpu_s

    @property
    def mbps_wall(self) -> float:
        return self.plain / MB / self.wall_s

    @property
    def read_mbps(self) -> float:
        return self.plain / MB / self.read_s


def _options(level: int, workers: int, job: int) -> dict[int, int]:
    options: dict[int, int] = {CParameter.compressionLevel: level, CParameter.checksumFlag: 1}
    if workers:
        options[CParameter.nbWorkers] = workers
    if job:
        options[CParameter.jobSize] = job
    return options


def seal_buffer(
    data: bytes, path: Path, *, level: int, workers: int = 0, job: int = 0
) -> tuple[float, float]:
    """Write ``data`` as a seekable zstd file (4 MiB frames), a piece at a time; return the
    process CPU and wall seconds it took (page cache, no fsync)."""
    view = memoryview(data)
    options = _options(level, workers, job)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    with SeekableZstdFile(
        path, "wb", level_or_option=options, max_frame_content_size=FRAME_BYTES
    ) as f:
        for at in range(0, len(view), PIECE):
            f.write(view[at : at + PIECE])
    return time.process_time() - cpu0, time.perf_counter() - wall0


def unseal(path: Path, expected: bytes | None = None) -> float:
    """Read a seekable zstd file back to its end, a piece at a time; return the wall seconds.
    With ``expected``, also check the bytes (then the time includes the comparison).

    :raises AssertionError: The bytes differ from ``expected``.
    """
    at = 0
    t0 = time.perf_counter()
    with SeekableZstdFile(path, "rb") as f:
        while piece := f.read(PIECE):
            if expected is not None and piece != expected[at : at + len(piece)]:
                raise AssertionError(f"{path}: bytes from {at} differ from what was sealed")
            at += len(piece)
    seconds = time.perf_counter() - t0
    if expected is not None and at != len(expected):
        raise AssertionError(f"{path}: {at} bytes read back, {len(expected)} sealed")
    return seconds


def compress(
    data: bytes, name: str, setting: tuple[str, int, int, int], work: Path, repeats: int
) -> Compression:
    """``data`` sealed with one setting ``repeats`` times (the fastest run kept), checked
    once and read back ``repeats`` times."""
    label, level, workers, job = setting
    path = work / "sealed.jsonl.zst"
    best = (float("inf"), float("inf"))
    for _ in range(repeats):
        gc.collect()
        run = seal_buffer(data, path, level=level, workers=workers, job=job)
        best = min(best, run, key=lambda t: t[1])
    sealed = path.stat().st_size
    unseal(path, data)
    read = min(unseal(path) for _ in range(repeats))
    path.unlink()
    return Compression(name, label, level, workers, job, len(data), sealed, *best, read)


def _redraw(value: Any, rng: np.random.Generator) -> Any:
    """A copy of a record whose ``token_ids`` are drawn uniformly from the vocabulary and
    whose ``logprobs`` are drawn afresh from the maker's law (every other value shared)."""
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for key, item in value.items():
            if key == "token_ids" and item:
                out[key] = rng.integers(0, _VOCAB, len(item)).tolist()
            elif key == "logprobs" and item:
                out[key] = np.round(-rng.exponential(1 / 3.0, len(item)), 4).tolist()
            else:
                out[key] = _redraw(item, rng)
        return out
    if isinstance(value, list) and value and isinstance(value[0], (dict, list)):
        return [_redraw(item, rng) for item in value]
    return value


def mix_jsonl(episodes: list[Episode]) -> bytes:
    """The episodes' records as one JSONL buffer (``orjson.dumps`` and a newline each)."""
    return b"".join(orjson.dumps(ep.to_record()) + b"\n" for ep in episodes)


def part1(cfg: Config, work: Path, t0: float) -> list[Compression]:
    maker = episode_maker()
    sizes = _sizes(cfg.mix_bytes, cfg.size, seed=0)
    episodes = [maker.episode(size, index=MIX_INDEX + i) for i, size in enumerate(sizes)]
    _log(t0, f"part 1: building {len(episodes)} episodes of the production mix")
    mix = mix_jsonl(episodes)
    name = f"production mix ({len(episodes)} eps)"
    rows = []
    for setting in SETTINGS:
        _log(t0, f"part 1: {name}, {len(mix) / MB:.0f} MB, {setting[0]}")
        rows.append(compress(mix, name, setting, work, cfg.repeats))
    del mix
    level3 = SETTINGS[1]
    side = _sizes(cfg.side_bytes, cfg.size, seed=0)[: len(sizes)]

    _log(t0, "part 1: the mix with its token ids and logprobs drawn afresh")
    rng = np.random.default_rng(0)
    redrawn = b"".join(
        orjson.dumps(_redraw(ep.to_record(), rng)) + b"\n" for ep in episodes[: len(side)]
    )
    rows.append(
        compress(redrawn, f"same, ids + logprobs redrawn ({len(side)} eps)", level3, work, 1)
    )
    del redrawn

    _log(t0, "part 1: text-heavy episodes")
    text = b"".join(
        orjson.dumps(make_episode(max(size, TEXT_MIN_BYTES), seed=MIX_INDEX + i)) + b"\n"
        for i, size in enumerate(side)
    )
    rows.append(compress(text, f"text-heavy ({len(side)} eps)", level3, work, 1))
    return rows


def compression_table(rows: list[Compression]) -> str:
    headers = [
        "JSONL",
        "setting",
        "MB",
        "ratio",
        "compress MB/s per core",
        "compress MB/s wall",
        "decompress MB/s",
    ]
    cells = [
        [
            r.data,
            r.setting,
            f"{r.plain / MB:.0f}",
            f"{r.ratio:.2f}x",
            f"{r.mbps_cpu:.0f}",
            f"{r.mbps_wall:.0f}",
            f"{r.read_mbps:.0f}",
        ]
        for r in rows
    ]
    return table(headers, cells, left=2)


# -- part 2: the file monitor, sealing on and off -----------------------------------------


class BacklogWatch:
    """Lists a stream's directory from a thread of its own (not the loop, whose lag is
    measured) and keeps the most plain chunks seen waiting to be sealed: every plain
    ``NNNNN.jsonl`` but the highest-numbered one, which the writer is filling."""

    def __init__(self, directory: Path, *, interval: float = 0.01) -> None:
        self.directory = directory
        self.interval = interval
        self.most = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="seal-backlog", daemon=True)

    def waiting(self) -> int:
        """Plain chunks other than the live one, now."""
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:
            return 0
        return max(0, sum(1 for name in names if _PLAIN.match(name)) - 1)

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.most = max(self.most, self.waiting())

    def __enter__(self) -> BacklogWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclass
class MonitorRun:
    """One ``FileMonitor`` run of part 2."""

    compress: bool
    episodes: int
    nbytes: int
    seconds: float  # inside log calls, summed
    slowest: float  # the slowest log call
    finalize: float  # the finalize call, right after the last log (and freeing its episode)
    lag: LagStats
    cpu_s: float  # process CPU seconds, first log to finalize, episode building excluded
    pressure: float | None  # share of that span some task waited for a core (Linux PSI)
    disk: int  # bytes of every file under the run's root at the end
    plain_chunks: int  # at the end
    sealed_chunks: int
    backlog: int | None  # the most full plain chunks seen waiting (None: not sealing)
    degraded: dict[str, int]  # the monitor's stats().degraded (seal_failed: chunks left plain)

    @property
    def name(self) -> str:
        return f"sealing {'on' if self.compress else 'off'}"

    @property
    def mbps(self) -> float:
        return self.nbytes / MB / self.seconds


def disk_bytes(root: Path) -> int:
    """Bytes of every file under ``root`` (their sizes, not the blocks they take)."""
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


async def drive_monitor(
    root: Path, sizes: list[int], *, compress: bool, chunk_bytes: int
) -> MonitorRun:
    """Log a fresh episode of each size, one ``log_episodes`` call each, then finalize,
    timing the calls and probing the loop (not while an episode is built or freed)."""
    monitor = FileMonitor(root, chunk_bytes=chunk_bytes, compress=compress, level=LEVEL)
    await monitor.start()
    stream = monitor.stream_dir  # root/monitors/file/traces/stream: every episode
    nbytes = 0
    busy = slowest = building_cpu = 0.0
    with BacklogWatch(stream) as watch:
        async with LoopLagProbe() as probe:
            stall0 = cpu_stall_seconds()
            cpu0 = time.process_time()
            start = time.perf_counter()
            episode: dict[str, Any] | None = None
            for i, size in enumerate([*sizes, None]):  # None: only free the last one
                # Free the previous episode and build the next with the probe paused: freeing
                # the largest takes ~0.1 s on the loop, the bench's doing, not the monitor's.
                probe.pause()
                c0 = time.process_time()
                episode = None
                if size is not None:
                    episode = fresh_episode(size, index=i)
                    nbytes += episode_maker().episode(size, index=i).size + 1
                gc.collect()
                building_cpu += time.process_time() - c0
                probe.resume()
                if episode is None:
                    break
                await asyncio.sleep(0.002)  # let the probe take a sample between episodes
                t0 = time.perf_counter()
                await monitor.log_episodes([episode], step=i, kind="train", subset="all")
                spent = time.perf_counter() - t0
                busy += spent
                slowest = max(slowest, spent)
            t0 = time.perf_counter()
            await monitor.finalize()
            end = time.perf_counter()
            cpu = time.process_time() - cpu0 - building_cpu
            stall1 = cpu_stall_seconds()
    stats = monitor.stats()
    assert stats.delivered == len(sizes), stats
    names = os.listdir(stream)
    pressure = None if stall0 is None or stall1 is None else (stall1 - stall0) / (end - start)
    return MonitorRun(
        compress=compress,
        episodes=len(sizes),
        nbytes=nbytes,
        seconds=busy,
        slowest=slowest,
        finalize=end - t0,
        lag=probe.stats(),
        cpu_s=cpu,
        pressure=pressure,
        disk=disk_bytes(root),
        plain_chunks=sum(1 for name in names if _PLAIN.match(name)),
        sealed_chunks=sum(1 for name in names if name.endswith(".jsonl.zst")),
        backlog=watch.most if compress else None,
        degraded=dict(stats.degraded),
    )


def part2(cfg: Config, work: Path, t0: float) -> list[MonitorRun]:
    if cfg.size is not None:
        sizes = [cfg.size] * cfg.episodes
    else:
        sizes = lognormal_sizes(cfg.episodes, seed=0)
    for i, size in enumerate(sizes):  # build the episodes' bodies outside the measurement
        episode_maker().episode(size, index=i)
    runs = []
    for compress in (True, False):
        _log(t0, f"part 2: FileMonitor(compress={compress}), {len(sizes)} episodes")
        root = work / f"monitor-{'on' if compress else 'off'}"
        runs.append(
            asyncio.run(drive_monitor(root, sizes, compress=compress, chunk_bytes=cfg.chunk_bytes))
        )
        shutil.rmtree(root)
    return runs


def monitor_table(runs: list[MonitorRun]) -> str:
    off = next((r for r in runs if not r.compress), None)
    headers = [
        "FileMonitor",
        "episodes",
        "MB",
        "MB/s",
        "slowest log (ms)",
        "lag p50",
        "lag p99",
        "lag max",
        "finalize after last log (s)",
        "CPU s/GB",
        "CPU pressure",
        "disk MB",
        "disk vs off",
        "chunks plain / sealed",
        "most waiting to seal",
    ]
    cells = [
        [
            r.name,
            str(r.episodes),
            f"{r.nbytes / MB:.0f}",
            f"{r.mbps:.0f}",
            f"{r.slowest * 1e3:.1f}",
            f"{r.lag.p50:.2f}",
            f"{r.lag.p99:.2f}",
            f"{r.lag.max:.2f}",
            f"{r.finalize:.2f}",
            f"{r.cpu_s / (r.nbytes / 1e9):.1f}",
            "?" if r.pressure is None else f"{r.pressure:.0%}",
            f"{r.disk / MB:.0f}",
            "" if off is None else f"{r.disk / off.disk:.2f}x",
            f"{r.plain_chunks} / {r.sealed_chunks}",
            "-" if r.backlog is None else str(r.backlog),
        ]
        for r in runs
    ]
    return table(headers, cells)


# -- part 3: one record out of a big chunk ------------------------------------------------


@dataclass
class Lookup:
    """One record of part 3, looked up ``CALLS`` times in each copy of the chunk."""

    where: str
    n: int
    id: str
    nbytes: int  # its line, newline included
    allowance: float  # LOOKUP_SECONDS + its bytes at decompression speed
    parse_s: list[float]  # orjson.loads of its line alone, for scale (each call)
    find_s: dict[str, list[float]] = field(default_factory=dict)  # copy -> each call's seconds
    read_s: dict[str, list[float]] = field(default_factory=dict)

    def find(self, copy: str) -> float:
        return statistics.median(self.find_s[copy])

    def read(self, copy: str) -> float:
        return statistics.median(self.read_s[copy])

    @property
    def parse(self) -> float:
        return statistics.median(self.parse_s)

    @property
    def worst_sealed(self) -> float:
        return max(self.find("sealed"), self.read("sealed"))


@dataclass
class BigChunk:
    """Part 3: the chunk, its two copies and the lookups."""

    nbytes: int  # its plain bytes
    records: int
    sealed: int  # the sealed file's bytes
    write_s: dict[str, float]  # copy -> seconds of appends
    close_s: dict[str, float]  # copy -> seconds of close (sealing it, for the sealed copy)
    read_mbps: float  # decompression speed on this chunk (the allowance's)
    lookups: list[Lookup]
    pressure: float | None  # share of the lookups' time some task waited for a core
    note: str | None = None  # why the chunk is smaller than asked


def big_size(asked: int, work: Path) -> tuple[int, str | None]:
    """The chunk size part 3 can afford on ``work``'s disk, and a note if it is not
    ``asked``."""
    free = shutil.disk_usage(work).free
    size = asked
    while size > SMALLEST_BIG and DISK_PER_BYTE * size + DISK_MARGIN > free:
        size //= 2
    if size == asked:
        return size, None
    return size, (
        f"only {free / 1e9:.1f} GB free under {work}: the chunk is {size / MIB:.0f} MiB "
        f"instead of {asked / MIB:.0f} MiB"
    )


async def write_stream(
    directory: Path, episodes: list[Episode], *, compress: bool, chunk_bytes: int
) -> tuple[float, float]:
    """Append every episode's record to a new stream (one chunk); return the seconds of the
    appends and of ``close`` (which waits for the seal)."""
    writer = TraceWriter(directory, chunk_bytes=chunk_bytes, compress=compress, level=LEVEL)
    t0 = time.perf_counter()
    for i, episode in enumerate(episodes):
        await writer.append(episode.to_record(), step=i // 256, kind="train")
    t1 = time.perf_counter()
    await writer.close()
    return t1 - t0, time.perf_counter() - t1


def _decompress_seconds(path: Path, span: int) -> float:
    """Wall seconds to read the first ``span`` uncompressed bytes of a sealed file."""
    with SeekableZstdFile(path, "rb") as f:
        t0 = time.perf_counter()
        left = span
        while left > 0 and (piece := f.read(min(PIECE, left))):
            left -= len(piece)
        return time.perf_counter() - t0


def _times(fn: Callable[..., Any], *args: Any, expect: str | None = None) -> list[float]:
    """Seconds of ``CALLS`` calls of ``fn(*args)`` (the collector run before each, the value
    freed after each, neither timed); with ``expect``, each value's ``"id"`` must be it."""
    times = []
    for _ in range(CALLS):
        gc.collect()
        t0 = time.perf_counter()
        value = fn(*args)
        times.append(time.perf_counter() - t0)
        if expect is not None:
            assert value["id"] == expect, (fn.__name__, args, value["id"])
        del value
    return times


def part3(cfg: Config, work: Path, t0: float) -> BigChunk:
    size, note = big_size(cfg.big_bytes, work)
    if note:
        print(f"note: {note}", file=sys.stderr)
    maker = episode_maker()
    episodes: list[Episode] = []
    total = 0
    for i, target in enumerate(_sizes(size, cfg.size, seed=3)):
        episode = maker.episode(target, index=BIG_INDEX + i)
        if total + episode.size + 1 > size:
            break
        episodes.append(episode)
        total += episode.size + 1
    if not episodes:
        raise ValueError(f"part 3's chunk ({size} bytes) holds no episode; make it larger")
    dirs = {"sealed": work / "big-sealed", "plain": work / "big-plain"}
    write_s: dict[str, float] = {}
    close_s: dict[str, float] = {}
    for copy, directory in dirs.items():
        _log(t0, f"part 3: writing the {copy} stream, {_size(total)} in one chunk")
        write_s[copy], close_s[copy] = asyncio.run(
            write_stream(directory, episodes, compress=copy == "sealed", chunk_bytes=size)
        )
    (sealed_file,) = dirs["sealed"].glob("*.jsonl.zst")
    plain = [name for name in os.listdir(dirs["sealed"]) if _PLAIN.match(name)]
    assert not plain, f"the sealed stream still has plain chunks: {plain}"

    # The decompression speed the allowance takes: this chunk's first SPEED_SPAN bytes (or
    # all), the fastest of CALLS passes (what the machine can do, not what it did when busy).
    span = min(total, SPEED_SPAN)
    read_mbps = span / MB / min(_decompress_seconds(sealed_file, span) for _ in range(CALLS))

    lookups = []
    stall0, start = cpu_stall_seconds(), time.perf_counter()
    for where, n in (("start", 0), ("middle", len(episodes) // 2), ("end", len(episodes) - 1)):
        episode = episodes[n]
        nbytes = episode.size + 1
        parse_s = _times(orjson.loads, orjson.dumps(episode.to_record()))
        allowance = LOOKUP_SECONDS + nbytes / MB / read_mbps
        lookup = Lookup(where, n, episode.id, nbytes, allowance, parse_s)
        for copy, directory in dirs.items():
            lookup.find_s[copy] = _times(find_record, directory, episode.id, expect=episode.id)
            lookup.read_s[copy] = _times(read_record, directory, n, expect=episode.id)
        lookups.append(lookup)
    stall1 = cpu_stall_seconds()
    pressure = (
        None
        if stall0 is None or stall1 is None
        else (stall1 - stall0) / (time.perf_counter() - start)
    )
    return BigChunk(
        nbytes=total,
        records=len(episodes),
        sealed=sealed_file.stat().st_size,
        write_s=write_s,
        close_s=close_s,
        read_mbps=read_mbps,
        lookups=lookups,
        pressure=pressure,
        note=note,
    )


def lookup_table(big: BigChunk) -> str:
    headers = [
        "record",
        "number",
        "MB",
        "sealed: find_record (ms)",
        "sealed: read_record (ms)",
        "allowance (ms)",
        "",
        "plain: find_record (ms)",
        "plain: read_record (ms)",
        "orjson.loads alone (ms)",
    ]
    cells = [
        [
            lk.where,
            str(lk.n),
            f"{lk.nbytes / MB:.1f}",
            f"{lk.find('sealed') * 1e3:.1f}",
            f"{lk.read('sealed') * 1e3:.1f}",
            f"{lk.allowance * 1e3:.0f}",
            _verdict(lk.worst_sealed <= lk.allowance),
            f"{lk.find('plain') * 1e3:.1f}",
            f"{lk.read('plain') * 1e3:.1f}",
            f"{lk.parse * 1e3:.1f}",
        ]
        for lk in big.lookups
    ]
    return table(headers, cells)


# -- the report ---------------------------------------------------------------------------


@dataclass
class Target:
    goal: str
    measured: str
    met: bool


def _size(n: float) -> str:
    """Bytes for a reader: GiB, MiB or kB."""
    if n >= GIB:
        return f"{n / GIB:.2f} GiB"
    if n >= MIB:
        return f"{n / MIB:.0f} MiB"
    return f"{n / 1e3:.0f} kB"


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def targets(rows: list[Compression], runs: list[MonitorRun], big: BigChunk | None) -> list[Target]:
    out = []
    level3 = next((r for r in rows if r.level == LEVEL and not r.workers), None)
    if level3 is not None:
        out.append(
            Target(
                f"sealed chunks take >= {RATIO_TARGET:.0f}x less disk than plain JSONL "
                f"(production mix, level {LEVEL})",
                f"{level3.ratio:.2f}x",
                level3.ratio >= RATIO_TARGET,
            )
        )
    on = next((r for r in runs if r.compress), None)
    if on is not None:
        out.append(
            Target(
                f"loop lag p99 <= {LAG_P99_MS:.0f} ms with sealing running (FileMonitor)",
                f"{on.lag.p99:.2f} ms (max {on.lag.max:.2f} ms)",
                on.lag.p99 <= LAG_P99_MS,
            )
        )
        assert on.backlog is not None
        out.append(
            Target(
                "at most one full chunk waits to be sealed",
                f"{on.backlog} at most",
                on.backlog <= 1,
            )
        )
    if big is not None:
        worst = max(big.lookups, key=lambda lk: lk.worst_sealed - lk.allowance)
        out.append(
            Target(
                f"one record from a sealed {_size(big.nbytes)} chunk in <= "
                f"{LOOKUP_SECONDS * 1e3:.0f} ms + its size at decompression speed",
                f"worst {worst.worst_sealed * 1e3:.0f} ms against {worst.allowance * 1e3:.0f} "
                f"ms ({worst.where}, {worst.nbytes / MB:.1f} MB)",
                all(lk.worst_sealed <= lk.allowance for lk in big.lookups),
            )
        )
    return out


def targets_table(ts: list[Target]) -> str:
    return table(["goal", "measured", ""], [[t.goal, t.measured, _verdict(t.met)] for t in ts])


def report(
    cfg: Config,
    quick: bool,
    elapsed: float,
    idle: LagStats | None,
    rows: list[Compression],
    runs: list[MonitorRun],
    big: BigChunk | None,
    ts: list[Target],
) -> str:
    lines = [
        f"sealed trace chunks ({'quick' if quick else 'full'} run, {elapsed:.0f} s): Python "
        f"{platform.python_version()}, pyzstd {version('pyzstd')} (zstd "
        f"{zstd_version}), {os.cpu_count()} cores, {platform.machine()}",
    ]
    if rows:
        best = f"the fastest of {cfg.repeats} runs" if cfg.repeats > 1 else "one run"
        lines += [
            "",
            "1. Compression alone: seekable zstd, 4 MiB frames, checksums on, written 1 MiB at "
            "a time to a file in the page cache (no fsync)",
            "",
            compression_table(rows),
            "",
            "ratio = plain bytes / sealed bytes; compress MB/s per core = MB of JSON / process "
            "CPU seconds (all threads: zstd's workers count), wall = over the wall clock; "
            "decompress = reading it all back with SeekableZstdFile, wall clock (one thread). "
            "2 zstd workers: zstd's default job at level 3 (8 MiB) is larger than a frame "
            "(4 MiB), so each frame is one job and they do not run side by side; 1 MiB jobs "
            "split a frame, at some cost in ratio. "
            f"The mix: {best}; the rows under it: one run. The maker's token ids and logprobs "
            "are slices of one 64 Ki-token pool, which a frame finds again; the redrawn row "
            "draws every id uniformly from the 151 k vocabulary instead (more entropy than real "
            "ids, which follow a Zipf-like law): real records fall between those two rows.",
        ]
    if runs:
        assert idle is not None
        chunk = cfg.chunk_bytes
        lines += [
            "",
            f"2. FileMonitor, sealing on (level {LEVEL}) and off, the same "
            f"{runs[0].episodes} episodes, chunk_bytes {chunk / MIB:.0f} MiB",
            "",
            monitor_table(runs),
            "",
            "MB/s = JSON bytes / time inside the log calls; lag (ms) = a task asking to wake "
            "every 1 ms, all through the run and finalize but not while an episode is "
            "built or freed; finalize after last log = the finalize call, which returns once "
            "every stream is closed (sealing on: its last chunks sealed); CPU s/GB = process "
            "CPU seconds (all threads) from the first log to the end of finalize, episode "
            "building excluded, per GB of JSON; CPU "
            "pressure = share of that span in which some task on the machine waited for a core "
            "(/proc/pressure/cpu); disk = bytes of every file at the end; most waiting to seal "
            "= the most plain chunks, other than the live one, seen at once (listed every "
            f"10 ms). The idle loop's own lag (1 s): p99 {idle.p99:.2f} ms, max "
            f"{idle.max:.2f} ms. The bench logs back to back, faster than one core seals: "
            "with sealing on, a log call that rolls the stream waits for the previous "
            "chunk's seal (the slowest log), which bounds MB/s; a run that logs more slowly "
            "than one core seals (CPU s/GB: the difference between the rows) never waits. "
            "On 2 cores the seal and the encoding each "
            "take one, so anything else running (CPU pressure) shows in the lag.",
        ]
    if big is not None:
        lines += [
            "",
            f"3. One record out of one {_size(big.nbytes)} chunk of {big.records} records, "
            f"sealed at level {LEVEL} ({_size(big.sealed)}, "
            f"{big.nbytes / big.sealed:.2f}x) and plain",
            "",
            lookup_table(big),
            "",
            f"Each time is the median of {CALLS} calls for that record and copy (find_record's, "
            "then read_record's; each call's time is in the JSON): the page cache was not "
            "dropped and the chunk was just written, so the disk is warm (nothing else is "
            "cached between calls: each opens the chunk and decompresses its frames anew). "
            "CPU pressure meanwhile: "
            + ("?" if big.pressure is None else f"{big.pressure:.0%}")
            + ". orjson.loads alone = parsing the record's "
            "line already in memory, the part of each time that sealing does not change "
            f"(records over {BIG_LINE / MIB:.0f} MiB are parsed by ijson instead). allowance = "
            f"{LOOKUP_SECONDS * 1e3:.0f} ms + the record's bytes at {big.read_mbps:.0f} MB/s "
            f"(decompressing this chunk's first {_size(SPEED_SPAN)}, the fastest of {CALLS} "
            "passes). Writing the streams took "
            f"{big.write_s['sealed']:.1f} s and {big.write_s['plain']:.1f} s of appends; close "
            f"took {big.close_s['sealed']:.1f} s for the sealed one (its seal) and "
            f"{big.close_s['plain']:.1f} s for the plain one.",
        ]
        if big.note:
            lines += ["", f"Note: {big.note}."]
    lines += ["", "Targets:", "", targets_table(ts)]
    return "\n".join(lines)


def payload(
    cfg: Config,
    quick: bool,
    elapsed: float,
    idle: LagStats | None,
    rows: list[Compression],
    runs: list[MonitorRun],
    big: BigChunk | None,
    ts: list[Target],
) -> dict[str, Any]:
    return {
        "mode": "quick" if quick else "full",
        "elapsed_s": elapsed,
        "config": {**asdict(cfg), "parts": sorted(cfg.parts)},
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "versions": {p: version(p) for p in ("pyzstd", "orjson", "anyio", "numpy")},
        "zstd": zstd_version,
        "idle_lag_ms": None if idle is None else asdict(idle),
        "compression": [
            {
                **asdict(r),
                "ratio": r.ratio,
                "compress_mb_per_s_per_core": r.mbps_cpu,
                "compress_mb_per_s_wall": r.mbps_wall,
                "decompress_mb_per_s": r.read_mbps,
            }
            for r in rows
        ],
        "file_monitor": [{**asdict(r), "mb_per_s": r.mbps} for r in runs],
        "big_chunk": None if big is None else asdict(big),
        "targets": [asdict(t) for t in ts],
    }


def _parts(value: str) -> frozenset[int]:
    parts = frozenset(int(p) for p in value.split(",") if p.strip())
    if not parts or not parts <= {1, 2, 3}:
        raise argparse.ArgumentTypeError(f"{value!r}: say which of 1, 2 and 3, as 1,3")
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    size = functools.partial(parse_bytes, default_unit=1)
    parser = argparse.ArgumentParser(
        prog="python -m bench.seal", description=(__doc__ or "").split("\n")[0]
    )
    parser.add_argument("--quick", action="store_true", help="every part smaller")
    parser.add_argument("--episodes", type=int, help="part 2's episodes (default 100; quick 20)")
    parser.add_argument("--parts", type=_parts, help="which parts to run (default 1,2,3)")
    parser.add_argument("--size", type=size, help="every episode this size (default: production)")
    parser.add_argument("--mix-bytes", type=size, help="part 1's production mix")
    parser.add_argument("--chunk-bytes", type=size, help="part 2's chunk_bytes")
    parser.add_argument("--big-bytes", type=size, help="part 3's chunk")
    parser.add_argument("--repeats", type=int, help="part 1's runs per setting (default 2)")
    parser.add_argument("--json", type=Path, default=DEFAULT_JSON, metavar="PATH")
    parser.add_argument("--md", type=Path, default=DEFAULT_MD, metavar="PATH")
    args = parser.parse_args(argv)
    cfg = QUICK if args.quick else FULL
    given = {
        "episodes": args.episodes,
        "parts": args.parts,
        "size": args.size,
        "mix_bytes": args.mix_bytes,
        "chunk_bytes": args.chunk_bytes,
        "big_bytes": args.big_bytes,
        "repeats": args.repeats,
    }
    cfg = replace(cfg, **{k: v for k, v in given.items() if v is not None})
    if args.mix_bytes is not None:
        cfg = replace(cfg, side_bytes=min(cfg.side_bytes, args.mix_bytes))

    t0 = time.perf_counter()
    # The idle loop's own lag, for part 2's lag to be read against.
    idle = LagStats.of(measure_idle_lag(1.0)) if 2 in cfg.parts else None
    rows: list[Compression] = []
    runs: list[MonitorRun] = []
    big: BigChunk | None = None
    with tempfile.TemporaryDirectory(prefix="nodewise-seal-") as tmp:
        work = Path(tmp)
        if 1 in cfg.parts:
            rows = part1(cfg, work, t0)
        if 2 in cfg.parts:
            runs = part2(cfg, work, t0)
        if 3 in cfg.parts:
            big = part3(cfg, work, t0)
    ts = targets(rows, runs, big)
    elapsed = time.perf_counter() - t0
    text = report(cfg, args.quick, elapsed, idle, rows, runs, big, ts)
    print(text)
    for path, content in (
        (
            args.json,
            json.dumps(payload(cfg, args.quick, elapsed, idle, rows, runs, big, ts), indent=2),
        ),
        (args.md, text),
    ):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content + "\n")
        _log(t0, f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
