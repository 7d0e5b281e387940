"""The load test's own parts: the episode generator and the ``nodewise`` command line."""

from __future__ import annotations

import contextlib
import gc
import itertools
import json
import os
import re
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest

from monitors import FileMonitor
from monitors.lag import LagStats
from monitors.loadtest import (
    LoadtestConfig,
    LoadtestError,
    LoadtestReport,
    RunResult,
    make_episodes,
    run_loadtest,
)
from monitors.loadtest._report import _lag_causes, targets
from monitors.loadtest.cli import main, nodewise, parse_bytes, parse_seconds, parser
from monitors.testing.episodes import (
    BODIES,
    CAP_BYTES,
    MIN_BYTES,
    EpisodeMaker,
    lognormal_sizes,
)
from monitors.traces import read_records

pytestmark = pytest.mark.load


def test_sizes_follow_production() -> None:
    sizes = sorted(lognormal_sizes(20_000, seed=3))
    assert sizes == sorted(lognormal_sizes(20_000, seed=3))
    median, p90 = sizes[10_000], sizes[18_000]
    assert 6.0e6 < median < 6.8e6
    assert 16e6 < p90 < 18e6
    assert 8.0e6 < statistics.mean(sizes) < 9.0e6
    assert sizes[0] >= MIN_BYTES
    assert sizes[-1] <= CAP_BYTES


def test_episodes_are_seeded_unique_and_exactly_sized() -> None:
    maker = EpisodeMaker(seed=7)
    episodes = maker.episodes(40, median=300_000, p90=900_000, cap=3_000_000)
    again = EpisodeMaker(seed=7).episodes(40, median=300_000, p90=900_000, cap=3_000_000)
    assert len({e.id for e in episodes}) == 40
    for episode, twin in zip(episodes, again, strict=True):
        data = orjson.dumps(episode.to_record())
        assert data == orjson.dumps(twin.to_record())  # reproducible, byte for byte
        assert len(data) == episode.size
        assert maker.matches(data, episode) is None
        assert b"".join(maker.expected_pieces(episode)) == data
    one = episodes[5]
    damaged = bytearray(orjson.dumps(one.to_record()))
    damaged[len(damaged) // 2] ^= 1
    assert maker.matches(damaged, one) is not None
    assert maker.matches(damaged[:-1], one) is not None


def test_episodes_have_the_verifiers_shape_and_share_their_bodies() -> None:
    maker = EpisodeMaker(seed=0)
    a, b = maker.episodes(2, size=3_000_000)
    assert abs(a.size - 3_000_000) < 0.03 * 3_000_000
    record = a.to_record()
    assert record["id"] == a.id
    traces = record["traces"]
    assert traces
    assert all(t is maker.body(i) for t, i in zip(traces, a.bodies, strict=True))
    roles = {node["role"] for trace in traces for node in trace["nodes"]}
    assert roles == {"system", "user", "assistant", "tool"}
    node = next(
        n for t in traces for n in t["nodes"] if n["role"] == "assistant" and n["tool_calls"]
    )
    assert isinstance(json.loads(node["tool_calls"][0]["function"]["arguments"]), dict)
    assert node["reasoning"]
    assert len(node["token_ids"]) == len(node["mask"]) == len(node["logprobs"]) > 0
    assert set(node["mask"]) == {1}
    # Shared: the same body is the same object in both episodes' records.
    shared = set(a.bodies) & set(b.bodies)
    for i in shared:
        assert (
            a.to_record()["traces"][a.bodies.index(i)] is b.to_record()["traces"][b.bodies.index(i)]
        )
    assert len(maker.targets) == BODIES


def test_config_refuses_bad_values() -> None:
    with pytest.raises(LoadtestError, match="unknown monitor"):
        LoadtestConfig(monitors=("nope",))  # type: ignore[arg-type]
    with pytest.raises(LoadtestError, match="episodes"):
        LoadtestConfig(episodes=0)
    with pytest.raises(LoadtestError, match="size must be at least"):
        LoadtestConfig(size=10)
    with pytest.raises(LoadtestError, match="latency"):
        LoadtestConfig(latency=-1.0)


def test_units() -> None:
    assert parse_bytes("2.2MB", default_unit=1) == 2_200_000
    assert parse_bytes("5GiB", default_unit=1) == 5 * 2**30
    assert parse_bytes("6.4", default_unit=10**6) == 6_400_000
    assert parse_seconds("100ms") == pytest.approx(0.1)
    assert parse_seconds("2") == 2.0


def test_cli_runs_and_reports_json(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(
        [
            "--monitors",
            "file,prime",
            "--episodes",
            "6",
            "--size",
            "200kB",
            "--step-size",
            "3",
            "--baseline",
            "--json",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    runs = {r["run"]: r for r in report["results"]}
    assert list(runs) == ["file", "prime", "baseline-file", "baseline-sdk"]
    for r in runs.values():
        assert (r["submitted"], r["delivered"], r["lost"]) == (12, 12, {}), r
        assert r["log_calls"] == 6 + 2
    assert runs["prime"]["server"]["unique_ids"] == 6
    assert Path(runs["file"]["streams"]["all"], "00000.jsonl").is_file()
    for r in runs.values():  # lag over time: the worst sample of every 0.1 s
        trace = r["lag_trace_ms"]
        assert trace["bin_s"] == 0.1
        assert len(trace["max"]) == pytest.approx(r["wall_s"] / 0.1, abs=2)
        assert max(trace["max"]) == pytest.approx(r["lag_ms"]["max"], abs=1e-3)
        wait = r["lag_cpu_wait"]  # Linux: schedstat says how much of the lag was a core's wait
        assert wait["worst_lag_ms"] == pytest.approx(r["lag_ms"]["max"])
        assert 0 <= wait["worst_wait_ms"] <= wait["worst_lag_ms"]
        assert 0 <= wait["share"] <= 1
        assert 0 <= wait["running_share"] <= 1 - wait["share"] + 1e-9
        assert 0 <= wait["worst_running_ms"] <= wait["worst_lag_ms"] - wait["worst_wait_ms"]
        assert 0 <= wait["stolen_share"] <= 1 - wait["share"] - wait["running_share"] + 1e-9
        assert r["lag_net_ms"]["max"] <= r["lag_ms"]["max"]
        # A witness on every core watched the run (Linux: the cores this process may use).
        assert r["witness_stalls"]["cores"] == sorted(os.sched_getaffinity(0))
        assert len(r["witness_stalls"]["count"]) == len(r["witness_stalls"]["cores"])
    for run in ("file", "prime"):  # what the loop's thread did during the slowest log call
        r = runs[run]
        waiting, running = r["slowest_log_waiting_ms"], r["slowest_log_running_ms"]
        assert waiting >= 0, r
        assert 0 < running <= r["slowest_log_ms"] + 0.01, r
        assert waiting + running <= r["slowest_log_ms"] + 0.05, r


def test_cli_prints_the_table_and_writes_json_to_a_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    args = ["--monitors", "file", "--episodes", "2", "--size", "100kB", "--no-progress"]
    png = tmp_path / "lag.png"
    code = main(
        [
            *args,
            "--out",
            str(tmp_path / "out"),
            "--json",
            str(tmp_path / "r.json"),
            "--plot",
            str(png),
        ]
    )
    assert code == 0
    printed = capsys.readouterr().out
    assert f"loop lag over time: {png}" in printed
    assert png.read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    assert printed.startswith("nodewise loadtest: 2 episodes")
    assert "| FileMonitor | - | - | 4 / 4 |" in printed
    assert "Where lag over 5 ms came from" in printed
    started = re.search(
        r"Loop lag while each monitor started.*: FileMonitor max ([0-9.]+) ms", printed
    )
    assert started is not None, printed
    report = json.loads((tmp_path / "r.json").read_text())
    assert float(started[1]) == pytest.approx(report["results"][0]["start_lag_max_ms"], abs=0.01)
    assert report["results"][0]["delivered"] == 4
    speed = re.search(r"orjson\.dumps ran at ([0-9]+) MB/s on the median episode", printed)
    assert speed is not None, printed
    assert int(speed[1]) == round(report["machine"]["orjson_mb_s"]) > 0
    assert main([*args, "--json", str(tmp_path / "missing" / "r.json")]) == 2
    assert "no such directory" in capsys.readouterr().err


def test_cli_errors_are_clear(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main(["--monitors", "file,s3"])
    assert exc.value.code == 2
    assert "unknown monitor 's3'" in capsys.readouterr().err
    assert nodewise(["frobnicate"]) == 2
    assert "unknown command" in capsys.readouterr().err
    assert nodewise(["--help"]) == 0


def test_without_effective_each_episode_is_logged_once(tmp_path: Path) -> None:
    config = LoadtestConfig(
        monitors=("file",),
        episodes=5,
        size=100_000,
        effective=False,
        out=tmp_path / "out",
        progress=False,
    )
    assert config.records == 5
    before = time.perf_counter()
    report = anyio.run(run_loadtest, config)
    result = report.result("file")
    # The lag samples sit on the machine's monotonic clock, after the run began.
    assert (
        before < result.started_at < result.started_at + result.lag_times[0] < time.perf_counter()
    )
    assert (result.submitted, result.delivered, result.log_calls) == (5, 5, 5)
    assert len(result.log_spans) == 5
    assert result.slowest_log == max(spent for _, spent in result.log_spans)
    assert all(a[0] + a[1] <= b[0] for a, b in itertools.pairwise(result.log_spans))
    assert result.all_delivered
    assert result.json_bytes == report.json_bytes
    assert [r["id"] for r in read_records(result.streams["all"])] == [
        e.id for e in make_episodes(config)[1]
    ]
    assert not Path(result.streams["effective"]).exists()


def test_a_run_goes_on_without_witnesses_where_they_cannot_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import monitors.loadtest._run as run_module

    @contextlib.contextmanager
    def no_witnesses() -> Iterator[None]:
        raise OSError("no processes here")
        yield

    monkeypatch.setattr(run_module, "witnesses", no_witnesses)
    config = LoadtestConfig(monitors=("file",), episodes=2, size=100_000, progress=False)
    result = anyio.run(run_loadtest, config).result("file")
    assert result.all_delivered
    assert (result.witness_cores, result.witness_stalls) == ([], [])
    assert result.witnessed() == [0.0] * len(result.lag_samples)
    assert "FileMonitor: no witness processes (no processes here)" in caplog.text


@pytest.mark.parametrize("freeze", [True, False])
def test_start_up_heap_is_frozen_only_while_logging(
    freeze: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With ``gc_freeze`` every log call runs with the start-up heap out of the collector's
    reach (so a full collection does not scan wandb's modules on the loop); afterwards, and
    without it, nothing stays frozen."""
    seen: list[int] = []
    log_episodes = FileMonitor.log_episodes

    async def spy(self: FileMonitor, *args: Any, **kwargs: Any) -> None:
        seen.append(gc.get_freeze_count())
        await log_episodes(self, *args, **kwargs)

    monkeypatch.setattr(FileMonitor, "log_episodes", spy)
    config = LoadtestConfig(
        monitors=("file",),
        episodes=3,
        size=100_000,
        out=tmp_path / "out",
        progress=False,
        gc_freeze=freeze,
    )
    before = gc.get_freeze_count()
    assert anyio.run(run_loadtest, config).result("file").all_delivered
    assert len(seen) == 3 + 1
    if freeze:
        assert min(seen) > before + 1000
    else:
        assert seen == [before] * 4
    assert gc.get_freeze_count() == before


def test_cli_turns_the_freeze_off() -> None:
    assert parser().parse_args([]).no_gc_freeze is False
    assert parser().parse_args(["--no-gc-freeze"]).no_gc_freeze is True


def test_temporary_files_stay_until_the_end_where_the_disk_holds_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Removing one run's GBs before the next frees that much memory at once, which the VM
    then takes back: kept until the end where they all fit, removed run by run where not."""
    import shutil
    from collections import namedtuple

    from monitors.loadtest import NotEnoughDiskError
    from monitors.loadtest._run import check_disk, disk_needed

    config = LoadtestConfig(monitors=("file", "prime", "wandb"), episodes=10)
    json_bytes = 10 * 2_000_000
    one = disk_needed(config, json_bytes)
    usage = namedtuple("usage", "total used free")

    def free(n: int) -> None:
        monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(0, 0, n))

    free(2 * one)  # both file-writing runs at once
    assert check_disk(config, json_bytes, tmp_path) is True
    free(2 * one - 1)  # one at a time only
    assert check_disk(config, json_bytes, tmp_path) is False
    free(one - 1)
    with pytest.raises(NotEnoughDiskError):
        check_disk(config, json_bytes, tmp_path)
    kept = LoadtestConfig(monitors=("file", "wandb"), episodes=10, out=tmp_path)
    free(2 * one - 1)  # --out keeps every run's files: all must fit
    with pytest.raises(NotEnoughDiskError):
        check_disk(kept, json_bytes, tmp_path)


@pytest.mark.parametrize("room", ["all", "one"])
def test_the_report_says_whether_files_went_between_runs(
    room: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    import monitors.loadtest._run as run_module

    monkeypatch.setattr(run_module, "check_disk", lambda *_: room == "all")
    removed: list[str] = []
    real_remove = run_module._remove
    monkeypatch.setattr(run_module, "_remove", lambda p: (removed.append(p.name), real_remove(p)))
    config = LoadtestConfig(monitors=("file",), episodes=4, size=200_000, progress=False)
    report = anyio.run(run_loadtest, config)
    assert report.removed_between_runs is (room == "one")
    assert report.to_dict()["removed_between_runs"] is (room == "one")
    # The run's own directory went after it only when the disk could not hold them all;
    # the temporary root always goes at the end.
    assert removed[:-1] == ([] if room == "all" else ["file"])
    assert removed[-1].startswith("nodewise-loadtest-")


def test_lag_over_5_ms_is_split_into_waiting_running_stolen_and_neither() -> None:
    r = RunResult(run="file", name="FileMonitor", episodes=1)
    r.lag_samples = [0.2, 10.0, 20.0, 17.0]
    r.lag_times = [0.001, 0.012, 0.033, 0.051]
    r.lag_cpu_waits = [0.0, 4.0, 30.0, 0.1]  # a sample's window is longer than its lag
    r.lag_cpu_runs = [1.2, 3.0, 5.0, 0.9]
    r.lag_stolen = [0.0, 0.0, 10.0, 20.0]  # to the tick: may be more than the lag
    # 10 ms: 4 waiting, 3 running, 3 neither; 20 ms: 10 stolen, then waiting the rest;
    # 17 ms: stolen all of it.
    assert r.cpu_wait() == {
        "over_ms": 5.0,
        "samples": 3,
        "share": pytest.approx(14 / 47),
        "running_share": pytest.approx(3 / 47),
        "stolen_share": pytest.approx(27 / 47),
        "worst_lag_ms": 20.0,
        "worst_wait_ms": 10.0,
        "worst_running_ms": 0.0,
        "worst_stolen_ms": 10.0,
    }
    assert r.to_dict()["lag_cpu_wait"] == r.cpu_wait()
    assert _lag_causes(r.name, r.cpu_wait() or {}) == (
        "FileMonitor 3 samples over 5 ms, of their lag 30% waiting, 6% running, 57% stolen, "
        "6% neither; worst 20.0 ms: 10.0 waiting, 0.0 running, 10.0 stolen"
    )
    # Without the steal: 0.2, 10, 10 and 0 ms.
    assert r.lag_net().max == 10.0
    assert r.lag_net().count == 4
    assert r.to_dict()["lag_net_ms"]["max"] == 10.0
    r.lag_samples = [0.2, 4.0, 1.0, 0.5]
    assert _lag_causes(r.name, r.cpu_wait() or {}) == (
        "FileMonitor no samples over 5 ms, worst 4.0 ms: 4.0 waiting, 0.0 running, 0.0 stolen"
    )
    r.lag_stolen = []  # the kernel did not tell the steal: none is counted
    r.lag_samples = [0.2, 10.0, 20.0, 17.0]
    assert (r.cpu_wait() or {})["stolen_share"] == 0.0
    assert r.lag_net() == LagStats.of(r.lag_samples)
    r.lag_cpu_runs = []  # the kernel did not tell
    assert r.cpu_wait() is None
    assert r.lag_net() == LagStats.of(r.lag_samples)


def test_lag_net_takes_off_what_the_witness_on_the_loops_core_saw() -> None:
    r = RunResult(run="prime", name="PrimeMonitor", episodes=1, started_at=100.0)
    # 200 samples on time, then four late ones ending at 102 s, 103 s, 104 s and 105 s.
    quiet = [0.5] * 200
    r.lag_samples = [*quiet, 20.0, 20.0, 20.0, 20.0]
    r.lag_times = [i / 1000 for i in range(200)] + [2.0, 3.0, 4.0, 5.0]
    r.lag_cpu_waits = [0.0] * 204
    r.lag_cpu_runs = [0.0] * 204
    r.lag_stolen = [0.0] * 200 + [0.0, 0.0, 10.0, 0.0]
    r.lag_cores = [(-1, -1)] * 200 + [(0, 0), (1, 1), (0, 0), (0, 1)]
    assert r.witnessed() == [0.0] * 204  # no witnesses: steal only
    r.lag = LagStats.of(r.lag_samples)
    r.witness_cores = [0, 1]
    # Core 0's witness stood still 15 ms of each late sample but the fourth's; core 1's
    # 5 ms of the second.
    r.witness_stalls = [
        [(101.985, 102.0), (102.985, 103.0), (104.985, 105.0)],
        [(101.995, 102.0)],
    ]
    assert r.witnessed()[:200] == [0.0] * 200
    assert r.witnessed()[200:] == [pytest.approx(15.0), 0.0, 0.0, pytest.approx(0.0)]
    # 5 ms left on core 0; core 1's witness was on time; 10 stolen; moved from core 0 to
    # core 1 (the lesser of the two witnesses').
    assert r.lag_net().max == pytest.approx(20.0)
    # The worst left: the sample on core 1, whose witness was on time while core 0's was not.
    assert r.worst_net() == {
        "at_s": 3.0,
        "lag_ms": 20.0,
        "net_ms": 20.0,
        "wait_ms": 0.0,
        "running_ms": 0.0,
        "stolen_ms": 0.0,
        "witnessed_ms": 0.0,
        "any_witness_ms": pytest.approx(15.0),
    }
    assert r.to_dict()["lag_net_worst"] == r.worst_net()
    (line,) = [t for t in targets(_report_of(r)) if t.startswith("loop lag")]
    assert "; net of the moments the loop's core stood still" in line
    assert "witness process on that core woke late" in line
    r.lag_samples[201] = r.lag_samples[203] = 1.0
    r.lag = LagStats.of(r.lag_samples)
    (line,) = [t for t in targets(_report_of(r)) if t.startswith("loop lag")]
    assert line.endswith("worst max 10.00 ms (PrimeMonitor) -> met"), line
    r.lag_stolen[202] = 20.0
    assert r.lag_net().max == pytest.approx(5.0)  # what core 0's witness left of the second
    w = r.cpu_wait() or {}
    assert w["worst_witnessed_ms"] == pytest.approx(15.0)
    assert "(its core's witness stood still 15.0)" in _lag_causes(r.name, w)
    stalls = r.to_dict()["witness_stalls"]
    assert stalls == {"cores": [0, 1], "count": [3, 1], "longest_ms": pytest.approx([15.0, 5.0])}


def test_the_worst_samples_running_says_how_much_was_the_kernel_faulting_pages_in() -> None:
    r = RunResult(run="file", name="FileMonitor", episodes=1)
    r.lag_samples = [0.2, 19.0, 6.0]
    r.lag_times = [0.001, 0.021, 0.028]
    r.lag_cpu_waits = [0.0, 1.0, 0.0]
    r.lag_cpu_runs = [0.2, 18.0, 6.0]
    r.lag_stolen = [0.0, 0.0, 0.0]
    r.lag_cpu_kernel = [0.0, 20.0, 0.1]  # to the tick: may be more than the running
    r.lag_faults = [0, 6000, 3]
    r.lag_reclaims = [0, 2, 0]
    w = r.cpu_wait() or {}
    assert (w["worst_running_ms"], w["worst_kernel_ms"], w["worst_faults"]) == (18.0, 18.0, 6000)
    assert w["worst_reclaims"] == 2
    assert r.to_dict()["lag_cpu_wait"] == w
    assert _lag_causes(r.name, w).endswith(
        "worst 19.0 ms: 1.0 waiting, 18.0 running (18.0 in the kernel, 6000 page faults, "
        "2 direct reclaims or compactions on the machine), 0.0 stolen"
    )
    r.lag_faults = []  # the kernel did not tell: nothing is said of it
    w = r.cpu_wait() or {}
    assert "worst_faults" not in w
    assert "worst_kernel_ms" not in w
    assert _lag_causes(r.name, w).endswith(
        "18.0 running (2 direct reclaims or compactions on the machine), 0.0 stolen"
    )
    r.lag_reclaims = []
    w = r.cpu_wait() or {}
    assert "worst_reclaims" not in w
    assert _lag_causes(r.name, w).endswith("worst 19.0 ms: 1.0 waiting, 18.0 running, 0.0 stolen")


def _report_of(*results: RunResult) -> LoadtestReport:
    return LoadtestReport(
        config=LoadtestConfig(monitors=("file",), episodes=1, size=200_000, progress=False),
        results=list(results),
        idle_lag=LagStats.of([]),
        json_bytes=0,
        rss_per_run=True,
        machine={},
        seconds=0.0,
    )


def test_the_lag_target_is_judged_as_measured_and_said_net_of_steal_too() -> None:
    r = RunResult(run="file", name="FileMonitor", episodes=1)
    r.lag_samples = [0.5] * 200 + [9.0, 17.0]
    r.lag_times = [i / 1000 for i in range(len(r.lag_samples))]
    r.lag_cpu_waits = [0.0] * len(r.lag_samples)
    r.lag_cpu_runs = [0.2] * len(r.lag_samples)
    r.lag_stolen = [0.0] * 201 + [10.0]
    r.lag = LagStats.of(r.lag_samples)
    (line,) = [t for t in targets(_report_of(r)) if t.startswith("loop lag")]
    assert "worst max 17.00 ms (FileMonitor) -> NOT met;" in line
    assert line.endswith("worst max 9.00 ms (FileMonitor) -> met"), line
    # Steal that leaves the loop's own lag over the target: NOT met either way.
    r.lag_stolen = [0.0] * 201 + [0.0]
    (line,) = [t for t in targets(_report_of(r)) if t.startswith("loop lag")]
    assert line.endswith("worst max 17.00 ms (FileMonitor) -> NOT met"), line
    r.lag_samples[-1] = 30.0
    r.lag_stolen[-1] = 10.0
    r.lag = LagStats.of(r.lag_samples)
    (line,) = [t for t in targets(_report_of(r)) if t.startswith("loop lag")]
    assert "-> NOT met; net of" in line
    assert line.endswith("worst max 20.00 ms (FileMonitor) -> NOT met"), line
    # The slowest log call, with what the loop's thread did meanwhile where it is known.
    p = RunResult(run="prime", name="PrimeMonitor", episodes=1, slowest_log=0.00308)
    p.lag = LagStats.of([0.5])
    (line,) = [t for t in targets(_report_of(p)) if t.startswith("slowest log()")]
    assert line == "slowest log() <= 1 ms (PrimeMonitor): 3.08 ms -> NOT met"
    p.slowest_log_waiting, p.slowest_log_running = 2.9, 0.12
    (line,) = [t for t in targets(_report_of(p)) if t.startswith("slowest log()")]
    assert line == (
        "slowest log() <= 1 ms (PrimeMonitor): 3.08 ms (the loop's thread meanwhile: 2.90 ms "
        "waiting for a core, 0.12 ms running) -> NOT met"
    )
    # Met as measured: nothing more is said.
    r.lag_samples[-1] = 12.0
    r.lag = LagStats.of(r.lag_samples)
    (line,) = [t for t in targets(_report_of(r)) if t.startswith("loop lag")]
    assert line.endswith("worst max 12.00 ms (FileMonitor) -> met"), line


def test_the_benchmark_says_the_worst_sample_net_of_the_machines_stalls() -> None:
    from bench.loadtest import worst_net

    w = {"at_s": 3.0, "lag_ms": 20.0, "net_ms": 12.5, "wait_ms": 7.5, "witnessed_ms": 7.5}
    assert worst_net(w) == (
        "net of the machine's stalls, the worst: 12.5 ms left of a 20.0 ms sample 3.0 s into "
        "the run (7.5 waiting for a core, 7.5 its core's witness stood still)"
    )
