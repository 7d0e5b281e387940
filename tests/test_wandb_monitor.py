"""WandbMonitor against the real wandb SDK in offline mode (no network): metrics in the run's
history, episodes in trace streams inside the run's files directory, files registered for
upload, init retries, accounting, and a loop that never stalls.

The traces are laid out as a FileMonitor's run directory (prime-rl's), below the run's files
directory: ``monitors/file/traces/stream/`` (every episode), its index
``monitors/file/traces/stream.index.jsonl``, and the annotation streams under
``monitors/file/traces/annotations/``. What W&B would upload is checked twice: the files the
run registered (in its transaction log), and a copy of just those files read back as a run.

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
from streams import index_rows
from test_file_monitor import failing_seal, refusing_dir
from wandb.proto import wandb_internal_pb2 as pb
from witness import lag_within, own_ms, witnesses

from monitors import DeliveryStats, LoopLagProbe, MonitorError, WandbMonitor, wandb_monitor
from monitors.testing.episodes import EpisodeMaker
from monitors.traces import find_record, read_records
from monitors.traces._annotations import read_annotations
from monitors.traces._layout import list_chunks, sealed_path
from monitors.traces._sealed import seal as real_seal

#: Where the monitor keeps a run's traces, relative to the run's files directory (``run.dir``),
#: as W&B saves them: prime-rl's run layout.
TRACES = "monitors/file/traces"
STREAM = f"{TRACES}/stream"
STREAM_INDEX = f"{TRACES}/stream.index.jsonl"
ANNOTATIONS = f"{TRACES}/annotations"


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
            stream = monitor.stream_dir
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
    assert stream == files / STREAM
    assert offline in files.parents
    n = 0
    for n, record in enumerate(read_records(files), 1):
        assert orjson.dumps(record) == expected[SPECS[(n - 1) % len(SPECS)]], f"record {n - 1}"
    assert n == EPISODES
    chunks = list_chunks(stream)
    assert len(chunks) == chunks_before_finalize >= 4  # ~120 MB in chunks of 16 MiB
    # A row per episode, in order, with its kind and step; nothing annotated (all "all").
    rows = index_rows(stream)
    assert [(row.line, row.kind, row.step) for row in rows] == [
        (i + 1, "train", i) for i in range(EPISODES)
    ]
    assert not (files / ANNOTATIONS).exists()

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
    ours = [(p, policy) for p, policy in saved if p.startswith("monitors/")]
    names = [f"{STREAM}/{n:05d}.jsonl.zst" for n in chunks]
    assert sorted(p.name for p in stream.iterdir()) == [Path(name).name for name in names]
    names.append(STREAM_INDEX)
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
    assert not monitor.stream_dir.exists()
    assert not (monitor.stream_dir.parent / "annotations").exists()


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
    stream = monitor.stream_dir
    assert stream == files / STREAM
    shipped = files / ANNOTATIONS / "unknown"  # the shipped cohort's marks (no producer)
    # ~100-byte records and chunks of 100 bytes: one record (and one mark) per chunk.
    episodes: list[Any] = [
        {"n": n, "traces": [{"id": f"t-{n}"}], "pad": "x" * 60} for n in range(5)
    ]
    # subset="effective" (the default): each episode written, its trace marked as shipped.
    await monitor.log_episodes([*episodes[:2], Broken(), *episodes[2:]], step=0)
    assert list_chunks(stream) == [0, 1, 2, 3, 4]
    assert list_chunks(shipped) == [0, 1, 2, 3, 4]
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

    # One stream, in arrival order, each row with its kind and step.
    assert list(read_records(files)) == [*episodes, {"n": 6}]
    assert [(row.kind, row.step) for row in index_rows(stream)] == [("train", 0)] * 5 + [
        ("eval", 1)
    ]
    assert {
        trace: [u["info"] for u in updates]
        for trace, updates in read_annotations(files / ANNOTATIONS).items()
    } == {f"t-{n}": [{"shipped": {"step": 0, "kind": "train"}}] for n in range(5)}
    assert not list(files.rglob("*.zst"))
    _, records = offline_run(monitor)
    ours = [(p, policy) for p, policy in saved_files(records) if p.startswith("monitors/")]
    # Without compress, a chunk is saved once its stream rolls past it: chunks 0-3 of both
    # streams right after the first call, the episodes' chunk 4 after the second (whose eval
    # episode started chunk 5), the rest and the indexes at finalize.
    now = pb.FilesItem.NOW
    assert ours == [
        *((f"{STREAM}/{n:05d}.jsonl", now) for n in range(4)),
        *((f"{ANNOTATIONS}/unknown/{n:05d}.jsonl", now) for n in range(4)),
        (f"{STREAM}/00004.jsonl", now),
        (f"{STREAM}/00005.jsonl", now),
        (STREAM_INDEX, now),
        (f"{ANNOTATIONS}/unknown/00004.jsonl", now),
        (f"{ANNOTATIONS}/unknown.index.jsonl", now),
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
    """The trace files (``monitors/...``, relative to the run's files directory) the run
    registered for upload, in order; each with policy "now"."""
    _, records = offline_run(monitor)
    ours = [(p, policy) for p, policy in saved_files(records) if p.startswith("monitors/")]
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
    """The paths ``run.save`` is called with (relative to its ``base_path``), as it is
    called."""
    assert monitor.run is not None
    real_save = monitor.run.save
    names: list[str] = []

    def save(path: str, base_path: str | None = None, policy: Any = "live") -> Any:
        assert base_path is not None
        names.append(Path(path).relative_to(base_path).as_posix())
        return real_save(path, base_path=base_path, policy=policy)

    monkeypatch.setattr(monitor.run, "save", save)
    return names


def chunk_names(directory: Path, relative: str) -> list[str]:
    """The sealed chunks of the stream in ``directory``, named as the run saves them."""
    return [f"{relative}/{n:05d}.jsonl.zst" for n in list_chunks(directory)]


def shipped(step: int, kind: str = "train") -> dict[str, Any]:
    """The info an annotation of the shipped cohort carries."""
    return {"shipped": {"step": step, "kind": kind}}


def episode(n: int, *, traces: int = 2) -> dict[str, Any]:
    """An episode with ``traces`` traces (ids ``e-N-T``), ~300 bytes."""
    return {
        "id": f"e-{n}",
        "traces": [{"id": f"e-{n}-{t}", "info": {"turn": t}} for t in range(traces)],
        "logprobs": [-0.123456 * n, 1.0 / 3],
        "pad": "x" * 150,
    }


@pytest.mark.anyio
async def test_sealed_chunks_and_the_indexes_are_saved_and_read_back(tmp_path: Path) -> None:
    """Each step logs three new episodes as "all", then its shipped cohort as "effective":
    two of those and one never logged before. The stream holds each episode once, in arrival
    order; the cohort's traces are marked shipped in the annotation stream; W&B got every
    sealed chunk of both streams and both indexes, and a copy of just those files reads
    back as the run."""
    episodes = [episode(n) for n in range(16)]
    evals = [episode(100 + n, traces=1) for n in range(2)]
    kept = copy.deepcopy([episodes, evals])
    cohorts = [[4 * s, 4 * s + 2, 4 * s + 3] for s in range(4)]
    async with WandbMonitor(project="p", chunk_bytes=500) as monitor:
        for step in range(4):
            await monitor.log_episodes(episodes[4 * step : 4 * step + 3], step=step, subset="all")
            cohort = [episodes[n] for n in cohorts[step]]
            await monitor.log_episodes(cohort, step=step)  # subset="effective", the default
        await monitor.log_episodes(evals, step=4, kind="eval", subset="all")
    assert [episodes, evals] == kept
    assert monitor.stats() == DeliveryStats(26, 26, {})
    assert monitor.run is not None
    files = Path(monitor.run.dir)

    # The stream: each episode once, in arrival order, its kind and step in its row.
    want = [*episodes, *evals]
    assert list(read_records(files)) == want
    rows = index_rows(files / STREAM)
    assert [(row.fields["id"], row.kind, row.step) for row in rows] == [
        *((f"e-{n}", "train", n // 4) for n in range(16)),
        ("e-100", "eval", 4),
        ("e-101", "eval", 4),
    ]
    # The annotations: each trace of each cohort marked shipped at its step, nothing else.
    marks = {
        f"e-{n}-{t}": [shipped(step)] for step, ns in enumerate(cohorts) for n in ns for t in (0, 1)
    }
    found = read_annotations(files / ANNOTATIONS)
    assert {trace: [u["info"] for u in updates] for trace, updates in found.items()} == marks
    assert all(
        u == {"version": 1, "trace_id": trace, "info": u["info"], "branches": []}
        for trace, updates in found.items()
        for u in updates
    )

    # What the run saved: the sealed chunks of both streams, in order, each index after its
    # stream's chunks; nothing else, each once, and no plain chunk left on disk.
    saved = traces_saved(monitor)
    assert len(saved) == len(set(saved))
    stream_names = chunk_names(files / STREAM, STREAM)
    marks_names = chunk_names(files / ANNOTATIONS / "unknown", f"{ANNOTATIONS}/unknown")
    assert len(stream_names) >= 4
    assert len(marks_names) >= 4
    stream_names.append(STREAM_INDEX)
    marks_names.append(f"{ANNOTATIONS}/unknown.index.jsonl")
    assert [p for p in saved if p in stream_names] == stream_names
    assert [p for p in saved if p in marks_names] == marks_names
    assert sorted(saved) == sorted(stream_names + marks_names)
    for directory, names in ((STREAM, stream_names), (f"{ANNOTATIONS}/unknown", marks_names)):
        listed = sorted(p.name for p in (files / directory).iterdir())
        assert listed == [Path(n).name for n in names[:-1]], directory

    # A copy of just the saved files (what a download gives) is a run directory: every
    # record; the index finds one; folded, the cohorts' traces say they were shipped.
    copied = download(files, saved, tmp_path / "dl")
    assert list(read_records(copied)) == want
    assert find_record(copied, "e-9") == episodes[9]
    assert read_annotations(copied / ANNOTATIONS) == found
    folded = copy.deepcopy(want)
    for record in folded:
        for trace in record["traces"]:
            if trace["id"] in marks:
                trace["info"] = {**trace["info"], **shipped(int(record["id"][2:]) // 4)}
    assert list(read_records(copied, fold=True)) == folded
    assert folded != want

    # And with any zstd reader: the chunks, decompressed in order, are the JSON lines.
    chunks = [pyzstd.decompress((files / n).read_bytes()) for n in stream_names[:-1]]
    assert [orjson.loads(line) for line in b"".join(chunks).splitlines()] == want


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
        stream = monitor.stream_dir
        await monitor.log_episodes(episodes[:1], step=0)
        await monitor.log_episodes(episodes[1:2], step=1)  # rolls: chunk 0 is being sealed
        assert saves == []  # its plain file is about to be replaced: not saved
        release.set()
        with anyio.fail_after(10):
            while not sealed_path(stream, 0).exists():
                await anyio.sleep(0.01)
        assert saves == []  # nothing saves it before the next call
        await monitor.log_episodes(episodes[2:], step=2)
        assert saves[:1] == [f"{STREAM}/00000.jsonl.zst"]
    finally:
        release.set()
        await monitor.finalize()
    assert saves == [f"{STREAM}/{n:05d}.jsonl.zst" for n in range(3)] + [STREAM_INDEX]
    assert traces_saved(monitor) == saves
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
        # It may yet be sealed: not saved before finalize.
        assert f"{STREAM}/00001.jsonl" not in saves
        assert monitor.stats() == DeliveryStats(4, 4, {}, {"seal_failed": 1})
    finally:
        await monitor.finalize()
    stream = monitor.stream_dir
    chunks = ["00000.jsonl.zst", "00001.jsonl", "00002.jsonl.zst", "00003.jsonl.zst"]
    assert sorted(saves) == sorted([f"{STREAM}/{name}" for name in chunks] + [STREAM_INDEX])
    assert saves[-1] == STREAM_INDEX
    assert sorted(p.name for p in stream.iterdir()) == chunks
    assert traces_saved(monitor) == saves
    assert list(read_records(stream)) == episodes
    assert monitor.stats() == DeliveryStats(4, 4, {}, {"seal_failed": 1})


@pytest.mark.anyio
async def test_seal_on_finalize_false_saves_the_live_chunk_plain(tmp_path: Path) -> None:
    episodes = [{"n": n, "pad": "x" * 80} for n in range(3)]
    async with WandbMonitor(
        project="p", dir=tmp_path / "w", chunk_bytes=100, seal_on_finalize=False, level=1
    ) as monitor:
        await monitor.log_episodes(episodes, step=0)
    names = ["00000.jsonl.zst", "00001.jsonl.zst", "00002.jsonl"]
    assert traces_saved(monitor) == [f"{STREAM}/{n}" for n in names] + [STREAM_INDEX]
    assert list(read_records(monitor.stream_dir)) == episodes


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


# -- annotations -------------------------------------------------------------------------


def judged(trace_id: str, score: float) -> dict[str, Any]:
    """An update as prime-rl's ``make_update`` makes one: a judge's score for a trace."""
    return {"version": 1, "trace_id": trace_id, "info": {"judge": {"score": score}}, "branches": []}


@pytest.mark.anyio
async def test_annotations_are_saved_as_their_chunks_seal_and_fold_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``log_annotations`` appends to the producer's annotation stream: its sealed chunks
    are saved while the run goes on, the rest and its index at finalize, and a copy of the
    saved files folds the updates onto the episodes' traces (newest last, merged deep)."""
    episodes = [episode(n) for n in range(3)]
    updates = [judged(f"e-{n}-{t}", n + t / 10) for n in range(3) for t in range(2)]
    late = {
        "version": 1,
        "trace_id": "e-0-1",
        "info": {"judge": {"note": "late"}, "turn": 9},
        "branches": [],
    }
    monitor = WandbMonitor(project="p", dir=tmp_path / "w", chunk_bytes=200, producer="judge")
    with pytest.raises(RuntimeError, match="not started"):
        await monitor.log_annotations(updates)
    await monitor.start()
    assert monitor.run is not None
    files = Path(monitor.run.dir)
    marks = files / ANNOTATIONS / "judge"
    try:
        saves = spy_on_saves(monitor, monkeypatch)
        await monitor.log_episodes(episodes, step=0, subset="all")
        # A call with an update that names no trace writes nothing of itself.
        with pytest.raises(TypeError, match="update 1 must be a Mapping with a string"):
            await monitor.log_annotations([updates[0], {"trace_id": 7}])
        assert not marks.exists()
        for i, update in enumerate(updates):  # ~80 bytes each: two a chunk
            await monitor.log_annotations([update], step=i)
        assert list_chunks(marks) == [0, 1, 2]
        with anyio.fail_after(10):  # chunk 1 is sealed in the background
            while not sealed_path(marks, 1).exists():
                await anyio.sleep(0.01)
        await monitor.log_annotations([late])  # no step: its row says none
        # Saved while the run goes on: chunks 0 and 1, sealed (and chunk 2 too, should its
        # seal, started by this last call, have beaten the save); never a plain one.
        during = [p for p in saves if p.startswith(f"{ANNOTATIONS}/")]
        sealed = [f"{ANNOTATIONS}/judge/{n:05d}.jsonl.zst" for n in (0, 1, 2)]
        assert during in (sealed[:2], sealed), during
    finally:
        await monitor.finalize()
    with pytest.raises(RuntimeError, match="finalized"):
        await monitor.log_annotations(updates)

    # On disk: the updates, in order, with their rows (trace, info, step) beside them.
    assert list(read_records(marks)) == [*updates, late]
    rows = index_rows(marks)
    assert [(row.fields["trace_id"], row.fields["info"], row.step) for row in rows] == [
        *((u["trace_id"], u["info"], i) for i, u in enumerate(updates)),
        ("e-0-1", late["info"], None),
    ]
    # Saved: every chunk sealed, each once; each index after its stream's chunks.
    saved = traces_saved(monitor)
    assert saved == saves
    names = [*chunk_names(marks, f"{ANNOTATIONS}/judge"), f"{ANNOTATIONS}/judge.index.jsonl"]
    stream = [*chunk_names(files / STREAM, STREAM), STREAM_INDEX]
    assert len(names) == 5  # 7 updates, two a chunk
    assert [p for p in saved if p in names] == names
    assert sorted(saved) == sorted(names + stream)
    assert sorted(p.name for p in marks.iterdir()) == [Path(n).name for n in names[:-1]]

    # A copy of the saved files: the records as written; folded, each trace's judge score
    # merged into its info, the late update merged over the first.
    copied = download(files, saved, tmp_path / "dl")
    assert list(read_records(copied)) == episodes
    assert read_annotations(copied / ANNOTATIONS) == {
        u["trace_id"]: [u, late] if u["trace_id"] == "e-0-1" else [u] for u in updates
    }
    folded = list(read_records(copied, fold=True))
    assert [[t["info"] for t in r["traces"]] for r in folded] == [
        [
            {"turn": 0, "judge": {"score": float(n)}},
            {"turn": 9, "judge": {"score": 0.1, "note": "late"}}
            if n == 0
            else {"turn": 1, "judge": {"score": n + 0.1}},
        ]
        for n in range(3)
    ]


@pytest.mark.anyio
async def test_annotations_without_a_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A disabled run keeps no annotations and counts them lost (as its episodes); a
    monitor whose start failed counts them as ``start_failed``, and says so at finalize."""
    async with WandbMonitor(project="p", mode="disabled", dir=tmp_path / "off") as monitor:
        await monitor.log_annotations([judged("e-0-0", 1.0)], step=0)
    assert not monitor.stream_dir.parent.exists()
    assert monitor.annotation_stats() == DeliveryStats(1, 0, {"disabled": 1})
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    failed = WandbMonitor(project="p")
    with pytest.raises(MonitorError):
        await failed.start()
    await failed.log_annotations([judged("e-0-0", 1.0), judged("e-0-1", 0.5)])
    with pytest.raises(TypeError, match="update 0"):  # checked all the same
        await failed.log_annotations(["not an update"])  # type: ignore[list-item]
    assert failed.annotation_stats() == DeliveryStats(2, 0, {"start_failed": 2})
    with caplog.at_level(logging.WARNING, logger="monitors"):
        await failed.finalize()
    assert "2 annotations lost as 'start_failed'" in caplog.text
