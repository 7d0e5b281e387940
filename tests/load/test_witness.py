"""The witnesses that tell the machine's stalls from the loop's own (``bench.witness``), and
the tests' and the load test's bounds judged net of them."""

from __future__ import annotations

import os
import signal
import time

import pytest
from witness import Stall, lag_within, machine_ms, overlap, own_ms, witnesses

from bench.attribution import RunAttribution
from monitors import LagStats, LoopLagProbe
from monitors.loadtest import RunResult

from .loadcheck import LAG_MAX, WRITE_RATE, check_run


def test_a_witness_sees_its_process_stopped_and_not_a_busy_neighbour() -> None:
    with witnesses() as w:
        time.sleep(0.05)
        busy = time.perf_counter()
        while time.perf_counter() < busy + 0.1:  # a stall of this process's own
            pass
        stopped = time.perf_counter()
        os.kill(w.pids[0], signal.SIGSTOP)  # as a host that stops the core would
        time.sleep(0.1)
        os.kill(w.pids[0], signal.SIGCONT)
        time.sleep(0.05)
    assert len(w.stalls) == len(w.pids) == len(os.sched_getaffinity(0))
    first = w.stalls[0]
    assert any(now - due >= 0.09 and now >= stopped + 0.09 for due, now in first), first
    # None saw this process's own busy 100 ms as a stall of theirs.
    assert all(overlap(busy, busy + 0.1, stalls) < 0.05 for stalls in w.stalls), w.stalls


def test_machine_ms_is_the_longest_overlap_of_any_witness() -> None:
    seen = [[(9.96, 9.99)], [(9.90, 9.97), (9.98, 9.985)]]
    times = [10.0, 10.0, 20.0]
    # 50 ms late: the first witness was stalled 30 ms of it, the second 20 + 5.
    assert machine_ms(times, [50.0, 2.0, 50.0], seen) == [
        pytest.approx(30.0),
        0.0,  # no later than the witnesses' threshold: not looked at
        0.0,  # no witness stalled then
    ]
    assert machine_ms(times, [50.0, 50.0, 50.0], []) == [0.0, 0.0, 0.0]


def test_own_ms_and_lag_within_leave_what_the_machine_did_not_take() -> None:
    seen = [[(9.990, 9.996)]]  # a witness stalled 6 ms of the first sample's 10
    assert own_ms([10.0, 20.0], [10.0, 10.0], seen) == [pytest.approx(4.0), 10.0]
    probe = LoopLagProbe(interval=0.001)
    # Samples asleep from (woke - 1 ms - lag) to woke: inside the window, across its end,
    # after it.
    probe.samples, probe.times = [10.0, 10.0, 5.0], [10.0, 10.5, 11.0]
    within = lag_within(probe, [(9.9, 10.4)], seen)
    assert within.count == 1
    assert within.max == pytest.approx(4.0)
    assert lag_within(probe, [(9.9, 10.4)]).max == 10.0


def _run(lags: list[float]) -> tuple[RunResult, RunAttribution]:
    """A run whose samples come one a second from t = 1 s, neither waiting nor running nor
    stolen unless a test says; one quick log call."""
    n = len(lags)
    times = [float(t) for t in range(1, n + 1)]
    result = RunResult(
        run="file",
        name="FileMonitor",
        episodes=1,
        submitted=2,
        delivered=2,
        log_calls=1,
        log_spans=[(0.5, 0.001)],
        log_bytes=[0],
        lag=LagStats.of(lags),
        lag_samples=lags,
        lag_times=times,
        lag_running=[0.0] * n,
    )
    att = RunAttribution(
        samples=lags, times=times, waits=[0.0] * n, runs=result.lag_running, stolen=[0.0] * n
    )
    return result, att


def with_stalls(att: RunAttribution, stalls: list[list[Stall]]) -> RunAttribution:
    """``att`` as if a witness on each of cores 0, 1, ... had seen ``stalls``."""
    att.witness_cores = list(range(len(stalls)))
    att.witness_stalls = stalls
    return att


def test_check_run_bounds_the_loops_own_lag() -> None:
    worst = 2 * LAG_MAX  # the last sample, ending at t = 201 s
    r, att = _run([0.5] * 200 + [worst])
    with pytest.raises(AssertionError, match=r"the loop's own, max 500\.00 ms"):
        check_run(r, with_stalls(att, []), 1)
    # A witness stalled through all but 100 ms of it: the machine's.
    check_run(r, with_stalls(att, [[(201.0 - worst / 1e3, 201.0 - 0.1)]]), 1)
    # ... but not through enough of it.
    with pytest.raises(AssertionError, match=r"own, max 300\.00 ms"):
        check_run(r, with_stalls(att, [[(201.0 - worst / 1e3, 201.0 - 0.3)]]), 1)
    # Waiting for a core and a stolen core are the machine's too, together ...
    att.waits[-1], att.stolen[-1] = 200.0, 200.0
    check_run(r, with_stalls(att, []), 1)
    # ... but the loop's thread running is its own.
    att.waits[-1], att.stolen[-1], att.runs[-1] = 0.0, 0.0, worst
    with pytest.raises(AssertionError, match=r"own, max 500\.00 ms"):
        check_run(r, with_stalls(att, []), 1)


def test_check_run_bounds_log_calls_net_of_the_machines_stalls() -> None:
    r, att = _run([0.5] * 200)
    r.log_spans.append((10.0, 1.5))
    r.log_bytes.append(0)
    r.log_calls = 2
    with pytest.raises(AssertionError, match=r"at worst 1\.500 s"):
        check_run(r, with_stalls(att, []), 1)
    check_run(r, with_stalls(att, [[(9.0, 10.8)], [(10.1, 10.2)]]), 1)  # 0.8 s of it the machine's
    with pytest.raises(AssertionError, match=r"at worst 1\.100 s"):
        check_run(r, with_stalls(att, [[(10.0, 10.4)]]), 1)
    # A monitor that writes its batch before returning has its bytes' time too ...
    r.log_bytes[-1] = int(0.6 * WRITE_RATE)
    check_run(r, with_stalls(att, []), 1)
    # ... but one that only queues (Prime) does not.
    r.run = "prime"
    with pytest.raises(AssertionError, match=r"at worst 1\.500 s"):
        check_run(r, with_stalls(att, []), 1)
    r.log_spans.clear()  # every call must be timed
    r.log_bytes.clear()
    with pytest.raises(AssertionError):
        check_run(r, with_stalls(att, [[(9.0, 10.8)]]), 1)
