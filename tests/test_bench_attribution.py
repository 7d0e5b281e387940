"""bench.attribution: what the kernel and the witnesses say the loop's thread did in each
late sample, and each run's lag split and taken net of the machine's stalls."""

from __future__ import annotations

import ctypes
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

from bench.attribution import AttributedProbe, Attribution, RunAttribution, lag_causes
from monitors.lag import LagStats
from monitors.loadtest import LoadtestConfig, run_loadtest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def hold_the_gil(seconds: float) -> None:
    """One C call that keeps the GIL for ``seconds`` on any machine (a PyDLL call does not
    release it; a long ``sum`` keeps it as long as the machine takes: ~80 ms here)."""
    ctypes.PyDLL(None).usleep(int(seconds * 1e6))


_CHILD = """
import json, os, subprocess, sys, anyio
from bench.attribution import AttributedProbe
os.sched_setaffinity(0, {{{cpu}}})
burner = subprocess.Popen([sys.executable, "-c", "while True: pass"])  # on the same core
os.nice(19)  # after the burner started: only this process yields the core when both want it
async def main():
    # Until enough samples, not for a fixed time: how long the burner keeps the core from
    # this process depends on the kernel's scheduler (3 to 40 ms a sample seen).
    with anyio.move_on_after(20):
        async with AttributedProbe() as probe:
            while len(probe.samples) < 30:
                await anyio.sleep(0.05)
    return probe
try:
    probe = anyio.run(main)
finally:
    burner.kill()
print(json.dumps({{"samples": probe.samples, "waits": probe.cpu_waits, "runs": probe.running}}))
"""


@pytest.mark.anyio
async def test_probe_tells_a_busy_loop_from_a_wait_for_a_core() -> None:
    """A loop busy for 50 ms of CPU shows at least that much lag, all of it running, and any
    rest waiting for a core (none on an idle machine); a loop whose thread shares its one core
    with a busier process of higher priority waits for it."""
    assert os.path.exists("/proc/thread-self/schedstat") == (sys.platform == "linux")
    async with AttributedProbe() as probe:
        await anyio.sleep(0.02)
        end = time.thread_time() + 0.05
        while time.thread_time() < end:  # busy on the loop's thread: running, not waiting
            pass
        await anyio.sleep(0.02)
    if sys.platform != "linux":
        assert probe.cpu_waits == []
        return
    assert len(probe.cpu_waits) == len(probe.running) == len(probe.samples)
    worst = max(range(len(probe.samples)), key=probe.samples.__getitem__)
    lag, wait, run = probe.samples[worst], probe.cpu_waits[worst], probe.running[worst]
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
    async with AttributedProbe() as probe:
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
    holder = threading.Thread(target=hold_the_gil, args=(0.1,))
    async with AttributedProbe() as probe:
        await anyio.sleep(0.02)
        holder.start()
        await anyio.sleep(0.2)
        holder.join()
    if sys.platform != "linux":
        assert probe.cpu_waits == []
        return
    worst = max(range(len(probe.samples)), key=probe.samples.__getitem__)
    lag = probe.samples[worst]
    assert lag >= 30, probe.samples
    assert probe.running[worst] + probe.cpu_waits[worst] < lag / 2, (
        lag,
        probe.running[worst],
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
    import bench.attribution as lag_module

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
    import bench.attribution as lag_module

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

    async with AttributedProbe() as probe:
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
    import bench.attribution as lag_module

    vmstat = tmp_path / "vmstat"
    vmstat.write_text(_vmstat_text(3, 10))
    monkeypatch.setattr(lag_module, "_VMSTAT", str(vmstat))
    stalls: list[float] = []
    async with AttributedProbe() as probe:
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
    async with AttributedProbe() as probe:
        await anyio.sleep(0.02)
    assert probe.samples
    assert probe.reclaims == []


@pytest.mark.anyio
async def test_probe_reads_the_machines_own_steal_counters() -> None:
    async with AttributedProbe() as probe:
        await anyio.sleep(0.02)
        time.sleep(0.01)
        # Until 11 samples, not for a fixed time: a loaded machine wakes the probe less often.
        with anyio.fail_after(30):
            while len(probe.samples) <= 10:
                await anyio.sleep(0.005)
    if sys.platform != "linux":
        assert probe.stolen == []
        return
    assert len(probe.stolen) == len(probe.samples) > 10
    assert all(s >= 0 for s in probe.stolen)


@pytest.mark.anyio
async def test_probe_without_steal_counters_counts_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import bench.attribution as lag_module

    monkeypatch.setattr(lag_module, "_STAT", str(tmp_path / "missing"))
    async with AttributedProbe() as probe:
        await anyio.sleep(0.02)
    assert probe.samples
    assert probe.stolen == []
    assert probe.cores == []


def test_lag_over_5_ms_is_split_into_waiting_running_stolen_and_neither() -> None:
    r = RunAttribution(samples=[], times=[])
    r.samples = [0.2, 10.0, 20.0, 17.0]
    r.times = [0.001, 0.012, 0.033, 0.051]
    r.waits = [0.0, 4.0, 30.0, 0.1]  # a sample's window is longer than its lag
    r.runs = [1.2, 3.0, 5.0, 0.9]
    r.stolen = [0.0, 0.0, 10.0, 20.0]  # to the tick: may be more than the lag
    # 10 ms: 4 waiting, 3 running, 3 neither; 20 ms: 10 stolen, then waiting the rest;
    # 17 ms: stolen all of it.
    assert r.cpu_wait() == {
        "over_ms": 5.0,
        "samples": 3,
        "share": pytest.approx(14 / 47),
        "running_share": pytest.approx(3 / 47),
        "stolen_share": pytest.approx(27 / 47),
        "worst_lag_ms": 20.0,
        "worst_wait_ms": 10.0,
        "worst_running_ms": 0.0,
        "worst_stolen_ms": 10.0,
    }
    assert r.to_dict()["lag_cpu_wait"] == r.cpu_wait()
    assert lag_causes("FileMonitor", r.cpu_wait() or {}) == (
        "FileMonitor 3 samples over 5 ms, of their lag 30% waiting, 6% running, 57% stolen, "
        "6% neither; worst 20.0 ms: 10.0 waiting, 0.0 running, 10.0 stolen"
    )
    # Without the steal: 0.2, 10, 10 and 0 ms.
    assert r.lag_net().max == 10.0
    assert r.lag_net().count == 4
    assert r.to_dict()["lag_net_ms"]["max"] == 10.0
    r.samples = [0.2, 4.0, 1.0, 0.5]
    assert lag_causes("FileMonitor", r.cpu_wait() or {}) == (
        "FileMonitor no samples over 5 ms, worst 4.0 ms: 4.0 waiting, 0.0 running, 0.0 stolen"
    )
    r.stolen = []  # the kernel did not tell the steal: none is counted
    r.samples = [0.2, 10.0, 20.0, 17.0]
    assert (r.cpu_wait() or {})["stolen_share"] == 0.0
    assert r.lag_net() == LagStats.of(r.samples)
    r.waits = []  # the kernel did not tell
    assert r.cpu_wait() is None
    assert r.lag_net() == LagStats.of(r.samples)


def test_lag_net_takes_off_what_the_witness_on_the_loops_core_saw() -> None:
    r = RunAttribution(samples=[], times=[], started_at=100.0)
    # 200 samples on time, then four late ones ending at 102 s, 103 s, 104 s and 105 s.
    quiet = [0.5] * 200
    r.samples = [*quiet, 20.0, 20.0, 20.0, 20.0]
    r.times = [i / 1000 for i in range(200)] + [2.0, 3.0, 4.0, 5.0]
    r.waits = [0.0] * 204
    r.runs = [0.0] * 204
    r.stolen = [0.0] * 200 + [0.0, 0.0, 10.0, 0.0]
    r.cores = [(-1, -1)] * 200 + [(0, 0), (1, 1), (0, 0), (0, 1)]
    assert r.witnessed() == [0.0] * 204  # no witnesses: steal only
    r.witness_cores = [0, 1]
    # Core 0's witness stood still 15 ms of each late sample but the fourth's; core 1's
    # 5 ms of the second.
    r.witness_stalls = [
        [(101.985, 102.0), (102.985, 103.0), (104.985, 105.0)],
        [(101.995, 102.0)],
    ]
    assert r.witnessed()[:200] == [0.0] * 200
    assert r.witnessed()[200:] == [pytest.approx(15.0), 0.0, 0.0, pytest.approx(0.0)]
    # 5 ms left on core 0; core 1's witness was on time; 10 stolen; moved from core 0 to
    # core 1 (the lesser of the two witnesses').
    assert r.lag_net().max == pytest.approx(20.0)
    # The worst left: the sample on core 1, whose witness was on time while core 0's was not.
    assert r.worst_net() == {
        "at_s": 3.0,
        "lag_ms": 20.0,
        "net_ms": 20.0,
        "wait_ms": 0.0,
        "running_ms": 0.0,
        "stolen_ms": 0.0,
        "witnessed_ms": 0.0,
        "any_witness_ms": pytest.approx(15.0),
    }
    assert r.to_dict()["lag_net_worst"] == r.worst_net()
    r.samples[201] = r.samples[203] = 1.0
    assert r.lag_net().max == pytest.approx(10.0)  # the third: 20 ms, 10 of it stolen
    r.stolen[202] = 20.0
    assert r.lag_net().max == pytest.approx(5.0)  # what core 0's witness left of the second
    w = r.cpu_wait() or {}
    assert w["worst_witnessed_ms"] == pytest.approx(15.0)
    assert "(its core's witness stood still 15.0)" in lag_causes("PrimeMonitor", w)
    stalls = r.to_dict()["witness_stalls"]
    assert stalls == {"cores": [0, 1], "count": [3, 1], "longest_ms": pytest.approx([15.0, 5.0])}


def test_the_worst_samples_running_says_how_much_was_the_kernel_faulting_pages_in() -> None:
    r = RunAttribution(samples=[], times=[])
    r.samples = [0.2, 19.0, 6.0]
    r.times = [0.001, 0.021, 0.028]
    r.waits = [0.0, 1.0, 0.0]
    r.runs = [0.2, 18.0, 6.0]
    r.stolen = [0.0, 0.0, 0.0]
    r.kernel = [0.0, 20.0, 0.1]  # to the tick: may be more than the running
    r.faults = [0, 6000, 3]
    r.reclaims = [0, 2, 0]
    w = r.cpu_wait() or {}
    assert (w["worst_running_ms"], w["worst_kernel_ms"], w["worst_faults"]) == (18.0, 18.0, 6000)
    assert w["worst_reclaims"] == 2
    assert r.to_dict()["lag_cpu_wait"] == w
    assert lag_causes("FileMonitor", w).endswith(
        "worst 19.0 ms: 1.0 waiting, 18.0 running (18.0 in the kernel, 6000 page faults, "
        "2 direct reclaims or compactions on the machine), 0.0 stolen"
    )
    r.faults = []  # the kernel did not tell: nothing is said of it
    w = r.cpu_wait() or {}
    assert "worst_faults" not in w
    assert "worst_kernel_ms" not in w
    assert lag_causes("FileMonitor", w).endswith(
        "18.0 running (2 direct reclaims or compactions on the machine), 0.0 stolen"
    )
    r.reclaims = []
    w = r.cpu_wait() or {}
    assert "worst_reclaims" not in w
    assert lag_causes("FileMonitor", w).endswith(
        "worst 19.0 ms: 1.0 waiting, 18.0 running, 0.0 stolen"
    )


def test_every_run_of_a_load_test_is_attributed(tmp_path: Path) -> None:
    """The instrument gives each run its probe and witnesses, and the run's JSON what they
    found: the samples are the run's own, split where the kernel tells."""
    from bench.loadtest import run

    config = LoadtestConfig(
        monitors=("file", "prime"), episodes=3, size=200_000, out=tmp_path, progress=False
    )
    report, attribution = run(config, baseline=True)
    assert [r.run for r in report.results] == ["file", "prime", "baseline-file", "baseline-sdk"]
    assert [r.ours for r in report.results] == [True, True, False, False]
    for r in report.results:
        att = attribution.runs[r.run]
        assert att.samples == r.lag_samples
        assert att.runs == r.lag_running
        assert r.to_dict()["lag_net_ms"]["max"] <= r.lag.max
        assert r.details["witness_stalls"]["cores"] == sorted(os.sched_getaffinity(0))
        if sys.platform == "linux":
            assert len(att.waits) == len(att.samples)
            w = r.details["lag_cpu_wait"]
            assert w["worst_lag_ms"] == pytest.approx(r.lag.max)
            assert 0 <= w["share"] <= 1


def test_a_run_goes_on_without_witnesses_where_they_cannot_start(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import contextlib
    from collections.abc import Iterator

    import bench.attribution

    @contextlib.contextmanager
    def no_witnesses() -> Iterator[None]:
        raise OSError("no processes here")
        yield

    monkeypatch.setattr(bench.attribution, "witnesses", no_witnesses)
    attribution = Attribution()
    config = LoadtestConfig(monitors=("file",), episodes=2, size=100_000, progress=False)
    result = anyio.run(lambda: run_loadtest(config, instrument=attribution)).result("file")
    assert result.all_delivered
    att = attribution.runs["file"]
    assert (att.witness_cores, att.witness_stalls) == ([], [])
    assert att.witnessed() == [0.0] * len(att.samples)
    assert "FileMonitor: no witness processes (no processes here)" in caplog.text


def test_verbose_says_where_the_lag_came_from(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from bench.loadtest import main

    argv = ["--monitors", "file", "--episodes", "2", "--size", "100kB", "--no-progress"]
    assert main([*argv, "--out", str(tmp_path), "--verbose", "--baseline"]) == 0
    printed = capsys.readouterr().out
    assert "| orjson + to_thread (file) | - | - | 4 / 4 |" in printed
    if sys.platform == "linux":
        assert "Where lag over 5 ms came from" in printed
        assert "FileMonitor " in printed.split("Where lag over 5 ms came from")[1]
    assert printed.rstrip().splitlines()[-3].startswith("Every record delivered")
