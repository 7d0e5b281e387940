"""FileMonitor: metrics.jsonl, trace streams per (kind, subset), lazy records, accounting of
every record (delivered, or lost with a reason), and a disk that fills up."""

from __future__ import annotations

import contextlib
import copy
import errno
import itertools
import logging
import math
import os
import subprocess
import threading
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import orjson
import pytest
from streams import chunk_bytes

from monitors import DeliveryStats, FileMonitor, TraceWriteError
from monitors import file as file_module
from monitors.records import Subset
from monitors.traces import _writer, read_records
from monitors.traces._index import count_rows
from monitors.traces._layout import (
    RUN_ANNOTATIONS,
    chunk_path,
    index_path,
    list_chunks,
    scan,
    sealed_path,
)
from monitors.traces._sealed import seal as real_seal


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def index_rows(monitor: FileMonitor) -> list[dict[str, Any]]:
    """The rows of the monitor's stream index, parsed."""
    return [orjson.loads(line) for line in index_path(monitor.stream_dir).read_bytes().splitlines()]


def metrics_lines(root: Path) -> list[dict[str, Any]]:
    return [
        orjson.loads(line)
        for line in (root / "monitors" / "file" / "metrics.jsonl").read_bytes().splitlines()
    ]


def assert_accounted(stats: DeliveryStats) -> None:
    assert stats.delivered + stats.lost_total == stats.submitted
    assert stats.pending == 0


# -- metrics ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_non_finite_metrics_are_dropped_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    metrics = {
        "loss": 0.25,
        "nan_loss": math.nan,
        "reward/mean": 1.5,
        "grad_norm": math.inf,
        "neg_inf": -math.inf,
        "np_nan": np.float64("nan"),
        "np32_inf": np.float32("inf"),
        "steps": 12,
        "flag": True,
        "decimal_nan": Decimal("NaN"),
        "np_ok": np.float32(0.5),
        "name": "run-1",
        "also_nan": float("nan"),
    }
    dropped = ["nan_loss", "grad_norm", "neg_inf", "np_nan", "np32_inf", "decimal_nan", "also_nan"]
    async with FileMonitor(tmp_path) as monitor:
        with caplog.at_level(logging.WARNING):
            await monitor.log_metrics(metrics, step=3)
        await monitor.log_metrics({"loss": 0.125}, step=4)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, caplog.text
    message = warnings[0].getMessage()
    assert "step 3" in message
    named = message.rsplit(": ", 1)[1].split(", ")
    assert sorted(named) == sorted(dropped), f"the warning names {named}, not {dropped}"

    first, second = metrics_lines(tmp_path)
    assert first["step"] == 3
    assert second["step"] == 4
    assert isinstance(first["time"], float)
    # Flat, as prime-rl writes a row: the step, the time, then the metrics.
    assert list(first) == ["step", "time", "loss", "reward/mean", "steps", "flag", "np_ok", "name"]
    assert {k: v for k, v in first.items() if k not in ("step", "time")} == {
        "loss": 0.25,
        "reward/mean": 1.5,
        "steps": 12,
        "flag": True,
        "np_ok": 0.5,
        "name": "run-1",
    }
    assert second == {"step": 4, "time": second["time"], "loss": 0.125}


@pytest.mark.anyio
async def test_a_metric_named_as_a_row_key_is_dropped_and_named(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """prime-rl's flat row would let a metric named ``step`` or ``time`` overwrite the
    row's own: it is dropped, and the warning names it."""
    async with FileMonitor(tmp_path) as monitor:
        with caplog.at_level(logging.WARNING, logger="monitors.file"):
            await monitor.log_metrics({"step": 99, "time": -1.0, "loss": 0.5}, step=7)
    (row,) = metrics_lines(tmp_path)
    assert row["step"] == 7
    assert row["time"] > 0
    assert row["loss"] == 0.5
    assert list(row) == ["step", "time", "loss"]
    assert "step 7: dropped metrics named as a row's own keys: step, time" in caplog.text


@pytest.mark.anyio
async def test_log_dispatches_mappings_to_metrics_and_the_rest_to_episodes(
    tmp_path: Path,
) -> None:
    async with FileMonitor(tmp_path) as monitor:
        await monitor.log({"loss": 1.0}, step=1)
        await monitor.log([{"e": 1}, {"e": 2}], step=1, kind="eval", subset="all")
        await monitor.log(({"e": n} for n in (3, 4)), step=2)  # a generator: episodes
        await monitor.log(({"e": 5},), step=2, kind="train", subset="all")
        stats = monitor.stats()
    assert [m["loss"] for m in metrics_lines(tmp_path)] == [1.0]
    # One stream, in arrival order; the kind is in each row.
    assert list(read_records(tmp_path)) == [{"e": n} for n in range(1, 6)]
    assert [row["kind"] for row in index_rows(monitor)] == ["eval"] * 2 + ["train"] * 3
    assert [row["step"] for row in index_rows(monitor)] == [1, 1, 2, 2, 2]
    assert monitor.stream_dir == tmp_path / "monitors" / "file" / "traces" / "stream"
    assert stats == DeliveryStats(submitted=5, delivered=5, lost={})


@pytest.mark.anyio
async def test_unknown_kind_or_subset_is_refused(tmp_path: Path) -> None:
    async with FileMonitor(tmp_path) as monitor:
        with pytest.raises(ValueError, match="kind"):
            await monitor.log_episodes([{"a": 1}], step=0, kind="test")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="subset"):
            await monitor.log_episodes([{"a": 1}], step=0, subset="some")  # type: ignore[arg-type]


class FullDisk:
    """``os.write`` as a disk with ``room`` bytes left: a write past it writes what fits,
    then raises ENOSPC (as a real disk does on the call after a short write). ``room =
    None``: space came back."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, room: int | None) -> None:
        self.room = room
        self.real = os.write
        self.failed = 0
        # monitors.file calls os.write through the os module: patch it there.
        monkeypatch.setattr("monitors.file.os.write", self)

    def __call__(self, fd: int, data: Any) -> int:
        if self.room is None:
            return self.real(fd, data)
        if len(data) > self.room:
            written = self.real(fd, bytes(data[: self.room])) if self.room else 0
            self.room -= written
            self.failed += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.room -= len(data)
        return self.real(fd, data)


def whole_lines(path: Path) -> list[dict[str, Any]]:
    """The file's lines, each parsed; it must end with a newline (or be empty)."""
    data = path.read_bytes()
    assert data == b"" or data.endswith(b"\n"), data[-80:]
    return [orjson.loads(line) for line in data.splitlines()]


@pytest.mark.anyio
@pytest.mark.parametrize("room", [0, 1, 17, 40])
async def test_a_metrics_write_that_fails_part_way_leaves_whole_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, room: int
) -> None:
    path = tmp_path / "monitors" / "file" / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    async with FileMonitor(tmp_path) as monitor:
        await monitor.log_metrics({"loss": 1.0}, step=0)
        before = path.read_bytes()
        disk = FullDisk(monkeypatch, room)
        with pytest.raises(TraceWriteError, match=str(path)) as info:
            await monitor.log_metrics({"loss": 0.5, "note": "x" * 200}, step=1)
        assert isinstance(info.value.__cause__, OSError)
        assert info.value.__cause__.errno == errno.ENOSPC
        assert disk.failed == 1
        assert path.read_bytes() == before  # the part that was written is gone again
        disk.room = None  # space is back: the next metric is a line of its own
        await monitor.log_metrics({"loss": 0.25}, step=2)
        await monitor.log_metrics({"loss": object()}, step=3)  # counted and logged, not raised
    lines = whole_lines(path)
    assert [(m["step"], m["loss"]) for m in lines] == [(0, 1.0), (2, 0.25)]
    assert monitor.metrics_stats() == DeliveryStats(4, 2, {"write_error": 1, "encode_error": 1})


@pytest.mark.anyio
async def test_short_writes_still_write_the_whole_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.write
    calls: list[int] = []

    def dribble(fd: int, data: Any) -> int:
        calls.append(len(data))
        return real(fd, bytes(data[:7]))  # the kernel may write less than asked

    monkeypatch.setattr("monitors.file.os.write", dribble)
    async with FileMonitor(tmp_path) as monitor:
        await monitor.log_metrics({"loss": 1.0, "name": "a" * 50}, step=0)
        await monitor.log_metrics({"loss": 2.0}, step=1)
    assert len(calls) > 10
    lines = whole_lines(tmp_path / "monitors" / "file" / "metrics.jsonl")
    assert [m["loss"] for m in lines] == [1.0, 2.0]


@pytest.mark.anyio
async def test_a_partial_line_that_could_not_be_cut_is_mended_before_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "monitors" / "file" / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    real_ftruncate = os.ftruncate

    def refuse(fd: int, size: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    caplog.set_level(logging.WARNING, logger="monitors")
    async with FileMonitor(tmp_path) as monitor:
        await monitor.log_metrics({"loss": 1.0}, step=0)
        disk = FullDisk(monkeypatch, 20)
        monkeypatch.setattr("monitors.file.os.ftruncate", refuse)
        with pytest.raises(TraceWriteError):
            await monitor.log_metrics({"loss": 0.5}, step=1)
        assert not path.read_bytes().endswith(b"\n")  # 20 bytes of a line left behind
        assert "cannot cut a partial metrics line" in caplog.text
        disk.room = None
        monkeypatch.setattr("monitors.file.os.ftruncate", real_ftruncate)
        await monitor.log_metrics({"loss": 0.25}, step=2)
    assert [m["step"] for m in whole_lines(path)] == [0, 2]
    assert "cut 20 bytes" in caplog.text


@pytest.mark.anyio
@pytest.mark.parametrize(
    "torn",
    [
        b'{"step":2,"time":1.5,"metr',  # a line cut short by a crash
        b"x" * 200_000,  # a long one, longer than a block read from the end
    ],
)
@pytest.mark.parametrize("whole", [0, 2])
async def test_a_torn_tail_is_mended_on_the_first_metrics(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, torn: bytes, whole: int
) -> None:
    path = tmp_path / "monitors" / "file" / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    earlier = b"".join(
        orjson.dumps({"step": n, "time": 1.0, "metrics": {"loss": n}}) + b"\n" for n in range(whole)
    )
    path.write_bytes(earlier + torn)  # what a process killed mid-write leaves
    caplog.set_level(logging.WARNING, logger="monitors")
    async with FileMonitor(tmp_path) as monitor:
        await monitor.log_metrics({"loss": 9.0}, step=whole)
        await monitor.log_metrics({"loss": 10.0}, step=whole + 1)
    assert [m["step"] for m in whole_lines(path)] == list(range(whole + 2))
    assert path.read_bytes().startswith(earlier + b'{"step":' + str(whole).encode())
    cuts = [r.getMessage() for r in caplog.records if "torn line" in r.getMessage()]
    assert len(cuts) == 1, cuts
    assert f"cut {len(torn)} bytes" in cuts[0]
    assert str(path) in cuts[0]


@pytest.mark.anyio
async def test_a_whole_metrics_file_is_appended_to_as_it_is(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "monitors" / "file" / "metrics.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    earlier = b'{"step":0,"time":1.0,"metrics":{}}\n'
    path.write_bytes(earlier)
    caplog.set_level(logging.WARNING, logger="monitors")
    async with FileMonitor(tmp_path) as monitor:
        await monitor.log_metrics({"loss": 9.0}, step=1)
    assert path.read_bytes().startswith(earlier)
    assert [m["step"] for m in whole_lines(path)] == [0, 1]
    assert "torn" not in caplog.text


# -- start ---------------------------------------------------------------------------------


def refusing_dir() -> Path:
    """A real directory that refuses to have a file created in it, even to root (sysfs,
    procfs): chmod cannot make one for uid 0. Which is found here is checked, not assumed."""
    for candidate in (Path("/sys/kernel"), Path("/sys"), Path("/proc/self/fdinfo")):
        probe = candidate / ".nodewise-test-probe"
        try:
            fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError:
            if candidate.is_dir():
                return candidate
            continue
        os.close(fd)
        probe.unlink()
    raise AssertionError("no directory here refuses writes: this test needs /sys or /proc")


@pytest.mark.anyio
async def test_start_creates_the_root_and_leaves_nothing_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    threads: list[threading.Thread] = []
    real = file_module.ensure_writable_dir

    def watched(root: Path) -> None:
        threads.append(threading.current_thread())
        real(root)

    monkeypatch.setattr(file_module, "ensure_writable_dir", watched)
    root = tmp_path / "a" / "b" / "run"
    async with FileMonitor(root):
        assert root.is_dir()
        assert list(root.iterdir()) == []  # the probe file is gone
    assert len(threads) == 1
    assert threads[0] is not threading.main_thread()  # checked in a worker, not on the loop


@pytest.mark.anyio
async def test_start_refuses_a_root_it_cannot_write(tmp_path: Path) -> None:
    a_file = tmp_path / "a_file"
    a_file.write_text("not a directory")
    refusing = refusing_dir()
    cases: list[tuple[Path, str]] = [
        (a_file, "it is a file, not a directory"),
        (a_file / "run", f"{a_file} is a file, not a directory"),
        (a_file / "deeper" / "run", f"{a_file} is a file, not a directory"),
        (refusing, "cannot create a file in it"),
        (refusing / "nodewise-run", "cannot create it"),
    ]
    for root, why in cases:
        monitor = FileMonitor(root)
        with pytest.raises(TraceWriteError) as info:
            await monitor.start()
        message = str(info.value)
        assert message.startswith(f"cannot write to {root}: "), message
        assert why in message, message
        assert isinstance(info.value.__cause__, OSError)
        await monitor.finalize()
    assert a_file.read_text() == "not a directory"


@pytest.mark.anyio
async def test_start_on_a_read_only_directory(tmp_path: Path) -> None:
    """chmod 0o555 refuses an ordinary user; root writes there all the same, so as root the
    check must pass and leave the directory as it found it."""
    root = tmp_path / "ro"
    root.mkdir()
    root.chmod(0o555)
    try:
        monitor = FileMonitor(root)
        if os.geteuid() != 0:
            with pytest.raises(TraceWriteError, match="cannot create a file in it") as info:
                await monitor.start()
            assert str(root) in str(info.value)
        else:
            async with monitor:
                pass
        assert list(root.iterdir()) == []
        assert root.stat().st_mode & 0o777 == 0o555
    finally:
        root.chmod(0o755)


# -- options -------------------------------------------------------------------------------


@pytest.mark.parametrize("bad", [2.0, "2", True])
def test_float_decimals_is_checked_at_construction(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(ValueError, match="float_decimals"):
        FileMonitor(tmp_path, float_decimals=bad)
    for good in (None, 0, 17):
        assert FileMonitor(tmp_path, float_decimals=good).float_decimals == good


@pytest.mark.anyio
async def test_float_decimals_leaves_a_dict_as_given(tmp_path: Path) -> None:
    """``float_decimals`` is verifiers' option (its per-token floats): a dict, which the
    caller built as it wants it on disk, is written with every digit, numpy floats too."""
    np_floats = np.array([0.123456789, 1.987654321])
    record: dict[str, Any] = {
        "reward": 0.987654321,
        "logprobs": [-0.123456, -2.718281828, 3.0, 1e-9],
        "nested": {"deep": [{"x": 1.005, "ints": [1, 2, 3]}], "text": "3.14159"},
        "n": 7,
        "np": np_floats,
    }
    kept = copy.deepcopy(record)
    async with FileMonitor(tmp_path, float_decimals=2, option=orjson.OPT_SERIALIZE_NUMPY) as m:
        await m.log_episodes([record], step=0)
    stream = m.stream_dir
    line = chunk_bytes(stream, 0)
    assert line == orjson.dumps(record, option=orjson.OPT_SERIALIZE_NUMPY) + b"\n"
    (got,) = read_records(stream)
    assert got == {**kept, "np": [0.123456789, 1.987654321]}
    assert record["np"] is np_floats


def stream_files(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


@pytest.mark.anyio
async def test_compress_options_reach_every_stream(tmp_path: Path) -> None:
    episodes = [{"id": f"e{n}", "traces": [{"id": f"t{n}"}], "pad": "x" * 80} for n in range(3)]
    runs: dict[str, dict[str, Any]] = {
        "default": {},
        "plain": {"compress": False},
        "live_left_plain": {"seal_on_finalize": False, "level": 19},
    }
    for name, options in runs.items():
        async with FileMonitor(tmp_path / name, chunk_bytes=100, **options) as monitor:
            for subset in ("all", "effective"):
                await monitor.log_episodes(episodes, step=0, subset=subset)
        traces = tmp_path / name / "monitors" / "file" / "traces"
        assert list(read_records(monitor.stream_dir)) == episodes  # each once
        # One record per chunk, in the stream and in the annotations; indexes beside.
        for stream in (monitor.stream_dir, traces / "annotations" / "unknown"):
            assert len(list(read_records(stream))) == 3
            assert index_path(stream).is_file()
            files = stream_files(stream)
            if name == "default":
                assert files == ["00000.jsonl.zst", "00001.jsonl.zst", "00002.jsonl.zst"]
            elif name == "plain":
                assert files == ["00000.jsonl", "00001.jsonl", "00002.jsonl"]
            else:
                assert files == ["00000.jsonl.zst", "00001.jsonl.zst", "00002.jsonl"]
        assert {w.level for w in monitor._traces.writers()} == {options.get("level", 3)}
        assert monitor.stats() == DeliveryStats(6, 6, {})


def failing_seal(monkeypatch: pytest.MonkeyPatch, fails: Callable[[int], bool]) -> list[int]:
    """Make sealing chunk ``n`` fail as a full disk does while ``fails(n)``; returns the
    chunks whose seal was tried, in order."""
    tried: list[int] = []

    def seal(directory: Path, chunk: int, **kwargs: Any) -> int:
        tried.append(chunk)
        if fails(chunk):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_seal(directory, chunk, **kwargs)

    monkeypatch.setattr("monitors.traces._writer.seal", seal)
    return tried


@pytest.mark.anyio
async def test_stats_count_chunks_whose_seal_failed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    full = [True]
    tried = failing_seal(monkeypatch, lambda chunk: chunk == 1 and full[0])
    episodes = [{"n": n, "pad": "x" * 80} for n in range(4)]  # one chunk each
    monitor = FileMonitor(tmp_path, chunk_bytes=100)
    await monitor.start()
    await monitor.log_episodes(episodes, step=0)
    await monitor.log_episodes([{"n": 4, "pad": "x" * 80}], step=1)  # waits for chunk 2's seal
    stream = monitor.stream_dir
    assert monitor.stats() == DeliveryStats(5, 5, {}, {"seal_failed": 1})
    assert "degraded={'seal_failed': 1}" in repr(monitor.stats())
    # Chunk 1 left plain and readable; 4 is live, and 3 may still be sealing.
    assert scan(stream).plain in ([1, 4], [1, 3, 4])
    assert list(read_records(stream)) == [*episodes, {"n": 4, "pad": "x" * 80}]
    full[0] = False  # space is back: finalize seals it after all
    await monitor.finalize()
    assert monitor.stats() == DeliveryStats(5, 5, {})
    assert repr(monitor.stats()) == "DeliveryStats(submitted=5, delivered=5, lost={})"
    assert scan(stream).plain == []
    assert list_chunks(stream) == [0, 1, 2, 3, 4]
    assert tried.count(1) == 2


@pytest.mark.anyio
async def test_a_seal_that_fails_for_good_stays_plain_and_counted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    failing_seal(monkeypatch, lambda chunk: chunk in (0, 2))
    episodes = [{"n": n, "pad": "x" * 80} for n in range(3)]
    async with FileMonitor(tmp_path, chunk_bytes=100) as monitor:
        await monitor.log_episodes(episodes, step=0)
    stream = monitor.stream_dir
    assert monitor.stats() == DeliveryStats(3, 3, {}, {"seal_failed": 2})  # 2: the live one
    assert chunk_path(stream, 0).is_file()
    assert sealed_path(stream, 1).is_file()
    assert chunk_path(stream, 2).is_file()
    assert list(read_records(stream)) == episodes


# -- records ------------------------------------------------------------------------------


class Lazy:
    """An episode that builds its record on demand, and says when."""

    def __init__(self, n: int, log: list[int], *, fail: bool = False) -> None:
        self.n = n
        self.log = log
        self.fail = fail
        self.calls = 0

    def to_record(self) -> Any:
        self.calls += 1
        self.log.append(self.n)
        if self.fail:
            raise RuntimeError(f"episode {self.n} cannot be built")
        return {"n": self.n, "text": "é" * 1000 * self.n}


@pytest.mark.anyio
async def test_records_are_built_lazily_once_each(tmp_path: Path) -> None:
    built: list[int] = []
    episodes = [Lazy(n, built) for n in range(6)]
    async with FileMonitor(tmp_path) as monitor:
        stream = monitor.stream_dir
        seen_when_built: list[int] = []

        class Watching(Lazy):
            def to_record(self) -> Any:
                # Built when its turn to be written comes, after the ones before it.
                seen_when_built.append(len(list(read_records(stream))) if stream.exists() else 0)
                return super().to_record()

        episodes.append(Watching(6, built))
        assert built == []
        await monitor.log_episodes(episodes, step=0)
    assert built == list(range(7))
    assert [e.calls for e in episodes] == [1] * 7
    assert seen_when_built == [6]
    assert [r["n"] for r in read_records(stream)] == list(range(7))
    assert monitor.stats() == DeliveryStats(7, 7, {})


@pytest.mark.anyio
async def test_bad_records_are_counted_and_the_rest_written(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    built: list[int] = []
    episodes: list[Any] = [
        {"n": 0},
        Lazy(1, built, fail=True),
        {"n": 2, "bad": object()},  # cannot be encoded
        Lazy(3, built),
        {"n": 4, "deep": [{"x": {1, 2}}]},  # cannot be encoded either
        "not an episode",  # neither a Mapping nor to_record()
        {"n": 6, "big": "x" * 3_000_000, "bad": object()},  # fails after megabytes
        {"n": 7},
    ]
    async with FileMonitor(tmp_path) as monitor:
        with caplog.at_level(logging.WARNING):
            await monitor.log_episodes(episodes, step=9, subset="all")
        stats = monitor.stats()
    got = list(read_records(monitor.stream_dir))
    assert [r["n"] for r in got] == [0, 3, 7]
    assert got[1] == Lazy(3, []).to_record()
    assert stats.submitted == 8
    assert stats.delivered == 3
    assert stats.lost == {"bad_record": 2, "encode_error": 3}
    assert_accounted(stats)
    assert "step 9" in caplog.text


@pytest.mark.anyio
async def test_cancelled_log_episodes_counts_what_was_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    huge = {"parts": ["abcdefgh" * 131_072] * 60}  # ~60 MB from one shared string

    class CancelWhenBuilt:
        """The caller gives up just as this episode starts being written."""

        def __init__(self, scope: anyio.CancelScope) -> None:
            self.scope = scope

        def to_record(self) -> Any:
            self.scope.cancel()
            return huge

    async with FileMonitor(tmp_path) as monitor:
        with anyio.CancelScope() as scope:
            await monitor.log_episodes([{"n": 0}, CancelWhenBuilt(scope), {"n": 2}], step=0)
        assert scope.cancelled_caught
        assert monitor.stats() == DeliveryStats(3, 1, {"cancelled": 2})
        # And a cancellation in the middle of a 60 MB record: once 4 of its ~60 batches of
        # 1 MiB are written (not after some milliseconds: the whole record takes 60-80 ms
        # here, so a faster machine could finish it first).
        real = _writer._write_joined
        batches = itertools.count()

        def write(fd: int, chunks: list[bytes]) -> None:
            if next(batches) == 4:
                anyio.from_thread.run_sync(scope.cancel)
            real(fd, chunks)

        monkeypatch.setattr(_writer, "_write_joined", write)
        with anyio.CancelScope() as scope:
            await monitor.log_episodes([huge, {"n": 4}], step=1)
        monkeypatch.setattr(_writer, "_write_joined", real)
        assert scope.cancelled_caught
        assert monitor.stats() == DeliveryStats(5, 1, {"cancelled": 4})
        await monitor.log_episodes([{"n": 5}], step=2)
    assert list(read_records(monitor.stream_dir)) == [{"n": 0}, {"n": 5}]
    assert_accounted(monitor.stats())


@pytest.mark.anyio
async def test_finalize_is_idempotent_and_closes(tmp_path: Path) -> None:
    monitor = FileMonitor(tmp_path, chunk_bytes=100)
    await monitor.start()
    await monitor.log_episodes([{"n": n, "pad": "x" * 80} for n in range(5)], step=0)
    await monitor.finalize()
    before = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
    await monitor.finalize()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == before
    with pytest.raises(RuntimeError, match="finalized"):
        await monitor.log_episodes([{"n": 5}], step=1)
    with pytest.raises(RuntimeError, match="finalized"):
        await monitor.log_metrics({"a": 1.0}, step=1)
    assert [r["n"] for r in read_records(monitor.stream_dir)] == list(range(5))
    assert monitor.stats() == DeliveryStats(5, 5, {})


def open_files_under(root: Path) -> list[str]:
    found = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/self/fd/{fd}")
            if target.startswith(str(root)):
                found.append(target)
    return found


@pytest.mark.anyio
async def test_a_failed_fsync_is_raised_by_finalize_after_closing_every_stream(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def fsync(fd: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", fsync)
    monitor = FileMonitor(tmp_path, chunk_bytes=100)
    await monitor.start()
    # One chunk each, in the stream and in the annotations: two rolls in each.
    episodes = [{"id": f"e{n}", "traces": [{"id": f"t{n}"}], "pad": "x" * 80} for n in range(3)]
    for subset in ("all", "effective"):
        await monitor.log_episodes(episodes, step=0, subset=subset)
    stats = monitor.stats()
    assert (stats.submitted, stats.delivered, stats.lost) == (6, 6, {})
    with pytest.raises(TraceWriteError, match="Input/output error") as info:
        await monitor.finalize()
    assert str(info.value).startswith(f"trace stream {monitor.stream_dir} ")  # the first's
    assert open_files_under(tmp_path) == []  # and the annotations' stream was closed too
    assert list(read_records(monitor.stream_dir)) == episodes
    assert len(list(read_records(tmp_path / RUN_ANNOTATIONS / "unknown"))) == 3
    # A seal fsyncs what it wrote: with fsync failing every chunk stayed plain, and says so.
    assert monitor.stats() == DeliveryStats(6, 6, {}, {"seal_failed": 6})
    assert sorted(p.name for p in monitor.stream_dir.iterdir()) == [
        "00000.jsonl",
        "00001.jsonl",
        "00002.jsonl",
    ]


# -- a disk that fills up -----------------------------------------------------------------


@contextlib.contextmanager
def tiny_disk(path: Path, monkeypatch: pytest.MonkeyPatch, size: int) -> Iterator[str]:
    """A ``size``-byte tmpfs at ``path``; where mounting is not allowed, writes through the
    trace writer fail with ENOSPC once ``size`` bytes were written."""
    path.mkdir()
    mounted = (
        subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)],
            capture_output=True,
            check=False,
        ).returncode
        == 0
    )
    if not mounted:
        left = [size]
        real = _writer.write_all

        def write_all(fd: int, data: bytes) -> None:
            if len(data) > left[0]:
                real(fd, data[: left[0]])
                left[0] = 0
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            left[0] -= len(data)
            real(fd, data)

        monkeypatch.setattr(_writer, "write_all", write_all)
    try:
        yield "tmpfs" if mounted else "patched"
    finally:
        if mounted and subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "-l", str(path)], check=False)


@pytest.mark.anyio
async def test_disk_full_raises_and_keeps_the_stream_readable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    episodes = [{"n": n, "text": f"{n} é漢🙂 " * 9_000} for n in range(40)]  # ~100 KB each
    size = len(orjson.dumps(episodes[0])) + 1
    root = tmp_path / "disk"
    with tiny_disk(root, monkeypatch, 2 << 20):
        monitor = FileMonitor(root)
        await monitor.start()
        try:
            await monitor.log_episodes(episodes[:3], step=0)
            with pytest.raises(TraceWriteError) as info:
                await monitor.log_episodes(episodes[3:], step=1)
            cause = info.value.__cause__
            assert isinstance(cause, OSError)
            assert cause.errno == errno.ENOSPC
            stats = monitor.stats()
            stream = monitor.stream_dir
            got = list(read_records(stream))
            # Every record that was reported delivered is there, whole; nothing else.
            assert len(got) == stats.delivered
            assert got == episodes[: stats.delivered]
            assert 3 < stats.delivered < 20 < 2 * (2 << 20) // size
            assert stats.submitted == 40
            assert stats.lost == {"write_error": 40 - stats.delivered}
            assert_accounted(stats)
            assert count_rows(index_path(stream)) == stats.delivered
            assert index_path(stream).read_bytes().endswith(b"\n")
            for chunk in stream.glob("0*.jsonl"):
                assert chunk.read_bytes().endswith(b"\n")

            # Still full: the next call fails and counts as well.
            with pytest.raises(TraceWriteError):
                await monitor.log_episodes([episodes[0], episodes[1]], step=2)
            stats2 = monitor.stats()
            assert stats2.submitted == 42
            assert stats2.delivered == stats.delivered
            assert stats2.lost["write_error"] == 42 - stats.delivered
            assert_accounted(stats2)
            assert list(read_records(stream)) == got
        finally:
            await monitor.finalize()
        assert list(read_records(stream)) == got


@pytest.mark.anyio
async def test_a_stream_directory_holding_a_stray_file_loses_its_episodes_as_write_errors(
    tmp_path: Path,
) -> None:
    async with FileMonitor(tmp_path) as monitor:
        stream = monitor.stream_dir
        stream.mkdir(parents=True)
        (stream / "notes.txt").write_text("not a chunk\n")
        with pytest.raises(TraceWriteError, match=r"notes\.txt") as caught:
            await monitor.log_episodes([{"id": "a"}, {"id": "b"}], step=0, subset="all")
        assert type(caught.value.__cause__).__name__ == "TraceFormatError"
        assert monitor.stats() == DeliveryStats(2, 0, {"write_error": 2})
        assert (stream / "notes.txt").read_text() == "not a chunk\n"  # left alone
        (stream / "notes.txt").unlink()
        await monitor.log_episodes([{"id": "c"}], step=0, subset="all")  # then it goes on
    assert [r["id"] for r in read_records(monitor.stream_dir)] == ["c"]


@pytest.mark.anyio
async def test_finalize_seals_the_streams_side_by_side(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    both = threading.Barrier(2, timeout=10)  # broken unless both seals run at once

    def seal(directory: Path, chunk: int, **kwargs: Any) -> int:
        both.wait()
        return real_seal(directory, chunk, **kwargs)

    monkeypatch.setattr("monitors.traces._writer.seal", seal)
    subsets: tuple[Subset, ...] = ("all", "effective")
    async with FileMonitor(tmp_path) as monitor:
        for subset in subsets:  # the episode, then its trace's annotation
            await monitor.log_episodes(
                [{"id": "e", "traces": [{"id": "t"}]}], step=0, subset=subset
            )
    assert monitor.stats() == DeliveryStats(2, 2, {})  # no seal failed
    for stream in (monitor.stream_dir, tmp_path / RUN_ANNOTATIONS / "unknown"):
        assert scan(stream).sealed == [0]
