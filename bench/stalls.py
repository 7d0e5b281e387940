"""Where was the event loop when it stalled, and could anything else in the process run then?

``python -m bench.stalls [nodewise loadtest options]`` runs the load test with a
``StallSampler``: a task on the loop notes the time and the loop's thread CPU clock every
1 ms, and a thread of the same process wakes every 1 ms and, while the loop is late, takes
the loop's thread's stack. For each stall of the loop over ``THRESHOLD_MS`` during the runs
it reports what tells the causes apart:

- the loop's thread on its CPU clock for most of the stall: a step of ours running long
  (its stack names it), or the machine running the thread slowly or not at all while its
  clock counts (``python -m bench.hiccup`` shows this VM doing so);
- neither thread ran: the loop's thread off its CPU clock and the sampler, which needs no
  more than a core and the GIL, woke as late as the loop: the process stood still;
- the loop off its CPU clock while the sampler woke on time: the loop's thread blocked
  outside Python's CPU work (a blocking call on the loop: its stack names it).

The sampler wakes 1,000 times a second and takes the GIL to look, so it adds a little load of
its own; run it for diagnosis, not for the benchmark's numbers.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import TracebackType

import anyio

from monitors.loadtest import LoadtestError, LoadtestReport, run_loadtest, text
from monitors.loadtest.cli import config_from, parser

THRESHOLD_MS = 8.0
EVERY_S = 0.001
#: Frames of the loop's thread kept per stack, innermost last.
FRAMES = 6
#: The kinds of stall, as ``Stall.kind`` tells them.
RUNNING, STILL, BLOCKED = "loop on its CPU clock", "neither thread ran", "loop blocked off the CPU"


@dataclass
class Stall:
    """One stretch over the threshold between two of the loop's notes of the time."""

    start: float  # perf_counter at the note before the stall
    wall_ms: float
    cpu_ms: float  # the loop's thread's CPU clock across it
    sampler_late_ms: float = 0.0  # the latest of the sampler's wake-ups in it or 2 ms after
    stacks: list[str] = field(default_factory=list)  # distinct, as the sampler saw them

    @property
    def kind(self) -> str:
        """``RUNNING``, ``STILL`` or ``BLOCKED``: what most of the stall was (see above)."""
        if self.cpu_ms >= self.wall_ms / 2:
            return RUNNING
        if self.sampler_late_ms >= self.wall_ms / 2:
            return STILL
        return BLOCKED


class StallSampler:
    """Notes the stalls of the running loop (``async with StallSampler() as s: ...``)."""

    def __init__(self, *, threshold_ms: float = THRESHOLD_MS) -> None:
        self.threshold = threshold_ms / 1e3
        self.stalls: list[Stall] = []
        self._beat = (time.perf_counter(), 0.0)
        self._looks: dict[float, list[str]] = {}
        self._late: list[tuple[float, float]] = []  # (woke at, ms late) of late wake-ups
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> StallSampler:
        self._beat = (time.perf_counter(), time.thread_time())
        self._task = asyncio.get_running_loop().create_task(self._notes())
        loop_thread = threading.get_ident()
        self._thread = threading.Thread(
            target=self._sample, args=(loop_thread,), name="stall-sampler", daemon=True
        )
        self._thread.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        assert self._task is not None
        assert self._thread is not None
        self._task.cancel()
        self._stop.set()
        await anyio.to_thread.run_sync(self._thread.join)
        for stall in self.stalls:
            stall.stacks = self._looks.get(stall.start, [])
            end = stall.start + stall.wall_ms / 1e3
            stall.sampler_late_ms = max(
                (ms for at, ms in self._late if stall.start < at <= end + 2 * EVERY_S),
                default=0.0,
            )

    async def _notes(self) -> None:
        while True:
            await asyncio.sleep(EVERY_S)
            now, cpu = time.perf_counter(), time.thread_time()
            then, then_cpu = self._beat
            if now - then > self.threshold:
                self.stalls.append(Stall(then, (now - then) * 1e3, (cpu - then_cpu) * 1e3))
            self._beat = (now, cpu)

    def _sample(self, loop_thread: int) -> None:
        clock, half = time.perf_counter, self.threshold / 2
        while not self._stop.is_set():
            before = clock()
            time.sleep(EVERY_S)
            now = clock()
            late = now - before - EVERY_S
            if late > EVERY_S:
                self._late.append((now, late * 1e3))
            beat = self._beat[0]
            if now - beat > half:
                frame = sys._current_frames().get(loop_thread)
                if frame is None:
                    continue
                stack = "".join(traceback.format_list(traceback.extract_stack(frame)[-FRAMES:]))
                seen = self._looks.setdefault(beat, [])
                if stack not in seen:
                    seen.append(stack)


def during_runs(report: LoadtestReport, stalls: Sequence[Stall]) -> list[tuple[str, Stall]]:
    """The stalls inside a run's measured stretch, each with the run's name."""
    found = []
    for r in report.results:
        label = r.name if r.in_flight is None else f"{r.name}, {r.network}, {r.in_flight} in flight"
        for s in stalls:
            if r.started_at <= s.start < r.started_at + r.wall:
                found.append((label, s))
    return found


def summary(
    found: Sequence[tuple[str, Stall]], *, longest: int = 8, threshold_ms: float = THRESHOLD_MS
) -> str:
    lines = [
        f"Stalls of the loop over {threshold_ms:g} ms during the runs (a task noting the time "
        f"every {EVERY_S * 1e3:g} ms; a thread of the same process waking as often): "
        f"{len(found)}; "
        + ", ".join(f"{k}: {sum(s.kind == k for _, s in found)}" for k in (RUNNING, STILL, BLOCKED))
    ]
    for label, s in sorted(found, key=lambda f: -f[1].wall_ms)[:longest]:
        lines.append(
            f"- {s.wall_ms:.1f} ms in {label}: the loop's thread {s.cpu_ms:.1f} ms on its CPU "
            f"clock, the sampler at most {s.sampler_late_ms:.1f} ms late ({s.kind})"
        )
        for stack in s.stacks[-2:]:
            lines.extend("    " + line for line in stack.rstrip().splitlines())
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = parser(prog="python -m bench.stalls").parse_args(argv)
    sampler = StallSampler()

    async def sampled() -> LoadtestReport:
        async with sampler:
            return await run_loadtest(config_from(args))

    try:
        report = anyio.run(sampled)
    except LoadtestError as exc:
        print(f"bench.stalls: {exc}", file=sys.stderr)
        return 2
    print(text(report, verbose=args.verbose))
    print()
    print(summary(during_runs(report, sampler.stalls)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
