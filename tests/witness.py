"""Machine stalls, seen from outside the process under test, and timings judged net of them.

A witness is a small process that sleeps 1 ms at a time, on one core, and notes every
wake-up that came more than 3 ms late. It does no work of its own, so its late wake-ups are
the machine's: its core stood still (a shared host's hypervisor ran something else, which
the guest's counters may show as steal, as waiting or even as running) or was busy with
other threads (a sleeper waking gets a core within a few ms). A stall of the load test's
loop that is its own (its code running, the GIL held by one of its threads, a blocking
call) leaves the witnesses on time, so it counts in full against the bound.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field

from monitors import LagStats, LoopLagProbe

#: A stall: from the wake-up asked for to the one that came, ``perf_counter`` seconds
#: (CLOCK_MONOTONIC on Linux: one clock for every process of the machine).
Stall = tuple[float, float]

_WITNESS = """
import json, os, signal, sys, time
if {cpu} >= 0:
    os.sched_setaffinity(0, {{{cpu}}})
stalls, stop = [], []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
clock = time.perf_counter
print("ready", flush=True)
while not stop:
    due = clock() + 0.001
    time.sleep(0.001)
    now = clock()
    if now - due > 0.003:
        stalls.append((due, now))
print(json.dumps(stalls), flush=True)
"""


@dataclass
class Witnesses:
    """The witness processes, and each one's stalls once they have stopped."""

    pids: list[int] = field(default_factory=list)
    stalls: list[list[Stall]] = field(default_factory=list)


@contextmanager
def witnesses() -> Iterator[Witnesses]:
    """One witness per core this process may run on (one unpinned where cores cannot be
    told), from the block's start to its end."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [-1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _WITNESS.format(cpu=cpu)],
            stdout=subprocess.PIPE,
            text=True,
        )
        for cpu in cores
    ]
    seen = Witnesses([p.pid for p in procs])
    try:
        for proc in procs:
            assert proc.stdout is not None
            assert proc.stdout.readline() == "ready\n"
        yield seen
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            out, _ = proc.communicate(timeout=30)
            if proc.returncode == 0:
                seen.stalls.append([(due, now) for due, now in json.loads(out)])
    if len(seen.stalls) != len(procs):
        raise RuntimeError("a witness did not report its stalls")


def overlap(start: float, end: float, stalls: Sequence[Stall]) -> float:
    """Seconds of [start, end] during which the witness was stalled."""
    return sum(max(0.0, min(end, now) - max(start, due)) for due, now in stalls)


def machine_ms(
    times: Sequence[float], lags_ms: Sequence[float], seen: Sequence[Sequence[Stall]]
) -> list[float]:
    """Per lag sample (taken at ``times``, late by ``lags_ms``), the ms of its lateness
    during which some witness was stalled too: the machine's share of it. Samples no later
    than the witnesses' own threshold (3 ms) are not looked at (0)."""
    return [
        max((overlap(t - lag / 1e3, t, stalls) * 1e3 for stalls in seen), default=0.0)
        if lag > 3.0
        else 0.0
        for t, lag in zip(times, lags_ms, strict=True)
    ]


def own_ms(
    times: Sequence[float], spans_ms: Sequence[float], seen: Sequence[Sequence[Stall]]
) -> list[float]:
    """Each lag sample (or call) that ended at ``times`` after ``spans_ms``, less the
    machine's share of it: what is left is the process's own."""
    shares = machine_ms(times, spans_ms, seen)
    return [ms - share for ms, share in zip(spans_ms, shares, strict=True)]


def lag_within(
    probe: LoopLagProbe,
    windows: Sequence[tuple[float, float]],
    seen: Sequence[Sequence[Stall]] = (),
) -> LagStats:
    """The probe's samples whose whole sleep fell inside one of the (sorted) ``perf_counter``
    windows, each less the machine's share of it."""
    times, lags = [], []
    w = 0
    for lag, woke in zip(probe.samples, probe.times, strict=True):
        asked = woke - probe.interval - lag / 1000.0
        while w < len(windows) and windows[w][1] < woke:
            w += 1
        if w < len(windows) and windows[w][0] <= asked:
            times.append(woke)
            lags.append(lag)
    return LagStats.of(own_ms(times, lags, seen))
