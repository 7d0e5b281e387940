"""LoopLagProbe: it sees a stall of the loop, says whether the loop's thread ran meanwhile, and
an idle loop shows little lag."""

from __future__ import annotations

import ctypes
import threading
import time

import anyio
import pytest

from monitors import LagStats, LoopLagProbe

_LIBC = ctypes.PyDLL(None)  # a PyDLL call keeps the GIL throughout


def hold_the_gil(seconds: float) -> None:
    """One C call that keeps the GIL for ``seconds`` on any machine (a long ``sum`` keeps it
    for as long as the machine takes: ~80 ms here, less on a faster one)."""
    _LIBC.usleep(int(seconds * 1e6))


async def until_samples(probe: LoopLagProbe, count: int) -> None:
    """Wait for ``count`` samples: a count, not a time, since a loaded machine wakes the
    probe less often (50 samples take ~60 ms here, with both cores busy too)."""
    with anyio.fail_after(30):
        while len(probe.samples) < count:
            await anyio.sleep(0.005)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.anyio
async def test_probe_reports_a_stall() -> None:
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.05)
        blocked = time.perf_counter()
        time.sleep(0.05)  # the loop is blocked for 50 ms, once
        await anyio.sleep(0.05)
        await until_samples(probe, 20)
        during = probe.stats()
    after = probe.stats()
    assert during.max >= 40, during
    assert after.max >= 40, after
    assert after.count >= during.count >= 20
    # The stall is the first sample taken after the loop was blocked.
    first_after = next(i for i, t in enumerate(probe.times) if t > blocked)
    assert probe.samples[first_after] >= 40, (probe.samples, first_after)
    assert len(probe.times) == len(probe.samples)
    assert probe.times == sorted(probe.times)
    # Sampling stopped on exit.
    await anyio.sleep(0.02)
    assert probe.stats() == after


@pytest.mark.anyio
async def test_idle_loop_has_small_lag() -> None:
    async with LoopLagProbe() as probe:
        await until_samples(probe, 50)
    stats = probe.stats()
    assert stats.count >= 50, stats
    assert stats.p50 < 5, stats  # 0.08-0.16 ms here, idle or with both cores busy
    assert stats.p50 <= stats.p90 <= stats.p99 <= stats.max


@pytest.mark.anyio
async def test_probe_interval() -> None:
    async with LoopLagProbe(interval=0.01) as probe:
        started = time.perf_counter()
        await until_samples(probe, 5)
    elapsed = time.perf_counter() - started
    # Each sample sleeps its 10 ms first: no more than the time allows, whatever it was.
    assert 5 <= probe.stats().count <= elapsed / 0.01 + 1, (probe.stats(), elapsed)
    for bad in (0, -1.0, float("nan")):
        with pytest.raises(ValueError, match="interval"):
            LoopLagProbe(interval=bad)


def test_lag_stats_of_samples() -> None:
    assert LagStats.of([]) == LagStats(0, 0.0, 0.0, 0.0, 0.0)
    stats = LagStats.of([float(x) for x in range(100, 0, -1)])  # 1..100 ms, shuffled order
    assert stats == LagStats(100, 50.0, 90.0, 99.0, 100.0)
    one = LagStats.of([3.5])
    assert one == LagStats(1, 3.5, 3.5, 3.5, 3.5)
    assert "p99 99.00 ms" in str(stats)
    assert "100 samples" in str(stats)


def test_probe_works_under_trio_too() -> None:
    async def main() -> LagStats:
        async with LoopLagProbe() as probe:
            await anyio.sleep(0.02)
            time.sleep(0.05)
            await anyio.sleep(0.02)
        return probe.stats()

    stats = anyio.run(main, backend="trio")
    assert stats.max >= 40, stats


@pytest.mark.anyio
async def test_probe_tells_a_busy_loop_from_one_kept_off_its_core() -> None:
    """A step busy for 50 ms of CPU is a late sample during which the loop's thread ran; a
    wait for the GIL (another thread in one long C call) is one during which it did not."""
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        end = time.thread_time() + 0.05
        while time.thread_time() < end:
            pass
        await anyio.sleep(0.02)
    assert len(probe.running) == len(probe.samples)
    worst = max(range(len(probe.samples)), key=probe.samples.__getitem__)
    assert probe.samples[worst] >= 45, probe.samples
    assert probe.running[worst] >= 45, (probe.samples[worst], probe.running[worst])

    holder = threading.Thread(target=hold_the_gil, args=(0.1,))
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        holder.start()
        await anyio.sleep(0.2)
        holder.join()
    worst = max(range(len(probe.samples)), key=probe.samples.__getitem__)
    assert probe.samples[worst] >= 30, probe.samples
    assert probe.running[worst] < probe.samples[worst] / 2, (probe.samples, probe.running)


@pytest.mark.anyio
async def test_a_pause_keeps_what_happens_meanwhile_out_of_the_samples() -> None:
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        probe.pause()
        blocked = time.perf_counter()
        time.sleep(0.05)  # blocked on purpose: not a sample
        unblocked = time.perf_counter()
        await anyio.sleep(0.01)
        probe.resume()
        await anyio.sleep(0.02)
    assert probe.samples
    # No sample spans the block (one that did would be >= 50 ms late); judged by when each
    # slept, not by a bound on lag, which a loaded machine may pass at any other moment.
    slept = [
        (woke - 0.001 - lag / 1e3, woke)
        for lag, woke in zip(probe.samples, probe.times, strict=True)
    ]
    assert not [s for s in slept if s[0] < blocked and s[1] > unblocked], (slept, blocked)
    assert len(probe.samples) == len(probe.times) == len(probe.running)
    assert probe.cpu_runs is probe.running  # its name before 0.1.0
