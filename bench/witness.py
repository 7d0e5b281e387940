"""The machine's stalls, seen from outside the load test's process: one witness per core.

A witness is a small process pinned to one core that sleeps 1 ms at a time and notes every
wake-up that came more than 3 ms late, not counting up to 10 ms of the time it then waited
for its core (Linux schedstat): a core crowded by busy threads, the load test's own
included, delays a sleeper only that way, and briefly. What is left is the core standing
still (a shared host's hypervisor ran something else, which the guest's counters may show
as steal, as waiting or even as running). A stall of the loop that is its own (its code
running, the GIL held by one of its threads, a blocking call, a busy core) leaves the
witnesses on time.
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

__all__ = ["THRESHOLD_MS", "Stall", "Witnesses", "core_ms", "machine_ms", "overlap", "witnesses"]

#: A stall: from the wake-up asked for to the one that came (less the witness's wait for its
#: core, up to ``CROWDED_MS``), ``time.perf_counter()`` seconds (CLOCK_MONOTONIC on Linux: one
#: clock for every process of the machine).
Stall = tuple[float, float]
#: A witness notes wake-ups later than this (ms): a sleeper's ordinary lateness stays under.
THRESHOLD_MS = 3.0
#: Of a late wake-up, up to this much (ms) of the witness's wait for its core is a crowded
#: core's, taken off; a longer wait is its core standing still, which the guest's kernel
#: counts as waiting too (a 1 s stall seen as 765 ms waiting and 240 ms steal). Busy runs
#: of the load test delayed the witnesses by 5.5 ms at most.
CROWDED_MS = 10.0

_SCRIPT = """
import json, os, signal, sys, time
if {cpu} >= 0:
    os.sched_setaffinity(0, {{{cpu}}})
try:
    fd = os.open("/proc/thread-self/schedstat", os.O_RDONLY)
except OSError:
    fd = None
def waited():
    return 0 if fd is None else int(os.pread(fd, 100, 0).split()[1]) / 1e9
stalls, stop = [], []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
clock = time.perf_counter
print("ready", flush=True)
while not stop:
    wait = waited()
    due = clock() + 0.001
    time.sleep(0.001)
    now = clock()
    woke = now - min(waited() - wait, {crowd})
    if woke - due > {threshold}:
        stalls.append((due, woke))
print(json.dumps(stalls), flush=True)
"""


@dataclass
class Witnesses:
    """The witness processes: the core each sits on (-1: not pinned, where the platform
    cannot pin), and each one's stalls once they have stopped."""

    pids: list[int] = field(default_factory=list)
    cores: list[int] = field(default_factory=list)
    stalls: list[list[Stall]] = field(default_factory=list)


@contextmanager
def witnesses() -> Iterator[Witnesses]:
    """One witness per core this process may run on, from the block's start to its end
    (blocking: ~50 ms to start them, a few ms to stop them)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [-1]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _SCRIPT.format(cpu=cpu, threshold=THRESHOLD_MS / 1e3, crowd=CROWDED_MS / 1e3),
            ],
            stdout=subprocess.PIPE,
            text=True,
        )
        for cpu in cores
    ]
    seen = Witnesses([p.pid for p in procs], cores)
    try:
        for proc in procs:
            assert proc.stdout is not None
            if proc.stdout.readline() != "ready\n":
                raise RuntimeError("a witness process did not start")
        yield seen
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            out, _ = proc.communicate(timeout=30)
            if proc.returncode == 0:
                seen.stalls.append([(due, now) for due, now in json.loads(out)])
    if len(seen.stalls) != len(procs):
        raise RuntimeError("a witness process did not report its stalls")


def overlap(start: float, end: float, stalls: Sequence[Stall]) -> float:
    """Seconds of [start, end] during which the witness was stalled."""
    return sum(max(0.0, min(end, now) - max(start, due)) for due, now in stalls)


def machine_ms(
    times: Sequence[float], lags_ms: Sequence[float], seen: Sequence[Sequence[Stall]]
) -> list[float]:
    """Per lag sample (taken at ``times``, late by ``lags_ms``), the ms of its lateness
    during which some witness, on any core, was stalled too. Samples no later than the
    witnesses' own threshold are not looked at (0)."""
    return [
        max((overlap(t - lag / 1e3, t, stalls) * 1e3 for stalls in seen), default=0.0)
        if lag > THRESHOLD_MS
        else 0.0
        for t, lag in zip(times, lags_ms, strict=True)
    ]


def core_ms(
    times: Sequence[float],
    lags_ms: Sequence[float],
    cores: Sequence[tuple[int, int]],
    seen: Witnesses,
) -> list[float]:
    """Per lag sample, the ms of its lateness during which the witness of the core the
    loop's thread was on stood still too (``cores``: that core at the sample's start and
    end, as ``LoopLagProbe.cores``; where it moved, the lesser of the two witnesses';
    where not known, the least of every witness's: the whole machine)."""
    by_core = dict(zip(seen.cores, seen.stalls, strict=True))
    every = list(by_core)
    out = []
    for t, lag, pair in zip(times, lags_ms, cores, strict=True):
        if lag <= THRESHOLD_MS or not seen.stalls:
            out.append(0.0)
            continue
        on = [c for c in set(pair) if c in by_core] if -1 not in pair else []
        out.append(min(overlap(t - lag / 1e3, t, by_core[c]) * 1e3 for c in on or every))
    return out
