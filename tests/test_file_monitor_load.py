"""FileMonitor under load: 200 production-like episodes of 1-3 MB, one ``log_episodes`` call
each, while a LoopLagProbe watches the event loop; every record reads back identical."""

from __future__ import annotations

import random
import time
from pathlib import Path

import orjson
import pytest
from witness import lag_within, own_ms, witnesses

from monitors import FileMonitor, LoopLagProbe
from monitors.testing.episodes import EpisodeMaker
from monitors.traces import read_records
from monitors.traces._layout import list_chunks

EPISODES = 200
#: Ten (size, index) pairs, each logged again and again as a fresh copy; the maker builds the
#: bodies they share once.
SPECS = [(random.Random(i).randint(1_000_000, 3_000_000), i) for i in range(10)]
MAKER = EpisodeMaker(seed=0)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_file_monitor_under_load(tmp_path: Path) -> None:
    expected = {}
    windows: list[tuple[float, float]] = []
    with witnesses() as seen:
        async with (
            LoopLagProbe() as probe,
            FileMonitor(tmp_path, chunk_bytes=64 << 20) as monitor,
        ):
            for i in range(EPISODES):
                spec = SPECS[i % len(SPECS)]
                # A fresh episode per call (new str objects, nothing cached by an earlier
                # encoding); built on the loop, outside the measured windows.
                episode = MAKER.episode(spec[0], index=spec[1]).to_record(fresh=True)
                started = time.perf_counter()
                await monitor.log_episodes([episode], step=i, subset="all")
                ended = time.perf_counter()
                windows.append((started, ended))
                data = orjson.dumps(episode)
                assert expected.setdefault(spec, data) == data  # same pair, same episode
                del episode
            stats = monitor.stats()
    # The loop's lag while log_episodes ran (samples whose whole sleep fell inside a call)
    # and the calls themselves, judged net of the machine's stalls (witness.py).
    during = lag_within(probe, windows, seen.stalls)
    ends = [end for _, end in windows]
    spent_ms = [(end - start) * 1e3 for start, end in windows]
    slowest = max(own_ms(ends, spent_ms, seen.stalls)) / 1e3
    window_ms = 1000 * sum(end - start for start, end in windows)
    summary = (
        f"during log_episodes ({window_ms:.0f} ms in all): {lag_within(probe, windows)}, net "
        f"of the machine's stalls {during}; overall: {probe.stats()}; slowest call "
        f"{max(spent_ms) / 1e3:.3f} s, net {slowest:.3f} s"
    )
    # The loop turned during the calls: a floor scaled to their time, so a fast machine's
    # short calls do not fail it (a sample is ~1 ms asleep plus its lag).
    assert during.count >= max(50, window_ms / 8), summary
    assert during.p99 < 50, summary
    assert during.max < 250, summary
    assert slowest < 5, summary

    assert stats.submitted == stats.delivered == EPISODES, stats
    assert stats.lost == {}
    stream = monitor.stream_dir
    assert stream == tmp_path / "monitors" / "file" / "traces" / "stream"
    assert len(list_chunks(stream)) >= 5  # ~400 MB in chunks of 64 MiB
    n = 0
    for n, record in enumerate(read_records(tmp_path), 1):
        spec = SPECS[(n - 1) % len(SPECS)]
        assert orjson.dumps(record) == expected[spec], f"record {n - 1} differs"
    assert n == EPISODES
