"""1,000 production-sized episodes (~8.5 GB of JSON, each logged twice: ~17 GB) through each
monitor, one test per monitor, as ``nodewise loadtest`` runs them.

Every record must arrive intact: the file and W&B streams are read back from every chunk
(at the default 5 GiB chunks, each stream spans two) and compared byte for byte; the Prime
run is counted by the TracesServer (every line received, one unique id per episode). The
lag and call bounds are loose on purpose (shared 2-core CI machines) and judged net of the
machine's stalls (``loadcheck.check_run``); the targets are what ``make bench`` reports
against, on raw lag.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import pytest

from monitors.loadtest import LoadtestConfig, make_episodes
from monitors.testing import TracesServer

from .loadcheck import check_run, check_server, check_shipped, check_stream, run

pytestmark = [pytest.mark.load, pytest.mark.timeout(1800)]

EPISODES = 1_000
#: A FileMonitor or WandbMonitor ``log_episodes`` call returns once its episodes are
#: written, so its time grows with its batch (``loadcheck.WRITE_RATE`` allows for it);
#: steps of 2 episodes keep the largest "effective" call at ~100 MB.
STEP = 2


def config(monitor: str, out: Path) -> LoadtestConfig:
    return LoadtestConfig(
        monitors=(monitor,),  # type: ignore[arg-type]
        episodes=EPISODES,
        step_size=STEP,
        out=out,
        progress=False,
    )


@pytest.mark.parametrize("monitor", ["file", "wandb"])
def test_trace_files_hold_every_record(monitor: str, out: Path) -> None:
    cfg = config(monitor, out)
    report, attribution = run(cfg)
    result = report.result(monitor)
    check_run(result, attribution.runs[monitor], EPISODES)
    maker, episodes = make_episodes(cfg)
    assert report.json_bytes == sum(e.size for e in episodes) > 8e9
    # Each episode written once; the effective cohort as annotations.
    check_stream(result.streams["stream"], maker, episodes, chunks=2)
    check_shipped(result.streams["run"], episodes)
    if monitor == "file":
        check_backfill(Path(result.streams["run"]), len(episodes))
        check_browser(Path(result.streams["run"]), len(episodes))


def check_backfill(run_dir: Path, episodes: int) -> None:
    """``nodewise traces upload`` sends the finished run (a sealed chunk and a live one) to
    a TracesServer: every record stored once, and a second run sends nothing."""
    key = "sk-nodewise-backfill"
    with TracesServer(api_key=key) as server:
        env = {**os.environ, "PRIME_API_KEY": key, "PRIME_TRACES_URL": server.url}
        command = [sys.executable, "-m", "monitors.traces", "upload", str(run_dir)]
        for _ in range(2):
            done = subprocess.run(
                [*command, "--run-id", "loadtest-backfill"],
                env=env,
                capture_output=True,
                text=True,
                timeout=1200,
            )
            assert done.returncode == 0, (done.stdout, done.stderr[-3000:])
            print(done.stdout)
        stats = server.stats()
    assert stats["unique_ids"] == stats["lines_stored"] == episodes, stats
    assert stats["duplicate_ids"] == 0, stats
    assert stats["records_without_id"] == 0, stats
    assert "nothing to upload" in done.stdout + done.stderr, (done.stdout, done.stderr)


def check_browser(run_dir: Path, episodes: int) -> None:
    """``nodewise traces serve`` on the finished run: the list sorted by reward, the largest
    episode's outline (first and kept) and a node of it, within bounds 10 times the
    targets (``make bench`` reports against the targets), and the server's peak RSS."""
    command = [sys.executable, "-m", "monitors.traces", "serve", str(run_dir), "--port", "0"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True) as server:
        try:
            assert server.stdout is not None
            base = server.stdout.readline().split()[1]

            def get(path: str, bound: float) -> Any:
                started = time.perf_counter()
                with urllib.request.urlopen(base + path, timeout=60) as answer:
                    value = orjson.loads(answer.read())
                seconds = time.perf_counter() - started
                print(f"browser: {path}: {seconds * 1000:.0f} ms")
                assert seconds <= bound, (path, seconds)
                return value

            while get("api/runs", 5)["runs"][0]["episodes"] < episodes:
                time.sleep(0.1)
            name = get("api/runs", 5)["runs"][0]["name"]
            page = get(f"api/runs/{name}/episodes?sort=-reward&limit=100", 3)
            assert page["matched"] == page["total"] == episodes
            rewards = [r["reward"] for r in page["rows"] if r["reward"] is not None]
            assert rewards == sorted(rewards, reverse=True)
            largest = get(f"api/runs/{name}/episodes?sort=-bytes&limit=1", 3)["rows"][0]
            assert largest["bytes"] > 55e6
            outline = get(f"api/runs/{name}/episodes/{largest['line']}", 10)
            assert get(f"api/runs/{name}/episodes/{largest['line']}", 0.5)["ms"] == 0
            trace = max(outline["traces"], key=lambda t: len(t["nodes"]))
            biggest = max(trace["nodes"], key=lambda n: n["bytes"])
            node = get(
                f"api/runs/{name}/episodes/{largest['line']}/traces/{trace['index']}"
                f"/nodes/{biggest['index']}",
                1,
            )
            assert node["tokens"]["count"] == biggest["tokens"] > 0
            status = Path(f"/proc/{server.pid}/status").read_text()
            peak = int(status.split("VmHWM:")[1].split()[0]) / 1024
            print(f"browser: server peak RSS {peak:.0f} MiB")
            assert peak <= 1500, peak
        finally:
            server.terminate()
            server.wait(timeout=30)


def test_prime_server_counts_every_record(out: Path) -> None:
    cfg = config("prime", out)
    report, attribution = run(cfg)
    result = report.result("prime")
    check_run(result, attribution.runs["prime"], EPISODES)
    _, episodes = make_episodes(cfg)
    check_server(result, episodes)
