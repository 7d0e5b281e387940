"""A monitor whose start failed keeps the books: every episode and metrics row it is then
given is counted lost as ``start_failed``, the cause is logged once when start fails and once
more at finalize with the count, and no call logs a traceback. Each monitor, each way its
start can fail, inside ``Monitors`` as a trainer runs them."""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from test_file_monitor import refusing_dir

from monitors import DeliveryStats, FileMonitor, Monitor, Monitors, PrimeMonitor, WandbMonitor


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def no_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, wandb_offline: Path) -> None:
    """No Prime key anywhere (a home of the test's own), and wandb offline."""
    for name in ("PRIME_API_KEY", "PRIME_TRACES_URL", "PRIME_TEAM_ID", "RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


def a_file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("not a directory")
    return path


def no_wandb(monkeypatch: pytest.MonkeyPatch) -> None:
    """``import wandb`` fails, as where it is not installed."""
    monkeypatch.setitem(sys.modules, "wandb", None)


Make = Callable[[Path, pytest.MonkeyPatch], Monitor]

#: (monitor, how its start fails): the monitor, and what its start raises.
CASES: dict[str, tuple[Make, str]] = {
    "file, root is a file": (lambda tmp, _: FileMonitor(a_file(tmp)), "is a file"),
    "file, root under a file": (lambda tmp, _: FileMonitor(a_file(tmp) / "run"), "is a file"),
    "file, root refuses writes": (
        lambda _, __: FileMonitor(refusing_dir() / "run"),
        "cannot",
    ),
    "prime, no API key": (lambda _, __: PrimeMonitor(run_id="r"), "no Prime API key"),
    "prime, a setting out of range": (
        lambda _, __: PrimeMonitor(api_key="k", max_in_flight=0),
        "max_in_flight",
    ),
    "wandb, not installed": (
        lambda _, mp: (no_wandb(mp), WandbMonitor(project="p"))[1],
        "needs the wandb package: pip install wandb",
    ),
    "wandb, dir is a file": (
        lambda tmp, _: WandbMonitor(project="p", dir=a_file(tmp)),
        "cannot write to dir",
    ),
    "wandb, init refuses its settings": (
        lambda _, __: WandbMonitor(project="p", settings={"no_such_setting": 1}),
        "wandb.init failed",
    ),
}


@pytest.mark.anyio
@pytest.mark.parametrize("case", CASES)
async def test_a_monitor_whose_start_failed_counts_everything_it_is_given(
    case: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    make, cause = CASES[case]
    monitor = make(tmp_path, monkeypatch)
    name = type(monitor).__name__
    fanout = Monitors(monitor)
    with caplog.at_level(logging.INFO, logger="monitors"):
        async with fanout:
            for step in range(3):
                await fanout.log_episodes([{"id": f"{step}-{i}"} for i in range(4)], step=step)
                await fanout.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    assert monitor.start_error is not None
    assert cause in str(monitor.start_error)
    assert monitor.stats() == DeliveryStats(12, 0, {"start_failed": 12})
    assert monitor.metrics_stats() == DeliveryStats(3, 0, {"start_failed": 3})
    assert fanout.failures == {name: 1}  # the start; no log call failed

    said = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.getMessage().split(" (")[0] for r in said] == [
        f"{name} did not start",
        f"{name} never started",
    ], caplog.text
    began, ended = (r.getMessage() for r in said)
    assert cause in began
    assert "'start_failed'" in began
    assert cause in ended
    assert "12 episodes, 3 metrics" in ended
    # A setting out of range is a programming error: its start gets a traceback, once.
    with_traceback = [r for r in said if r.exc_info]
    assert len(with_traceback) == (1 if "out of range" in case else 0), caplog.text


@pytest.mark.anyio
async def test_a_monitor_never_started_refuses_records_rather_than_lose_them(
    tmp_path: Path,
) -> None:
    """Not calling ``start`` is a mistake in the caller's code: log calls raise, and nothing
    is counted as submitted."""
    for monitor in (PrimeMonitor(api_key="k"), WandbMonitor(project="p")):
        with pytest.raises(RuntimeError, match="not started"):
            await monitor.log_episodes([{"id": "1"}], step=0)
        with pytest.raises(RuntimeError, match="not started"):
            await monitor.log_metrics({"x": 1}, step=0)
        assert monitor.stats() == DeliveryStats()
        assert monitor.metrics_stats() == DeliveryStats()
