"""Timings judged net of the machine's stalls, for the tests that time the loop or a call.

The witnesses themselves (``bench.witness``: a process per core sleeping 1 ms
at a time, noting each wake-up over 3 ms late) tell the machine's stalls; a stall of the
process under test that is its own leaves them on time, so it counts in full.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench.witness import Stall, Witnesses, machine_ms, overlap, witnesses
from monitors import LagStats, LoopLagProbe

__all__ = ["Stall", "Witnesses", "lag_within", "machine_ms", "overlap", "own_ms", "witnesses"]


def own_ms(
    times: Sequence[float], spans_ms: Sequence[float], seen: Sequence[Sequence[Stall]]
) -> list[float]:
    """Each lag sample (or call) that ended at ``times`` after ``spans_ms``, less the
    machine's share of it (any witness stalled meanwhile): what is left is the process's
    own."""
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
