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
    """A step of ours running long on the loop: ``seconds`` of its thread's CPU clock, so
    that it has run that long however busy the machine is."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def _block(seconds: float) -> None:
    """A blocking call on the loop."""
    time.sleep(seconds)


def _stalls_around(step: Callable[[float], None]) -> list[Stall]:
    """The stalls that span the 60 ms ``step`` (a loaded machine may stall the loop at other
    moments too)."""

    async def run() -> tuple[list[Stall], float, float]:
        async with StallSampler() as sampler:
            await asyncio.sleep(0.02)
            before = time.perf_counter()
            step(0.06)
            after = time.perf_counter()
            await asyncio.sleep(0.02)
        return sampler.stalls, before, after

    found, before, after = asyncio.run(run())
    return [s for s in found if s.start <= before and after <= s.start + s.wall_ms / 1e3]


def test_a_long_step_on_the_loop_is_caught_with_its_cpu_time_and_stack() -> None:
    (stall,) = _stalls_around(_spin)
    # What the step did, whatever else ran on the machine: 60 ms on the loop's CPU clock.
    # Which kind that makes depends on the machine's load too (a loop kept off its core for
    # more than half the stall is not RUNNING): the rule is checked on its own below.
    assert stall.cpu_ms >= 60, stall
    assert stall.wall_ms >= 60, stall
    assert any(", in _spin\n" in stack for stack in stall.stacks), stall.stacks


def test_a_blocking_call_on_the_loop_is_caught_off_the_cpu_with_its_stack() -> None:
    (stall,) = _stalls_around(_block)
    # Asleep: the loop's thread took (nearly) no CPU in its 60 ms.
    assert stall.cpu_ms < stall.wall_ms / 2, stall
    assert stall.wall_ms >= 60, stall
    assert any(", in _block\n" in stack for stack in stall.stacks), stall.stacks


def test_a_stall_is_told_by_what_took_most_of_it() -> None:
    assert Stall(0.0, 100.0, 60.0).kind == stalls.RUNNING  # the loop's thread on its CPU
    assert Stall(0.0, 100.0, 50.0, sampler_late_ms=80.0).kind == stalls.RUNNING
    assert Stall(0.0, 100.0, 10.0, sampler_late_ms=60.0).kind == stalls.STILL  # nobody ran
    assert Stall(0.0, 100.0, 10.0, sampler_late_ms=40.0).kind == stalls.BLOCKED
    assert Stall(0.0, 100.0, 10.0).kind == stalls.BLOCKED  # off the CPU, the sampler ran


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
