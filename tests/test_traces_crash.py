"""A writer process killed with SIGKILL mid-append or mid-seal: the stream reads back every
completed record, intact and in order, never a torn one; reopening mends it (a seal cut short
is finished or undone, chunks left plain are sealed) and appending goes on."""

from __future__ import annotations

import importlib.util
import os
import random
import selectors
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Literal

import anyio
import orjson
import pytest
import pyzstd
from streams import chunk_bytes, index_rows

from monitors.traces import TraceReader, TraceWriter, read_record, read_row
from monitors.traces._index import count_rows
from monitors.traces._layout import (
    chunk_path,
    index_path,
    list_chunks,
    scan,
    sealed_path,
)

HELPER = Path(__file__).parent / "helpers" / "trace_crash_writer.py"
CHUNK_BYTES = 8 << 20


def _load_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("trace_crash_writer", HELPER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


helper = _load_helper()


def _read_lines(proc: subprocess.Popen[bytes], until: int, *, timeout: float) -> list[str]:
    """Lines from the helper's stdout until ``until`` completions were printed."""
    assert proc.stdout is not None
    lines: list[str] = []
    done = 0
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while done < until:
            left = deadline - time.monotonic()
            if left <= 0 or not sel.select(left):
                pytest.fail(f"the writer printed only {lines!r} in {timeout} s")
            line = proc.stdout.readline().decode()
            if not line:
                err = proc.stderr.read().decode() if proc.stderr else ""
                pytest.fail(f"the writer exited ({proc.wait()}) after {lines!r}: {err}")
            lines.append(line.strip())
            if not line.startswith("open"):
                done += 1
    return lines


def _run_and_kill(directory: Path, completions: int, delay: float) -> tuple[int, int]:
    """Start the writer, let it complete ``completions`` appends, SIGKILL it ``delay``
    seconds later. Return (records it found when opening, last n it printed)."""
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), str(directory), str(CHUNK_BYTES), "plain"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        lines = _read_lines(proc, completions, timeout=60)
        time.sleep(delay)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        assert proc.stderr is not None
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, err
    assert lines[0].startswith("open "), lines
    opened = int(lines[0].split()[1])
    printed = [int(x) for x in lines[1:]]
    assert printed == list(range(opened, opened + len(printed))), lines
    return opened, printed[-1]


def _check_index(directory: Path, records: int) -> None:
    """The index holds one whole row per record, numbered 1.., each pointing at its
    record's bytes (no torn row after them)."""
    assert index_path(directory).read_bytes().endswith(b"\n")
    rows = index_rows(directory)
    assert [r.line for r in rows] == list(range(1, records + 1))
    assert [(r.chunk, r.offset) for r in rows] == sorted((r.chunk, r.offset) for r in rows)
    for row in rows:
        assert row.length is not None
        assert row.length == len(orjson.dumps(helper.record(row.line - 1))) + 1, row


def _check_unmended(directory: Path, last_printed: int) -> tuple[int, int]:
    """The killed stream, before anyone mends it: records 0..k, each intact, k >= the last
    one reported done; return (k + 1, bytes of the torn last line)."""
    reader = TraceReader(directory)
    count = 0
    for n, value in enumerate(reader):
        assert value["n"] == n, f"record {n} is record {value['n']}"
        assert orjson.dumps(value) == orjson.dumps(helper.record(n)), f"record {n} differs"
        count += 1
    assert reader.skipped == 0
    assert count >= last_printed + 1, f"{count} records, but record {last_printed} completed"
    # At most the record being written when the kill came may be missing from the index, or
    # be indexed while its line is torn; every other row points at its record.
    rows = count_rows(index_path(directory))  # whole rows: a torn last one is not counted
    assert count - 1 <= rows <= count + 1, (rows, count)
    for i in range(min(rows, count)):
        row = read_row(directory, i)
        # A row that an earlier reopening rebuilt from the data has no step.
        assert row.step in (i, None), (i, row)
        if i >= count - 3:
            assert read_record(directory, i)["n"] == i
    return count, reader.torn_tail_bytes


def test_sigkill_mid_append_loses_only_the_record_being_written(tmp_path: Path) -> None:
    directory = tmp_path / "stream"
    total = 0
    torn_seen = 0
    # Kill at different moments of an append (a few ms in, a 3 MB record is mid-write);
    # go on until a kill has left a torn line (usually the second or third), at most 6 times.
    plan = [(20, 0.0), (8, 0.015), (6, 0.03), (6, 0.008), (6, 0.05), (6, 0.02)]
    for round_, (completions, delay) in enumerate(plan):
        opened, last = _run_and_kill(directory, completions, delay)
        # The helper's reopening found exactly the records left complete by the last kill.
        assert opened == total
        total, torn = _check_unmended(directory, last)
        assert total >= last + 1
        torn_seen += bool(torn)
        if torn_seen and round_ >= 2:
            break
    chunks = list_chunks(directory)
    assert len(chunks) >= 2, "the writer never rolled to a new chunk"
    for c in chunks[:-1]:
        assert chunk_bytes(directory, c).endswith(b"\n")

    async def reopen_and_append() -> None:
        async with TraceWriter(directory, chunk_bytes=CHUNK_BYTES, compress=False) as writer:
            recovery = writer.recovery
            assert recovery is not None
            assert recovery.records == writer.records == total
            assert recovery.torn_bytes == torn
            assert recovery.chunk == list_chunks(directory)[-1]
            row = await writer.append(helper.record(total), step=total)
            assert row.step == total

    anyio.run(reopen_and_append)
    _check_index(directory, total + 1)
    reader = TraceReader(directory)
    got = [value["n"] for value in reader]
    assert got == list(range(total + 1))
    assert reader.torn_tail_bytes == 0
    assert orjson.dumps(read_record(directory, -1)) == orjson.dumps(helper.record(total))
    for i in range(total + 1):
        row = read_row(directory, i)
        data = chunk_path(directory, row.chunk).read_bytes()[row.offset : row.end]
        assert data == orjson.dumps(helper.record(i)) + b"\n"
    assert os.path.getsize(chunk_path(directory, list_chunks(directory)[-1])) > 0


# -- killed while sealing ------------------------------------------------------------------

SEEDS = [1, 2, 3, 4]


def _mid_seal(directory: Path) -> bool:
    """Whether a seal is under way: a ``.zst.tmp`` file is being written."""
    try:
        return any(name.endswith(".zst.tmp") for name in os.listdir(directory))
    except FileNotFoundError:
        return False


def _renamed(directory: Path) -> bool:
    """Whether a seal is about to end: the sealed file is in place, the plain one is not yet
    unlinked (while the directory is fsynced)."""
    listing = scan(directory)
    return bool(set(listing.plain) & set(listing.sealed))


#: When to kill: "sealing" a few ms after a .zst.tmp file appears; "renamed" as soon as a
#: chunk is both plain and sealed (a window of a directory fsync: where fsync costs nothing,
#: as on tmpfs, it may never be seen, and the kill comes after 5 s); "random" a random delay
#: after a random number of appends.
KillAt = Literal["sealing", "renamed", "random"]


def _run_sealed_and_kill(directory: Path, rng: random.Random, at: KillAt) -> int:
    """Start the writer with sealing on and SIGKILL it ``at`` some moment; return the last n
    it printed (-1 when none)."""
    proc = subprocess.Popen(
        [sys.executable, str(HELPER), str(directory), str(CHUNK_BYTES), "sealed"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    lines: list[str] = []
    try:
        if at == "random":
            lines = _read_lines(proc, rng.randint(1, 12), timeout=60)
            time.sleep(rng.uniform(0, 0.25))
        else:
            seen = _mid_seal if at == "sealing" else _renamed
            start = time.monotonic()
            while not seen(directory):
                if proc.poll() is not None or time.monotonic() > start + 60:
                    pytest.fail(f"the writer never sealed a chunk (exit status {proc.poll()})")
                if at == "renamed" and time.monotonic() > start + 5:
                    break
                time.sleep(0.0002)
            if at == "sealing":
                time.sleep(rng.uniform(0, 0.003))
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.stdout is not None
        assert proc.stderr is not None
        words = " ".join(lines).split() + proc.stdout.read().decode().split()
        proc.stdout.close()
        err = proc.stderr.read().decode()
        proc.stderr.close()
    assert proc.returncode == -signal.SIGKILL, err
    # "open N", then the n of each append that returned.
    assert words[:1] == ["open"], words
    opened = int(words[1])
    printed = [int(x) for x in words[2:]]
    assert printed == list(range(opened, opened + len(printed))), words
    return printed[-1] if printed else opened - 1


def _reopen_and_append(directory: Path, count: int, torn: int) -> bool:
    """Reopen the killed stream (``count`` records, a torn tail of ``torn`` bytes), check
    what recovery settled, append ``record(count)`` and close (sealing the rest). Return
    whether the kill had cut a seal short."""
    before = scan(directory)
    pairs = sorted(set(before.plain) & set(before.sealed))
    for c in before.sealing:  # never renamed into place: the plain chunk is still there
        assert c in before.plain, before
    for c in pairs:  # renamed into place whole, the plain one not yet unlinked
        sealed = pyzstd.decompress(sealed_path(directory, c).read_bytes())
        assert sealed == chunk_path(directory, c).read_bytes(), c
    plain = set(before.plain) - set(pairs)
    last = before.chunks[-1]
    appends_in = last if last in plain else last + 1
    unsealed = sorted(plain - {appends_in})

    async def reopen() -> None:
        async with TraceWriter(directory, chunk_bytes=CHUNK_BYTES) as writer:
            recovery = writer.recovery
            assert recovery is not None
            assert recovery.records == writer.records == count
            assert recovery.torn_bytes == torn
            assert recovery.seals_undone == len(before.sealing)
            assert recovery.seals_finished == len(pairs)
            assert recovery.chunk == appends_in
            assert recovery.unsealed == unsealed
            # Settled before open() returned; only the chunks left plain are being sealed.
            now = scan(directory)
            assert set(now.sealing) <= set(unsealed), now
            assert set(now.plain) & set(now.sealed) <= set(unsealed), now
            row = await writer.append(helper.record(count), step=count)
            assert row.chunk >= appends_in  # or the next one, when it does not fit
            assert writer.seal_failures == set()
        assert writer.seal_failures == set()

    anyio.run(reopen)
    after = scan(directory)
    assert (after.plain, after.sealing) == ([], []), after  # every chunk sealed on close
    assert after.sealed == list(range(len(after.sealed)))
    return bool(before.sealing or pairs)


@pytest.mark.parametrize("seed", SEEDS)
def test_sigkill_while_sealing_loses_nothing_and_reopening_mends(tmp_path: Path, seed: int) -> None:
    """A writer with 8 MiB chunks is sealing one most of the time: SIGKILL it while a seal
    writes its .zst.tmp file, just after one renamed it into place, and at a random moment
    (then again mid-seal until a kill has cut a seal short); every record that completed
    reads back once, in order, intact, from plain and sealed chunks alike; reopening
    finishes or undoes the seal cut short, seals what was left plain, and appending goes
    on."""
    rng = random.Random(seed)
    directory = tmp_path / "stream"
    total = 0
    kills = cut_short = 0
    plan: list[KillAt] = ["sealing", "renamed", "random"]
    try:
        while kills < len(plan) or (not cut_short and kills < len(plan) + 3):
            at = plan[kills] if kills < len(plan) else "sealing"
            last = _run_sealed_and_kill(directory, rng, at)
            kills += 1
            count, torn = _check_unmended(directory, last)
            assert count >= total  # nothing from before is lost
            cut_short += _reopen_and_append(directory, count, torn)
            total = count + 1
            reader = TraceReader(directory)
            for n, value in enumerate(reader):
                assert orjson.dumps(value) == orjson.dumps(helper.record(n)), n
            assert reader.records == total
            assert (reader.skipped, reader.torn_tail_bytes) == (0, 0)
            _check_index(directory, total)
            for n in (0, total // 2, total - 1):
                assert read_record(directory, n)["n"] == n
        assert cut_short, f"none of {kills} kills came in the middle of a seal"
        assert len(list_chunks(directory)) >= 3
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # a few hundred MB
