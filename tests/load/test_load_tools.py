"""The load test's own parts: the episode generator and the ``nodewise`` command line."""

from __future__ import annotations

import gc
import itertools
import json
import re
import statistics
import time
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
    summary,
    targets,
)
from monitors.loadtest.cli import main, nodewise, parse_bytes, parse_seconds, parser
from monitors.testing.episodes import (
    BODIES,
    CAP_BYTES,
    MIN_BYTES,
    EpisodeMaker,
    lognormal_sizes,
)
from monitors.traces import read_records
from monitors.traces._layout import RUN_ANNOTATIONS

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
    assert [t["id"] for t in traces] == list(a.trace_ids)
    assert all(t["nodes"] is maker.body(i)["nodes"] for t, i in zip(traces, a.bodies, strict=True))
    roles = {node["message"]["role"] for trace in traces for node in trace["nodes"]}
    assert roles == {"system", "user", "assistant", "tool"}
    node = next(n for t in traces for n in t["nodes"] if n["message"].get("tool_calls"))
    assert isinstance(json.loads(node["message"]["tool_calls"][0]["arguments"]), dict)
    assert node["message"]["reasoning_content"]
    assert len(node["token_ids"]) == len(node["mask"]) == len(node["is_content"]) > 0
    assert len(node["logprobs"]) == len(node["advantages"]) == sum(node["mask"]) > 0
    # Shared: the same body's lists are the same objects in both episodes' records, while
    # each trace dict, and its id, is the episode's own.
    shared = set(a.bodies) & set(b.bodies)
    for i in shared:
        ta = a.to_record()["traces"][a.bodies.index(i)]
        tb = b.to_record()["traces"][b.bodies.index(i)]
        assert ta["nodes"] is tb["nodes"]
        assert ta["id"] != tb["id"]
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
            "--json",
            "--no-progress",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    runs = {r["run"]: r for r in report["results"]}
    assert list(runs) == ["file", "prime"]
    for r in runs.values():
        assert (r["submitted"], r["delivered"], r["lost"]) == (12, 12, {}), r
        assert r["log_calls"] == 6 + 2
        assert r["ours"] is True
        trace = r["lag_trace_ms"]  # lag over time: the worst sample of every 0.1 s
        assert trace["bin_s"] == 0.1
        assert len(trace["max"]) == pytest.approx(r["wall_s"] / 0.1, abs=2)
        assert max(trace["max"]) == pytest.approx(r["lag_ms"]["max"], abs=1e-3)
        assert 0 <= r["stalls"]["running_share"] <= 1
        # What the loop's thread did during the slowest log call: it ran for part of it.
        assert 0 < r["slowest_log_running_ms"] <= r["slowest_log_ms"] + 0.05, r
    assert runs["prime"]["server"]["unique_ids"] == 6
    assert Path(runs["file"]["streams"]["stream"], "00000.jsonl.zst").is_file()  # sealed
    assert report["summary"][0] == "Every record delivered (12 per monitor)."
    assert len(report["summary"]) == 3


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
    # The table and the summary, nothing more: the details are --verbose's.
    table_end = printed.index("\n\n", printed.index("| FileMonitor"))
    assert (
        printed[table_end:].strip().splitlines()[:3]
        == json.loads((tmp_path / "r.json").read_text())["summary"]
    )
    assert "Loop lag while each monitor started" not in printed
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["results"][0]["delivered"] == 4

    assert main([*args, "--out", str(tmp_path / "out2"), "--verbose"]) == 0
    printed = capsys.readouterr().out
    started = re.search(
        r"Loop lag while each monitor started.*: FileMonitor max ([0-9.]+) ms", printed
    )
    assert started is not None, printed
    speed = re.search(r"orjson\.dumps at ([0-9]+) MB/s on the median episode", printed)
    assert speed is not None, printed
    assert "Samples over 5 ms" in printed
    assert "Garbage collector during each run" in printed
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
    assert [r["id"] for r in read_records(result.streams["run"])] == [
        e.id for e in make_episodes(config)[1]
    ]
    assert not Path(result.streams["run"], RUN_ANNOTATIONS).exists()


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
    from monitors.loadtest._run import RUNS, check_disk, disk_needed

    config = LoadtestConfig(monitors=("file", "prime", "wandb"), episodes=10)
    json_bytes = 10 * 2_000_000
    one = disk_needed(config, json_bytes)
    usage = namedtuple("usage", "total used free")

    def free(n: int) -> None:
        monkeypatch.setattr(shutil, "disk_usage", lambda _: usage(0, 0, n))

    free(2 * one)  # both file-writing runs at once
    assert check_disk(config, json_bytes, tmp_path, [RUNS[m] for m in config.monitors]) is True
    free(2 * one - 1)  # one at a time only
    assert check_disk(config, json_bytes, tmp_path, [RUNS[m] for m in config.monitors]) is False
    free(one - 1)
    with pytest.raises(NotEnoughDiskError):
        check_disk(config, json_bytes, tmp_path, [RUNS[m] for m in config.monitors])
    kept = LoadtestConfig(monitors=("file", "wandb"), episodes=10, out=tmp_path)
    free(2 * one - 1)  # --out keeps every run's files: all must fit
    with pytest.raises(NotEnoughDiskError):
        check_disk(kept, json_bytes, tmp_path, [RUNS[m] for m in kept.monitors])


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


def test_the_summary_says_whose_a_miss_was() -> None:
    """Three lines: delivery, then lag p99 and the slowest Prime log() against the targets,
    a miss said to be the machine's only where the loop's thread barely ran through it."""
    r = RunResult(run="prime", name="PrimeMonitor", episodes=1, records=2, submitted=2)
    r.delivered = 2
    r.lag_samples = [0.5] * 95 + [9.0] * 5
    r.lag_running = [0.4] * 95 + [0.5] * 5
    r.lag = LagStats.of(r.lag_samples)
    r.slowest_log, r.slowest_log_running = 0.0004, 0.3
    lines = summary(_report_of(r))
    assert len(lines) == 3
    assert lines[0] == "Every record delivered (2 per monitor)."
    assert lines[1].startswith("Loop lag p99 9.00 ms at worst (PrimeMonitor; target 5 ms): over,")
    assert "ran 6% of the time: the machine kept it off its core, not nodewise's work" in lines[1]
    assert lines[1].endswith("slowest Prime log() 0.40 ms (target 1 ms): met.")
    assert "--verbose" in lines[2]
    r.lag_running = [0.4] * 95 + [8.0] * 5  # the loop's own steps
    assert "ran 89% of the time: the loop's own work" in summary(_report_of(r))[1]
    r.lag_samples = [0.5] * 100
    r.lag = LagStats.of(r.lag_samples)
    r.slowest_log, r.slowest_log_running = 0.00308, 0.12
    assert summary(_report_of(r))[1] == (
        "Loop lag p99 0.50 ms at worst (PrimeMonitor; target 5 ms): met; slowest Prime log() "
        "3.08 ms (target 1 ms): over (the loop's thread ran only 0.12 ms of it: the rest it was "
        "kept off its core, the machine's stall rather than nodewise's work)."
    )
    r.slowest_log_running = 3.0
    assert summary(_report_of(r))[1].endswith("over (the loop's thread ran 3.00 ms of it).")
    r.delivered, r.lost = 1, {"queue_full": 1}
    assert summary(_report_of(r))[0] == (
        "NOT every record delivered: PrimeMonitor 1 of 2, lost {'queue_full': 1}."
    )
    assert targets is summary  # its name before 0.1.0
    # Runs measured beside the monitors are not judged.
    base = RunResult(run="baseline-sdk", name="SDK-like uploader", episodes=1, ours=False)
    assert summary(_report_of(base)) == []


def test_the_benchmark_says_the_worst_sample_net_of_the_machines_stalls() -> None:
    from bench.production import worst_net

    w = {"at_s": 3.0, "lag_ms": 20.0, "net_ms": 12.5, "wait_ms": 7.5, "witnessed_ms": 7.5}
    assert worst_net(w) == (
        "net of the machine's stalls, the worst: 12.5 ms left of a 20.0 ms sample 3.0 s into "
        "the run (7.5 waiting for a core, 7.5 its core's witness stood still)"
    )
