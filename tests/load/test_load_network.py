"""50 production-sized episodes through each monitor with 100 ms + 100 MB/s injected on
every request and 8 in flight: everything is delivered within the drain."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitors.loadtest import LoadtestConfig, make_episodes

from .loadcheck import check_run, check_server, check_shipped, check_stream, run

pytestmark = [pytest.mark.load, pytest.mark.timeout(900)]

EPISODES = 50


@pytest.mark.parametrize("monitor", ["file", "prime", "wandb"])
def test_slow_network_everything_delivered_within_the_drain(monitor: str, out: Path) -> None:
    cfg = LoadtestConfig(
        monitors=(monitor,),  # type: ignore[arg-type]
        episodes=EPISODES,
        step_size=4,
        latency=0.1,
        bandwidth=100e6,
        in_flight=8,
        out=out,
        progress=False,
    )
    report, attribution = run(cfg)
    result = report.result(monitor)
    check_run(result, attribution.runs[monitor], EPISODES)
    assert result.drain < cfg.drain_timeout
    maker, episodes = make_episodes(cfg)
    if monitor == "prime":
        check_server(result, episodes)
        assert result.server is not None
        assert result.server["max_in_flight"] > 1  # requests overlapped
    else:
        check_stream(result.streams["stream"], maker, episodes, chunks=1)
        check_shipped(result.streams["run"], episodes)
