"""LoopLagProbe: it sees a stall of the loop, and an idle loop shows little lag."""

from __future__ import annotations

import json
import mmap
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import anyio
import pytest

from monitors import LagStats, LoopLagProbe


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
        await anyio.sleep(0.3)
    stats = probe.stats()
    assert stats.count >= 50, stats
    assert stats.p50 < 5, stats
    assert stats.p50 <= stats.p90 <= stats.p99 <= stats.max


@pytest.mark.anyio
async def test_probe_interval() -> None:
    async with LoopLagProbe(interval=0.01) as probe:
        await anyio.sleep(0.2)
    assert 5 <= probe.stats().count <= 21, probe.stats()
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


_CHILD = """
import json, os, subprocess, sys, anyio
from monitors import LoopLagProbe
os.sched_setaffinity(0, {{{cpu}}})
burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # on the same core
os.nice(19)  # after the burner started: only this process yields the core when both want it
async def main():
    # Until enough samples, not for a fixed time: how long the burner keeps the core from
    # this process depends on the kernel's scheduler (3 to 40 ms a sample seen).
    with anyio.move_on_after(20):
        async with LoopLagProbe() as probe:
            while len(probe.samples) < 30:
                await anyio.sleep(0.05)
    return probe
try:
    probe = anyio.run(main)
finally:
    burner.kill()
print(json.dumps({{"samples": probe.samples, "waits": probe.cpu_waits, "runs": probe.cpu_runs}}))
"""


@pytest.mark.anyio
async def test_probe_tells_a_busy_loop_from_a_wait_for_a_core() -> None:
    """A loop busy for 50 ms of CPU shows at least that much lag, all of it running, and any
    rest waiting for a core (none on an idle machine); a loop whose thread shares its one core
    with a busier process of higher priority waits for it."""
    assert os.path.exists("/proc/thread-self/schedstat") == (sys.platform == "linux")
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        end = time.thread_time() + 0.05
        while time.thread_time() < end:  # busy on the loop's thread: running, not waiting
            pass
        await anyio.sleep(0.02)
    if sys.platform != "linux":
        assert probe.cpu_waits == probe.cpu_runs == []
        return
    assert len(probe.cpu_waits) == len(probe.cpu_runs) == len(probe.samples)
    worst = max(range(len(probe.samples)), key=probe.samples.__getitem__)
    lag, wait, run = probe.samples[worst], probe.cpu_waits[worst], probe.cpu_runs[worst]
    assert lag >= 45, probe.samples
    assert run >= 50, (lag, wait, run)
    # Both are shares of the sample's span (the 1 ms interval and the lag); on a shared host
    # a neighbour may take the core mid-step, and that part is waiting, not running.
    assert run + wait <= lag + 3, (lag, wait, run)

    cpu = min(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD.format(cpu=cpu)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert out.returncode == 0, out.stderr
    child = json.loads(out.stdout)
    lag, waits = sum(child["samples"]), sum(child["waits"])
    assert len(child["waits"]) == len(child["runs"]) == len(child["samples"]) > 20
    assert lag > 100, child  # 30 samples, the core mostly the burner's
    assert waits > lag / 2, (lag, waits)
    assert sum(child["runs"]) < lag / 4, child


@pytest.mark.anyio
async def test_probe_tells_a_stall_in_the_kernel_faulting_pages_in_from_a_busy_step() -> None:
    """Memory touched afresh on the loop's thread is running in the kernel, one page fault
    a page; a step busy in Python takes (nearly) none."""
    pages = (64 << 20) // 4096
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        touched = time.perf_counter()
        # Fresh pages from the kernel (a bytearray may reuse heap pages already in memory),
        # of 4 KiB whatever the transparent huge page settings.
        fresh = mmap.mmap(-1, pages * 4096)
        if hasattr(mmap, "MADV_NOHUGEPAGE"):
            fresh.madvise(mmap.MADV_NOHUGEPAGE)
        fresh[::4096] = b"\x01" * pages  # one write a page: each page faulted in once
        await anyio.sleep(0.02)
        busy = time.perf_counter()
        end = busy + 0.03
        while time.perf_counter() < end:
            pass
        await anyio.sleep(0.02)
    fresh.close()
    if sys.platform != "linux":
        assert probe.cpu_kernel == probe.faults == []
        return
    assert len(probe.cpu_kernel) == len(probe.faults) == len(probe.samples)
    first_after = next(i for i, t in enumerate(probe.times) if t > touched)
    assert probe.faults[first_after] >= pages / 2, probe.faults
    assert probe.cpu_kernel[first_after] > 0, probe.cpu_kernel
    after_busy = next(i for i, t in enumerate(probe.times) if t > busy)
    assert probe.samples[after_busy] >= 25, probe.samples
    assert probe.faults[after_busy] < pages / 100, probe.faults
    assert all(f >= 0 for f in probe.faults)
    assert all(k >= 0 for k in probe.cpu_kernel)


@pytest.mark.anyio
async def test_probe_tells_a_loop_asleep_past_its_time() -> None:
    """A loop whose thread waits for the GIL (another thread in one long C call) neither runs
    nor waits for a core meanwhile."""
    holder = threading.Thread(target=sum, args=(range(5_000_000),))  # ~90 ms holding the GIL
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        holder.start()
        await anyio.sleep(0.2)
        holder.join()
    if sys.platform != "linux":
        assert probe.cpu_runs == probe.cpu_waits == []
        return
    worst = max(range(len(probe.samples)), key=probe.samples.__getitem__)
    lag = probe.samples[worst]
    assert lag >= 30, probe.samples
    assert probe.cpu_runs[worst] + probe.cpu_waits[worst] < lag / 2, (
        lag,
        probe.cpu_runs[worst],
        probe.cpu_waits[worst],
    )


def _stat_text(steal: list[int]) -> str:
    """/proc/stat as Linux writes it, with these steal ticks per core."""
    lines = [f"cpu  100 0 50 1000 0 0 0 {sum(steal)} 0 0"]
    lines += [f"cpu{i} 50 0 25 500 0 0 0 {s} 0 0" for i, s in enumerate(steal)]
    lines += ["intr 1 0 0", "ctxt 42", "btime 1700000000", "processes 7"]
    return "\n".join(lines) + "\n"


def _thread_stat_text(core: int) -> str:
    """/proc/thread-self/stat as Linux writes it, for a thread last on ``core`` (field 39),
    its name holding a space and a parenthesis as a thread's name may."""
    fields = ["R", *("0" * 35), str(core), *("0" * 13)]
    return f"4242 (py (loop) 1) {' '.join(fields)}\n"


def test_the_core_is_read_from_the_thread_stat(tmp_path: Path) -> None:
    import monitors.lag as lag_module

    path = tmp_path / "stat"
    path.write_text(_thread_stat_text(5))
    fd = os.open(path, os.O_RDONLY)
    try:
        assert lag_module._core(fd) == 5
    finally:
        os.close(fd)
    if sys.platform == "linux":
        fd = os.open("/proc/thread-self/stat", os.O_RDONLY)
        try:
            assert 0 <= lag_module._core(fd) < (os.cpu_count() or 1)
        finally:
            os.close(fd)


@pytest.mark.anyio
@pytest.mark.parametrize("know_core", [True, False])
async def test_probe_counts_the_loops_core_standing_still_as_stolen(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, know_core: bool
) -> None:
    """A sample during which the loop's core lost time to the hypervisor (steal ticks in
    /proc/stat) says how much: the core the thread is on, or, where it moved, the lesser of
    the two; steal on another core, or a sample on time, says 0. Where the kernel does not
    say which core, only steal on every core counts."""
    import monitors.lag as lag_module

    stat = tmp_path / "stat"
    stat.write_text(_stat_text([5, 7, 1]))
    thread = tmp_path / "thread-stat"
    thread.write_text(_thread_stat_text(1))
    monkeypatch.setattr(lag_module, "_STAT", str(stat))
    monkeypatch.setattr(lag_module, "_THREAD_STAT", str(thread if know_core else tmp_path / "no"))
    tick_ms = 1000 / os.sysconf("SC_CLK_TCK")
    stalls: list[float] = []

    def stall(steal: list[int], *, core: int = 1) -> None:
        stat.write_text(_stat_text(steal))
        thread.write_text(_thread_stat_text(core))
        stalls.append(time.perf_counter())
        time.sleep(0.03)

    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        stall([7, 10, 3])  # every core: at least 2 ticks
        await anyio.sleep(0.02)
        stall([7, 14, 3])  # the loop's core only: 4 ticks
        await anyio.sleep(0.02)
        stall([7, 14, 8])  # another core only
        await anyio.sleep(0.02)
        stall([7, 17, 10], core=2)  # moved from core 1 (3 ticks) to core 2 (2 ticks)
        await anyio.sleep(0.02)
    assert len(probe.stolen) == len(probe.samples)
    at = [next(i for i, t in enumerate(probe.times) if t > s) for s in stalls]
    assert all(probe.samples[i] >= 25 for i in at), probe.samples
    got = [probe.stolen[i] for i in at]
    if know_core:
        assert got == [3 * tick_ms, 4 * tick_ms, 0.0, 2 * tick_ms]
        assert [probe.cores[i] for i in at] == [(1, 1), (1, 1), (1, 1), (1, 2)]
    else:
        assert got == [2 * tick_ms, 0.0, 0.0, 0.0]
        assert [probe.cores[i] for i in at] == [(-1, -1)] * 4
    assert all(s == 0.0 for i, s in enumerate(probe.stolen) if i not in at), probe.stolen
    # The cores are told for late samples only.
    assert len(probe.cores) == len(probe.samples)
    assert all(c == (-1, -1) for i, c in enumerate(probe.cores) if probe.samples[i] < 1), (
        probe.cores
    )


def _vmstat_text(allocstalls: int, compactions: int) -> str:
    """/proc/vmstat as Linux writes it: the direct reclaims split by zone, among others."""
    return (
        f"nr_free_pages 5000\nallocstall_dma 0\nallocstall_normal {allocstalls}\n"
        f"allocstall_movable 2\npgscan_direct 900\ncompact_stall {compactions}\n"
        "compact_fail 1\ncompact_stall_extra 77\n"
    )


@pytest.mark.anyio
async def test_probe_counts_the_machines_direct_reclaims_in_a_late_sample(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A sample during which some thread had to reclaim or compact memory itself to allocate
    (/proc/vmstat) says how many times; a sample on time says 0."""
    import monitors.lag as lag_module

    vmstat = tmp_path / "vmstat"
    vmstat.write_text(_vmstat_text(3, 10))
    monkeypatch.setattr(lag_module, "_VMSTAT", str(vmstat))
    stalls: list[float] = []
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        vmstat.write_text(_vmstat_text(4, 12))  # one reclaim and two compactions
        stalls.append(time.perf_counter())
        time.sleep(0.03)
        await anyio.sleep(0.02)
        stalls.append(time.perf_counter())
        time.sleep(0.03)  # nothing reclaimed meanwhile
        await anyio.sleep(0.02)
    if sys.platform != "linux":
        assert probe.reclaims == []
        return
    assert len(probe.reclaims) == len(probe.samples)
    at = [next(i for i, t in enumerate(probe.times) if t > s) for s in stalls]
    assert [probe.reclaims[i] for i in at] == [3, 0]
    assert all(r == 0 for i, r in enumerate(probe.reclaims) if i not in at), probe.reclaims

    monkeypatch.setattr(lag_module, "_VMSTAT", str(tmp_path / "missing"))
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
    assert probe.samples
    assert probe.reclaims == []


@pytest.mark.anyio
async def test_probe_reads_the_machines_own_steal_counters() -> None:
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
        time.sleep(0.01)
        await anyio.sleep(0.02)
    if sys.platform != "linux":
        assert probe.stolen == []
        return
    assert len(probe.stolen) == len(probe.samples) > 10
    assert all(s >= 0 for s in probe.stolen)


@pytest.mark.anyio
async def test_probe_without_steal_counters_counts_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import monitors.lag as lag_module

    monkeypatch.setattr(lag_module, "_STAT", str(tmp_path / "missing"))
    async with LoopLagProbe() as probe:
        await anyio.sleep(0.02)
    assert probe.samples
    assert probe.stolen == []
    assert probe.cores == []
