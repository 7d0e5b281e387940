"""``nodewise traces upload RUN --run-id ID``: a finished or interrupted run's trace stream
sent to a real Prime Traces API server (``TracesServer``, its own process on 127.0.0.1) by
the command run as a user runs it (a subprocess), from real files: runs a ``FileMonitor``
wrote, and a stream laid out as prime-rl writes one (rows without ``length``, sealed
chunks)."""

from __future__ import annotations

import base64
import io
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from prime_rl_rules import write_prime_rl_stream
from prime_runs.sinks import stamp_run as sdk_stamp_run

from monitors.file import FileMonitor
from monitors.prime._backfill import Progress, make_plan, read_cursor
from monitors.prime._outbox import Cursor, cursor_path
from monitors.records import Kind
from monitors.testing import EpisodeMaker, TracesServer
from monitors.traces import read_records
from monitors.traces._layout import RUN_STREAM, chunk_path, index_path

ROOT = Path(__file__).resolve().parents[1]
KEY = "sk-nodewise-upload-test-9a8b7c"
RUN = "run-upload"
#: The console script, as a user runs it.
NODEWISE = Path(sys.executable).with_name("nodewise")
#: Seconds any one command may take before the test fails (none should come near it).
TIMEOUT = 120

#: An episode as logged: its step, kind and record.
Logged = tuple[int, Kind, dict[str, Any]]


@pytest.fixture(scope="module")
def running() -> Iterator[TracesServer]:
    with TracesServer(api_key=KEY, keep_lines=True) as server:
        yield server


@pytest.fixture
def server(running: TracesServer) -> TracesServer:
    if not running.running:  # a test stopped it (an outage) and failed before starting it
        running.start()
    running.reset(faults=True)
    return running


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home of the test's own: no ``~/.prime/config.json`` is read."""
    path = tmp_path / "home"
    path.mkdir()
    return path


def environment(server: TracesServer, home: Path, *, key: str = KEY) -> dict[str, str]:
    """The command's environment: no Prime setting but the key and the server's URL."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("PRIME_") and name != "RUN_ID"
    }
    return {
        **env,
        "HOME": str(home),
        "PYTHONPATH": str(ROOT),
        "PRIME_API_KEY": key,
        "PRIME_TRACES_URL": server.url,
    }


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: str


def upload(env: dict[str, str], run: Path, *args: str, console: bool = False) -> Ran:
    """``python -m monitors.traces upload RUN --run-id RUN ARGS`` (or the console script)."""
    command = [str(NODEWISE), "traces"] if console else [sys.executable, "-m", "monitors.traces"]
    done = subprocess.run(
        [*command, "upload", str(run), "--run-id", RUN, *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return Ran(done.returncode, done.stdout, done.stderr)


@contextmanager
def started(env: dict[str, str], run: Path) -> Iterator[subprocess.Popen[str]]:
    """The upload running in its own process (killed if the test leaves it running)."""
    with subprocess.Popen(
        [sys.executable, "-m", "monitors.traces", "upload", str(run), "--run-id", RUN],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as proc:
        try:
            yield proc
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()


def episode(i: int, size: int = 16_000) -> dict[str, Any]:
    return EpisodeMaker(seed=i).episode(size, index=i).to_record()


def mixed(n: int, *, per_step: int = 3) -> list[Logged]:
    """``n`` episodes (step, kind, record), a few to a step, every fifth an eval."""
    return [
        (i // per_step, "eval" if i % 5 == 4 else "train", episode(i, 16_000 + 700 * (i % 9)))
        for i in range(n)
    ]


def write_run(run: Path, episodes: list[Logged], **kwargs: Any) -> None:
    """A run directory holding ``episodes``, written by FileMonitor."""

    async def write() -> None:
        async with FileMonitor(run, **kwargs) as files:
            for step, kind, record in episodes:
                await files.log_episodes([record], step=step, kind=kind, subset="all")

    anyio.run(write)


def rows(run: Path) -> list[dict[str, Any]]:
    return [orjson.loads(r) for r in index_path(run / RUN_STREAM).read_bytes().splitlines()]


def expected_lines(run: Path, kind: str | None = None) -> list[bytes]:
    """Each record of the run's stream (of ``kind``) as the service must store it: stamped
    by prime-runs' own ``stamp_run`` (its kind from its row, as the upload takes it), in
    stream order."""
    out = []
    for row, record in zip(rows(run), read_records(run), strict=True):
        row_kind = "eval" if row.get("kind") == "eval" else "train"
        if kind is None or row_kind == kind:
            out.append(orjson.dumps(sdk_stamp_run(record, RUN, row_kind)))
    return out


def ids_once(server: TracesServer, n: int) -> None:
    stats = server.stats()
    assert stats["unique_ids"] == n, stats
    assert stats["duplicate_ids"] == 0, stats


def cursor(run: Path) -> Cursor:
    found = Cursor(cursor_path(run / RUN_STREAM, RUN), RUN)
    assert found.read() is None
    return found


def field(out: str, label: str) -> str:
    """The value the summary gives ``label`` (its line starts with it)."""
    for line in out.splitlines():
        if line.startswith(label + " ") and line[len(label) :].strip():
            return line[len(label) :].strip()
    raise AssertionError(f"no {label!r} line in:\n{out}")


# -- uploads -------------------------------------------------------------------------------


def test_every_record_is_stored_once_stamped_and_a_second_run_sends_nothing(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    write_run(run, mixed(26))
    env = environment(server, home)

    first = upload(env, run)
    assert first.code == 0, first
    assert sorted(server.lines()) == sorted(expected_lines(run))  # batches land in any order
    ids_once(server, 26)
    assert field(first.out, "to upload").startswith("26 records")
    assert field(first.out, "delivered") == "26"
    assert field(first.out, "pending") == "0"
    assert field(first.out, "earlier runs") == "none"
    assert (cursor(run).ranges(), cursor(run).delivered) == ([(1, 26)], 26)

    requests = server.stats()["requests_total"]
    again = upload(env, run)
    assert again.code == 0, again
    assert "nothing to upload" in again.out
    assert field(again.out, "earlier runs") == "26 delivered, 0 lost"
    assert server.stats()["requests_total"] == requests
    assert again.err == ""  # no progress: there was nothing to do


def test_records_a_crash_left_without_rows_are_named_and_sent_once_their_rows_are_rebuilt(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    """An interrupted run whose last records were written but their rows were not (the
    index cut back, as a kill between a record and its row leaves it): the upload sends what
    the index names, says how much it could not find and exits 1; once the run goes on (a
    FileMonitor's next append rebuilds the rows), the same command sends the rest, each
    once."""
    run = tmp_path / "run"
    write_run(run, mixed(8, per_step=8))
    index = index_path(run / RUN_STREAM)
    whole = index.read_bytes().splitlines(keepends=True)
    index.write_bytes(b"".join(whole[:5]))
    env = environment(server, home)
    first = upload(env, run)
    assert first.code == 1, first
    assert "past the index's last row" in first.out, first.out
    assert field(first.out, "delivered") == "5"
    ids_once(server, 5)
    write_run(run, [(1, "train", episode(100))])  # the run goes on: the rows are rebuilt
    assert index.read_bytes().count(b"\n") == 9
    second = upload(env, run)
    assert second.code == 0, second
    assert "past the index's last row" not in second.out
    ids_once(server, 9)
    assert sorted(server.lines()) == sorted(expected_lines(run))


def test_progress_is_a_plain_line_on_stderr_when_it_is_not_a_terminal(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    """Not a terminal: a line at the start and one at the end (and one every 10 s between),
    never a bar redrawn with ``\\r``; bytes of the stream's lines, records, MB/s."""
    run = tmp_path / "run"
    write_run(run, mixed(9))
    total = sum(row["length"] for row in rows(run))
    ran = upload(environment(server, home), run)
    assert ran.code == 0, ran
    lines = ran.err.splitlines()
    assert "\r" not in ran.err
    assert lines[0].startswith("upload: 0.0%, 0 B / "), lines
    assert ", 0 / 9 records, " in lines[0]
    assert lines[-1].startswith("upload: 100.0%, "), lines
    assert ", 9 / 9 records, " in lines[-1]
    assert lines[-1].endswith(" MB/s")
    assert f"{total / 1e3:.1f} kB / {total / 1e3:.1f} kB" in lines[-1]
    assert len(lines) == 2


def test_on_a_terminal_the_bar_is_redrawn_in_place_at_most_five_times_a_second() -> None:
    out = io.StringIO()
    progress = Progress(100, 10_000_000, label="upload", out=out, live=True)
    began = time.monotonic()
    n = 0
    while time.monotonic() - began < 1.0:
        n += 1
        progress.show(min(n, 100), min(n, 100) * 100_000)
        time.sleep(0.005)
    progress.close(100, 10_000_000)
    text = out.getvalue()
    draws = text.count("\r")
    assert n > 50
    assert 2 <= draws <= 7, text  # 1 s at most 5 a second, the first and the last
    assert text.endswith("\n")
    assert "[########################] 100.0% 10.0 MB / 10.0 MB, 100 / 100 records" in text


def test_kind_eval_uploads_only_evals_and_a_later_run_the_rest_with_no_duplicates(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    episodes = mixed(20)
    write_run(run, episodes)
    env = environment(server, home)
    n_eval = sum(kind == "eval" for _, kind, _ in episodes)

    evals = upload(env, run, "--kind", "eval")
    assert evals.code == 0, evals
    assert sorted(server.lines()) == sorted(expected_lines(run, "eval"))
    assert field(evals.out, "to upload").startswith(f"{n_eval} records, ")
    assert field(evals.out, "delivered") == str(n_eval)
    assert field(evals.out, "pending") == "0"

    rest = upload(env, run)
    assert rest.code == 0, rest
    assert field(rest.out, "to upload").startswith(f"{20 - n_eval} records, ")
    assert field(rest.out, "delivered") == str(20 - n_eval)
    assert field(rest.out, "earlier runs") == f"{n_eval} delivered, 0 lost"
    assert sorted(server.lines()[n_eval:]) == sorted(expected_lines(run, "train"))
    assert sorted(server.lines()) == sorted(expected_lines(run))
    ids_once(server, 20)


def test_a_prime_rl_stream_with_sealed_chunks_is_uploaded_whole(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    """prime-rl's rows have no ``length``: the totals take each line to the next row's
    offset, or to its chunk's end (sealed or plain), which is exact."""
    run = tmp_path / "run"
    (run / "monitors").mkdir(parents=True)
    records = [episode(i, 16_000 + 3000 * (i % 4)) for i in range(14)]
    stream = write_prime_rl_stream(run, records, chunk_bytes=60_000, seal_upto=3)
    assert list(stream.glob("*.zst")), "some chunks sealed"
    assert list(stream.glob("*.jsonl")), "the last one plain"
    assert all("length" not in row for row in rows(run))
    lines = [orjson.dumps(r, default=str) + b"\n" for r in records]
    plan = make_plan(stream, read_cursor(stream, RUN)[0], kind=None)
    assert (plan.records, plan.bytes, plan.inferred) == (14, sum(map(len, lines)), 14)

    ran = upload(environment(server, home), run)
    assert ran.code == 0, ran
    assert sorted(server.lines()) == sorted(expected_lines(run))  # batches land in any order
    ids_once(server, 14)
    assert "14 sized by their rows' offsets" in field(ran.out, "to upload")


# -- stopping and going on -----------------------------------------------------------------


def wait_for(check: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_ctrl_c_exits_130_leaves_a_cursor_and_a_rerun_stores_every_record_once(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    """SIGINT while the service holds answers (batches it stored, unconfirmed): the command
    stops at once, saying what is left and how to go on; run again, it sends what was never
    confirmed under the same keys, and the service keeps one copy."""
    run = tmp_path / "run"
    write_run(run, mixed(40, per_step=1))
    env = environment(server, home)
    server.set_faults(latency=0.2)
    with started(env, run) as proc:
        path = cursor_path(run / RUN_STREAM, RUN)

        def some_confirmed() -> bool:
            found = Cursor(path, RUN)
            return path.is_file() and found.read() is None and found.delivered > 0

        wait_for(some_confirmed, "a first batch confirmed")
        server.set_faults(hold=True)
        wait_for(lambda: server.stats()["in_flight"] > 0, "a request held")
        time.sleep(0.5)  # past the latency: the held batches are stored, not answered
        proc.send_signal(signal.SIGINT)
        sent = time.monotonic()
        out, err = proc.communicate(timeout=TIMEOUT)
        took = time.monotonic() - sent
    assert proc.returncode == 130, (out, err)
    assert took < 10, took
    assert "Traceback" not in err, err
    assert f"go on with: python -m monitors.traces upload {run} --run-id {RUN}" in err
    saved = cursor(run)
    assert 0 < saved.delivered < 40
    left = int(field(out, "pending"))
    assert left == 40 - saved.delivered, out

    server.set_faults(hold=False, latency=0.0)
    again = upload(env, run)
    assert again.code == 0, again
    assert field(again.out, "delivered") == str(left)
    assert field(again.out, "earlier runs") == f"{saved.delivered} delivered, 0 lost"
    ids_once(server, 40)
    assert server.stats()["replays"] >= 1  # a held batch, sent again under its key
    assert sorted(server.lines()) == sorted(expected_lines(run))
    assert (cursor(run).ranges(), cursor(run).delivered) == ([(1, 40)], 40)


def test_sigterm_stops_it_too_with_status_143_and_nothing_is_lost(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    write_run(run, mixed(6))
    env = environment(server, home)
    server.set_faults(hold=True)
    with started(env, run) as proc:
        wait_for(lambda: server.stats()["in_flight"] > 0, "a request held")
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 143, (out, err)
    assert "stopped by SIGTERM: 6 records left" in err
    assert field(out, "pending") == "6"
    assert cursor(run).ranges() == []  # saved, with nothing answered
    server.set_faults(hold=False)
    again = upload(env, run)
    assert again.code == 0, again
    ids_once(server, 6)


def test_an_outage_is_waited_out_and_the_progress_says_so(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    write_run(run, mixed(8))
    env = environment(server, home)
    server.stop()  # the port is kept: the command sees "connection refused"
    err_lines: list[str] = []
    with started(env, run) as proc:
        assert proc.stderr is not None
        reader = threading.Thread(target=lambda: err_lines.extend(proc.stderr or []), daemon=True)
        reader.start()
        wait_for(lambda: any("; waiting: 127.0.0.1:" in line for line in err_lines), "waiting")
        time.sleep(1.0)
        assert proc.poll() is None, "it waits, it does not give up"
        server.start()
        assert proc.stdout is not None
        out = proc.stdout.read()
        proc.wait(timeout=TIMEOUT)
        reader.join(timeout=TIMEOUT)
    assert proc.returncode == 0, (out, err_lines)
    assert field(out, "delivered") == "8"
    waiting = next(line for line in err_lines if "waiting:" in line)
    assert "not answering" in waiting
    # Each batch retried on its own backoff: stored in the order the retries came.
    assert sorted(server.lines()) == sorted(expected_lines(run))
    ids_once(server, 8)


def test_a_wrong_key_ends_promptly_naming_the_settings_and_leaves_everything_pending(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    write_run(run, mixed(10))
    began = time.monotonic()
    ran = upload(environment(server, home, key="sk-not-the-key"), run)
    assert time.monotonic() - began < 30
    assert ran.code == 1, ran
    last = ran.err.splitlines()[-1]
    assert last.startswith("python -m monitors.traces upload: the Prime API refused the cred")
    assert "HTTP 401" in last
    assert "PRIME_API_KEY" in last
    assert "PRIME_TEAM_ID" in last
    assert (
        f"10 records stay pending: once fixed, go on with: python -m monitors.traces upload {run} --run-id {RUN}"
        in last
    )
    assert "sk-not-the-key" not in ran.err + ran.out
    assert field(ran.out, "pending") == "10"
    assert server.stats()["lines_stored"] == 0
    assert cursor(run).ranges() == []

    fixed = upload(environment(server, home), run)
    assert fixed.code == 0, fixed
    ids_once(server, 10)


# -- losses --------------------------------------------------------------------------------


def test_a_record_the_service_rejects_is_summed_under_its_code_and_exits_1(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    episodes = mixed(12, per_step=12)
    write_run(run, episodes)
    bad = episodes[7][2]["id"]
    server.set_faults(reject_ids={bad: "invalid_trace"})
    env = environment(server, home)

    ran = upload(env, run)
    assert ran.code == 1, ran
    assert field(ran.out, "delivered") == "11"
    assert field(ran.out, "rejected:invalid_trace") == "1"
    assert field(ran.out, "too large") == "0"
    assert field(ran.out, "damaged") == "0"
    assert field(ran.out, "pending") == "0"
    ids_once(server, 11)
    assert bad.encode() not in b"".join(server.lines())

    again = upload(env, run)  # nothing left, but the upload lost one: still 1
    assert again.code == 1, again
    assert "nothing to upload" in again.out
    assert field(again.out, "earlier runs") == ("11 delivered, 1 lost (rejected:invalid_trace 1)")


def refused_run(run: Path) -> dict[str, int]:
    """A run whose records include some the service would refuse; their lines by reason."""
    episodes: list[Logged] = [(step, "train", episode(step)) for step in range(6)]
    specials: dict[str, dict[str, Any]] = {
        # 65 MiB of text: over the 64 MiB line cap.
        "too_large": {"id": "huge", "traces": [], "text": "x" * (65 << 20)},
        # An episode whose id is over 256 characters: the service's contract refuses it.
        "rejected:episode_id_too_long": {"id": "e" * 300, "traces": []},
        # Not JSON deep inside (a byte changed below): the stamp passes over it, the
        # service's parser does not.
        "rejected:invalid_trace": {"id": "broken", "traces": [], "meta": {"flag": True}},
        # Its brackets do not match (its last byte changed below): the stamp finds it.
        "damaged_record": {"id": "damaged", "traces": []},
    }
    lines: dict[str, int] = {}
    for reason, record in specials.items():
        episodes.append((len(episodes), "train", record))
        lines[reason] = len(episodes)
    episodes.append((len(episodes), "eval", episode(99)))
    write_run(run, episodes, compress=False)
    for reason in ("rejected:invalid_trace", "damaged_record"):
        row = rows(run)[lines[reason] - 1]
        chunk = chunk_path(run / RUN_STREAM, row["chunk"])
        data = bytearray(chunk.read_bytes())
        end = row["offset"] + row["length"] - 1  # the newline
        if reason == "damaged_record":
            assert data[end - 1 : end + 1] == b"}\n"
            data[end - 1] = ord("]")
        else:
            at = data.index(b"true", row["offset"], end)
            data[at : at + 4] = b"tru!"
        chunk.write_bytes(bytes(data))
    return lines


def test_dry_run_sends_nothing_and_names_what_the_upload_would_lose(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    """The dry run's verdicts are the upload's: the same records, under the same reasons."""
    run = tmp_path / "run"
    lines = refused_run(run)
    # Random bytes as base64: a line under 64 MiB whose gzip still passes the 32 MiB request cap.
    noise = base64.b64encode(os.urandom(36 << 20)).decode()  # line 12, 48 MiB
    write_run(run, [(20, "train", {"id": "noise", "traces": [], "noise": noise})], compress=False)
    del noise
    env = environment(server, home)

    dry = upload(env, run, "--dry-run")
    assert dry.code == 1, dry
    assert server.stats()["requests_total"] == 0
    assert not cursor_path(run / RUN_STREAM, RUN).exists()
    assert field(dry.out, "ok") == "7"
    big = lines["too_large"]
    size = len(orjson.dumps({"id": "huge", "traces": [], "text": ""})) + (65 << 20)
    assert field(dry.out, "too_large") == (
        f"2  lines {big}, 12 (first: line {big} is {size} bytes, over 67108864)"
    )
    long_id = lines["rejected:episode_id_too_long"]
    assert field(dry.out, "rejected:episode_id_too_long") == (
        f"1  lines {long_id} (first: line {long_id}: episode id over 256 characters)"
    )
    broken = field(dry.out, "rejected:invalid_trace")
    assert broken.startswith(f"1  lines {lines['rejected:invalid_trace']} (first: line "), broken
    assert "is not JSON" in broken
    damaged = field(dry.out, "damaged_record")
    assert damaged.startswith(f"1  lines {lines['damaged_record']} (first: line "), damaged
    assert "not one JSON value" in damaged

    real = upload(env, run)
    assert real.code == 1, real
    assert field(real.out, "delivered") == "7"
    assert field(real.out, "too large") == "2"
    assert field(real.out, "rejected:episode_id_too_long") == "1"
    assert field(real.out, "rejected:invalid_trace") == "1"
    assert field(real.out, "damaged") == "1"
    assert field(real.out, "pending") == "0"
    ids_once(server, 7)


def test_dry_run_of_a_sound_run_exits_0_and_checks_only_what_is_left(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    write_run(run, mixed(10))
    env = environment(server, home)
    dry = upload(env, run, "--dry-run", "--kind", "eval")
    assert dry.code == 0, dry
    assert field(dry.out, "ok") == "2"
    assert "check: 100.0%" in dry.err
    assert upload(env, run, "--kind", "eval").code == 0
    again = upload(env, run, "--dry-run")
    assert again.code == 0, again
    assert again.out.startswith("dry run: 8 records of ")
    assert field(again.out, "earlier runs") == "2 delivered, 0 lost"
    assert server.stats()["lines_stored"] == 2


# -- what it refuses to start with ---------------------------------------------------------


def test_no_run_no_stream_no_index_or_no_key_is_one_line_and_exit_1(
    server: TracesServer, home: Path, tmp_path: Path
) -> None:
    env = environment(server, home)
    missing = upload(env, tmp_path / "missing", console=True)
    assert missing.code == 1
    assert missing.err.splitlines() == [
        f"nodewise traces upload: {tmp_path / 'missing'} does not exist: give a run's "
        "directory or a trace stream's (RUN/monitors/file/traces/stream)"
    ]
    empty = tmp_path / "empty"
    empty.mkdir()
    ran = upload(env, empty)
    assert ran.code == 1
    assert ran.err.splitlines() == [
        f"python -m monitors.traces upload: {empty} is empty: not a run or a trace stream "
        "(a stream's directory holds 00000.jsonl or 00000.jsonl.zst, its index beside it)"
    ]

    run = tmp_path / "run"
    write_run(run, mixed(3))
    index_path(run / RUN_STREAM).rename(tmp_path / "index")
    ran = upload(env, run)
    assert ran.code == 1
    [line] = ran.err.splitlines()
    assert f"has no index ({index_path(run / RUN_STREAM)} is missing)" in line
    (tmp_path / "index").rename(index_path(run / RUN_STREAM))

    keyless = {k: v for k, v in env.items() if k != "PRIME_API_KEY"}
    ran = upload(keyless, run)
    assert ran.code == 1
    [line] = ran.err.splitlines()
    assert "no Prime API key" in line
    assert "PRIME_API_KEY" in line
    assert server.stats()["requests_total"] == 0

    usage = upload(env, run, "--kind", "test")
    assert usage.code == 2
