"""WandbMonitor against the real wandb SDK in offline mode (no network): metrics in the run's
history, episodes in trace streams inside the run's files directory, files registered for
upload, init retries, accounting, and a loop that never stalls.

The run is read back from disk: the trace streams with ``monitors.traces.read_records``, and
the run's transaction log (``run-<id>.wandb``) record by record as wandb's own protobuf
``Record`` messages. The wandb we lock (0.31) no longer ships its Python reader of that log
(``wandb.sdk.internal.datastore``; wandb-core reads it now), so ``wandb_records`` below reads
the framing that module documented (a 7-byte file header, 32 KiB blocks, records of crc32 +
length + type, split across blocks) and checks every checksum. On a 1.4 MB log written by
wandb 0.19.11 it yields exactly the records that version's ``DataStore.scan_data`` does.
"""

from __future__ import annotations

import copy
import json
import logging
import math
import random
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import types
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import pyzstd
import wandb
from test_file_monitor import failing_seal, refusing_dir
from wandb.proto import wandb_internal_pb2 as pb
from witness import lag_within, own_ms, witnesses

from monitors import DeliveryStats, LoopLagProbe, MonitorError, WandbMonitor, wandb_monitor
from monitors.records import Subset
from monitors.testing.episodes import EpisodeMaker
from monitors.traces import read_records
from monitors.traces._layout import list_chunks, sealed_path
from monitors.traces._sealed import seal as real_seal


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def offline(wandb_offline: Path) -> Path:
    """Every test here runs wandb offline; the folder its runs go to."""
    return wandb_offline


# -- reading an offline run back ----------------------------------------------------------

_BLOCK = 32768
_FULL, _FIRST, _MIDDLE, _LAST = 1, 2, 3, 4


def wandb_records(path: Path) -> Iterator[pb.Record]:
    """Every record of a run's ``.wandb`` transaction log, in order, checksums checked."""
    data = path.read_bytes()
    ident, magic, version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), data[:7]
    pos = 7
    pending: bytes | None = None
    while pos < len(data):
        if _BLOCK - pos % _BLOCK < 7:  # a block's tail too short for a header is padding
            pos += _BLOCK - pos % _BLOCK
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        payload = data[pos + 7 : pos + 7 + length]
        assert len(payload) == length, f"truncated record at byte {pos}"
        assert zlib.crc32(payload, zlib.crc32(bytes([kind]))) == checksum, f"byte {pos}"
        pos += 7 + length
        if kind == _FULL:
            whole: bytes | None = payload
        elif kind == _FIRST:
            pending, whole = payload, None
        elif kind in (_MIDDLE, _LAST):
            assert pending is not None, f"a continuation without a start at byte {pos}"
            pending += payload
            whole, pending = (pending, None) if kind == _LAST else (None, pending)
        else:
            raise AssertionError(f"record type {kind} at byte {pos}")
        if whole is not None:
            record = pb.Record()
            record.ParseFromString(whole)
            yield record
    assert pending is None, "the log ends inside a record"


def history_value(item: pb.HistoryItem) -> Any:
    if item.value_json:
        return json.loads(item.value_json)
    case = item.WhichOneof("value")
    return None if case in (None, "none") else getattr(item, case)


def history(records: list[pb.Record]) -> dict[int, dict[str, Any]]:
    """Each history row's user values (not wandb's own ``_step``, ``_runtime``, ...)."""
    rows: dict[int, dict[str, Any]] = {}
    for record in records:
        if record.WhichOneof("record_type") != "history":
            continue
        values = {
            item.key or ".".join(item.nested_key): history_value(item)
            for item in record.history.item
        }
        step = values.pop("_step")
        assert step not in rows, f"step {step} twice"
        rows[step] = {k: v for k, v in values.items() if not k.startswith("_")}
    return rows


def saved_files(records: list[pb.Record]) -> list[tuple[str, int]]:
    """(path, policy) of every file registered for upload, in the order registered."""
    return [
        (item.path, item.policy)
        for record in records
        if record.WhichOneof("record_type") == "files"
        for item in record.files.files
    ]


def offline_run(monitor: WandbMonitor, *, timeout: float = 30.0) -> tuple[Path, list[pb.Record]]:
    """The run's files directory and the records of its transaction log.

    wandb-core writes the log in its own process and, in offline mode, may still be writing
    it when ``run.finish()`` returns (seen with wandb 0.31: a file holding only its header,
    complete ~0.5 s later), so this waits for the log's ``exit`` record.
    """
    assert monitor.run is not None
    files = Path(monitor.run.dir)
    logs = list(files.parent.glob("run-*.wandb"))
    assert len(logs) == 1, logs
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = list(wandb_records(logs[0]))
        except AssertionError:
            if time.monotonic() > deadline:
                raise
        else:
            if any(r.WhichOneof("record_type") == "exit" for r in records):
                return files, records
            assert time.monotonic() < deadline, f"{logs[0]} has no exit record"
        time.sleep(0.05)


# -- the whole run ------------------------------------------------------------------------

EPISODES = 100
#: A few (size, index) pairs, each logged as a fresh copy of the maker's episode.
SPECS = [(random.Random(i).randint(500_000, 2_000_000), i) for i in range(6)]
MAKER = EpisodeMaker(seed=0)


def step_metrics(step: int) -> dict[str, Any]:
    metrics: dict[str, Any] = {
        "loss": 1.0 / (step + 1),
        "reward/mean": step * 0.125,
        "tokens": 1000 + step,
        "done": step % 2 == 0,
    }
    if step == 7:
        metrics["grad_norm"] = math.nan
    if step == 8:
        metrics["kl"] = math.inf
    return metrics


@pytest.mark.anyio
async def test_offline_run_holds_every_step_and_every_episode(
    offline: Path, caplog: pytest.LogCaptureFixture
) -> None:
    expected: dict[tuple[int, int], bytes] = {}
    windows: list[tuple[float, float]] = []
    slowest = 0.0
    caplog.set_level(logging.WARNING, logger="monitors")
    with witnesses() as seen:
        async with (
            LoopLagProbe() as probe,
            WandbMonitor(project="nodewise-test", name="offline", chunk_bytes=16 << 20) as monitor,
        ):
            assert monitor.mode == "offline"
            for i in range(EPISODES):
                spec = SPECS[i % len(SPECS)]
                # A fresh copy, built on the loop, outside the windows.
                episode = MAKER.episode(spec[0], index=spec[1]).to_record(fresh=True)
                started = time.perf_counter()
                await monitor.log_metrics(step_metrics(i), step=i)
                await monitor.log_episodes([episode], step=i, subset="all")
                ended = time.perf_counter()
                windows.append((started, ended))
                slowest = max(slowest, ended - started)
                data = orjson.dumps(episode)
                assert expected.setdefault(spec, data) == data
                del episode
            stream = monitor.stream_dir("train", "all")
            chunks_before_finalize = len(list_chunks(stream))
    during = lag_within(probe, windows, seen.stalls)
    window_ms = 1000 * sum(end - start for start, end in windows)
    summary = (
        f"during log calls ({window_ms:.0f} ms in all): {lag_within(probe, windows)}, net of "
        f"the machine's stalls {during}; overall: {probe.stats()}; slowest {slowest:.3f} s"
    )
    # The probe sampled all through the calls (a sample's sleep must fit inside one call, so
    # a fast machine's short calls hold fewer: the floor scales with their time), and enough
    # samples for a p99. The bounds are judged net of the machine's stalls (witness.py).
    assert during.count >= max(50, window_ms / 8), summary
    assert during.p99 < 50, summary
    assert during.max < 250, summary

    # Accounting: every episode written, every step logged.
    assert monitor.stats() == DeliveryStats(EPISODES, EPISODES, {})
    assert monitor.metrics_stats() == DeliveryStats(EPISODES, EPISODES, {})
    dropped = [r.getMessage() for r in caplog.records if "non-finite" in r.getMessage()]
    assert dropped == [
        "step 7: dropped non-finite metrics: grad_norm",
        "step 8: dropped non-finite metrics: kl",
    ]

    # The files directory: every record, byte for byte, under this test's WANDB_DIR (not where
    # an earlier test's wandb session pointed).
    files, records = offline_run(monitor)
    assert stream == files / "traces" / "train" / "all"
    assert offline in files.parents
    n = 0
    for n, record in enumerate(read_records(stream), 1):
        assert orjson.dumps(record) == expected[SPECS[(n - 1) % len(SPECS)]], f"record {n - 1}"
    assert n == EPISODES
    chunks = list_chunks(stream)
    assert len(chunks) == chunks_before_finalize >= 4  # ~120 MB in chunks of 16 MiB

    # The history, through the run's transaction log: every step, every finite value.
    rows = history(records)
    assert sorted(rows) == list(range(EPISODES))
    for step, row in rows.items():
        want = {
            k: v
            for k, v in step_metrics(step).items()
            if not isinstance(v, float) or math.isfinite(v)
        }
        assert row == want, f"step {step}"

    # Every chunk (sealed: no plain copy) and the index registered for upload, once each,
    # with policy "now"; the sealed chunks while the run went on, before its last steps were
    # logged.
    saved = saved_files(records)
    ours = [(p, policy) for p, policy in saved if p.startswith("traces/")]
    names = [f"traces/train/all/{n:05d}.jsonl.zst" for n in chunks]
    names.append("traces/train/all/index.jsonl")
    assert sorted(p.name for p in stream.iterdir()) == [Path(name).name for name in names]
    assert ours == [(name, pb.FilesItem.NOW) for name in names]
    position = {id(r): i for i, r in enumerate(records)}
    first_save = next(
        position[id(r)]
        for r in records
        if r.WhichOneof("record_type") == "files" and r.files.files[0].path == names[0]
    )
    last_row = max(position[id(r)] for r in records if r.WhichOneof("record_type") == "history")
    assert first_save < last_row


# -- start -------------------------------------------------------------------------------


def test_importing_monitors_does_not_import_wandb() -> None:
    code = "import sys, monitors; print('wandb' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


@pytest.mark.anyio
async def test_missing_wandb_gives_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    monitor = WandbMonitor(project="p")
    with pytest.raises(MonitorError, match=re.escape("pip install wandb")) as info:
        await monitor.start()
    assert isinstance(info.value.__cause__, ImportError)
    await monitor.log_metrics({"a": 1.0}, step=0)  # counted lost, not raised
    await monitor.finalize()  # nothing to finish
    assert monitor.stats() == DeliveryStats()
    assert monitor.metrics_stats() == DeliveryStats(1, 0, {"start_failed": 1})


def test_mode_defaults_to_wandb_mode_then_online(monkeypatch: pytest.MonkeyPatch) -> None:
    assert WandbMonitor(project="p").mode == "offline"
    assert WandbMonitor(project="p", mode="disabled").mode == "disabled"
    monkeypatch.delenv("WANDB_MODE")
    assert WandbMonitor(project="p").mode == "online"


@pytest.mark.anyio
async def test_init_retries_transient_errors_without_blocking_the_loop(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    real_init = wandb.init
    calls: list[tuple[float, float]] = []  # (start, end) of each attempt

    def flaky_init(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            if len(calls) < 2:
                raise wandb.errors.CommError("could not reach the W&B server")
            return real_init(*args, **kwargs)
        finally:
            calls.append((started, time.perf_counter()))

    monkeypatch.setattr(wandb, "init", flaky_init)
    # The backoff's jitter as drawn, so that each pause is checked against its own delay.
    jitter: list[float] = []

    def uniform(low: float, high: float) -> float:
        jitter.append(random.uniform(low, high))
        return jitter[-1]

    monkeypatch.setattr(wandb_monitor, "random", types.SimpleNamespace(uniform=uniform))
    caplog.set_level(logging.WARNING, logger="monitors")
    monitor = WandbMonitor(project="p", retry_base=0.2)
    with witnesses() as seen:
        async with LoopLagProbe() as probe:
            await monitor.start()
            try:
                await monitor.log_metrics({"a": 1.0}, step=0)
            finally:
                await monitor.finalize()
    assert len(calls) == 3
    # Backoff: 0.2 s then 0.4 s, times uniform(0.5, 1.5). Each pause is its delay plus two
    # thread hops and a log line: 1.3-2.5 ms more here, idle or with both cores busy.
    assert len(jitter) == 2, jitter
    assert all(0.5 <= f <= 1.5 for f in jitter), jitter
    delays = [0.2 * jitter[0], 0.4 * jitter[1]]
    pauses = [calls[1][0] - calls[0][1], calls[2][0] - calls[1][1]]
    over = [p - d for p, d in zip(pauses, delays, strict=True)]
    assert all(-0.001 <= o < 0.025 for o in over), (pauses, delays)
    windows = [(calls[0][1], calls[1][0]), (calls[1][1], calls[2][0])]
    waits = lag_within(probe, windows, seen.stalls)
    # The loop ran while init waited to retry: ~0.9 samples a ms here, with both cores busy
    # too (a floor scaled to the pauses, which the jitter makes 0.3 to 0.9 s).
    window_ms = 1000 * sum(end - start for start, end in windows)
    assert waits.count >= window_ms / 10, (waits, window_ms)
    # A retry that slept on the loop would stall it for its whole pause (>= 100 ms); judged
    # net of the machine's stalls, with room for a gc pause or a wandb thread's GIL turn
    # (0.2-4 ms here, with both cores busy too).
    assert waits.max < 50, (waits, lag_within(probe, windows))
    retries = [r.getMessage() for r in caplog.records if "retrying" in r.getMessage()]
    assert len(retries) == 2
    assert "attempt 1/5" in retries[0]
    assert "could not reach" in retries[0]
    _, records = offline_run(monitor)
    assert history(records) == {0: {"a": 1.0}}


@pytest.mark.anyio
async def test_init_gives_up(monkeypatch: pytest.MonkeyPatch) -> None:
    real_init = wandb.init
    calls: list[str] = []

    def down(*args: Any, **kwargs: Any) -> Any:
        calls.append("down")
        raise wandb.errors.CommError("down")

    def refused(*args: Any, **kwargs: Any) -> Any:
        calls.append("refused")
        raise wandb.errors.AuthenticationError("bad key")

    monkeypatch.setattr(wandb, "init", down)
    with pytest.raises(MonitorError, match="failed 3 times"):
        await WandbMonitor(project="p", init_attempts=3, retry_base=0.01).start()
    assert calls == ["down"] * 3
    calls.clear()
    monkeypatch.setattr(wandb, "init", refused)  # not transient: no retry
    with pytest.raises(MonitorError, match="credentials"):
        await WandbMonitor(project="p", retry_base=0.01).start()
    assert calls == ["refused"]
    monkeypatch.setattr(wandb, "init", real_init)
    with pytest.raises(MonitorError, match="no_such_setting"):  # not transient either
        await WandbMonitor(project="p", settings={"no_such_setting": 1}).start()


@pytest.mark.anyio
async def test_disabled_mode_writes_nothing(tmp_path: Path) -> None:
    async with WandbMonitor(project="p", mode="disabled", dir=tmp_path / "off") as monitor:
        await monitor.log_metrics({"a": 1.0}, step=0)
        await monitor.log_episodes([{"n": 1}, {"n": 2}], step=0)
        assert monitor.run is not None
        assert monitor.run.disabled
    assert monitor.stats() == DeliveryStats(2, 0, {"disabled": 2})
    assert not monitor.stream_dir("train", "effective").exists()


# -- accounting, rolling, saving, finalize ------------------------------------------------


class Broken:
    def to_record(self) -> Any:
        raise RuntimeError("this episode cannot be built")


@pytest.mark.anyio
async def test_accounting_rolling_saving_and_finalize(tmp_path: Path) -> None:
    # Plain chunks (compress=False): each saved as soon as the stream rolls past it.
    monitor = WandbMonitor(project="p", dir=tmp_path / "elsewhere", chunk_bytes=100, compress=False)
    await monitor.start()
    assert monitor.run is not None
    files = Path(monitor.run.dir)
    assert files.is_relative_to(tmp_path / "elsewhere")
    train = monitor.stream_dir("train", "effective")
    eval_all = monitor.stream_dir("eval", "all")
    # ~100-byte records and chunks of 100 bytes: one record per chunk.
    episodes: list[Any] = [{"n": n, "pad": "x" * 80} for n in range(5)]
    await monitor.log_episodes([*episodes[:2], Broken(), *episodes[2:]], step=0)
    assert list_chunks(train) == [0, 1, 2, 3, 4]
    await monitor.log_episodes(
        [{"n": 5, "bad": object()}, "not an episode", {"n": 6}], step=1, kind="eval", subset="all"
    )
    await monitor.log_metrics({"loss": 0.5}, step=1)
    stats = monitor.stats()
    assert stats == DeliveryStats(9, 6, {"bad_record": 2, "encode_error": 1})
    assert stats.pending == 0

    await monitor.finalize()
    before = {p: p.read_bytes() for p in files.rglob("*") if p.is_file()}
    await monitor.finalize()
    assert {p: p.read_bytes() for p in files.rglob("*") if p.is_file()} == before
    with pytest.raises(RuntimeError, match="finalized"):
        await monitor.log_episodes([{"n": 7}], step=2)
    with pytest.raises(RuntimeError, match="finalized"):
        await monitor.log_metrics({"a": 1.0}, step=2)
    assert monitor.stats() == stats
    assert monitor.metrics_stats() == DeliveryStats(1, 1, {})

    assert list(read_records(train)) == episodes
    assert list(read_records(eval_all)) == [{"n": 6}]
    assert not list(files.rglob("*.zst"))
    _, records = offline_run(monitor)
    ours = [(p, policy) for p, policy in saved_files(records) if p.startswith("traces/")]
    # Chunks 0-3 sealed during the first call and saved right after it; the rest at finalize.
    assert ours == [
        *((f"traces/train/effective/{n:05d}.jsonl", pb.FilesItem.NOW) for n in range(4)),
        ("traces/train/effective/00004.jsonl", pb.FilesItem.NOW),
        ("traces/train/effective/index.jsonl", pb.FilesItem.NOW),
        ("traces/eval/all/00000.jsonl", pb.FilesItem.NOW),
        ("traces/eval/all/index.jsonl", pb.FilesItem.NOW),
    ]
    for path, _ in ours:
        assert (files / path).is_file()
    assert history(records) == {1: {"loss": 0.5}}


@pytest.mark.anyio
async def test_a_slow_run_log_neither_blocks_nor_reorders(monkeypatch: pytest.MonkeyPatch) -> None:
    async with WandbMonitor(project="p", metrics_queue=10) as monitor:
        assert monitor.run is not None
        real_log = monitor.run.log

        def slow_log(data: dict[str, Any], step: int | None = None) -> None:
            time.sleep(0.02)  # in the worker thread: a backed-up wandb-core socket
            real_log(data, step=step)

        monkeypatch.setattr(monitor.run, "log", slow_log)
        ends, spent_ms = [], []
        with witnesses() as seen:
            for step in range(60):
                started = time.perf_counter()
                await monitor.log_metrics({"v": step}, step=step)
                ends.append(time.perf_counter())
                spent_ms.append((ends[-1] - started) * 1e3)
                if step < 30:  # the worker keeps up with these: each logged before the next
                    with anyio.fail_after(30):  # (~20 ms each here)
                        while monitor.metrics_stats().delivered <= step:
                            await anyio.sleep(0.005)
        # Each call judged net of the machine's stalls; a call that waited for the worker
        # would take its 20 ms (the slowest takes 0.3 ms here, 1.1 ms with both cores busy).
        assert max(own_ms(ends, spent_ms, seen.stalls)) < 5, max(spent_ms)
    stats = monitor.metrics_stats()
    # The last 30 came at once: the queue took what it could and the rest were dropped.
    assert stats.submitted == 60
    assert stats.lost.keys() == {"queue_full"}
    assert stats.delivered + stats.lost["queue_full"] == 60
    # The first 30, and at least as many of the rest as the queue holds (41 here).
    assert 40 <= stats.delivered < 60
    _, records = offline_run(monitor)
    rows = history(records)
    assert list(rows) == sorted(rows)  # in order
    assert list(rows)[:30] == list(range(30))
    assert all(row == {"v": step} for step, row in rows.items())
    assert len(rows) == stats.delivered


# -- sealed chunks -----------------------------------------------------------------------


def traces_saved(monitor: WandbMonitor) -> list[str]:
    """The ``traces/`` files the run registered for upload, in order; each with policy
    "now"."""
    _, records = offline_run(monitor)
    ours = [(p, policy) for p, policy in saved_files(records) if p.startswith("traces/")]
    assert {policy for _, policy in ours} <= {pb.FilesItem.NOW}
    return [p for p, _ in ours]


def download(files: Path, names: list[str], to: Path) -> Path:
    """What downloading these run files gives: copies under ``to``, paths kept."""
    for name in names:
        target = to / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(files / name, target)
    return to


def spy_on_saves(monitor: WandbMonitor, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the files ``run.save`` is called with, as it is called."""
    assert monitor.run is not None
    real_save = monitor.run.save
    names: list[str] = []

    def save(path: str, base_path: str | None = None, policy: Any = "live") -> Any:
        names.append(Path(path).name)
        return real_save(path, base_path=base_path, policy=policy)

    monkeypatch.setattr(monitor.run, "save", save)
    return names


@pytest.mark.anyio
async def test_sealed_chunks_and_the_index_are_saved_and_read_back(tmp_path: Path) -> None:
    subsets: tuple[Subset, ...] = ("all", "effective")
    episodes: dict[str, list[dict[str, Any]]] = {
        subset: [
            {"n": n, "subset": subset, "logprobs": [-0.123456 * n, 1.0 / 3], "pad": "x" * 150}
            for n in range(12)
        ]
        for subset in subsets
    }
    kept = copy.deepcopy(episodes)
    async with WandbMonitor(project="p", chunk_bytes=500) as monitor:
        for step in range(4):
            for subset in subsets:
                batch = episodes[subset][3 * step : 3 * step + 3]
                await monitor.log_episodes(batch, step=step, subset=subset)
    assert episodes == kept
    assert monitor.stats() == DeliveryStats(24, 24, {})
    assert monitor.run is not None
    files = Path(monitor.run.dir)
    saved = traces_saved(monitor)
    assert len(saved) == len(set(saved))  # each once
    for subset in subsets:
        stream = monitor.stream_dir("train", subset)
        chunks = list_chunks(stream)
        assert len(chunks) >= 4
        names = [f"traces/train/{subset}/{n:05d}.jsonl.zst" for n in chunks]
        names.append(f"traces/train/{subset}/index.jsonl")
        # In order within the stream, no plain chunk, the index last.
        assert [p for p in saved if p.startswith(f"traces/train/{subset}/")] == names
        assert sorted(p.name for p in stream.iterdir()) == [Path(n).name for n in names]
        # Read back from what a download of the saved files gives.
        got = list(read_records(download(files, names, tmp_path / "dl") / "traces/train" / subset))
        want = episodes[subset]  # a dict is written as given, every digit
        assert got == want
        # And with any zstd reader: the chunks, decompressed in order, are the JSON lines.
        lines = b"".join(pyzstd.decompress((files / n).read_bytes()) for n in names[:-1])
        assert [orjson.loads(line) for line in lines.splitlines()] == want


@pytest.mark.anyio
async def test_a_chunk_is_saved_once_sealed_never_while_plain(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    release = threading.Event()

    def held_seal(directory: Path, chunk: int, **kwargs: Any) -> int:
        if chunk == 0:
            assert release.wait(30), "never released"
        return real_seal(directory, chunk, **kwargs)

    monkeypatch.setattr("monitors.traces._writer.seal", held_seal)
    episodes = [{"n": n, "pad": "x" * 80} for n in range(3)]  # one chunk each
    monitor = WandbMonitor(project="p", dir=tmp_path / "w", chunk_bytes=100)
    await monitor.start()
    try:
        saves = spy_on_saves(monitor, monkeypatch)
        stream = monitor.stream_dir("train", "effective")
        await monitor.log_episodes(episodes[:1], step=0)
        await monitor.log_episodes(episodes[1:2], step=1)  # rolls: chunk 0 is being sealed
        assert saves == []  # its plain file is about to be replaced: not saved
        release.set()
        with anyio.fail_after(10):
            while not sealed_path(stream, 0).exists():
                await anyio.sleep(0.01)
        assert saves == []  # nothing saves it before the next call
        await monitor.log_episodes(episodes[2:], step=2)
        assert saves[:1] == ["00000.jsonl.zst"]
    finally:
        release.set()
        await monitor.finalize()
    assert saves == ["00000.jsonl.zst", "00001.jsonl.zst", "00002.jsonl.zst", "index.jsonl"]
    assert traces_saved(monitor) == [f"traces/train/effective/{name}" for name in saves]
    assert list(read_records(stream)) == episodes


@pytest.mark.anyio
async def test_a_chunk_whose_seal_failed_is_saved_plain_at_finalize(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_seal(monkeypatch, lambda chunk: chunk == 1)  # a full disk, for that chunk only
    episodes = [{"n": n, "pad": "x" * 80} for n in range(4)]  # one chunk each
    monitor = WandbMonitor(project="p", dir=tmp_path / "w", chunk_bytes=100)
    await monitor.start()
    try:
        saves = spy_on_saves(monitor, monkeypatch)
        await monitor.log_episodes(episodes[:3], step=0)
        await monitor.log_episodes(episodes[3:], step=1)
        assert "00001.jsonl" not in saves  # it may yet be sealed: not saved before finalize
        assert monitor.stats() == DeliveryStats(4, 4, {}, {"seal_failed": 1})
    finally:
        await monitor.finalize()
    stream = monitor.stream_dir("train", "effective")
    assert sorted(saves) == [
        "00000.jsonl.zst",
        "00001.jsonl",
        "00002.jsonl.zst",
        "00003.jsonl.zst",
        "index.jsonl",
    ]
    assert saves[-1] == "index.jsonl"
    assert sorted(p.name for p in stream.iterdir()) == sorted(saves)
    assert sorted(traces_saved(monitor)) == [f"traces/train/effective/{n}" for n in sorted(saves)]
    assert list(read_records(stream)) == episodes
    assert monitor.stats() == DeliveryStats(4, 4, {}, {"seal_failed": 1})


@pytest.mark.anyio
async def test_seal_on_finalize_false_saves_the_live_chunk_plain(tmp_path: Path) -> None:
    episodes = [{"n": n, "pad": "x" * 80} for n in range(3)]
    async with WandbMonitor(
        project="p", dir=tmp_path / "w", chunk_bytes=100, seal_on_finalize=False, level=1
    ) as monitor:
        await monitor.log_episodes(episodes, step=0)
    names = ["00000.jsonl.zst", "00001.jsonl.zst", "00002.jsonl", "index.jsonl"]
    assert traces_saved(monitor) == [f"traces/train/effective/{n}" for n in names]
    assert list(read_records(monitor.stream_dir("train", "effective"))) == episodes


@pytest.mark.parametrize("bad", [1.5, "3", True])
def test_float_decimals_is_checked_at_construction(bad: Any) -> None:
    with pytest.raises(ValueError, match="float_decimals"):
        WandbMonitor(project="p", float_decimals=bad)
    assert WandbMonitor(project="p", float_decimals=0).float_decimals == 0


@pytest.mark.anyio
async def test_start_refuses_a_dir_it_cannot_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    inits: list[Any] = []
    monkeypatch.setattr(wandb, "init", lambda *a, **k: inits.append(k))
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    refusing = refusing_dir()
    cases = [
        (a_file, "it is a file, not a directory"),
        (a_file / "runs", f"{a_file} is a file, not a directory"),
        (refusing, "cannot create a file in it"),
        (refusing / "runs", "cannot create it"),
    ]
    for path, why in cases:
        monitor = WandbMonitor(project="p", dir=path)
        with pytest.raises(MonitorError) as info:
            await monitor.start()
        message = str(info.value)
        assert f"dir={path}: " in message, message
        assert why in message, message
        await monitor.finalize()
    assert inits == []  # refused before wandb.init
