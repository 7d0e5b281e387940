"""An orchestrator uploading through PrimeMonitor's outbox, SIGKILLed mid-upload at random
moments and restarted, stores every episode exactly once (docs/design.md D18).

Each seed runs ``helpers/outbox_child.py`` against one real ``TracesServer`` process: the
child is killed two or three times (once while the server holds answers to batches it has
already stored, so a batch stored but never confirmed is certain), then left to finish.
The service must then hold each episode once, each line as prime-runs stamps the stream's
record, and the cursor must cover the whole stream. A restart that re-formed a batch
differently (other lines, other bytes, so another ``Idempotency-Key``) would store its
episodes twice; one that skipped the cursor would send everything again as new batches or
replays; one that trusted an unconfirmed batch would lose it.
"""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

import orjson
import pytest
from prime_runs.sinks import stamp_run

from monitors.prime._outbox import Cursor, cursor_path
from monitors.testing import TracesServer
from monitors.traces import IndexRow
from monitors.traces._index import iter_rows
from monitors.traces._layout import RUN_STREAM, index_path
from monitors.traces._reader import line_at

HELPER = Path(__file__).parent / "helpers" / "outbox_child.py"
SEEDS = [101, 202, 303, 404, 505]
#: Seconds the server waits before each answer, after storing the batch: a kill then
#: often lands between "stored" and "confirmed".
LATENCY = 0.05


def _load_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("outbox_child", HELPER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


child = _load_helper()


@pytest.fixture(scope="module")
def running() -> Iterator[TracesServer]:
    with TracesServer(api_key=child.KEY, keep_lines=True, history=5_000) as server:
        yield server


@pytest.fixture
def server(running: TracesServer) -> TracesServer:
    running.reset(faults=True)
    return running


@dataclass
class Kill:
    """What one SIGKILL left: when it landed (seconds after the start), whether the server
    was holding answers then, the stream's complete index rows, and the lines the cursor
    had settled."""

    after: float
    held: bool
    rows: int
    settled: int

    def __str__(self) -> str:
        held = " (answers held)" if self.held else ""
        return f"at {self.after:.2f} s{held}: {self.rows} rows, {self.settled} settled"


class Runs:
    """The child processes of one run directory, their output in files under ``tmp_path``
    (shown by ``output()`` in every failure message)."""

    def __init__(self, tmp_path: Path, server: TracesServer, seed: int) -> None:
        self.dir = tmp_path
        self.run = tmp_path / "run"
        self.server = server
        self.seed = seed
        self.logs: list[tuple[Path, Path]] = []
        self.proc: subprocess.Popen[bytes] | None = None
        home = tmp_path / "home"  # no ~/.prime/config.json of the machine's
        home.mkdir()
        self.env = {
            k: v for k, v in os.environ.items() if not k.startswith("PRIME_") and k != "RUN_ID"
        }
        self.env["HOME"] = str(home)

    def start(self) -> float:
        """Start the next child; return when it was started (monotonic)."""
        n = len(self.logs)
        out, err = self.dir / f"child{n}.out", self.dir / f"child{n}.err"
        self.logs.append((out, err))
        with out.open("wb") as stdout, err.open("wb") as stderr:
            command = [sys.executable, str(HELPER), str(self.run), self.server.url, str(self.seed)]
            self.proc = subprocess.Popen(command, stdout=stdout, stderr=stderr, env=self.env)
        return time.monotonic()

    def output(self) -> str:
        parts = []
        for out, err in self.logs:
            for path in (out, err):
                text = path.read_text(errors="replace") if path.exists() else ""
                parts.append(f"--- {path.name} ---\n{text[-3000:]}")
        return "\n".join(parts)

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until the child says it has started its monitors and read the stream."""
        assert self.proc is not None
        out = self.logs[-1][0]
        deadline = time.monotonic() + timeout
        while b"ready" not in out.read_bytes():
            if self.proc.poll() is not None:
                pytest.fail(
                    f"the child exited ({self.proc.returncode}) before it was ready\n"
                    f"{self.output()}"
                )
            if time.monotonic() > deadline:
                pytest.fail(f"the child was not ready in {timeout} s\n{self.output()}")
            time.sleep(0.01)

    def kill(self) -> bool:
        """SIGKILL the child; False when it had already exited, with status 0."""
        proc = self.proc
        assert proc is not None
        self.proc = None
        if proc.poll() is None:
            proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        if proc.returncode == 0:
            return False
        assert proc.returncode == -signal.SIGKILL, (
            f"child exited {proc.returncode}\n{self.output()}"
        )
        return True

    def finish(self, timeout: float = 60.0) -> None:
        proc = self.proc
        assert proc is not None
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the last child did not finish in {timeout} s\n{self.output()}")
        self.proc = None
        assert proc.returncode == 0, f"the last child exited {proc.returncode}\n{self.output()}"
        assert b"done" in self.logs[-1][0].read_bytes(), self.output()

    def stop(self) -> None:
        """Kill a child a failure left running."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    # -- the run directory, as it is now ----------------------------------------------

    def rows(self) -> list[IndexRow]:
        index = index_path(self.run / RUN_STREAM)
        return [row for _, row in iter_rows(index)]

    def cursor(self) -> Cursor:
        cursor = Cursor(cursor_path(self.run / RUN_STREAM, child.RUN_ID), child.RUN_ID)
        damage = cursor.read()
        assert damage is None, f"{damage}\n{self.output()}"
        return cursor


def _settled(cursor: Cursor) -> int:
    """How many lines the cursor holds settled."""
    return sum(last - first + 1 for first, last in cursor.ranges())


def _wait_in_flight(server: TracesServer, runs: Runs, timeout: float = 20.0) -> None:
    """Until the server holds an answer (the batch stored before the answer waits)."""
    deadline = time.monotonic() + timeout
    while server.stats()["in_flight"] < 1:
        if runs.proc is not None and runs.proc.poll() is not None:
            pytest.fail(f"the child exited before an upload was held\n{runs.output()}")
        if time.monotonic() > deadline:
            pytest.fail(f"no upload reached the server in {timeout} s\n{runs.output()}")
        time.sleep(0.005)


@pytest.mark.parametrize("seed", SEEDS)
def test_killed_and_restarted_orchestrator_stores_each_episode_once(
    server: TracesServer, tmp_path: Path, seed: int
) -> None:
    """Two or three kills at moments drawn from ``seed``, the first while answers are held,
    then a run left to finish: each episode stored once, as the stream holds it, the cursor
    whole, and the restarts went on from the cursor (what it settled was never sent again,
    what it had not was, a replay among it)."""
    rng = random.Random(seed)
    runs = Runs(tmp_path, server, seed)
    server.set_faults(latency=LATENCY)
    kills: list[Kill] = []
    try:
        for k in range(rng.randint(2, 3)):
            started = runs.start()
            held = k == 0
            if held:
                # Answers held while stored: the kill lands with a batch stored and unconfirmed.
                runs.wait_ready()
                time.sleep(rng.uniform(0.1, 1.0))
                server.set_faults(hold=True)
                _wait_in_flight(server, runs)
                time.sleep(0.3)  # the held request's batch is stored by now
            else:
                # A moment of the run, from its start-up on: a whole run lasts ~3 s, one
                # that resumes less (only what the stream lacks is logged).
                left = child.EPISODES - len(runs.rows())
                moment = rng.uniform(0.3, 1.0 + 2.0 * left / child.EPISODES)
                time.sleep(max(0.0, started + moment - time.monotonic()))
            after = time.monotonic() - started
            killed = runs.kill()
            if held:
                server.set_faults(hold=False)
                assert killed, f"the child finished while its answers were held\n{runs.output()}"
            if killed:  # else the run had finished by then: nothing to resume
                kills.append(Kill(after, held, len(runs.rows()), _settled(runs.cursor())))
        runs.start()
        runs.finish()
    finally:
        runs.stop()
        server.set_faults(hold=False)

    stats = server.stats()
    out = runs.output()
    rows = runs.rows()
    report = (
        f"seed {seed}: kills [{', '.join(map(str, kills))}]"
        f", replays {stats['replays']}, uploads {stats['uploads']}, aborted {stats['aborted']}"
        f", lines received {stats['lines_received']}"
        f", rows rebuilt by recovery {sum(1 for row in rows if row.step is None)}"
    )
    print(report)

    # The stream holds each planned episode once, in order, under the kind it was logged as.
    n = child.EPISODES
    plan = child.plan(seed)
    ids = [child.episode_id(seed, i) for i in range(n)]
    assert [row.id for row in rows] == ids, f"{report}\n{out}"
    assert [row.kind for row in rows] == [kind for _, kind, _ in plan], f"{report}\n{out}"

    # The service stored each episode once, each line the stream's record as prime-runs
    # stamps it.
    assert stats["unique_ids"] == n, f"{report}\n{stats}\n{out}"
    assert stats["duplicate_ids"] == 0, f"{report}\n{stats}\n{out}"
    assert stats["lines_stored"] == n, f"{report}\n{stats}\n{out}"
    stream = runs.run / RUN_STREAM
    expected = Counter(
        orjson.dumps(
            stamp_run(orjson.loads(line_at(stream, row, what="record")), child.RUN_ID, kind)
        )
        for row, (_, kind, _) in zip(rows, plan, strict=True)
    )
    stored = Counter(server.lines())
    assert stored == expected, (
        f"{report}\n{sum((stored - expected).values())} line(s) stored that the stream does not "
        f"hold, {sum((expected - stored).values())} of the stream's not stored\n{out}"
    )

    # The cursor settles every line of the stream, each delivered.
    cursor = runs.cursor()
    assert cursor.ranges() == [(1, n)], f"{report}\n{out}"
    assert (cursor.delivered, dict(cursor.lost)) == (n, {}), f"{report}\n{out}"

    # A kill left lines of the stream unconfirmed, which the restart sent again: the batch
    # stored but never confirmed came back under its key, a replay.
    assert any(k.rows > k.settled for k in kills), f"{report}\n{out}"
    assert stats["replays"] >= 1, f"{report}\n{stats}\n{out}"

    # Each restart went on from the cursor: a line it had settled was never sent again. A
    # line reaches the service more than once only when a kill left it in the stream and
    # unsettled, so the service received at most each line once plus those.
    resendable = sum(k.rows - k.settled for k in kills)
    assert stats["lines_received"] <= n + resendable, f"{report}\n{stats}\n{out}"
