"""Does the machine stop a thread that its own CPU clock counts as running?

``python -m bench.hiccup [SECONDS]`` spins one thread on the clock (a few clock reads an
iteration, nothing else: no I/O, no allocation to speak of) and reports every gap over 2 ms
between two iterations, with what the thread's CPU clock and the machine's steal counters
said over it. A gap whose CPU time is about its wall time is a thread "running" that ran
none of its code: what the load test's lag probe counts as the loop's thread running, where
no step of ours can be to blame. Run it beside a load (``nodewise loadtest --monitors
prime``) and alone.
"""

from __future__ import annotations

import os
import sys
import time

from .attribution import steal as read_steal

GAP_S = 0.002
STEAL_EVERY_S = 0.01


def main(argv: list[str]) -> int:
    seconds = float(argv[0]) if argv else 60.0
    stat = os.open("/proc/stat", os.O_RDONLY)
    try:
        gaps = _spin(seconds, stat)
    finally:
        os.close(stat)
    running = [g for g in gaps if g[1] >= g[0] / 2]
    print(
        f"{len(gaps)} gaps over {GAP_S * 1e3:g} ms in {seconds:g} s; {len(running)} of them "
        "with the thread's CPU clock running for at least half the gap (it ran none of its code)"
    )
    for wall, ran, stolen in sorted(gaps, reverse=True)[:15]:
        print(
            f"  {wall * 1e3:6.1f} ms: CPU clock {ran * 1e3:5.1f} ms, steal ticks per core "
            f"since <= {STEAL_EVERY_S * 1e3:g} ms before it {stolen}"
        )
    return 0


def _spin(seconds: float, stat: int) -> list[tuple[float, float, list[int]]]:
    """Every gap over ``GAP_S``: its wall time, the CPU clock over it, steal ticks per core."""
    clock, cpu = time.perf_counter, time.thread_time
    gaps: list[tuple[float, float, list[int]]] = []
    steal = read_steal(stat)
    read = last = clock()
    last_cpu = cpu()
    end = last + seconds
    while last < end:
        now, now_cpu = clock(), cpu()
        if now - last > GAP_S:
            after = read_steal(stat)
            gaps.append(
                (now - last, now_cpu - last_cpu, [b - a for a, b in zip(steal, after, strict=True)])
            )
            steal, read = after, now
        elif now - read > STEAL_EVERY_S:
            steal, read = read_steal(stat), now
        last, last_cpu = now, now_cpu
    return gaps


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
