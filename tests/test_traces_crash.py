"""A writer process killed with SIGKILL mid-append: the stream reads back every completed record,
intact and in order, never a torn one; reopening mends it and appending goes on."""

from __future__ import annotations

import importlib.util
import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType

import anyio
import orjson
import pytest

from monitors.traces import TraceReader, TraceWriter, read_record, read_row
from monitors.traces._layout import INDEX_NAME, ROW_BYTES, chunk_path, list_chunks

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
        [sys.executable, str(HELPER), str(directory), str(CHUNK_BYTES)],
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
    rows = (directory / INDEX_NAME).stat().st_size // ROW_BYTES
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
        assert chunk_path(directory, c).read_bytes().endswith(b"\n")

    async def reopen_and_append() -> None:
        async with TraceWriter(directory, chunk_bytes=CHUNK_BYTES) as writer:
            recovery = writer.recovery
            assert recovery is not None
            assert recovery.records == writer.records == total
            assert recovery.torn_bytes == torn
            assert recovery.chunk == list_chunks(directory)[-1]
            row = await writer.append(helper.record(total), step=total)
            assert row.step == total

    anyio.run(reopen_and_append)
    assert (directory / INDEX_NAME).stat().st_size == (total + 1) * ROW_BYTES
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
