"""``nodewise traces upload RUN --run-id ID``: a run's trace stream sent to the Prime Traces
API from the disk by ``PrimeMonitor``'s outbox mode (docs/design.md D18), or checked against
the service's limits and contract without the network (``--dry-run``).

The upload is the monitor's own: the same batches (consecutive lines of one kind and step),
the same ``Idempotency-Key`` for a batch sent again, the same cursor beside the stream
(``stream.uploads/RUN_ID.json``). This module adds what a command needs around it: what is
left to do, read once from the index and the cursor; progress on stderr; a wait without end
while the service is down (the monitor retries an outbox's batches until they are answered);
a prompt stop on Ctrl-C or SIGTERM that a second run resumes from the cursor; and a summary.

Bytes are those of the stream's lines (the newline counted). A row prime-rl wrote has no
``length``: its line's bytes are taken as far as the next row's offset in the same chunk, or
to the chunk's end (``chunk_size``) for the last row of a chunk, without reading the chunk.
"""

from __future__ import annotations

import logging
import math
import shlex
import signal
import sys
import time
from collections import Counter
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TextIO

import anyio
from anyio.abc import TaskGroup

from ..base import DeliveryStats
from ..errors import TraceFormatError, UploadError
from ..records import Kind
from ..testing._batch import BatchLimits, Refused, check_traces
from ..traces._layout import IndexRow, index_path, list_chunks, stream_of
from ..traces._reader import line_at
from ..traces._sealed import chunk_size
from ._batch import BatchBuilder, Keys
from ._config import MAX_BATCH_BYTES, MAX_LINE_BYTES, MAX_REQUEST_BYTES
from ._monitor import PrimeMonitor
from ._outbox import Cursor, Tail, cursor_path, kind_of, outbox_stream, wanted
from ._restamp import Restamp
from ._worker import Worker, result

__all__ = [
    "DryRun",
    "Outcome",
    "Plan",
    "Progress",
    "check_upload",
    "make_plan",
    "resume_command",
    "upload",
    "upload_command",
]

log = logging.getLogger("monitors.prime")

#: Seconds between two looks at the monitor's counts.
_POLL = 0.05
#: The progress line: redrawn at most this often on a terminal, else printed this often.
_REDRAW_EVERY = 0.2
_PRINT_EVERY = 10.0
#: Offending lines a dry run names per reason.
_SHOW_LINES = 5
#: The gzip level the upload uses (``PrimeMonitor``'s default), for a dry run's request size.
_GZIP_LEVEL = 1
#: The service's limits, as ``TracesServer`` checks them by default.
_LIMITS = BatchLimits(max_line_bytes=MAX_LINE_BYTES)


# -- what is left to do --------------------------------------------------------------------


@dataclass(frozen=True)
class Plan:
    """What an upload has left to do, read once from the stream's index and its cursor.

    :param stream: The stream's directory.
    :param run_id: The run the records go to.
    :param kind: Only the records of this kind (None: every record).
    :param records: Rows to upload: not settled in the cursor, of ``kind``.
    :param bytes: Their lines' bytes (see the module's docstring for rows without a length).
    :param inferred: How many of them had no ``length`` (their bytes taken from the next
        row's offset or the chunk's size).
    :param delivered_before: Records earlier runs had stored (the cursor's count).
    :param lost_before: Records earlier runs had lost for good, by reason (the cursor's).
    :param cursor_problem: Why the cursor could not be read (then nothing counts as settled).
    :param skipped: Line ranges no readable index row names: never uploaded.
    :param unindexed: Bytes of the stream past its last row's line: records a crash left
        without their row (a ``FileMonitor``'s next append rebuilds them), not uploaded.
    """

    stream: Path
    run_id: str
    kind: Kind | None
    records: int
    bytes: int
    inferred: int = 0
    delivered_before: int = 0
    lost_before: Mapping[str, int] = field(default_factory=dict)
    cursor_problem: str | None = None
    skipped: tuple[tuple[int, int], ...] = ()
    unindexed: int = 0


def upload_stream(given: Path) -> Path:
    """The stream an upload of ``given`` (a run's directory or a stream's) reads, as the
    monitor finds it.

    :raises UploadError: The stream has no index: the upload reads records through it.
    """
    stream = outbox_stream(given)
    if not index_path(stream).is_file():
        missing = index_path(stream_of(given))
        raise UploadError(
            f"{given} has no index ({missing} is missing): the upload reads the records "
            "through it; reopen the stream with a TraceWriter to rebuild it (without ids)"
        )
    return stream


def read_cursor(stream: Path, run_id: str) -> tuple[Cursor, str | None]:
    """The cursor of the upload of ``stream`` to ``run_id`` as it is on the disk, and what
    was wrong with it (None: sound, or none yet)."""
    cursor = Cursor(cursor_path(stream, run_id), run_id)
    return cursor, cursor.read()


def _sized(stream: Path, rows: Iterable[IndexRow]) -> Iterator[tuple[IndexRow, int, bool]]:
    """Each row with its line's bytes and whether they were inferred (a row without a
    ``length``: up to the next row's offset in its chunk, else to the chunk's end)."""
    sizes: dict[int, int] = {}

    def to_end(row: IndexRow) -> int:
        if row.chunk not in sizes:
            try:
                sizes[row.chunk] = chunk_size(stream, row.chunk)
            except (OSError, TraceFormatError):
                sizes[row.chunk] = row.offset  # unreadable: the upload counts it damaged
        return max(sizes[row.chunk] - row.offset, 0)

    def size(row: IndexRow, after: IndexRow | None) -> tuple[IndexRow, int, bool]:
        if row.length is not None:
            return row, row.length, False
        if after is not None and after.chunk == row.chunk and after.offset > row.offset:
            return row, after.offset - row.offset, True
        return row, to_end(row), True

    previous: IndexRow | None = None
    for row in rows:
        if previous is not None:
            yield size(previous, row)
        previous = row
    if previous is not None:
        yield size(previous, None)


def make_plan(
    stream: Path, cursor: Cursor, *, kind: Kind | None, cursor_problem: str | None = None
) -> Plan:
    """Read the index once: the rows the upload has left to send (blocking)."""
    tail = Tail(stream)
    records = size = inferred = 0
    end = (-1, 0)  # the last row's chunk, and where its line ends
    for row, length, guessed in _sized(stream, tail.rows()):
        end = (row.chunk, row.offset + length)
        if wanted(row, cursor, kind):
            records += 1
            size += length
            inferred += guessed
    return Plan(
        stream=stream,
        run_id=cursor.run_id,
        kind=kind,
        records=records,
        bytes=size,
        inferred=inferred,
        delivered_before=cursor.delivered,
        lost_before=dict(cursor.lost),
        cursor_problem=cursor_problem,
        skipped=tuple(tail.skipped),
        unindexed=_past(stream, *end),
    )


def _past(stream: Path, chunk: int, offset: int) -> int:
    """Bytes of the stream past ``offset`` of chunk ``chunk`` (its last row's line's end)."""
    try:
        return sum(
            chunk_size(stream, n) - (offset if n == chunk else 0)
            for n in list_chunks(stream)
            if n >= chunk
        )
    except (OSError, TraceFormatError):
        return 0  # an unreadable chunk: the upload names it


# -- progress ------------------------------------------------------------------------------


def _size(n: float) -> str:
    """Bytes in decimal units: ``512 B``, ``12.3 kB``, ``4.5 MB``, ``1.2 GB``."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n:.0f} B"


class Progress:
    """The progress of an upload (or a dry run) on stderr: bytes of the stream's lines and
    records, done of the total, and MB/s; on a terminal a bar redrawn in place at most five
    times a second, else a plain line at the start, every ten seconds, when it starts or
    stops waiting, and at the end.

    :param records: The records to do.
    :param total_bytes: Their bytes.
    :param label: What is being done (``upload``, ``check``).
    :param out: Where to write (default: stderr).
    :param live: Redraw in place (default: whether ``out`` is a terminal).
    """

    def __init__(
        self,
        records: int,
        total_bytes: int,
        *,
        label: str,
        out: TextIO | None = None,
        live: bool | None = None,
    ) -> None:
        self.records = records
        self.total_bytes = total_bytes
        self.label = label
        self.out = sys.stderr if out is None else out
        self.live = self.out.isatty() if live is None else live
        self.started = time.monotonic()
        self._shown = -float("inf")
        self._width = 0  # of the line drawn in place
        self._waiting: str | None = None
        self._last: tuple[int, int, str | None] = (0, 0, None)

    def show(
        self, records: int, done_bytes: int, *, waiting: str | None = None, force: bool = False
    ) -> None:
        """Show the progress, if it is time to: ``records`` and ``done_bytes`` done;
        ``waiting``: why nothing goes on (the service not answering)."""
        done_bytes = min(done_bytes, self.total_bytes)
        self._last = (records, done_bytes, waiting)
        now = time.monotonic()
        changed = (waiting is None) != (self._waiting is None)
        self._waiting = waiting
        every = _REDRAW_EVERY if self.live else _PRINT_EVERY
        if not (force or changed or now - self._shown >= every):
            return
        self._shown = now
        text = self._text(records, done_bytes, waiting, now)
        if self.live:
            self.out.write("\r" + text.ljust(self._width))
            self._width = len(text)
        else:
            self.out.write(text + "\n")
        self.out.flush()

    def clear(self) -> None:
        """Erase the line drawn in place (before something else is written below it)."""
        if self.live and self._width:
            self.out.write("\r" + " " * self._width + "\r")
            self.out.flush()
            self._width = 0
            self._shown = -float("inf")  # redrawn at the next show

    def close(self, records: int | None = None, done_bytes: int | None = None) -> None:
        """Show the last counts (default: the latest shown), and end the line drawn in
        place."""
        last_records, last_bytes, _ = self._last
        records = last_records if records is None else records
        done_bytes = last_bytes if done_bytes is None else done_bytes
        self.show(records, done_bytes, force=True)
        if self.live:
            self.out.write("\n")
            self.out.flush()
            self._width = 0

    def _text(self, records: int, done_bytes: int, waiting: str | None, now: float) -> str:
        total = self.total_bytes
        fraction = done_bytes / total if total else records / self.records if self.records else 1.0
        rate = done_bytes / max(now - self.started, 1.0) / 1e6  # no wild rate in the first second
        counts = (
            f"{_size(done_bytes)} / {_size(total)}, {records} / {self.records} records, "
            f"{rate:.1f} MB/s"
        )
        wait = f"; waiting: {waiting}" if waiting else ""
        if self.live:
            bar = "#" * int(min(fraction, 1.0) * 24)
            return f"{self.label} [{bar:<24}] {fraction:6.1%} {counts}{wait}"
        return f"{self.label}: {fraction:.1%}, {counts}{wait}"


class _ClearingHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """Log records on stderr, the progress bar erased first so the two do not mix."""

    def __init__(self, progress: Progress) -> None:
        super().__init__(progress.out)
        self.progress = progress
        self.setFormatter(logging.Formatter("%(message)s"))

    def emit(self, record: logging.LogRecord) -> None:
        self.progress.clear()
        super().emit(record)


# -- the upload ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Outcome:
    """How an upload ended.

    :param plan: What it had to do.
    :param stats: The monitor's counts for this run (empty when there was nothing to do):
        ``submitted`` the rows it took, ``delivered``, ``lost`` by reason (rejected with the
        service's code, ``too_large``, ``damaged_record``), ``pending`` the rest, left on
        the disk for the next run.
    :param seconds: How long it took.
    :param done_bytes: Bytes of lines answered for good.
    :param signal: The signal that stopped it (None: it ran to its end).
    :param stopped: Why uploads could not go on (the service refused the key, say).
    """

    plan: Plan
    stats: DeliveryStats
    seconds: float = 0.0
    done_bytes: int = 0
    signal: int | None = None
    stopped: str | None = None

    @property
    def left(self) -> int:
        """Records of the plan not answered for good (pending, on the disk)."""
        answered = self.stats.delivered + self.stats.lost_total
        return max(self.stats.pending, self.plan.records - answered)

    @property
    def lost_total(self) -> int:
        """Records of the upload lost for good, by this run and earlier ones."""
        return self.stats.lost_total + sum(self.plan.lost_before.values())

    @property
    def exit_status(self) -> int:
        """128 + the signal that stopped it (130 SIGINT, 143 SIGTERM); 1 when records are
        left pending or were lost (by this run or an earlier one: the cursor remembers), have
        no row to be found by, or uploads were refused; else 0."""
        if self.signal is not None:
            return 128 + self.signal
        if self.stopped is not None or self.left or self.lost_total or self.plan.unindexed:
            return 1
        return 0


@dataclass
class _Stops:
    """The signals received, and the scope the first one cancels: the monitor's
    ``finalize``, which then leaves what is not answered on the disk (its cleanup is
    shielded: the cursor is saved, its lock let go)."""

    received: list[int] = field(default_factory=list)
    scope: anyio.CancelScope | None = None


async def _catch(signals: AsyncIterator[signal.Signals], stops: _Stops) -> None:
    async for signum in signals:
        stops.received.append(int(signum))
        if stops.scope is not None:
            stops.scope.cancel()


def _stopped(monitor: PrimeMonitor) -> str | None:
    """Why the monitor's uploads stopped for good, if they did: the service refused the
    credentials (401/403), or a setting is wrong (a redirect, TLS). The monitor keeps this
    on its client only (its records then stay pending, which its counts do not tell from
    records still to come)."""
    client = monitor._client
    if client is None or not client.stopped:
        return None
    if client.stopped_as == "unauthorized":
        return (
            f"the Prime API refused the credentials ({client.stop_reason}): check "
            "PRIME_API_KEY and PRIME_TEAM_ID (or run `prime login`)"
        )
    return (
        f"the Prime API is not reachable as set up ({client.stop_reason}): check PRIME_TRACES_URL"
    )


def _waiting(monitor: PrimeMonitor) -> str | None:
    """What the upload waits for, when the service is not answering."""
    client = monitor._client
    outage = None if client is None else client.outage()
    if outage is None:
        return None
    cause = outage.cause if len(outage.cause) <= 80 else outage.cause[:77] + "..."
    since = time.monotonic() - outage.since
    return f"{outage.host} not answering for {since:.0f} s ({cause}); retrying"


async def _report(monitor: PrimeMonitor, progress: Progress) -> None:
    """Show the monitor's progress until cancelled."""
    while True:
        stats = monitor.stats()
        done = stats.delivered + stats.lost_total
        progress.show(done, monitor.settled_bytes, waiting=_waiting(monitor))
        await anyio.sleep(_POLL)


async def upload(
    given: Path,
    *,
    run_id: str,
    kind: Kind | None = None,
    err: TextIO | None = None,
    live: bool | None = None,
) -> Outcome:
    """Upload every record of the stream of ``given`` (a run's directory or a stream's) not
    answered for good yet to run ``run_id``, with a ``PrimeMonitor`` in outbox mode, until
    each is answered: an outage is waited out, for as long as it lasts. SIGINT or SIGTERM
    stops it at once; the cursor keeps what was answered, and the same call goes on.

    The monitor is started and at once finalized without a deadline: its finalize takes
    every row of the index written by then, and waits until each batch is answered (an
    outbox's batches close only on the stream's lines, so the last one is sent by finalize).

    :param kind: Only the records of this kind.
    :param err: Where progress goes (default: stderr).
    :param live: Redraw the progress in place (default: whether ``err`` is a terminal).
    :raises UploadError: No index, no API key, or another uploader at work on this cursor.
    """
    stream = upload_stream(given)
    cursor, problem = await anyio.to_thread.run_sync(read_cursor, stream, run_id)
    plan = await anyio.to_thread.run_sync(
        partial(make_plan, stream, cursor, kind=kind, cursor_problem=problem)
    )
    if not plan.records:
        return Outcome(plan=plan, stats=DeliveryStats())
    monitor = PrimeMonitor(outbox=given, run_id=run_id, outbox_kind=kind, drain_timeout=math.inf)
    progress = Progress(plan.records, plan.bytes, label="upload", out=err, live=live)
    handler = _ClearingHandler(progress)
    handler.setLevel(logging.WARNING)
    log.addHandler(handler)
    stops = _Stops()
    failure: UploadError | None = None
    started = time.monotonic()
    try:
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async with anyio.create_task_group() as watcher:
                watcher.start_soon(_catch, signals, stops)
                try:
                    plan = await _upload(monitor, plan, cursor, stops, progress, watcher)
                except UploadError as exc:  # raised after the group: not in a group of one
                    failure = exc
                watcher.cancel_scope.cancel()
    finally:
        log.removeHandler(handler)
    if failure is not None:
        raise failure
    stats = monitor.stats()
    progress.close(stats.delivered + stats.lost_total, monitor.settled_bytes)
    return Outcome(
        plan=plan,
        stats=stats,
        seconds=time.monotonic() - started,
        done_bytes=min(monitor.settled_bytes, plan.bytes),
        signal=stops.received[0] if stops.received else None,
        stopped=_stopped(monitor),
    )


async def _upload(
    monitor: PrimeMonitor,
    plan: Plan,
    cursor: Cursor,
    stops: _Stops,
    progress: Progress,
    watcher: TaskGroup,
) -> Plan:
    """Start the monitor (its cursor's lock taken), show its progress, finalize it; the
    plan, read again if another uploader moved the cursor meanwhile.

    ``start`` enters the monitor's task group and ``finalize`` leaves it, so the scope a
    signal cancels is entered before ``start`` (anyio's scopes nest).
    """
    with anyio.CancelScope() as scope:
        stops.scope = scope
        if stops.received:
            scope.cancel()
        await monitor.start()
        try:
            # Read before anything awaits: the monitor's tasks have not run, so the file is
            # the cursor it started from.
            now, problem = read_cursor(plan.stream, plan.run_id)
            if now.encode() != cursor.encode():
                plan = await anyio.to_thread.run_sync(
                    partial(make_plan, plan.stream, now, kind=plan.kind, cursor_problem=problem)
                )
                progress.records, progress.total_bytes = plan.records, plan.bytes
            progress.show(0, 0, force=True)
            watcher.start_soon(_report, monitor, progress)
        finally:
            await monitor.finalize()
    return plan


def resume_command(given: Path, *, run_id: str, kind: Kind | None, prog: str) -> str:
    """The command that goes on with the upload."""
    words = [*prog.split(), "upload", str(given), "--run-id", run_id]
    if kind is not None:
        words += ["--kind", kind]
    return shlex.join(words)


def _lost_lines(lost: Mapping[str, int]) -> list[tuple[str, int]]:
    """The losses as the summary names them: rejections by code, then too large, damaged,
    and any other reason."""
    lines = [(reason, n) for reason, n in sorted(lost.items()) if reason.startswith("rejected")]
    lines.append(("too large", lost.get("too_large", 0)))
    lines.append(("damaged", lost.get("damaged_record", 0)))
    known = {"too_large", "damaged_record"}
    lines += [
        (reason, n)
        for reason, n in sorted(lost.items())
        if not reason.startswith("rejected") and reason not in known
    ]
    return lines


def _earlier(plan: Plan) -> str:
    lost = sum(plan.lost_before.values())
    if not plan.delivered_before and not lost:
        return "none"
    reasons = ", ".join(f"{reason} {n}" for reason, n in sorted(plan.lost_before.items()))
    return f"{plan.delivered_before} delivered, {lost} lost" + (f" ({reasons})" if reasons else "")


def summary(outcome: Outcome) -> list[str]:
    """The upload's summary, a line each (stdout)."""
    plan, stats = outcome.plan, outcome.stats
    kind = plan.kind or "all"
    lines = [
        f"upload of {plan.stream} to run {plan.run_id} (kind: {kind})",
    ]
    if plan.cursor_problem is not None:
        lines.append(f"note: {plan.cursor_problem}; every record was taken as not yet sent")
    if plan.skipped:
        gaps = ", ".join(f"{a}-{b}" if a != b else str(a) for a, b in plan.skipped[:_SHOW_LINES])
        lines.append(f"note: no readable index row for line(s) {gaps}: not uploaded")
    if plan.unindexed > 0:
        lines.append(
            f"note: {_size(plan.unindexed)} of records past the index's last row (a crash "
            "left them without rows): not uploaded; the run's next FileMonitor append "
            "rebuilds their rows, then run the upload again"
        )
    if not plan.records:
        lines.append("nothing to upload: every record is answered already (no request sent)")
    else:
        inferred = f", {plan.inferred} sized by their rows' offsets" if plan.inferred else ""
        rate = outcome.done_bytes / outcome.seconds / 1e6 if outcome.seconds else 0.0
        lines.append(f"{'to upload':<32}{plan.records} records, {_size(plan.bytes)}{inferred}")
        lines.append(
            f"{'answered':<32}{stats.delivered + stats.lost_total} records, "
            f"{_size(outcome.done_bytes)} in {outcome.seconds:.1f} s ({rate:.1f} MB/s)"
        )
        lines.append(f"{'delivered':<32}{stats.delivered}")
        lines += [f"{label:<32}{n}" for label, n in _lost_lines(stats.lost)]
        lines.append(f"{'pending':<32}{outcome.left}")
    lines.append(f"{'earlier runs':<32}{_earlier(plan)}")
    return lines


# -- the dry run ---------------------------------------------------------------------------


@dataclass
class DryRun:
    """What a dry run found: records that would be sent and stored (``ok``), and those the
    upload would lose, by the reason it would count (``too_large``, ``damaged_record``,
    ``rejected:CODE``), with their first lines and the first one's problem."""

    plan: Plan
    ok: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    lines: dict[str, list[int]] = field(default_factory=dict)
    first: dict[str, str] = field(default_factory=dict)

    def add(self, line: int, reason: str, problem: str) -> None:
        self.refused[reason] += 1
        shown = self.lines.setdefault(reason, [])
        if len(shown) < _SHOW_LINES:
            shown.append(line)
        self.first.setdefault(reason, problem)

    @property
    def exit_status(self) -> int:
        """1 when any record would be refused, else 0."""
        return 1 if self.refused else 0


@dataclass(frozen=True)
class _Verdict:
    reason: str | None  # None: stored
    problem: str = ""
    big: Restamp | None = None  # a stamped line so long its request's size must be measured
    line_format: str = "episode"


def _inspect(stream: Path, row: IndexRow, run_id: str) -> _Verdict:
    """Record ``row`` as the upload would take it: read, held to the line cap, stamped, and
    checked by the test server's own checker as a batch of its one line (blocking)."""
    number = row.line
    assert number is not None
    try:
        data = line_at(stream, row, what=f"record {number}")
    except TraceFormatError as exc:
        return _Verdict("damaged_record", f"line {number} cannot be read: {exc}")
    if len(data) > MAX_LINE_BYTES + 1:  # the cap leaves out the newline
        return _Verdict(
            "too_large", f"line {number} is {len(data) - 1} bytes, over {MAX_LINE_BYTES}"
        )
    scan = Restamp(data, run_id=run_id, run_type=kind_of(row))
    try:
        while not scan.step(budget=1 << 30):
            pass
    except ValueError as exc:
        return _Verdict("damaged_record", f"line {number}: {exc}")
    line_format = "episode" if scan.traces else "trace"
    if scan.length - 1 > MAX_BATCH_BYTES:  # its request may pass the cap: built to measure
        return _Verdict(None, big=scan, line_format=line_format)
    return _check([b"".join(scan.pieces)], line_format=line_format, compressed=False, number=number)


def _check(parts: list[bytes], *, line_format: str, compressed: bool, number: int) -> _Verdict:
    """The test server's check of a traces part of one line (``check_traces``)."""
    try:
        check_traces(parts, _LIMITS, line_format=line_format, compressed_part=compressed)
    except Refused as exc:
        problem = exc.message.replace("line 1", f"line {number}", 1)
        return _Verdict(f"rejected:{exc.code}" if exc.code else "rejected", problem)
    return _Verdict(None)


async def _check_request(verdict: _Verdict, row: IndexRow, run_id: str, worker: Worker) -> _Verdict:
    """A long line framed as the upload frames it, alone in its batch: refused when the
    request passes the service's cap, else its gzip part checked by the server's checker."""
    scan = verdict.big
    assert scan is not None
    assert row.line is not None
    kind = kind_of(row)
    builder = BatchBuilder(
        worker=worker,
        keys=Keys(),
        gzip_level=_GZIP_LEVEL,
        kind=kind,
        subset="all",
        line_format=verdict.line_format,
    )
    await builder.add(scan.pieces, scan.length, step=row.step, line=row.line)
    batch = await result(await builder.close(builder.context(run_id)))
    if batch.body.size > MAX_REQUEST_BYTES:
        return _Verdict(
            "too_large",
            f"line {row.line}: its request would be {batch.body.size} bytes, over the "
            f"service's {MAX_REQUEST_BYTES} byte cap",
        )
    gzipped = list(batch.body.pieces[1:-1])  # between the framing's head and tail
    return await anyio.to_thread.run_sync(
        partial(_check, gzipped, line_format=verdict.line_format, compressed=True, number=row.line)
    )


async def check_upload(
    given: Path,
    *,
    run_id: str,
    kind: Kind | None = None,
    err: TextIO | None = None,
    live: bool | None = None,
) -> DryRun:
    """Check every record the upload of ``given`` to ``run_id`` would send, without the
    network: the line readable and one JSON value, stamped as it would be sent, at most
    ``MAX_LINE_BYTES``, its request within ``MAX_REQUEST_BYTES``, and accepted by the test
    server's checker (``monitors.testing._batch.check_traces``: JSON, the line format's
    shape, id lengths, traces per episode, ids repeated within the line). Ids repeated
    across records, which the service refuses within one upload, are not checked.

    :raises UploadError: The stream has no index.
    """
    stream = upload_stream(given)
    cursor, problem = await anyio.to_thread.run_sync(read_cursor, stream, run_id)
    plan = await anyio.to_thread.run_sync(
        partial(make_plan, stream, cursor, kind=kind, cursor_problem=problem)
    )
    found = DryRun(plan)
    progress = Progress(plan.records, plan.bytes, label="check", out=err, live=live)
    worker: Worker | None = None
    done = done_bytes = 0
    # The index read a block at a time on the loop: nothing else runs beside a dry run.
    rows = _sized(stream, Tail(stream).rows()) if plan.records else iter(())
    try:
        progress.show(0, 0, force=True)
        for row, length, _ in rows:
            if not wanted(row, cursor, kind):
                continue
            assert row.line is not None
            verdict = await anyio.to_thread.run_sync(_inspect, stream, row, run_id)
            if verdict.big is not None:
                worker = worker or Worker(name="nodewise dry run gzip")
                verdict = await _check_request(verdict, row, run_id, worker)
            if verdict.reason is None:
                found.ok += 1
            else:
                found.add(row.line, verdict.reason, verdict.problem)
            done += 1
            done_bytes += length
            progress.show(done, done_bytes)
        progress.close(done, done_bytes)
    finally:
        if worker is not None:
            await worker.aclose()
    return found


def dry_run_summary(found: DryRun) -> list[str]:
    """The dry run's report, a line each (stdout)."""
    plan = found.plan
    lines = [
        f"dry run: {plan.records} records of {plan.stream} checked as the upload to run "
        f"{plan.run_id} would send them (kind: {plan.kind or 'all'}); no request sent",
        f"{'ok':<32}{found.ok}",
    ]
    for reason, n in sorted(found.refused.items()):
        shown = found.lines[reason]
        more = f" and {n - len(shown)} more" if n > len(shown) else ""
        where = ", ".join(map(str, shown))
        lines.append(f"{reason:<32}{n}  lines {where}{more} (first: {found.first[reason]})")
    lines.append(f"{'earlier runs':<32}{_earlier(plan)}")
    return lines


# -- the command ---------------------------------------------------------------------------


def upload_command(given: Path, *, run_id: str, kind: Kind | None, dry_run: bool, prog: str) -> int:
    """``upload``: run it, print its summary on stdout, say on stderr what is left and how
    to go on with it; the exit status (see ``Outcome.exit_status``, ``DryRun.exit_status``).

    :raises UploadError: The upload cannot start (no index, no key, another uploader).
    """
    where = f"{prog} upload"
    resume = resume_command(given, run_id=run_id, kind=kind, prog=prog)
    if dry_run:
        try:
            found = anyio.run(partial(check_upload, given, run_id=run_id, kind=kind))
        except KeyboardInterrupt:
            print(f"\n{where}: interrupted (the dry run changes nothing)", file=sys.stderr)
            return 130
        print("\n".join(dry_run_summary(found)))
        return found.exit_status
    try:
        outcome = anyio.run(partial(upload, given, run_id=run_id, kind=kind))
    except KeyboardInterrupt:  # while the plan was read, before the signals were taken
        print(f"\n{where}: interrupted; go on with: {resume}", file=sys.stderr)
        return 130
    print("\n".join(summary(outcome)), flush=True)
    left = outcome.left
    if outcome.stopped is not None:
        print(
            f"{where}: {outcome.stopped}; {left} records stay pending: once fixed, go on "
            f"with: {resume}",
            file=sys.stderr,
        )
    elif outcome.signal is not None:
        name = signal.Signals(outcome.signal).name
        print(
            f"{where}: stopped by {name}: {left} records left; go on with: {resume}",
            file=sys.stderr,
        )
    elif left:
        print(f"{where}: {left} records left; go on with: {resume}", file=sys.stderr)
    return outcome.exit_status
