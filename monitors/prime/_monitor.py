"""PrimeMonitor: episodes to the Prime Traces API, metrics to the Prime RFT metrics endpoint."""

from __future__ import annotations

import logging
import math
import os
import time
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future
from contextlib import aclosing
from functools import partial
from pathlib import Path
from typing import Any, Final

import aiohttp
import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

import encoder

from .._release import release
from ..base import START_FAILED, DeliveryStats, Ledger, Monitor, finite_metrics
from ..errors import TraceFormatError, UploadError
from ..records import (
    DEFAULT_FLOAT_DECIMALS,
    Kind,
    Records,
    Subset,
    check_float_decimals,
    check_kind,
    line_option,
)
from ..traces._layout import IndexRow
from ..traces._reader import line_at
from ._batch import PIECE_BYTES, Batch, BatchBuilder, Keys, Piece
from ._client import Attempts, Client
from ._config import (
    MAX_BATCH_LINES,
    MAX_LINE_BYTES,
    MAX_REQUEST_BYTES,
    METRICS_PATH,
    TRACES_PATH,
    PrimeConfig,
    Secret,
)
from ._outbox import Cursor, Tail, cursor_path, kind_of, known_run_ids, outbox_stream, wanted
from ._restamp import restamp
from ._stamp import Stamp
from ._worker import Worker, result

__all__ = ["PrimeMonitor"]

log = logging.getLogger("monitors.prime")

#: An episode whose line is at least this long is let go of a piece per step (``release``).
_RELEASE_BYTES = 1 << 20

#: Seconds between two warnings about a full queue (drops in between are summed).
_WARN_EVERY = 5.0

_Item = tuple[Any, int, Kind, Subset]  # episode, step, kind, subset

#: Seconds the oldest pending episode may wait before the monitor warns (once).
PENDING_AGE = 60.0

#: Outbox mode: seconds between two looks at the stream's index for new rows.
OUTBOX_POLL = 0.1

#: Rejections that name records (or a size that halving cures), not the request: a batch of
#: several lines rejected so is split to find the lines (prime-traces' ``ErrorCode``).
RECORD_CODES: Final = frozenset(
    {
        "invalid_trace",
        "trace_too_large",
        "too_many_traces_in_episode",
        "episode_id_too_long",
        "environment_id_too_long",
        "duplicate_trace_id",
        "duplicate_episode_id",
        "created_at_out_of_window",
        "unknown_episode_reference",
        "upload_too_large",
        "too_many_traces_in_upload",
    }
)


class _Tally:
    """Records of one batch not counted yet (its halves are counted as they are answered),
    how those counted were, and what the attempts of its request under way have done."""

    __slots__ = ("attempts", "counts", "left")

    def __init__(self, records: int) -> None:
        self.left = records
        self.counts: Counter[str] = Counter()
        self.attempts = Attempts()


def _pieces(data: bytes) -> list[Piece]:
    """A line as pieces of at most ``PIECE_BYTES`` (views, no copy), the last ``bytes``."""
    view = memoryview(data)
    cut = max(0, len(data) - 1)
    pieces: list[Piece] = [view[i : min(i + PIECE_BYTES, cut)] for i in range(0, cut, PIECE_BYTES)]
    return [*pieces, data[cut:]]


def _settles(reason: str) -> bool:
    """Whether a record counted so is answered for good (else, in outbox mode, it stays on
    the disk, pending): stored, rejected by the service, or too large ever to be sent."""
    return reason in ("delivered", "too_large", "damaged_record") or reason.startswith("rejected")


_Line = tuple[Sequence[Piece], int, str]  # encoded chunks, bytes in all, line format
# a line, its step, kind and subset, and its number in the outbox's stream (else None)
_Encoded = tuple[_Line, int | None, Kind, Subset, int | None]


class _RateLimitedWarning:
    """At most one warning every ``every`` seconds, naming everything since the last one."""

    def __init__(self, message: str, every: float = _WARN_EVERY) -> None:
        self.message = message
        self.every = every
        self.last = -float("inf")
        self.unreported = 0

    def __call__(self, count: int) -> None:
        self.unreported += count
        now = time.monotonic()
        if now - self.last >= self.every:
            log.warning(self.message, self.unreported)
            self.last = now
            self.unreported = 0


class PrimeMonitor(Monitor):
    """Uploads episodes to the Prime Traces API and metrics to the Prime API.

    ``log_episodes`` and ``log_metrics`` never wait on the network: they queue and return.
    In the background, each queued episode is encoded on the loop as soon as it comes (a
    verifiers episode or pydantic model walked a part at a time, ``monitors.records``), so that what the monitor holds is known to the byte: an
    episode whose line would take it past ``queue_bytes`` is dropped and counted
    ``queue_full`` (docs/design.md D8). Lines are gathered into NDJSON batches, hashed and
    gzipped in the monitor's worker thread (D10) and streamed to the server (D11); a retry
    sends the same bytes under the same ``Idempotency-Key`` (D12).

    ``stats()`` counts episodes: delivered once the server committed their batch, else lost
    by reason (``queue_full``, ``unauthorized``, ``failed``, ...: the monitors guide lists
    them); ``metrics_stats()`` counts metrics posts the same way.

    With ``outbox``, the monitor uploads a run's trace stream from the disk instead of from
    memory (docs/design.md D18): every record of the stream a ``FileMonitor`` writes there
    (or any nodewise or prime-rl run directory), in order, whatever it is given itself. What
    the service has answered for good is kept in a cursor beside the stream, so a restarted
    process goes on where the last one was answered, sending again, byte for byte and under
    the same ``Idempotency-Key``, what was never confirmed. Batches hold consecutive lines of
    one kind and step (``linger`` is not used), a batch is retried until it is answered
    (``retry_for`` is not used), and what is still on the disk at ``finalize`` is counted
    ``pending``, not lost: ``nodewise traces upload`` sends it.

    ``start`` enters the monitor's task group and ``finalize`` leaves it: call both from the
    same task (``async with`` does).

    Settings left unset come from the environment, then from ``~/.prime/config.json`` (what
    ``prime login`` writes), then the SDK's defaults, as in the Prime SDKs.

    :param api_key: the Prime API key (default: ``PRIME_API_KEY``, else ``api_key`` in
        ``~/.prime/config.json``).
    :param traces_url: the Traces API's base URL (default: ``PRIME_TRACES_URL``, else
        ``traces_url`` in the config file, else https://api.primeintellect.ai; never
        ``base_url``, which may not route the Traces API).
    :param team_id: sent as ``X-Prime-Team-ID`` (default: ``PRIME_TEAM_ID``, else
        ``team_id`` in the config file).
    :param base_url: the Prime API's base URL, for metrics (default: ``PRIME_API_BASE_URL``
        or ``PRIME_BASE_URL``, else ``base_url`` in the config file, else
        https://api.primeintellect.ai).
    :param run_id: the run named in every upload (default: ``RUN_ID``, else a random id).
    :param stamp_run: set ``run.id`` (``run_id``) and ``run.type`` (the episodes' ``kind``)
        on each episode and each of its member traces as it is uploaded, as prime-runs does:
        the service joins a trace to its run by them. The episodes themselves are not changed.
    :param max_in_flight: most batches at once, uploading or being assembled.
    :param queue_records: most episodes waiting to be encoded.
    :param queue_bytes: most bytes of encoded lines held, waiting for a batch, in one or
        uploading; an episode whose line would pass it is dropped as ``queue_full`` (its
        encoding stops there). In outbox mode, the most bytes of closed batches held, the
        reader waiting (never dropping) for room; the batch being filled is on top.
    :param batch_bytes: a batch closes before the line that would take it past this many
        bytes uncompressed (or past 1,000,000 lines); at most 31 MiB, so that every request
        fits the service's 32 MiB cap.
    :param gzip_level: zlib's scale, 0 (store) to 9.
    :param drain_timeout: seconds ``finalize`` waits for what is queued and in flight.
    :param retry_base: seconds of the first backoff, doubled at each retry (up to 30x).
    :param retry_for: seconds a batch is retried (an outage, a 5xx, a 429) from its first
        attempt before its records are counted ``failed``.
    :param attempt_timeout: seconds one request may take in all, sending and answer; a
        server that takes the body and never answers costs one attempt, not the read
        timeout of the socket.
    :param linger: seconds without a new episode after which a batch is sent.
    :param metrics_queue: most metrics posts waiting in their queue.
    :param option: encoder options (``encoder.OPT_*``) for each episode's line.
    :param default: called for values the encoder cannot serialize, as in orjson.
    :param float_decimals: verifiers' ``to_record(float_decimals=...)``: the per-token floats
        of verifiers episodes rounded to this many decimals, verifiers' and
        prime-rl's default; None sends every digit. A dict or another model is sent as given.
    :param outbox: a run's directory (or its stream's) to upload from; with no ``run_id``
        nor ``RUN_ID``, the run its one earlier upload went to.
    :param outbox_kind: in outbox mode, upload only the records of this kind.
    :raises ValueError: ``float_decimals`` is neither None nor an int (and the
        other settings' own checks).
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        traces_url: str | None = None,
        team_id: str | None = None,
        base_url: str | None = None,
        run_id: str | None = None,
        stamp_run: bool = True,
        max_in_flight: int = 8,
        queue_records: int = 10_000,
        queue_bytes: int = 1 << 30,
        batch_bytes: int = 30 * 2**20,
        gzip_level: int = 1,
        drain_timeout: float = 60.0,
        retry_base: float = 1.0,
        retry_for: float = 300.0,
        attempt_timeout: float = 60.0,
        linger: float = 0.05,
        metrics_queue: int = 1_000,
        option: int = 0,
        default: Callable[[Any], Any] | None = None,
        float_decimals: int | None = DEFAULT_FLOAT_DECIMALS,
        outbox: str | os.PathLike[str] | None = None,
        outbox_kind: Kind | None = None,
    ) -> None:
        self.outbox = None if outbox is None else Path(outbox)
        if outbox_kind is not None:
            check_kind(outbox_kind, "all")
            if outbox is None:
                raise ValueError("outbox_kind is for outbox mode: give outbox too")
        self.outbox_kind = outbox_kind
        self._cursor: Cursor | None = None
        self._tail: Tail | None = None
        self._stream: Path | None = None
        self._rows: deque[IndexRow] = deque()  # read from the index, not taken yet
        self._closing = False  # finalize began: the outbox reader takes the rows there are
        self._wake = anyio.Event()  # set by log_episodes and finalize: look at the index now
        self._released = anyio.Event()  # set when held bytes go down
        self._saving = anyio.Lock()
        self._skipped_warned = 0
        self._cursor_warned = -math.inf
        #: Outbox mode: bytes of the stream's lines answered for good in this process.
        self.settled_bytes = 0
        self._raw: dict[int, int] = {}  # a line's bytes in the stream, by its number, in flight
        self._filling = 0  # outbox mode: bytes of the batch being filled, not closed yet
        # The key is wrapped at once, so no repr, traceback local or log shows it.
        self._api_key = None if api_key is None else Secret(api_key)
        self.stamp_run = stamp_run
        self.float_decimals = check_float_decimals(float_decimals)
        self._records = Records(self.float_decimals)
        self._codes_logged: set[str] = set()  # rejection codes whose message was logged
        if isinstance(queue_bytes, bool) or not isinstance(queue_bytes, int) or queue_bytes < 1:
            raise ValueError(f"queue_bytes must be a positive integer, not {queue_bytes!r}")
        self.queue_bytes = queue_bytes
        #: Bytes of the encoded lines not yet counted, for ``queue_bytes``.
        self._held = 0
        #: When the pending episodes were logged, oldest first (for the age warning).
        self._logged: deque[float] = deque()
        self._uploads: set[_Tally] = set()  # batches being uploaded, or cut short
        self._metrics_attempts: Attempts | None = None  # the metrics post under way
        self._warned_pending = False
        self._args: dict[str, Any] = {
            "traces_url": traces_url,
            "team_id": team_id,
            "base_url": base_url,
            "run_id": run_id,
            "max_in_flight": max_in_flight,
            "queue_records": queue_records,
            "batch_bytes": batch_bytes,
            "batch_lines": MAX_BATCH_LINES,
            "line_bytes": MAX_LINE_BYTES,
            "gzip_level": gzip_level,
            "drain_timeout": drain_timeout,
            "retry_base": retry_base,
            "retry_after_cap": 60.0,
            "retry_for": retry_for,
            "linger": linger,
            "connect_timeout": 30.0,
            "read_timeout": 300.0,
            "attempt_timeout": attempt_timeout,
        }
        if isinstance(metrics_queue, bool) or not isinstance(metrics_queue, int):
            raise ValueError(f"metrics_queue must be a positive integer, not {metrics_queue!r}")
        if metrics_queue < 1:
            raise ValueError(f"metrics_queue must be a positive integer, not {metrics_queue!r}")
        self.metrics_queue = metrics_queue
        self.option = line_option(option)
        self.default = default
        self.config: PrimeConfig | None = None
        self._ledger = Ledger()
        self._metrics_ledger = Ledger()
        self._group: TaskGroup | None = None
        self._session: aiohttp.ClientSession | None = None
        self._client: Client | None = None
        self._worker: Worker | None = None
        self._send: MemoryObjectSendStream[_Item] | None = None
        self._receive: MemoryObjectReceiveStream[_Item] | None = None
        self._lines_send: MemoryObjectSendStream[_Encoded] | None = None
        self._lines_receive: MemoryObjectReceiveStream[_Encoded] | None = None
        self._metrics_send: MemoryObjectSendStream[bytes] | None = None
        self._metrics_receive: MemoryObjectReceiveStream[bytes] | None = None
        self._slots: anyio.Semaphore | None = None
        self._assembled = anyio.Event()
        self._arrived = anyio.Event()  # set when a line is encoded (or no more will be)
        self._metrics_done = anyio.Event()
        self._crashed = False
        self._started = False
        self._finalized = False
        self._warn_full = _RateLimitedWarning(
            "Prime monitor queue is full: dropped %d episode(s) (counted as 'queue_full')"
        )
        self._warn_metrics_full = _RateLimitedWarning(
            "Prime monitor metrics queue is full: dropped %d metrics post(s)"
        )

    def __repr__(self) -> str:
        config = self.config
        where = "not started" if config is None else f"traces_url={config.traces_url!r}"
        state = "finalized" if self._finalized else "running" if self._started else "new"
        return f"PrimeMonitor({where}, {state}, {self._ledger.snapshot()})"

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Check the settings (``UploadError`` without an API key), open the HTTP session
        and start the background tasks. After a failure, what the monitor is given is
        counted lost as ``start_failed``."""
        if self._started or self.start_error is not None:
            raise RuntimeError("PrimeMonitor is already started")
        with self._keeping_start_error():
            await self._start()

    async def _start(self) -> None:
        key = None if self._api_key is None else self._api_key.reveal()
        args = dict(self._args)
        if self.outbox is not None:
            args["retry_for"] = math.inf  # the disk holds the batch: retried until answered
            args["run_id"] = await anyio.to_thread.run_sync(self._outbox_run_id)
        # In a thread: it reads ~/.prime/config.json, and a home on a network mount may stall.
        resolve = partial(PrimeConfig.resolve, api_key=key, **args)
        config = await anyio.to_thread.run_sync(resolve)
        if self.outbox is not None:
            await anyio.to_thread.run_sync(self._open_outbox, config.run_id)
        self.config = config
        self._started = True
        session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=config.max_in_flight + 2),
            timeout=aiohttp.ClientTimeout(
                total=config.attempt_timeout,
                sock_connect=config.connect_timeout,
                sock_read=config.read_timeout,
            ),
        )
        self._session = session
        self._client = Client(config, session)
        self._client.durable = self.outbox is not None
        self._worker = Worker(name="PrimeMonitor gzip")
        self._keys = Keys()
        self._send, self._receive = anyio.create_memory_object_stream[_Item](config.queue_records)
        # Unbounded in count: what it holds is bounded in bytes (``queue_bytes``).
        self._lines_send, self._lines_receive = anyio.create_memory_object_stream[_Encoded](
            math.inf
        )
        self._metrics_send, self._metrics_receive = anyio.create_memory_object_stream[bytes](
            self.metrics_queue
        )
        self._slots = anyio.Semaphore(config.max_in_flight)
        self._assembled, self._metrics_done, self._arrived = (anyio.Event() for _ in range(3))
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        if self.outbox is None:
            group.start_soon(self._encode_lines, name="PrimeMonitor encoder")
        else:
            self._receive.close()  # no episode is queued: the stream is the queue
            group.start_soon(self._read_outbox, name="PrimeMonitor outbox reader")
        group.start_soon(self._assemble, name="PrimeMonitor batch assembler")
        group.start_soon(self._send_metrics, name="PrimeMonitor metrics sender")
        log.info(
            "Prime monitor started: traces to %s, metrics to %s, run %s",
            config.traces_url,
            config.base_url,
            config.run_id,
        )

    def _outbox_run_id(self) -> str | None:
        """The run an outbox goes to: the one named, else ``RUN_ID``, else the run of the
        stream's one earlier upload (None: a new run id)."""
        assert self.outbox is not None
        named = self._args["run_id"] or os.environ.get("RUN_ID")
        if named:
            return str(named)
        known = known_run_ids(outbox_stream(self.outbox))
        if len(known) > 1:
            raise UploadError(
                f"{self.outbox} was uploaded to several runs ({', '.join(known)}): name the "
                "one to go on with (run_id)"
            )
        return known[0] if known else None

    def _open_outbox(self, run_id: str) -> None:
        """Take the cursor's lock, read the cursor, and start reading the index."""
        assert self.outbox is not None
        stream = outbox_stream(self.outbox)
        cursor = Cursor(cursor_path(stream, run_id), run_id)
        cursor.lock()
        damage = cursor.read()
        if damage is not None:
            log.warning(
                "Prime monitor: %s; every record of the stream not confirmed since is sent "
                "again, each batch under the key it had, so the service answers for those it "
                "holds and keeps one copy",
                damage,
            )
        self._cursor = cursor
        self._stream = stream
        self._tail = Tail(stream)
        done = cursor.delivered + sum(cursor.lost.values())
        if done:
            log.info(
                "Prime monitor: resuming the upload of %s to run %s: %d record(s) answered "
                "already (%d stored)",
                stream,
                run_id,
                done,
                cursor.delivered,
            )

    async def finalize(self) -> None:
        """Deliver what is queued and in flight within ``drain_timeout``, then cancel the
        rest (counted ``drain_timeout``) and close the session. Idempotent. In outbox mode,
        what is not confirmed then stays on the disk, counted ``pending``."""
        if self._finalized:
            return
        self._finalized = True
        if self.start_error is not None:
            self._report_start_failure(
                episodes=self._ledger.submitted, metrics_posts=self._metrics_ledger.submitted
            )
            if self.outbox is not None:
                log.warning(
                    "Prime monitor: nothing of the outbox %s was uploaded; upload it with `%s`",
                    self.outbox,
                    self._upload_command(self._args["run_id"] or os.environ.get("RUN_ID")),
                )
        group, config = self._group, self.config
        if group is None or config is None:
            return
        assert self._send is not None
        assert self._metrics_send is not None
        reason = "cancelled"
        try:
            self._send.close()  # the encoder takes what is queued, then the assembler
            self._metrics_send.close()
            self._closing = True  # the outbox reader takes the rows written by now
            self._wake.set()
            self._say_what_finalize_waits_for(config.drain_timeout)
            with anyio.move_on_after(config.drain_timeout) as scope:
                await self._assembled.wait()
                await self._metrics_done.wait()
            reason = "drain_timeout" if scope.cancelled_caught else "internal_error"
        finally:
            group.cancel_scope.cancel()
            try:
                await group.__aexit__(None, None, None)
            finally:
                with anyio.CancelScope(shield=True):
                    if self._session is not None:
                        await self._session.close()
                    if self._worker is not None:
                        await self._worker.aclose()
                    if self._cursor is not None:
                        await self._close_outbox()
                    else:
                        self._count_rest(reason)

    def _upload_command(self, run_id: str | None) -> str:
        kind = f" --kind {self.outbox_kind}" if self.outbox_kind else ""
        run = f" --run-id {run_id}" if run_id else ""
        return f"nodewise traces upload {self.outbox}{run}{kind}"

    async def _close_outbox(self) -> None:
        """Count the rows not taken yet as pending, save the cursor a last time, let go of
        its lock, and say what is left on the disk and how to send it."""
        cursor, tail, config = self._cursor, self._tail, self.config
        assert cursor is not None
        assert tail is not None
        assert config is not None

        def rest() -> int:
            return sum(1 for row in [*self._rows, *tail.rows()] if self._wanted(row))

        try:
            self._ledger.submitted += await anyio.to_thread.run_sync(rest)
            await self._save_cursor()
        finally:
            cursor.unlock()
        pending = self._ledger.pending
        if pending:
            client = self._client
            outage = None if client is None else client.outage()
            why = (
                f"{outage.host} is not answering ({outage.cause})"
                if outage is not None
                else client.stop_reason
                if client is not None and client.stopped
                else f"drain_timeout {config.drain_timeout:g} s"
            )
            log.warning(
                "Prime monitor: %d episode(s) of %s are not confirmed (%s) and wait on the "
                "disk (counted 'pending'); send them with `%s`",
                pending,
                self._stream,
                why,
                self._upload_command(config.run_id),
            )

    def _say_what_finalize_waits_for(self, deadline: float) -> None:
        """When the service is not answering, say at once what finalize waits for."""
        client = self._client
        outage = None if client is None else client.outage()
        episodes, posts = self._ledger.pending, self._metrics_ledger.pending
        if outage is None or not (episodes or posts):
            return
        since = (
            f"for {time.monotonic() - outage.since:.0f} s"
            if outage.ever_answered
            else "once since the monitor started"
        )
        log.warning(
            "Prime monitor: finalize waits up to %g s (drain_timeout) for %d episode(s) and "
            "%d metrics post(s): the Prime API at %s has not answered %s (last: %s)",
            deadline,
            episodes,
            posts,
            outage.host,
            since,
            outage.cause,
        )

    def _count_rest(self, reason: str) -> None:
        """Count what finalize left undelivered: records whose request went out whole and
        was never answered as ``unconfirmed`` (the service may have stored them); the rest
        as ``unreachable`` while the service is not answering, else as ``reason``."""
        client = self._client
        outage = None if client is None else client.outage()
        if outage is not None:
            reason = "unreachable"
        unconfirmed = sum(t.left for t in self._uploads if t.attempts.may_be_stored())
        posting = self._metrics_attempts
        for ledger, what, sent in (
            (self._ledger, "episode(s)", unconfirmed),
            (
                self._metrics_ledger,
                "metrics post(s)",
                int(bool(posting and posting.may_be_stored())),
            ),
        ):
            rest = ledger.pending
            sent = min(sent, rest)
            if sent > 0:
                ledger.lost["unconfirmed"] += sent
                log.warning(
                    "Prime monitor: %d %s sent but never confirmed at finalize; the service "
                    "may have stored them",
                    sent,
                    what,
                )
            if rest > sent:
                ledger.lost[reason] += rest - sent
                log.warning(
                    "Prime monitor: %d %s not delivered at finalize (%s)%s",
                    rest - sent,
                    what,
                    reason,
                    "" if outage is None else f": {outage.host} is not answering ({outage.cause})",
                )

    def stats(self) -> DeliveryStats:
        """Episodes: submitted, delivered, lost by reason (metrics are in ``metrics_stats``);
        ``degraded["slow_to_record"]``: ``to_record()`` calls that held the event loop."""
        slow = self._records.slow
        return self._ledger.snapshot(degraded={"slow_to_record": slow} if slow else None)

    def metrics_stats(self) -> DeliveryStats:
        """Metrics posts (one per ``log_metrics`` call): submitted, delivered, lost."""
        return self._metrics_ledger.snapshot()

    # -- the caller's side: never waits -------------------------------------------------

    def _check_open(self) -> bool:
        """Whether the monitor takes records (False: its start failed, so they are lost).

        :raises RuntimeError: It was never started, or is finalized.
        """
        if self._finalized:
            raise RuntimeError("PrimeMonitor is finalized")
        if self.start_error is not None:
            return False
        if not self._started:
            raise RuntimeError("PrimeMonitor is not started; call start() or use async with")
        return True

    async def log_episodes(
        self,
        episodes: Iterable[Any],
        *,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        """Queue episodes for upload and return at once (a full queue drops and counts).
        In outbox mode, only look at the stream for new records: the outbox's records are
        what is uploaded, and counted."""
        running = self._check_open()
        check_kind(kind, subset)
        if self.outbox is not None:
            self._wake.set()
            return
        batch = list(episodes)
        ledger = self._ledger
        if not running:
            ledger.refuse(len(batch), START_FAILED)
            return
        now = time.monotonic()
        self._warn_pending(now)
        ledger.submitted += len(batch)
        assert self._send is not None
        assert self._client is not None
        if self._client.stopped:
            ledger.lost[self._client.stopped_as] += len(batch)
            return
        send = self._send.send_nowait
        for i, episode in enumerate(batch):
            try:
                send((episode, step, kind, subset))
            except anyio.WouldBlock:
                ledger.lost["queue_full"] += len(batch) - i
                self._warn_full(len(batch) - i)
                return
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                ledger.lost["internal_error"] += len(batch) - i
                log.error("Prime monitor: the encoder is gone; episodes not queued")
                return
            self._logged.append(now)

    def _warn_pending(self, now: float) -> None:
        """Warn once when what is held passes half of ``queue_bytes`` or the oldest pending
        episode has waited ``PENDING_AGE`` seconds (again after it has drained)."""
        logged, pending = self._logged, self._ledger.pending
        while len(logged) > pending:  # episodes are counted about in the order logged
            logged.popleft()
        oldest = now - logged[0] if logged else 0.0
        held = self._held
        if held > self.queue_bytes / 2 or oldest > PENDING_AGE:
            if not self._warned_pending:
                self._warned_pending = True
                log.warning(
                    "Prime monitor: %.0f MiB of episodes held (%d pending, the oldest for "
                    "%.0f s): the service is slow or unreachable. Past %.0f MiB (queue_bytes) "
                    "the newest are dropped as 'queue_full'.",
                    held / 2**20,
                    pending,
                    oldest,
                    self.queue_bytes / 2**20,
                )
        elif held < self.queue_bytes / 4:
            self._warned_pending = False

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        """Queue one metrics post (non-finite values dropped and named) and return at once."""
        ledger = self._metrics_ledger
        if not ledger.take(1, unless=None if self._check_open() else START_FAILED):
            return
        assert self.config is not None
        assert self._metrics_send is not None
        payload = {
            "run_id": self.config.run_id,
            "step": step,
            "metrics": finite_metrics(metrics, step=step),
        }
        try:
            body = encoder.encode(payload, option=encoder.OPT_SERIALIZE_NUMPY, default=self.default)
        except encoder.EncodeError as exc:
            ledger.lost["encode_error"] += 1
            log.warning("step %d: metrics not sent: %s", step, exc)
            return
        try:
            self._metrics_send.send_nowait(body)
        except anyio.WouldBlock:
            ledger.lost["queue_full"] += 1
            self._warn_metrics_full(1)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            ledger.lost["internal_error"] += 1

    # -- the background: encoding ------------------------------------------------------

    async def _encode_lines(self) -> None:
        """Encode each queued episode as it comes and hand its line to the assembler, until
        the queue is closed and empty; then close the lines' stream."""
        receive, send, client = self._receive, self._lines_send, self._client
        assert receive is not None
        assert send is not None
        assert client is not None
        ledger = self._ledger
        try:
            async with send:
                async for item in receive:
                    episode, step, kind, subset = item
                    del item
                    line = None
                    if client.stopped:
                        ledger.lost[client.stopped_as] += 1
                    else:
                        line = await self._encode(episode, step, kind)
                    if line is not None:
                        send.send_nowait((line, step, kind, subset, None))
                        self._arrived.set()
                    if line is not None and line[1] < _RELEASE_BYTES:
                        del episode  # small: freed at once
                    else:
                        # Where the caller let go of it, this holds its last reference:
                        # freed a bounded piece per step (a 60 MB episode: ~10 ms at once).
                        held = [episode]
                        del episode
                        await release(held)
        except Exception:
            self._crashed = True
            log.exception("Prime monitor: encoding failed; uploads stop")
        finally:
            receive.close()
            self._arrived.set()

    # -- the background: the outbox ------------------------------------------------------

    def _wanted(self, row: IndexRow) -> bool:
        assert self._cursor is not None
        return wanted(row, self._cursor, self.outbox_kind)

    async def _read_outbox(self) -> None:
        """Outbox mode: take each row of the stream's index as it is written, until finalize
        and the rows written by then are taken; then close the lines' stream."""
        send, tail = self._lines_send, self._tail
        assert send is not None
        assert tail is not None
        rows = self._rows
        try:
            async with send:
                while True:
                    wake = self._wake = anyio.Event()
                    closing = self._closing  # before reading: every row of now is read
                    rows.extend(await anyio.to_thread.run_sync(tail.read))
                    self._warn_skipped(tail)
                    if not rows:
                        if closing:
                            break
                        with anyio.move_on_after(OUTBOX_POLL):
                            await wake.wait()
                        continue
                    while rows:  # a row leaves the deque as it is counted, in _take
                        await self._take(rows.popleft(), send)
        except Exception:
            self._crashed = True
            log.exception("Prime monitor: reading the outbox failed; uploads stop")
        finally:
            self._arrived.set()

    def _warn_skipped(self, tail: Tail) -> None:
        for first, last in tail.skipped[self._skipped_warned :]:
            log.warning(
                "Prime monitor: the index of %s has no readable row for line(s) %d to %d; "
                "those records are not uploaded (`nodewise traces verify` names the damage)",
                self._stream,
                first,
                last,
            )
        self._skipped_warned = len(tail.skipped)

    async def _take(self, row: IndexRow, send: MemoryObjectSendStream[_Encoded]) -> None:
        """Read one row's line from the disk, stamp it and hand it to the assembler, waiting
        (never dropping) while ``queue_bytes`` are held. A line that cannot be sent is
        settled lost at once; with uploads stopped, it stays pending."""
        config, client, stream = self.config, self._client, self._stream
        assert config is not None
        assert client is not None
        assert stream is not None
        assert row.line is not None
        if not self._wanted(row):
            return
        number, kind = row.line, kind_of(row)
        self._ledger.submitted += 1
        if client.stopped:
            return  # pending: the disk keeps it
        what = f"record {number} of {stream}"
        try:
            data = await anyio.to_thread.run_sync(partial(line_at, stream, row, what=what))
        except TraceFormatError as exc:
            log.warning("Prime monitor: %s cannot be read, so not uploaded: %s", what, exc)
            await self._settle_alone(number, "damaged_record", 0)
            return
        length = len(data)
        if length > config.line_bytes + 1:  # the cap leaves out the newline
            log.warning("Prime monitor: %s refused: over %d bytes", what, config.line_bytes)
            await self._settle_alone(number, "too_large", length)
            return
        # Only closed batches count here: the open one closes when its next line comes, so
        # waiting for its bytes would wait for ever (it is at most batch_bytes more).
        while (busy := self._held - self._filling) > 0 and busy + length > self.queue_bytes:
            self._released = released = anyio.Event()
            await released.wait()
        self._held += length
        try:
            stamped = await restamp(data, run_id=config.run_id, run_type=kind)
        except ValueError as exc:
            self._release(length)
            log.warning("Prime monitor: %s is not one JSON value, so not uploaded: %s", what, exc)
            await self._settle_alone(number, "damaged_record", length)
            return
        pieces = stamped.pieces if self.stamp_run else _pieces(data)
        size = stamped.length if self.stamp_run else length
        self._held += size - length
        if size > config.line_bytes + 1:  # as stamped: what the service would refuse
            self._release(size)
            log.warning("Prime monitor: %s refused: over %d bytes", what, config.line_bytes)
            await self._settle_alone(number, "too_large", length)
            return
        line_format = "episode" if stamped.traces else "trace"
        self._raw[number] = length
        send.send_nowait(((pieces, size, line_format), row.step, kind, "all", number))
        self._arrived.set()

    def _release(self, size: int) -> None:
        self._held -= size
        self._released.set()

    async def _settle_alone(self, line: int, reason: str, size: int) -> None:
        self._ledger.lost[reason] += 1
        self.settled_bytes += size
        assert self._cursor is not None
        self._cursor.settle(line, line, delivered=0, lost={reason: 1})
        await self._save_cursor()

    async def _save_cursor(self) -> None:
        """Write the cursor as it is now, one save at a time; a disk that refuses is warned
        about (the next save tries again: until then a restart sends those batches again,
        under their keys, and the service answers for them)."""
        cursor = self._cursor
        assert cursor is not None
        async with self._saving:
            data = cursor.encode()
            try:
                await anyio.to_thread.run_sync(cursor.save, data)
            except OSError as exc:
                self._warn_cursor(exc)

    # -- the background: assembling batches ---------------------------------------------

    async def _assemble(self) -> None:
        assert self._lines_receive is not None
        try:
            async with anyio.create_task_group() as uploads:
                try:
                    await self._assemble_into(uploads)
                except Exception:
                    self._crashed = True
                    log.exception("Prime monitor: batch assembly failed; uploads stop")
        finally:
            self._lines_receive.close()
            self._assembled.set()

    async def _next(self, wait: float | None) -> _Encoded | None:
        """The next encoded line; None after ``wait`` seconds without one. Raises
        ``anyio.EndOfStream`` once the encoder is done and every line taken.

        The timed wait is on an event, never on ``receive()``: a receive cancelled by its
        deadline just as an item was handed to it would lose that item.
        """
        receive = self._lines_receive
        assert receive is not None
        try:
            return receive.receive_nowait()
        except anyio.WouldBlock:
            pass
        if wait is None:
            return await receive.receive()
        self._arrived = arrived = anyio.Event()
        with anyio.move_on_after(wait):
            await arrived.wait()
        try:
            return receive.receive_nowait()
        except anyio.WouldBlock:
            return None

    async def _assemble_into(self, uploads: TaskGroup) -> None:
        config, client, slots = self.config, self._client, self._slots
        assert config is not None
        assert client is not None
        assert slots is not None
        builder: BatchBuilder | None = None
        outbox = self._cursor is not None
        while True:
            try:
                # An outbox's batches never close for time: they are the stream's (D18).
                item = await self._next(None if builder is None or outbox else config.linger)
            except anyio.EndOfStream:
                break
            if item is None:  # the queue went quiet: send what we have
                assert builder is not None
                await self._ship(builder, uploads)
                builder = None
                continue
            (chunks, length, line_format), step, kind, subset, number = item
            if client.stopped:
                self._lose(client.stopped_as, 1)
                self._release(length)
                if builder is not None:
                    self._lose(client.stopped_as, builder.records)
                    self._filling = 0
                    self._release(builder.size)
                    builder = None
                    slots.release()
                continue
            if builder is not None and (
                (builder.kind, builder.subset, builder.line_format) != (kind, subset, line_format)
                or not builder.fits(
                    length, batch_bytes=config.batch_bytes, batch_lines=config.batch_lines
                )
                or (
                    outbox and (number != (builder.last_line or 0) + 1 or step != builder.last_step)
                )
            ):
                await self._ship(builder, uploads)
                builder = None
            if builder is None:
                await slots.acquire()  # at most max_in_flight batches exist at once
                assert self._worker is not None
                builder = BatchBuilder(
                    worker=self._worker,
                    keys=self._keys,
                    gzip_level=config.gzip_level,
                    kind=kind,
                    subset=subset,
                    line_format=line_format,
                )
            await builder.add(chunks, length, step=step, line=number)
            if outbox:
                self._filling = builder.size
                self._released.set()  # the outbox reader's wait counts the open batch apart
        if builder is not None:
            await self._ship(builder, uploads)

    async def _encode(self, episode: Any, step: int, kind: Kind) -> _Line | None:
        """One episode as its NDJSON line, then held (``_held``); or None, counted lost, if
        it cannot be one or would take what is held past ``queue_bytes``."""
        config = self.config
        assert config is not None
        ledger = self._ledger
        stamp = Stamp(config.run_id, kind) if self.stamp_run else None
        try:
            record = self._records.value(episode, edit=stamp)
        except Exception as exc:
            ledger.lost["bad_record"] += 1
            log.warning("step %d: episode has no record: %r", step, exc)
            return None
        chunks: list[bytes] = []
        length = 0
        try:
            encoded = encoder.aiterencode(record, option=self.option, default=self.default)
            async with aclosing(encoded):
                async for chunk in encoded:
                    length += len(chunk)
                    if length > config.line_bytes + 1:  # the cap leaves out the newline
                        ledger.lost["too_large"] += 1
                        log.warning(
                            "step %d: episode refused: its line is over %d bytes",
                            step,
                            config.line_bytes,
                        )
                        return None
                    if self._held + length > self.queue_bytes:  # only uploads change it meanwhile
                        ledger.lost["queue_full"] += 1
                        self._warn_full(1)
                        return None
                    chunks.append(chunk)
        except encoder.EncodeError as exc:
            ledger.lost["encode_error"] += 1
            log.warning("step %d: episode not encoded: %s", step, exc)
            return None
        # As prime-runs chooses it: a record with member traces is an episode, else a trace.
        if stamp is not None:
            traces = stamp.traces
        elif isinstance(record, Mapping):
            traces = "traces" in record
        else:
            traces = isinstance(getattr(getattr(record, "model", None), "traces", None), list)
        line_format = "episode" if traces else "trace"
        self._held += length
        return chunks, length, line_format

    async def _ship(self, builder: BatchBuilder, uploads: TaskGroup) -> None:
        """Close the batch and start its upload, which awaits the framing (queued in the
        worker) while the loop goes on with the next batch."""
        self._filling = 0
        config = self.config
        assert config is not None
        context = builder.context(config.run_id)
        closing = await builder.close(context)
        uploads.start_soon(self._upload, builder, closing, context)

    # -- the background: uploading ------------------------------------------------------

    async def _upload(
        self, builder: BatchBuilder, closing: Future[Batch], context: dict[str, str]
    ) -> None:
        slots = self._slots
        assert slots is not None
        tally = _Tally(builder.records)
        self._uploads.add(tally)
        try:
            batch = await result(closing)
            await self._post(batch, builder, context, tally)
        except Exception:
            log.exception("Prime monitor: traces batch (%d records) failed", builder.records)
            self._count(tally, "internal_error", tally.left)
        finally:
            if not tally.left:  # else cut short by finalize, which counts what is left
                self._uploads.discard(tally)
            self._release(builder.size)
            slots.release()
        if self._cursor is not None and not tally.left:
            assert builder.first_line is not None
            assert builder.last_line is not None
            delivered = tally.counts.pop("delivered", 0)
            lines = range(builder.first_line, builder.last_line + 1)
            self.settled_bytes += sum(self._raw.pop(n, 0) for n in lines)
            self._cursor.settle(
                builder.first_line, builder.last_line, delivered=delivered, lost=tally.counts
            )
            await self._save_cursor()

    async def _post(
        self, batch: Batch, builder: BatchBuilder, context: dict[str, str], tally: _Tally
    ) -> None:
        """Post one batch and count its records by the answer. A rejection naming a record
        (``RECORD_CODES``) of a batch of several lines is not counted: its halves are sent
        instead, so only the offending lines are lost (about 2·log2(lines) more requests for
        each; each half is new content, so no rejection is ever retried unchanged)."""
        config, client = self.config, self._client
        assert config is not None
        assert client is not None
        records = batch.records
        what = f"traces batch {batch.key[7:19]} ({records} records)"
        if batch.spaces:
            log.debug(
                "Prime monitor: %s repeats an earlier batch's lines; its last line ends "
                "in %d space(s) so that its key is its own",
                what,
                batch.spaces,
            )
        if batch.body.size > MAX_REQUEST_BYTES:  # one line, alone in its batch
            self._count(tally, "too_large", records)
            log.warning(
                "Prime monitor: %s refused: its request would be %d bytes, over the "
                "service's %d byte cap",
                what,
                batch.body.size,
                MAX_REQUEST_BYTES,
            )
            return
        headers = {
            "Content-Type": batch.body.content_type,
            "Idempotency-Key": batch.key,
            "X-Prime-Line-Format": builder.line_format,
        }
        tally.attempts = Attempts()
        answer = await client.post(
            config.traces_url + TRACES_PATH,
            batch.body,
            headers,
            what=what,
            committed=True,
            attempts=tally.attempts,
        )
        if answer.outcome == "delivered":
            self._count(tally, "delivered", records)
            return
        code = answer.code if answer.outcome == "rejected" else None
        if code in RECORD_CODES and records > 1:
            log.info("Prime monitor: %s rejected (%s); sending its halves", what, code)
            await self._send_halves(batch, builder, context, tally)
            return
        self._count(tally, answer.reason, records)
        # A rejection's code is logged with its message once; the counts say the rest.
        if code is not None and code in self._codes_logged:
            log.debug("Prime monitor: %s lost (%s)", what, answer.reason)
        elif answer.outcome not in ("unauthorized", "setup_error"):
            if code is not None:
                self._codes_logged.add(code)
            log.warning(
                "Prime monitor: %s lost (%s after %d attempt(s)): %s%s",
                what,
                answer.reason,
                answer.attempts,
                answer.detail if answer.status is None else f"HTTP {answer.status} {answer.detail}",
                " (later batches rejected with this code are only counted)"
                if code is not None
                else "",
            )

    async def _send_halves(
        self, batch: Batch, builder: BatchBuilder, context: dict[str, str], tally: _Tally
    ) -> None:
        config, worker = self.config, self._worker
        assert config is not None
        assert worker is not None
        lines = await result(worker.submit(batch.lines))
        middle = len(lines) // 2
        for part in (lines[:middle], lines[middle:]):
            half = BatchBuilder(
                worker=worker,
                keys=self._keys,
                gzip_level=config.gzip_level,
                kind=builder.kind,
                subset=builder.subset,
                line_format=builder.line_format,
            )
            for line in part:
                await half.add([line + b"\n"], len(line) + 1, step=0)
            await self._post(await result(await half.close(context)), builder, context, tally)

    def _count(self, tally: _Tally, reason: str, records: int) -> None:
        """Count ``records`` of a batch as ``reason``. In outbox mode, only an answer for
        good counts: the rest stay on the disk, pending."""
        if self._cursor is not None and not _settles(reason):
            return
        if reason == "delivered":
            self._ledger.delivered += records
        else:
            self._ledger.lost[reason] += records
        tally.counts[reason] += records
        tally.left -= records

    def _lose(self, reason: str, records: int) -> None:
        """Count ``records`` lost as ``reason``; in outbox mode, they stay pending unless
        the reason is an answer for good."""
        if self._cursor is None or _settles(reason):
            self._ledger.lost[reason] += records

    def _warn_cursor(self, exc: OSError) -> None:
        now = time.monotonic()
        if now - self._cursor_warned >= _WARN_EVERY * 12:
            self._cursor_warned = now
            log.warning(
                "Prime monitor: cannot save the upload's cursor %s (%s); uploads go on, and "
                "until a save succeeds a restart sends the batches confirmed since again "
                "(under their keys: the service keeps one copy)",
                self._cursor.path if self._cursor else "",
                exc,
            )

    async def _send_metrics(self) -> None:
        config, client, receive = self.config, self._client, self._metrics_receive
        assert config is not None
        assert client is not None
        assert receive is not None
        ledger = self._metrics_ledger
        url = config.base_url + METRICS_PATH
        try:
            async with receive:
                async for body in receive:
                    self._metrics_attempts = attempts = Attempts()
                    try:
                        answer = await client.post(
                            url,
                            body,
                            {"Content-Type": "application/json"},
                            what="metrics",
                            attempts=attempts,
                        )
                    except Exception:
                        self._metrics_attempts = None
                        ledger.lost["internal_error"] += 1
                        log.exception("Prime monitor: metrics post failed")
                        continue
                    self._metrics_attempts = None  # (left set when finalize cuts it short)
                    if answer.outcome == "delivered":
                        ledger.delivered += 1
                    else:
                        ledger.lost[answer.reason] += 1
                        if answer.outcome not in ("unauthorized", "setup_error"):
                            log.warning(
                                "Prime monitor: metrics post lost (%s): %s",
                                answer.outcome,
                                answer.detail,
                            )
        finally:
            self._metrics_done.set()
