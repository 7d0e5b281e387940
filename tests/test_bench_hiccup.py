"""bench.hiccup: gaps between a spinning thread's iterations, told apart by its CPU clock."""

from __future__ import annotations

import types

import pytest

from bench import hiccup


def test_a_gap_the_cpu_clock_counts_as_running_is_told_from_one_off_the_core(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # (wall, cpu) at each iteration: steady 1 us steps, then a 9 ms gap the CPU clock
    # counts as running, a 6 ms gap it does not, and the end.
    ticks = iter(
        [
            *[(0.0, 0.0), (1e-6, 1e-6), (0.009001, 0.009001), (0.009002, 0.009002)],
            *[(0.015002, 0.009003), (0.015003, 0.009004), (0.0152, 0.0092)],
        ]
    )
    now: list[tuple[float, float]] = []

    def clock() -> float:
        now.append(next(ticks))
        return now[-1][0]

    monkeypatch.setattr(
        hiccup, "time", types.SimpleNamespace(perf_counter=clock, thread_time=lambda: now[-1][1])
    )
    steals = [[5, 7]]  # then [5, 8] from the first gap on: one tick on the second core
    monkeypatch.setattr(hiccup, "read_steal", lambda fd: steals.pop() if steals else [5, 8])
    assert hiccup.main(["0.0151"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("2 gaps over 2 ms in 0.0151 s; 1 of them with the thread's CPU clock")
    assert " ".join(out[1].split()) == (
        "9.0 ms: CPU clock 9.0 ms, steal ticks per core since <= 10 ms before it [0, 1]"
    )
    assert " ".join(out[2].split()).startswith("6.0 ms: CPU clock 0.0 ms")
