"""FileMonitor: metrics.jsonl, trace streams per (kind, subset), lazy records, accounting of
every record (delivered, or lost with a reason), and a disk that fills up."""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
import subprocess
from collections.abc import Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import anyio
import numpy as np
import orjson
import pytest

from monitors import DeliveryStats, FileMonitor, TraceWriteError
from monitors.traces import _writer, read_records


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def metrics_lines(root: Path) -> list[dict[str, Any]]:
    return [orjson.loads(line) for line in (root / "metrics.jsonl").read_bytes().splitlines()]


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
    assert first["metrics"] == {
        "loss": 0.25,
        "reward/mean": 1.5,
        "steps": 12,
        "flag": True,
        "np_ok": 0.5,
        "name": "run-1",
    }
    assert second["metrics"] == {"loss": 0.125}


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
    assert [m["metrics"] for m in metrics_lines(tmp_path)] == [{"loss": 1.0}]
    assert list(read_records(monitor.stream_dir("eval", "all"))) == [{"e": 1}, {"e": 2}]
    assert list(read_records(monitor.stream_dir("train", "effective"))) == [{"e": 3}, {"e": 4}]
    assert list(read_records(monitor.stream_dir("train", "all"))) == [{"e": 5}]
    assert monitor.stream_dir("eval", "all") == tmp_path / "traces" / "eval" / "all"
    assert stats == DeliveryStats(submitted=5, delivered=5, lost={})


@pytest.mark.anyio
async def test_unknown_kind_or_subset_is_refused(tmp_path: Path) -> None:
    async with FileMonitor(tmp_path) as monitor:
        with pytest.raises(ValueError, match="kind"):
            await monitor.log_episodes([{"a": 1}], step=0, kind="test")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="subset"):
            await monitor.log_episodes([{"a": 1}], step=0, subset="some")  # type: ignore[arg-type]


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
        stream = monitor.stream_dir("train", "effective")
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
    got = list(read_records(monitor.stream_dir("train", "all")))
    assert [r["n"] for r in got] == [0, 3, 7]
    assert got[1] == Lazy(3, []).to_record()
    assert stats.submitted == 8
    assert stats.delivered == 3
    assert stats.lost == {"bad_record": 2, "encode_error": 3}
    assert_accounted(stats)
    assert "step 9" in caplog.text


@pytest.mark.anyio
async def test_cancelled_log_episodes_counts_what_was_not_written(tmp_path: Path) -> None:
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
        # And a cancellation in the middle of a 60 MB record, after some milliseconds.
        with anyio.move_on_after(0.02) as scope:
            await monitor.log_episodes([huge, {"n": 4}], step=1)
        assert scope.cancelled_caught
        assert monitor.stats() == DeliveryStats(5, 1, {"cancelled": 4})
        await monitor.log_episodes([{"n": 5}], step=2)
    assert list(read_records(monitor.stream_dir("train", "effective"))) == [{"n": 0}, {"n": 5}]
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
    assert [r["n"] for r in read_records(monitor.stream_dir("train", "effective"))] == list(
        range(5)
    )
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
    episodes = [{"n": n, "pad": "x" * 80} for n in range(3)]  # one chunk each: two rolls
    for subset in ("all", "effective"):
        await monitor.log_episodes(episodes, step=0, subset=subset)  # type: ignore[arg-type]
    assert monitor.stats() == DeliveryStats(6, 6, {})
    with pytest.raises(TraceWriteError, match="Input/output error") as info:
        await monitor.finalize()
    assert "traces/train/all" in str(info.value)  # the first stream's error
    assert open_files_under(tmp_path) == []  # and the second stream was closed too
    for subset in ("all", "effective"):
        assert list(read_records(monitor.stream_dir("train", subset))) == episodes  # type: ignore[arg-type]


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
        real = _writer._write_all

        def write_all(fd: int, data: bytes) -> None:
            if len(data) > left[0]:
                real(fd, data[: left[0]])
                left[0] = 0
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
            left[0] -= len(data)
            real(fd, data)

        monkeypatch.setattr(_writer, "_write_all", write_all)
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
            stream = monitor.stream_dir("train", "effective")
            got = list(read_records(stream))
            # Every record that was reported delivered is there, whole; nothing else.
            assert len(got) == stats.delivered
            assert got == episodes[: stats.delivered]
            assert 3 < stats.delivered < 20 < 2 * (2 << 20) // size
            assert stats.submitted == 40
            assert stats.lost == {"write_error": 40 - stats.delivered}
            assert_accounted(stats)
            assert (stream / "index.jsonl").stat().st_size == 160 * stats.delivered
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
