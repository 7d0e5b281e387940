"""PrimeMonitor's outbox mode: a run's trace stream uploaded from the disk, against a real
Prime Traces API server (``TracesServer``, its own process on 127.0.0.1) and real files."""

from __future__ import annotations

import errno
import logging
import os
import resource
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from prime_rl_rules import write_prime_rl_stream
from prime_runs.sinks import stamp_run as sdk_stamp_run

from monitors import FileMonitor, Monitors, PrimeMonitor, UploadError
from monitors.prime import _outbox
from monitors.prime._outbox import Cursor, Tail, cursor_path, known_run_ids
from monitors.testing import EpisodeMaker, TracesServer
from monitors.traces import read_records
from monitors.traces._layout import RUN_STREAM, encode_row, index_path

KEY = "sk-nodewise-outbox-test-1f2e3d"
RUN = "run-outbox"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def running() -> Iterator[TracesServer]:
    with TracesServer(api_key=KEY, keep_lines=True) as server:
        yield server


@pytest.fixture
def server(running: TracesServer) -> TracesServer:
    if not running.running:
        running.start()
    running.reset(faults=True)
    return running


@pytest.fixture(autouse=True)
def no_prime_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("PRIME_API_KEY", "PRIME_TRACES_URL", "PRIME_TEAM_ID", "RUN_ID"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))


def outbox(server: TracesServer, run: Path, **kwargs: Any) -> PrimeMonitor:
    options: dict[str, Any] = {
        "api_key": KEY,
        "traces_url": server.url,
        "base_url": server.url,
        "run_id": RUN,
        "retry_base": 0.01,
        "batch_bytes": 64 * 1024,
        "drain_timeout": 20.0,
        "outbox": run,
        **kwargs,
    }
    return PrimeMonitor(**options)


def episode(i: int, size: int = 20_000) -> dict[str, Any]:
    return EpisodeMaker(seed=i).episode(size, index=i).to_record()


async def write_run(run: Path, episodes: list[tuple[int, str, dict[str, Any]]]) -> None:
    """A run directory holding ``episodes`` ((step, kind, record)), written by FileMonitor."""
    async with FileMonitor(run) as files:
        for step, kind, record in episodes:
            await files.log_episodes([record], step=step, kind=kind, subset="all")


def expected_lines(run: Path, run_id: str = RUN) -> list[bytes]:
    """Each record of the run's stream as the service must store it: stamped by prime-runs'
    own ``stamp_run`` (its kind from its row), in stream order."""
    rows = [orjson.loads(r) for r in index_path(run / RUN_STREAM).read_bytes().splitlines()]
    records = list(read_records(run))
    return [
        orjson.dumps(sdk_stamp_run(record, run_id, row["kind"]))
        for row, record in zip(rows, records, strict=True)
    ]


def ids_once(server: TracesServer, n: int) -> None:
    stats = server.stats()
    assert stats["unique_ids"] == n, stats
    assert stats["duplicate_ids"] == 0, stats


def mixed(n: int, per_step: int = 3, start: int = 0) -> list[tuple[int, str, dict[str, Any]]]:
    """``n`` small episodes (ids of their own from ``start``), a few to a step, some eval."""
    return [
        (i // per_step, "eval" if i % 5 == 4 else "train", episode(i, 16_000 + 3_000 * (i % 7)))
        for i in range(start, start + n)
    ]


# -- the cursor and the index's tail ------------------------------------------------------


def test_cursor_ranges_merge_and_answer_lookups(tmp_path: Path) -> None:
    cursor = Cursor(tmp_path / "c.json", RUN)
    for first, last in [(5, 7), (1, 2), (9, 9), (3, 4), (8, 8), (20, 30), (12, 12)]:
        cursor.settle(first, last, delivered=last - first + 1, lost={})
    assert cursor.ranges() == [(1, 9), (12, 12), (20, 30)]
    assert [cursor.settled_through(n) for n in (1, 9, 10, 12, 13, 19, 25, 31)] == [
        9,
        9,
        None,
        12,
        None,
        None,
        30,
        None,
    ]
    cursor.settle(10, 11, delivered=1, lost={"rejected:invalid_trace": 1})
    assert cursor.ranges() == [(1, 12), (20, 30)]


def test_cursor_round_trips_and_a_damaged_one_is_named(tmp_path: Path) -> None:
    path = tmp_path / "uploads" / "c.json"
    path.parent.mkdir()
    cursor = Cursor(path, RUN)
    cursor.settle(1, 4, delivered=3, lost={"too_large": 1})
    cursor.save()
    again = Cursor(path, RUN)
    assert again.read() is None
    assert (again.ranges(), again.delivered, dict(again.lost)) == ([(1, 4)], 3, {"too_large": 1})
    assert not list(path.parent.glob("*.tmp"))
    for damage in (b'{"version": 1, "run_id": "run-outbox", "settl', b"", b"[]", b"\x00" * 9):
        path.write_bytes(damage)
        torn = Cursor(path, RUN)
        problem = torn.read()
        assert problem is not None
        assert str(path) in problem
        assert torn.ranges() == []
    cursor.save()
    other = Cursor(path, "another-run")
    assert other.read() is not None  # another run's cursor is never taken for this one


def test_one_uploader_per_cursor(tmp_path: Path) -> None:
    first = Cursor(tmp_path / "u" / "c.json", RUN)
    first.lock()
    second = Cursor(tmp_path / "u" / "c.json", RUN)
    with pytest.raises(UploadError, match="another uploader"):
        second.lock()
    first.unlock()
    second.lock()
    second.unlock()


def test_cursor_names_and_known_runs(tmp_path: Path) -> None:
    stream = tmp_path / "stream"
    assert known_run_ids(stream) == []
    for run_id in ("plain", "with/slash and space", "ünï"):
        path = cursor_path(stream, run_id)
        assert path.parent == tmp_path / "stream.uploads"
        path.parent.mkdir(exist_ok=True)
        Cursor(path, run_id).save()
    assert sorted(known_run_ids(stream)) == sorted(["plain", "with/slash and space", "ünï"])


def test_tail_takes_whole_rows_once(tmp_path: Path) -> None:
    stream = tmp_path / "stream"
    index = index_path(stream)
    tail = Tail(stream)
    assert tail.read() == []  # no index yet
    rows = [
        encode_row({"line": n, "chunk": 0, "offset": 10 * n, "kind": "train"}) for n in (1, 2, 3, 4)
    ]
    index.write_bytes(rows[0] + rows[1][:7])  # the second row half written
    assert [r.line for r in tail.read()] == [1]
    with index.open("ab") as f:
        f.write(rows[1][7:] + rows[2])
    assert [r.line for r in tail.read()] == [2, 3]
    assert tail.read() == []
    # Rewritten (a writer's recovery), with a damaged row: read again, taken rows passed
    # over, and the row no readable line names is reported, not passed over silently.
    replacement = index.with_name("new")
    replacement.write_bytes(rows[0] + rows[1] + rows[2] + b'{"garbage\n' + rows[3])
    os.replace(replacement, index)
    assert [r.line for r in tail.read()] == [4]
    assert tail.skipped == []
    index.write_bytes(rows[0] + b"not a row\n" + rows[2])  # cut shorter than what was read
    tail = Tail(stream)
    assert [r.line for r in tail.read()] == [1, 3]
    assert tail.skipped == [(2, 2)]


# -- uploads ------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_file_monitors_run_is_uploaded_from_the_disk_once(
    server: TracesServer, tmp_path: Path
) -> None:
    """Monitors(FileMonitor, PrimeMonitor(outbox)): every record of the stream is stored
    once, stamped as prime-runs stamps it; a second monitor finds nothing
    left to send."""
    run = tmp_path / "run"
    prime = outbox(server, run)
    episodes = mixed(23)
    async with Monitors(FileMonitor(run), prime) as both:
        for step, kind, record in episodes:
            await both.log_episodes([record], step=step, kind=kind, subset="all")
    stats = prime.stats()
    assert (stats.submitted, stats.delivered, stats.pending, dict(stats.lost)) == (23, 23, 0, {})
    assert sorted(server.lines()) == sorted(expected_lines(run))  # batches land in any order
    ids_once(server, 23)
    rows = [orjson.loads(r) for r in index_path(run / RUN_STREAM).read_bytes().splitlines()]
    assert prime.settled_bytes == sum(row["length"] for row in rows)  # the stream's bytes
    requests = server.stats()["requests_total"]
    # Batches hold lines of one step and kind: the service's context says which.
    for request in server.requests():
        assert request["status"] == 200
    cursor = Cursor(cursor_path(run / RUN_STREAM, RUN), RUN)
    assert cursor.read() is None
    assert (cursor.ranges(), cursor.delivered) == ([(1, 23)], 23)

    again = outbox(server, run)
    async with again:
        pass
    assert again.stats().submitted == 0
    assert server.stats()["requests_total"] == requests


@pytest.mark.anyio
async def test_batches_are_the_streams_consecutive_lines_of_one_step_and_kind(
    server: TracesServer, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    episodes = mixed(17, per_step=4)
    await write_run(run, episodes)
    async with outbox(server, run, batch_bytes=1 << 20):
        pass
    assert sorted(server.lines()) == sorted(expected_lines(run))  # batches land in any order
    # Grouping the stream into runs of one (step, kind) gives exactly the batches sent.
    groups: list[tuple[int, str]] = []
    for step, kind, _ in episodes:
        if not groups or groups[-1] != (step, kind):
            groups.append((step, kind))
    contexts = [r["metadata"]["context"] for r in server.requests() if r["metadata"]]
    sent = sorted((c["first_step"], c["step"], c["run_type"]) for c in contexts)
    assert sent == sorted((str(step), str(step), kind) for step, kind in groups)
    assert server.stats()["uploads"] == len(groups)


@pytest.mark.anyio
async def test_a_prime_rl_stream_with_sealed_chunks_is_uploaded_whole(
    server: TracesServer, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    stream = run / RUN_STREAM
    (run / "monitors").mkdir(parents=True)
    records = [episode(i, 16_000) for i in range(12)]
    write_prime_rl_stream(run, records, chunk_bytes=60_000, seal_upto=2)
    assert list(stream.glob("*.zst")), "some chunks sealed"
    async with outbox(server, run) as prime:
        pass
    assert prime.stats().delivered == 12
    assert sorted(server.lines()) == sorted(expected_lines(run))  # batches land in any order
    # prime-rl's rows name no step: the batches' context says none (never "None").
    contexts = [r["metadata"]["context"] for r in server.requests() if r["metadata"]]
    assert contexts
    assert all("step" not in c and c["run_type"] == "train" for c in contexts), contexts


@pytest.mark.anyio
async def test_outbox_kind_uploads_one_kind_and_a_later_run_the_rest(
    server: TracesServer, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    episodes = mixed(15)
    await write_run(run, episodes)
    async with outbox(server, run, outbox_kind="eval") as evals:
        pass
    n_eval = sum(kind == "eval" for _, kind, _ in episodes)
    assert evals.stats().delivered == n_eval
    assert all(orjson.loads(line)["run"]["type"] == "eval" for line in server.lines())
    async with outbox(server, run) as rest:
        pass
    assert rest.stats().delivered == 15 - n_eval
    assert sorted(server.lines()) == sorted(expected_lines(run))
    ids_once(server, 15)


@pytest.mark.anyio
async def test_a_rejected_record_alone_is_lost_with_its_code_and_never_sent_again(
    server: TracesServer, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    episodes = mixed(12, per_step=12)
    await write_run(run, episodes)
    bad = episodes[5][2]["id"]
    server.set_faults(reject_ids={bad: "invalid_trace"})
    async with outbox(server, run, batch_bytes=1 << 20) as prime:
        pass
    stats = prime.stats()
    assert (stats.delivered, dict(stats.lost), stats.pending) == (
        11,
        {"rejected:invalid_trace": 1},
        0,
    )
    ids_once(server, 11)
    cursor = Cursor(cursor_path(run / RUN_STREAM, RUN), RUN)
    cursor.read()
    assert (cursor.ranges(), dict(cursor.lost)) == ([(1, 12)], {"rejected:invalid_trace": 1})
    before = server.stats()["requests_total"]
    async with outbox(server, run) as again:
        pass
    assert again.stats().submitted == 0
    assert server.stats()["requests_total"] == before


@pytest.mark.anyio
async def test_what_finalize_leaves_waits_on_the_disk_and_a_restart_sends_it_once(
    server: TracesServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The service down: finalize counts everything ``pending`` (none lost), names it and
    the command; back up, the next monitor sends it, and batches that reached the service
    before are answered from its store (same bytes, same keys)."""
    run = tmp_path / "run"
    await write_run(run, mixed(9))
    first = outbox(server, run, drain_timeout=0.5)
    server.stop()
    caplog.set_level(logging.WARNING, logger="monitors.prime")
    async with first:
        pass
    stats = first.stats()
    assert (stats.submitted, stats.delivered, stats.pending, dict(stats.lost)) == (9, 0, 9, {})
    assert f"nodewise traces upload {run} --run-id {RUN}" in caplog.text
    server.start()
    server.reset(faults=True)
    async with outbox(server, run) as second:
        pass
    assert second.stats().delivered == 9
    ids_once(server, 9)


@pytest.mark.anyio
async def test_a_batch_stored_but_never_confirmed_is_sent_again_under_its_key(
    server: TracesServer, tmp_path: Path
) -> None:
    """The service stores a batch and the answer is lost; the monitor stops before a retry
    is answered. The next monitor sends the same bytes under the same key: a replay."""
    run = tmp_path / "run"
    await write_run(run, mixed(6, per_step=6))
    server.set_faults(hold=True)  # stored, and the answer held back
    async with outbox(server, run, drain_timeout=0.5, batch_bytes=1 << 20) as first:
        pass
    assert (first.stats().pending, first.stats().delivered) == (6, 0)
    assert server.stats()["uploads"] == 3  # train 1-4, eval 5, train 6: all stored
    server.set_faults(hold=False)
    async with outbox(server, run, batch_bytes=1 << 20) as second:
        pass
    assert second.stats().delivered == 6
    stats = server.stats()
    assert (stats["uploads"], stats["replays"]) == (3, 3)
    ids_once(server, 6)
    assert sorted(server.lines()) == sorted(expected_lines(run))  # batches land in any order


@pytest.mark.anyio
@pytest.mark.parametrize("damage", ["torn", "deleted"])
async def test_a_lost_cursor_resumes_from_the_services_answers(
    server: TracesServer, tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    """Cursor torn or deleted: every record is sent again, each batch under the key it had,
    so the service answers from its store and keeps one copy; a torn cursor is named."""
    run = tmp_path / "run"
    await write_run(run, mixed(14))
    async with outbox(server, run):
        pass
    ids_once(server, 14)
    uploads = server.stats()["uploads"]
    path = cursor_path(run / RUN_STREAM, RUN)
    if damage == "torn":
        path.write_bytes(path.read_bytes()[:17])
    else:
        path.unlink()
    caplog.set_level(logging.WARNING, logger="monitors.prime")
    async with outbox(server, run) as again:
        pass
    assert again.stats().delivered == 14
    stats = server.stats()
    assert stats["uploads"] == uploads  # nothing new stored
    assert stats["replays"] == uploads  # every batch answered from the store
    ids_once(server, 14)
    if damage == "torn":
        assert f"{path} is damaged" in caplog.text


@pytest.mark.anyio
async def test_an_outage_longer_than_the_memory_bound_loses_nothing_and_memory_stays_flat(
    server: TracesServer, tmp_path: Path
) -> None:
    """40 MB of episodes logged while the service is down, with queue_bytes at 4 MiB: an
    in-memory monitor drops most of them as queue_full; the outbox keeps them on the disk,
    holds at most queue_bytes, and sends all once the service is back."""
    run = tmp_path / "run"
    episodes = [EpisodeMaker(seed=i).episode(1_000_000, index=i).to_record() for i in range(40)]
    rss = []
    memory = PrimeMonitor(
        api_key=KEY,
        traces_url=server.url,
        run_id="memory",
        queue_bytes=4 << 20,
        retry_base=0.01,
        drain_timeout=0.2,
    )
    prime = outbox(server, run, queue_bytes=4 << 20, batch_bytes=2 << 20)
    server.stop()
    async with Monitors(FileMonitor(run), prime, memory) as all_three:
        for i, record in enumerate(episodes):
            await all_three.log_episodes([record], step=i, subset="all")
            rss.append(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
        # queue_bytes of closed batches at most, and the one being filled (2 MiB, and the
        # ~1 MB line that closes it).
        assert prime._held - prime._filling <= 4 << 20
        assert prime._held <= (4 + 2 + 1) << 20
        server.start()
        with anyio.fail_after(60):  # all but the last step's batch, which finalize closes
            while prime.stats().delivered < 39:
                await anyio.sleep(0.05)
    assert memory.stats().lost["queue_full"] > 20
    stats = prime.stats()
    assert (stats.submitted, stats.delivered, stats.pending, dict(stats.lost)) == (40, 40, 0, {})
    ours = [line for line in server.lines() if orjson.loads(line)["run"]["id"] == RUN]
    assert sorted(ours) == sorted(expected_lines(run))  # each once (the other run: "memory")
    # Peak RSS grew by far less than what was logged (40 MB, held as dicts by the test).
    assert (rss[-1] - rss[5]) * 1024 < 30 << 20, rss


@pytest.mark.anyio
async def test_a_step_larger_than_queue_bytes_still_goes(
    server: TracesServer, tmp_path: Path
) -> None:
    """One step's lines pass queue_bytes while its batch is still open (it closes only at the
    next step's first line): the reader must not wait for that batch's bytes, or nothing
    would ever be sent."""
    run = tmp_path / "run"
    records = [{"id": f"e{i}", "text": "x" * 200_000, "traces": []} for i in range(10)]
    await write_run(run, [(0, "train", record) for record in records])
    async with outbox(server, run, queue_bytes=1 << 20, batch_bytes=30 << 20) as prime:
        pass
    assert (prime.stats().delivered, prime.stats().pending) == (10, 0)
    ids_once(server, 10)


@pytest.mark.anyio
async def test_a_full_disk_under_the_cursor_loses_nothing(
    server: TracesServer,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The disk refuses the cursor's saves (ENOSPC, as a full disk does): uploads go on,
    the warning names the cursor, and a restart from the stale cursor sends the confirmed
    batches again under their keys: the service keeps one copy."""
    run = tmp_path / "run"
    await write_run(run, mixed(10))
    real_write = os.write
    path = cursor_path(run / RUN_STREAM, RUN)

    def full(fd: int, data: Any) -> int:
        if os.readlink(f"/proc/self/fd/{fd}").endswith(".json.tmp"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return real_write(fd, data)

    monkeypatch.setattr(_outbox.os, "write", full)
    caplog.set_level(logging.WARNING, logger="monitors.prime")
    async with outbox(server, run) as first:
        pass
    assert first.stats().delivered == 10
    assert "cannot save the upload's cursor" in caplog.text
    assert not path.exists()
    monkeypatch.setattr(_outbox.os, "write", real_write)
    async with outbox(server, run) as second:
        pass
    assert second.stats().delivered == 10
    ids_once(server, 10)
    assert server.stats()["replays"] >= 1


@pytest.mark.anyio
async def test_wrong_key_leaves_everything_pending(server: TracesServer, tmp_path: Path) -> None:
    run = tmp_path / "run"
    await write_run(run, mixed(5))
    async with outbox(server, run, api_key="sk-wrong") as prime:
        pass
    stats = prime.stats()
    assert (stats.delivered, stats.pending, dict(stats.lost)) == (0, 5, {})


@pytest.mark.anyio
async def test_a_second_uploader_of_the_same_run_is_refused(
    server: TracesServer, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    await write_run(run, mixed(3))
    async with outbox(server, run):
        second = outbox(server, run)
        with pytest.raises(UploadError, match="another uploader"):
            await second.start()
        await second.finalize()


@pytest.mark.anyio
async def test_a_restart_without_a_run_id_goes_on_with_the_streams_run(
    server: TracesServer, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    await write_run(run, mixed(4))
    async with outbox(server, run, run_id="first-run"):
        pass
    await write_run(run, mixed(3, start=4))
    async with outbox(server, run, run_id=None) as again:
        pass
    assert again.config is not None
    assert again.config.run_id == "first-run"
    assert again.stats().delivered == 3
    ids_once(server, 7)
