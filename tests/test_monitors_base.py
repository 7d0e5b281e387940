"""The Monitors fan-out never raises into the caller, and DeliveryStats' arithmetic."""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from streams import chunk_bytes

from monitors import DeliveryStats, FileMonitor, Monitor, Monitors
from monitors.traces import read_records
from monitors.traces._layout import index_path

#: Where a FileMonitor writes a run, below its root (prime-rl's layout).
METRICS = Path("monitors", "file", "metrics.jsonl")
STREAM = Path("monitors", "file", "traces", "stream")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Broken(Monitor):
    """Fails at everything it is asked to do (and counts how often it was asked)."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        self.calls.append("log_metrics")
        raise RuntimeError(f"metrics of step {step} refused")

    async def log_episodes(
        self, episodes: Iterable[Any], *, step: int, kind: Any = "train", subset: Any = "effective"
    ) -> None:
        self.calls.append("log_episodes")
        raise OSError(f"episodes of step {step} refused")

    async def finalize(self) -> None:
        self.calls.append("finalize")
        raise ValueError("cannot finalize")

    def stats(self) -> DeliveryStats:
        return DeliveryStats(submitted=7, delivered=2, lost={"write_error": 3, "dropped": 1})


class Recorder(Monitor):
    """Keeps what it is given; finalize is idempotent as the interface asks."""

    def __init__(self) -> None:
        self.metrics: list[tuple[int, dict[str, Any]]] = []
        self.episodes: list[tuple[int, str, str, list[Any]]] = []
        self.finalized = 0
        self.started = 0

    async def start(self) -> None:
        self.started += 1

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        self.metrics.append((step, dict(metrics)))

    async def log_episodes(
        self, episodes: Iterable[Any], *, step: int, kind: Any = "train", subset: Any = "effective"
    ) -> None:
        self.episodes.append((step, kind, subset, list(episodes)))

    async def finalize(self) -> None:
        self.finalized += 1

    def stats(self) -> DeliveryStats:
        n = sum(len(e[3]) for e in self.episodes)
        return DeliveryStats(submitted=n + 1, delivered=n, lost={})


class Counted:
    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def to_record(self) -> dict[str, int]:
        self.calls += 1
        return {"n": self.n}


@pytest.mark.anyio
async def test_a_failing_monitor_never_reaches_the_caller(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Broken()
    recorder = Recorder()
    file_monitor = FileMonitor(tmp_path)
    fanout = Monitors(broken, file_monitor, recorder)
    lazy = [Counted(n) for n in range(3)]
    with caplog.at_level(logging.WARNING, logger="monitors"):
        async with fanout:
            await fanout.log_metrics({"loss": 0.5}, step=1)
            await fanout.log_episodes(iter([{"n": 0}, {"n": 1}]), step=1, kind="eval")
            await fanout.log({"loss": 0.25}, step=2)
            await fanout.log(lazy, step=2, subset="all")
        # Leaving the block finalized every monitor (Broken's failure logged, not raised).

    assert broken.calls == [
        "log_metrics",
        "log_episodes",
        "log_metrics",
        "log_episodes",
        "finalize",
    ]
    assert fanout.failures == {"Broken": 5}
    warnings = [r for r in caplog.records if r.name == "monitors" and r.levelno == logging.WARNING]
    assert len(warnings) == 5
    for record in warnings:
        assert record.exc_info is not None
        assert record.exc_info[0] is not None
        assert "Broken" in record.getMessage()
    kinds = [r.exc_info[0] for r in warnings if r.exc_info]
    assert sorted(k.__name__ for k in kinds) == sorted(
        ["RuntimeError", "OSError", "RuntimeError", "OSError", "ValueError"]
    )
    assert "Broken.log_episodes failed during step 2" in caplog.text
    assert "Broken.finalize failed during finalize" in caplog.text
    assert "Traceback" in caplog.text
    assert "cannot finalize" in caplog.text

    # The good monitors got everything.
    assert recorder.started == 1
    assert recorder.metrics == [(1, {"loss": 0.5}), (2, {"loss": 0.25})]
    assert [(s, k, sub, len(e)) for s, k, sub, e in recorder.episodes] == [
        (1, "eval", "effective", 2),
        (2, "train", "all", 3),
    ]
    assert recorder.episodes[0][3] == [{"n": 0}, {"n": 1}]  # the iterator was shared, not spent
    assert recorder.finalized == 1
    metrics = [orjson.loads(x) for x in (tmp_path / METRICS).read_bytes().splitlines()]
    assert [(m["step"], m["loss"]) for m in metrics] == [(1, 0.5), (2, 0.25)]
    # One stream, in arrival order: the eval episodes, then the train ones; each row says
    # which kind and step.
    assert file_monitor.stream_dir == tmp_path / STREAM
    assert list(read_records(tmp_path)) == [{"n": 0}, {"n": 1}, *({"n": n} for n in range(3))]
    rows = [orjson.loads(x) for x in index_path(tmp_path / STREAM).read_bytes().splitlines()]
    assert [(r["line"], r["kind"], r["step"]) for r in rows] == [
        (1, "eval", 1),
        (2, "eval", 1),
        (3, "train", 2),
        (4, "train", 2),
        (5, "train", 2),
    ]
    assert [c.calls for c in lazy] == [1, 1, 1]  # the file monitor built each record once

    # stats() sums every monitor's.
    total = fanout.stats()
    assert total == DeliveryStats(
        submitted=7 + 5 + 6, delivered=2 + 5 + 5, lost={"write_error": 3, "dropped": 1}
    )
    assert total.pending == 1 + 1  # Broken's and the recorder's
    assert fanout.stats_by_monitor() == {
        "Broken": broken.stats(),
        "FileMonitor": DeliveryStats(5, 5, {}),
        "Recorder": DeliveryStats(6, 5, {}),
    }


@pytest.mark.anyio
async def test_finalize_twice_does_nothing_the_second_time(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    broken = Broken()
    recorder = Recorder()
    file_monitor = FileMonitor(tmp_path)
    fanout = Monitors(broken, file_monitor, recorder)
    await fanout.start()
    await fanout.log_episodes([{"n": 1}], step=0)
    with caplog.at_level(logging.WARNING, logger="monitors"):
        await fanout.finalize()
        failures = dict(fanout.failures)
        logged = len(caplog.records)
        files = {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()}
        await fanout.finalize()
    assert {p: p.read_bytes() for p in tmp_path.rglob("*") if p.is_file()} == files
    # "calling it again does nothing" (Monitor.finalize): no second failure logged or
    # counted for the monitor that failed to finalize, no second finalize for the others.
    assert dict(fanout.failures) == failures, "the second finalize counted failures again"
    assert len(caplog.records) == logged, caplog.text
    assert recorder.finalized == 1
    assert fanout.stats().pending == 1 + 1  # the made-up counts: Recorder 1, Broken 7 - 2 - 4


@pytest.mark.anyio
async def test_finalize_twice_with_well_behaved_monitors(tmp_path: Path) -> None:
    file_monitor = FileMonitor(tmp_path)
    fanout = Monitors(file_monitor)
    async with fanout:
        await fanout.log_episodes([{"n": 1}, {"n": 2}], step=0)
    await fanout.finalize()
    assert fanout.failures == {}
    assert list(read_records(file_monitor.stream_dir)) == [{"n": 1}, {"n": 2}]
    assert fanout.stats() == DeliveryStats(2, 2, {})


@pytest.mark.anyio
async def test_an_empty_fanout_is_harmless() -> None:
    fanout = Monitors()
    async with fanout:
        await fanout.log({"a": 1.0}, step=0)
        await fanout.log([{"n": 1}], step=0)
    assert fanout.stats() == DeliveryStats()
    assert fanout.failures == {}


def test_delivery_stats_arithmetic() -> None:
    a = DeliveryStats(submitted=10, delivered=6, lost={"write_error": 1, "encode_error": 2})
    assert a.lost_total == 3
    assert a.pending == 1
    b = DeliveryStats(submitted=5, delivered=5, lost={})
    assert b.pending == 0
    assert b.lost_total == 0
    c = DeliveryStats(submitted=4, delivered=0, lost={"encode_error": 1, "dropped": 3})
    total = a + b + c
    assert total == DeliveryStats(19, 11, {"write_error": 1, "encode_error": 3, "dropped": 3})
    assert total.pending == 1
    assert total.lost_total == 7
    assert DeliveryStats() + DeliveryStats() == DeliveryStats()
    assert DeliveryStats().pending == 0
    # The operands are unchanged.
    assert a.lost == {"write_error": 1, "encode_error": 2}
    assert c.lost == {"encode_error": 1, "dropped": 3}


@pytest.mark.anyio
@pytest.mark.usefixtures("wandb_offline")
async def test_fan_out_to_every_real_monitor(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """File, Prime (a real TracesServer) and W&B (offline) behind one Monitors: the two with
    background work must start and finish in the caller's task, so the fan-out does that."""
    from monitors import PrimeMonitor, WandbMonitor
    from monitors.testing import TracesServer

    episodes = [{"id": i, "text": "x" * 1000, "traces": [{"id": f"{i}-0"}]} for i in range(20)]
    with TracesServer(api_key="k") as server:
        files = FileMonitor(tmp_path / "files")
        prime = PrimeMonitor(api_key="k", traces_url=server.url, base_url=server.url, run_id="r")
        wandb = WandbMonitor(project="fan-out", mode="offline", dir=tmp_path / "wandb")
        async with Monitors(files, prime, wandb) as monitors:
            await monitors.log_metrics({"loss": 0.5}, step=0)
            await monitors.log_episodes(episodes, step=0)
        assert monitors.failures == {}, caplog.text
        for monitor in (files, prime, wandb):
            stats = monitor.stats()
            assert (stats.submitted, stats.delivered, stats.lost) == (20, 20, {}), monitor
        assert server.stats()["unique_ids"] == 20
    # Both run directories: each episode once, its trace marked as shipped at step 0.
    assert wandb.run is not None
    for run in (tmp_path / "files", Path(wandb.run.dir)):
        assert [r["id"] for r in read_records(run)] == list(range(20)), run
        shipped = {"shipped": {"step": 0, "kind": "train"}}
        folded = [r["traces"][0] for r in read_records(run, fold=True)]
        assert folded == [{"id": f"{i}-0", "info": shipped} for i in range(20)], run


def test_every_jsonl_writer_refuses_an_indent(tmp_path: Path) -> None:
    """An indented record would span lines: each monitor (and the trace writer) says so when
    built, rather than writing a stream no reader can split."""
    import encoder
    from monitors import PrimeMonitor, WandbMonitor
    from monitors.traces import TraceWriter

    option = encoder.OPT_INDENT_2 | encoder.OPT_SORT_KEYS
    builders = {
        "file": lambda: FileMonitor(tmp_path, option=option),
        "prime": lambda: PrimeMonitor(api_key="k", option=option),
        "wandb": lambda: WandbMonitor(project="p", option=option),
        "writer": lambda: TraceWriter(tmp_path / "stream", option=option),
    }
    for name, build in builders.items():
        with pytest.raises(ValueError, match="OPT_INDENT_2") as caught:
            build()
        assert "one line" in str(caught.value), name
    assert not (tmp_path / "stream").exists()  # refused before anything was written


@pytest.mark.anyio
async def test_other_options_reach_the_records(tmp_path: Path) -> None:
    import encoder

    async with FileMonitor(tmp_path, option=encoder.OPT_SORT_KEYS) as monitor:
        await monitor.log_episodes([{"b": 1, "a": {"d": 2, "c": 3}}], step=0)
    assert chunk_bytes(tmp_path / STREAM, 0) == b'{"a":{"c":3,"d":2},"b":1}\n'
