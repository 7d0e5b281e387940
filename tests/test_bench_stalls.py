"""bench.stalls: a stall of the loop is caught with the loop's stack and told apart by cause."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from bench import stalls
from bench.stalls import Stall, StallSampler


def _spin(seconds: float) -> None:
    """A step of ours running long on the loop."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _block(seconds: float) -> None:
    """A blocking call on the loop."""
    time.sleep(seconds)


def _stalls_around(step: Callable[[float], None]) -> list[Stall]:
    async def run() -> list[Stall]:
        async with StallSampler() as sampler:
            await asyncio.sleep(0.02)
            step(0.06)
            await asyncio.sleep(0.02)
        return sampler.stalls

    return [s for s in asyncio.run(run()) if s.wall_ms >= 50]


def test_a_long_step_on_the_loop_is_caught_running_with_its_stack() -> None:
    (stall,) = _stalls_around(_spin)
    assert stall.kind == stalls.RUNNING
    assert any(", in _spin\n" in stack for stack in stall.stacks), stall.stacks


def test_a_blocking_call_on_the_loop_is_caught_off_the_cpu_with_its_stack() -> None:
    (stall,) = _stalls_around(_block)
    assert stall.kind == stalls.BLOCKED
    assert any(", in _block\n" in stack for stack in stall.stacks), stall.stacks


def test_the_sampler_stops_when_the_body_fails() -> None:
    sampler = StallSampler()

    async def run() -> None:
        async with sampler:
            await asyncio.sleep(0.005)
            raise ZeroDivisionError

    with pytest.raises(ZeroDivisionError):
        asyncio.run(run())
    assert sampler._thread is not None
    assert not sampler._thread.is_alive()


def test_the_load_test_runs_under_the_sampler(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--monitors", "file", "--episodes", "4", "--size", "200kB", "--no-progress"]
    assert stalls.main([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| FileMonitor |" in out
    assert "Stalls of the loop over 8 ms during the runs" in out


def test_only_stalls_inside_a_run_are_reported_and_the_longest_first() -> None:
    class Run:
        name, network, in_flight, started_at, wall = "PrimeMonitor", "none", 8, 100.0, 10.0

    report = type("Report", (), {"results": [Run()]})()
    early = Stall(99.0, 20.0, 19.0)
    short = Stall(101.0, 9.0, 0.5, sampler_late_ms=8.5, stacks=["  File x, in poll\n"])
    long = Stall(105.0, 30.0, 2.0)
    found = stalls.during_runs(report, [early, short, long])  # type: ignore[arg-type]
    assert [s for _, s in found] == [short, long]
    text = stalls.summary(found).splitlines()
    assert text[0].endswith(
        ": 2; loop on its CPU clock: 0, neither thread ran: 1, loop blocked off the CPU: 1"
    )
    assert text[1].startswith("- 30.0 ms in PrimeMonitor, none, 8 in flight: ")
    assert text[2].startswith("- 9.0 ms in PrimeMonitor, none, 8 in flight: ")
    assert text[3] == "      File x, in poll"
