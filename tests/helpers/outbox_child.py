"""A training orchestrator that uploads its run's trace stream through PrimeMonitor's outbox,
resuming from where an earlier, killed process of the same run stopped (used by
test_outbox_crash.py).

``python outbox_child.py RUN URL SEED``: logs the episodes of ``plan(SEED)`` to
``Monitors(FileMonitor(RUN), PrimeMonitor(outbox=RUN, ...))`` at ``URL``, skipping those the
run's stream holds already, then finalizes and exits 0. It prints ``ready <held>`` once the
monitors are started and the stream is read (``held``: episodes found in it), ``logged <i>``
after each episode, and ``done <stats>`` at the end. Episode ``i`` of a seed is always
``record(seed, i)``, so the test can check every line the service stored.
"""

from __future__ import annotations

import functools
import logging
import random
import sys
from pathlib import Path
from typing import Any

import anyio

from monitors import FileMonitor, Monitors, PrimeMonitor
from monitors.records import Kind
from monitors.testing import EpisodeMaker
from monitors.traces import TraceWriter
from monitors.traces._index import iter_rows
from monitors.traces._layout import RUN_STREAM, index_path

KEY = "sk-nodewise-outbox-crash-5c4b3a"
RUN_ID = "run-outbox-crash"
EPISODES = 60
PER_STEP = 4
#: Seconds between two episodes: the run logs for ~2 s, so kills land mid-run.
PAUSE = 0.03


def plan(seed: int) -> list[tuple[int, Kind, int]]:
    """``(step, kind, size)`` of each episode of the run: four to a step, sizes from 16 KB to
    300 KB, about one in four an eval, so batches close at a step's end, at a kind's change
    and at ``batch_bytes``."""
    rng = random.Random(f"outbox-crash-plan-{seed}")
    return [
        (i // PER_STEP, "eval" if rng.random() < 0.25 else "train", rng.randint(16_000, 300_000))
        for i in range(EPISODES)
    ]


@functools.cache
def maker(seed: int) -> EpisodeMaker:
    """The run's one maker: it builds the trace bodies its episodes share once."""
    return EpisodeMaker(seed=seed)


def episode_id(seed: int, i: int) -> str:
    """The id of episode ``i`` of the run."""
    return maker(seed).episode(plan(seed)[i][2], index=i).id


def record(seed: int, i: int) -> dict[str, Any]:
    """Episode ``i`` of the run: an ``EpisodeMaker`` episode whose own ``run`` block names
    the kind it is logged as, as an orchestrator's records do (a row that a crash left for
    the stream's recovery to rebuild takes its kind from there)."""
    _, kind, size = plan(seed)[i]
    value = maker(seed).episode(size, index=i).to_record()
    run = dict(value["run"], type=kind)
    run["work"] = dict(run["work"], type=kind)
    value["run"] = run
    return value


def held_ids(run: Path) -> list[Any]:
    """The ids of the episodes in the run's stream, in order (complete index rows only)."""
    return [row.id for _, row in iter_rows(index_path(run / RUN_STREAM))]


def say(text: str) -> None:
    """One line of progress on stdout, flushed: the test reads it while the child runs."""
    print(text, flush=True)


async def main(run: Path, url: str, seed: int) -> None:
    episodes = plan(seed)
    ids = [episode_id(seed, i) for i in range(EPISODES)]
    prime = PrimeMonitor(
        outbox=run,
        run_id=RUN_ID,
        api_key=KEY,
        traces_url=url,
        base_url=url,
        batch_bytes=256 * 1024,
        max_in_flight=4,
        retry_base=0.01,
        drain_timeout=60,
    )
    async with Monitors(FileMonitor(run), prime) as monitors:
        # FileMonitor opens its stream at the first append, and only then mends what a kill
        # tore (a record without its index row gets one rebuilt). Mend it now, before the
        # stream is read: else an episode whose row a kill tore would look missing and be
        # written twice. The outbox is running meanwhile and sees the mended index.
        async with TraceWriter(run / RUN_STREAM, seal_on_close=False):
            pass
        held = await anyio.to_thread.run_sync(held_ids, run)
        if held != ids[: len(held)]:
            raise SystemExit(f"the stream holds {held!r}, not a prefix of the run's episodes")
        say(f"ready {len(held)}")
        for i in range(len(held), EPISODES):
            step, kind, _ = episodes[i]
            await monitors.log_episodes([record(seed, i)], step=step, kind=kind, subset="all")
            say(f"logged {i}")
            await anyio.sleep(PAUSE)
    say(f"done {prime.stats()!r}")


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(message)s")
    anyio.run(main, Path(sys.argv[1]), sys.argv[2], int(sys.argv[3]))
