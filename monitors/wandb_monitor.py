"""WandbMonitor: metrics to a W&B run's history, episodes to trace streams in the run's files.

The module is named ``wandb_monitor`` (not ``wandb``) so that it can never shadow the
``wandb`` package, whatever ends up on ``sys.path``.
"""

from __future__ import annotations

import importlib
import logging
import os
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
from anyio.abc import TaskGroup
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from ._tracelog import RunDir, TraceLog, check_updates, writer_for
from .base import START_FAILED, DeliveryStats, Ledger, Monitor, finite_metrics
from .errors import MonitorError
from .file import close_streams, degraded, ensure_writable_dir
from .records import (
    DEFAULT_FLOAT_DECIMALS,
    Kind,
    Records,
    Subset,
    check_float_decimals,
    check_kind,
    line_option,
)
from .traces import DEFAULT_CHUNK_BYTES, TraceWriter
from .traces._layout import chunk_path, scan, sealed_path
from .traces._sealed import DEFAULT_LEVEL

if TYPE_CHECKING:
    from wandb import Run

__all__ = ["WandbMonitor"]

log = logging.getLogger("monitors.wandb")

#: nodewise is installed from a checkout, not from PyPI: name commands that work from either.
INSTALL_HINT = "pip install wandb (or pip install '.[wandb]' in the nodewise checkout)"
#: What the monitor sets unless ``settings`` says otherwise: the orchestrator's stdout and
#: stderr are left alone (capturing them would hook every write, on the event loop too), no
#: code is saved, and W&B prints only what matters.
DEFAULT_SETTINGS: Mapping[str, Any] = {"console": "off", "save_code": False, "quiet": True}
#: Longest pause between two ``wandb.init`` attempts, before jitter.
_RETRY_CAP = 30.0

_Step = tuple[dict[str, Any], int]  # metrics, step


class _Stream:
    """One trace stream and which of its chunks were handed to W&B."""

    __slots__ = ("directory", "lock", "rolled", "saved", "unsaved", "writer")

    def __init__(self, writer: TraceWriter) -> None:
        self.writer = writer
        self.directory = writer.directory
        self.lock = anyio.Lock()  # one hand-over at a time
        self.rolled = 0  # chunks below this number are full (the writer rolled past them)
        #: Chunks handed to W&B, and full chunks not handed over yet (a few at most).
        self.saved: set[int] = set()
        self.unsaved: set[int] = set()

    def rolled_to(self, chunk: int) -> None:
        """Note that the chunks below ``chunk`` are full."""
        if chunk > self.rolled:
            self.unsaved.update(range(self.rolled, chunk))
            self.rolled = chunk

    def waiting(self) -> bool:
        """Whether a full chunk waits to be saved (not one whose seal failed: that one
        waits for ``finalize``, where ``close`` tries the seal again)."""
        failed = self.writer.seal_failures
        return any(n not in failed for n in list(self.unsaved))  # a copy: a thread saves


class WandbMonitor(Monitor):
    """Logs a run to Weights & Biases:

        run history                                        log_metrics, one row per step
        <run.dir>/monitors/file/traces/stream/             log_episodes, as FileMonitor
        <run.dir>/monitors/file/traces/stream.index.jsonl  writes them (prime-rl's layout)
        <run.dir>/monitors/file/traces/annotations/...     log_annotations, the shipped cohort

    The loop never waits on the SDK: wandb is imported and the run (one per monitor)
    created in a worker thread, ``run.log`` is called in order by one worker, and each
    trace chunk is saved with policy "now" once it is final (docs/design.md D13). Episodes
    are written and counted in ``stats()`` as ``FileMonitor`` does; metrics steps are
    counted in ``metrics_stats()`` (docs/design.md D8). ``start`` enters the monitor's task
    group and ``finalize`` leaves it: call both from the same task (``async with`` does).

    With ``compress`` (the default) a full chunk is sealed with zstd in the background and
    its ``.jsonl.zst`` saved at a later ``log_episodes`` once it exists; the plain file it
    replaces is never saved. ``finalize`` seals each live chunk (``seal_on_finalize``) and
    saves every chunk left and the index. A chunk whose seal failed (a full disk) is saved
    plain at ``finalize``, and counted in ``stats().degraded["seal_failed"]``. Without
    ``compress``, each plain chunk is saved once the stream rolls past it.

    Reading traces back from a run: download its ``monitors/`` files, keeping their paths;
    the directory they land in is a run directory that nodewise's readers and CLI and
    prime-rl's tools read, as a FileMonitor's (or, from a shell, ``zstd -dcf
    DIR/0*.jsonl* | jq`` on the stream's directory; ``-f`` passes a chunk left plain through
    as it is)::

        run = wandb.Api().run("entity/project/run_id")
        for f in run.files(pattern="monitors/%"):
            f.download(root="run", exist_ok=True)
        for record in monitors.traces.read_records("run"):
            ...

    ``monitors.traces.read_record("run", n)`` finds one record through the stream's index.

    :param project: The W&B project.
    :param entity: The W&B team or user; None for the default one.
    :param name: The run's display name.
    :param group: The run group.
    :param tags: The run's tags.
    :param mode: ``"online"``, ``"offline"`` or ``"disabled"``; None for ``$WANDB_MODE``,
        else ``"online"``. When disabled, episodes are not written and count as lost
        (``disabled``).
    :param dir: The directory W&B writes the run under (``wandb.init``'s ``dir``), created if
        missing; None for W&B's default.
    :param config: The run's config.
    :param settings: ``wandb.Settings`` fields, over ``DEFAULT_SETTINGS``.
    :param chunk_bytes: Most bytes in one chunk file before its stream rolls to the next.
    :param option: orjson's ``OPT_*`` flags for every record (``OPT_INDENT_2`` is refused).
    :param default: Called with each object orjson cannot write; returns one it can.
    :param fsync: Flush chunks and indexes to the disk when they roll and at ``finalize``.
    :param compress: Seal each full chunk with zstd (``NNNNN.jsonl.zst``, in a background
        thread) and save the sealed file; False keeps and saves every chunk plain.
    :param level: zstd's compression level for sealing.
    :param seal_on_finalize: Seal each stream's live chunk too at ``finalize`` (when
        ``compress``); False saves it plain.
    :param float_decimals: verifiers' ``to_record(float_decimals=...)``: the per-token floats
        (logprobs, advantages, ...) of verifiers episodes rounded to this many decimals,
        verifiers' and prime-rl's default; None writes every digit. A dict or another
        model is written as given.
    :param producer: Names this process's annotation stream (None: ``"unknown"``).
    :param metrics_queue: Steps that may wait for ``run.log``; a step logged while they
        all wait is dropped (``queue_full``).
    :param init_attempts: ``wandb.init`` attempts on transient failures (``CommError``,
        timeouts).
    :param retry_base: Seconds before the second attempt; doubled after each (30 s at most),
        then jittered.
    :raises ValueError: ``metrics_queue`` or ``init_attempts`` is below 1, ``option``
        includes ``OPT_INDENT_2``, or ``float_decimals`` is neither None nor an int.
    """

    def __init__(
        self,
        *,
        project: str,
        entity: str | None = None,
        name: str | None = None,
        group: str | None = None,
        tags: Sequence[str] | None = None,
        mode: str | None = None,
        dir: str | os.PathLike[str] | None = None,
        config: Mapping[str, Any] | None = None,
        settings: Mapping[str, Any] | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        option: int = 0,
        default: Callable[[Any], Any] | None = None,
        fsync: bool = True,
        compress: bool = True,
        level: int = DEFAULT_LEVEL,
        seal_on_finalize: bool = True,
        float_decimals: int | None = DEFAULT_FLOAT_DECIMALS,
        producer: str | None = None,
        metrics_queue: int = 10_000,
        init_attempts: int = 5,
        retry_base: float = 1.0,
    ) -> None:
        if metrics_queue < 1:
            raise ValueError(f"metrics_queue must be positive, not {metrics_queue!r}")
        if init_attempts < 1:
            raise ValueError(f"init_attempts must be positive, not {init_attempts!r}")
        self.project = project
        self.entity = entity
        self.name = name
        self.group = group
        self.tags = None if tags is None else list(tags)
        self.mode = mode or os.environ.get("WANDB_MODE") or "online"
        self.dir = None if dir is None else Path(dir)
        self.config = None if config is None else dict(config)
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self.chunk_bytes = chunk_bytes
        self.option = option
        line_option(option)  # refuse an option no JSON Lines record can take, now
        self.default = default
        self.fsync = fsync
        self.compress = compress
        self.level = level
        self.seal_on_finalize = seal_on_finalize
        self.float_decimals = check_float_decimals(float_decimals)
        self.producer = producer
        self._records = Records(self.float_decimals)
        self.metrics_queue = metrics_queue
        self.init_attempts = init_attempts
        self.retry_base = retry_base
        self.run: Run | None = None
        self._ledger = Ledger()
        self._metrics_ledger = Ledger()
        self._annotations_ledger = Ledger()
        self._streams: dict[Path, _Stream] = {}
        self._traces: TraceLog | None = None
        self._group: TaskGroup | None = None
        self._metrics_send: MemoryObjectSendStream[_Step] | None = None
        self._started = False
        self._disabled = False
        self._finalized = False

    def __repr__(self) -> str:
        state = "finalized" if self._finalized else "running" if self._group else "new"
        return f"WandbMonitor(project={self.project!r}, mode={self.mode!r}, {state})"

    # -- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        """Import wandb and create the run (both in a worker thread), then start the
        metrics worker.

        :raises MonitorError: ``dir`` cannot be written (a file, under a file, no
            permission: checked before ``wandb.init``), wandb is missing, refused the
            credentials, or init failed.
        :raises RuntimeError: The monitor was started before.

        After a failure, what the monitor is given is counted lost as ``start_failed``.
        """
        if self._started:
            raise RuntimeError("WandbMonitor is already started")
        self._started = True
        with self._keeping_start_error():
            await self._start()

    async def _start(self) -> None:
        if self.dir is not None:
            try:
                await anyio.to_thread.run_sync(ensure_writable_dir, self.dir)
            except OSError as exc:
                why = exc.strerror or str(exc)
                raise MonitorError(f"WandbMonitor cannot write to dir={self.dir}: {why}") from exc
        try:
            # Importing wandb is slow: not on the loop (docs/design.md D13).
            wandb = await anyio.to_thread.run_sync(importlib.import_module, "wandb")
        except ImportError as exc:
            raise MonitorError(f"WandbMonitor needs the wandb package: {INSTALL_HINT}") from exc
        run = await self._init(wandb)
        self._disabled = bool(run.disabled)
        send, receive = anyio.create_memory_object_stream[_Step](self.metrics_queue)
        self._metrics_send = send
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group = group
        group.start_soon(self._log_steps, receive, name="WandbMonitor metrics worker")
        log.info("W&B run %s started (%s): files in %s", run.id, self.mode, run.dir)

    async def _init(self, wandb: Any) -> Run:
        transient = (wandb.errors.CommError, TimeoutError)
        for attempt in range(1, self.init_attempts + 1):
            try:
                run: Run = await anyio.to_thread.run_sync(self._init_once, wandb)
                return run
            except wandb.errors.AuthenticationError as exc:
                raise MonitorError(f"wandb.init refused the credentials: {exc}") from exc
            except transient as exc:
                if attempt == self.init_attempts:
                    raise MonitorError(f"wandb.init failed {attempt} times; last: {exc!r}") from exc
                delay = min(_RETRY_CAP, self.retry_base * 2 ** (attempt - 1))
                delay *= random.uniform(0.5, 1.5)
                log.warning(
                    "wandb.init attempt %d/%d failed (%r); retrying in %.1f s",
                    attempt,
                    self.init_attempts,
                    exc,
                    delay,
                )
                await anyio.sleep(delay)
            except Exception as exc:  # UsageError, bad settings, ...: retrying cannot help
                raise MonitorError(f"wandb.init failed: {exc!r}") from exc
        raise AssertionError("unreachable")

    def _init_once(self, wandb: Any) -> Run:
        """One ``wandb.init``, in a worker thread."""
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        run: Run = wandb.init(
            project=self.project,
            entity=self.entity,
            name=self.name,
            group=self.group,
            tags=self.tags,
            mode=self.mode,
            dir=self.dir,
            config=self.config,
            reinit="create_new",
            settings=wandb.Settings(**self.settings),
        )
        self.run = run  # here, so that finalize finishes it even if start was cancelled
        return run

    async def finalize(self) -> None:
        """Log the queued steps, seal every stream and save its files, finish the run.
        Idempotent.

        :raises TraceWriteError: A stream's fsync failed (its files are saved all the same).
        """
        if self._finalized:
            return
        self._finalized = True
        if self.start_error is not None:
            self._report_start_failure(
                episodes=self._ledger.submitted,
                metrics_rows=self._metrics_ledger.submitted,
                annotations=self._annotations_ledger.submitted,
            )
        run, group = self.run, self._group
        if run is None:
            return
        try:
            if group is not None:
                assert self._metrics_send is not None
                self._metrics_send.close()  # the worker logs what is queued, then stops
                await group.__aexit__(None, None, None)
        finally:
            # Local work and the SDK's own finish: done even if finalize is cancelled.
            with anyio.CancelScope(shield=True):
                failures = []
                try:
                    streams = self._opened_streams() if self._traces is not None else []
                    # A failure is logged; the files still go to W&B.
                    failures = await close_streams(stream.writer for stream in streams)
                    for stream in streams:
                        await self._hand_over(stream, final=True)
                finally:
                    await anyio.to_thread.run_sync(run.finish)
                    self._count_unlogged()
                if failures:
                    raise failures[0]

    def _count_unlogged(self) -> None:
        ledger = self._metrics_ledger
        rest = ledger.submitted - ledger.delivered - sum(ledger.lost.values())
        if rest > 0:
            ledger.lost["cancelled"] += rest
            log.warning("W&B monitor: %d step(s) of metrics not logged at finalize", rest)

    def stats(self) -> DeliveryStats:
        """Episodes: submitted, written, lost by reason (metrics are in ``metrics_stats``);
        ``degraded["seal_failed"]``: chunks left plain because sealing them failed."""
        return self._ledger.snapshot(
            degraded=degraded((stream.writer for stream in self._streams.values()), self._records)
        )

    def annotation_stats(self) -> DeliveryStats:
        """Updates given to ``log_annotations``: submitted, written, lost by reason."""
        return self._annotations_ledger.snapshot()

    def metrics_stats(self) -> DeliveryStats:
        """Metrics steps (one per ``log_metrics`` call): submitted, logged, lost by reason
        (``queue_full``, ``log_error``, or ``cancelled``: still queued when ``finalize`` was
        cancelled)."""
        return self._metrics_ledger.snapshot()

    @property
    def stream_dir(self) -> Path:
        """The episodes' stream: ``<run.dir>/monitors/file/traces/stream``.

        :raises RuntimeError: The run does not exist yet (the monitor is not started).
        """
        if self.run is None:
            raise RuntimeError("WandbMonitor is not started: its run has no directory yet")
        return RunDir(Path(self.run.dir)).stream

    def _refusing(self, running: bool) -> str | None:
        """Why episodes or annotations are lost at once: the start failed, or the run is
        disabled (W&B keeps nothing, so neither do we); else None."""
        if not running:
            return START_FAILED
        return "disabled" if self._disabled else None

    def _check_open(self) -> bool:
        """Whether the monitor takes records (False: its start failed, so they are lost).

        :raises RuntimeError: It was never started, or is finalized.
        """
        if self._finalized:
            raise RuntimeError("WandbMonitor is finalized")
        if self.start_error is not None:
            return False
        if self._group is None:
            raise RuntimeError("WandbMonitor is not started; call start() or use async with")
        return True

    # -- metrics ------------------------------------------------------------------------

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        """Queue one step's metrics (non-finite values dropped and named); returns at once.

        :param metrics: Metric names and their values.
        :param step: The training step, as ``run.log`` takes it.
        :raises RuntimeError: The monitor is not started, or finalized.
        """
        ledger = self._metrics_ledger
        if not ledger.take(1, unless=None if self._check_open() else START_FAILED):
            return
        assert self._metrics_send is not None
        try:
            self._metrics_send.send_nowait((finite_metrics(metrics, step=step), step))
        except anyio.WouldBlock:
            ledger.lost["queue_full"] += 1
            log.warning("step %d: W&B metrics queue is full; step dropped", step)
        except (anyio.BrokenResourceError, anyio.ClosedResourceError):
            ledger.lost["log_error"] += 1
            log.error("step %d: the W&B metrics worker is gone; step dropped", step)

    async def _log_steps(self, receive: MemoryObjectReceiveStream[_Step]) -> None:
        """The one metrics worker: takes every queued step, logs them in order in a
        thread, and waits for that before taking more."""
        ledger = self._metrics_ledger
        async with receive:
            async for first in receive:
                steps = [first]
                while True:
                    try:
                        steps.append(receive.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                try:
                    failed = await anyio.to_thread.run_sync(self._log_in_thread, steps)
                except Exception:
                    log.exception("W&B monitor: logging %d step(s) failed", len(steps))
                    failed = len(steps)
                ledger.delivered += len(steps) - failed
                if failed:
                    ledger.lost["log_error"] += failed

    def _log_in_thread(self, steps: list[_Step]) -> int:
        """``run.log`` each step, in order; returns how many failed."""
        run = self.run
        assert run is not None
        failed = 0
        for metrics, step in steps:
            try:
                run.log(metrics, step=step)
            except Exception:
                failed += 1
                log.warning("step %d: run.log failed", step, exc_info=True)
        return failed

    # -- episodes -----------------------------------------------------------------------

    def _trace_log(self) -> TraceLog:
        if self._traces is None:
            assert self.run is not None
            run = RunDir(Path(self.run.dir))
            self._traces = TraceLog(run, producer=self.producer, writer=writer_for(self))
        return self._traces

    def _opened_streams(self) -> list[_Stream]:
        """A ``_Stream`` for each stream the trace log opened, each noted full below the
        chunk its writer is at."""
        streams = []
        for writer in self._trace_log().writers():
            stream = self._streams.get(writer.directory)
            if stream is None:
                stream = self._streams[writer.directory] = _Stream(writer)
            stream.rolled_to(writer.chunk)
            streams.append(stream)
        return streams

    async def log_episodes(
        self,
        episodes: Iterable[Any],
        *,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        """Write the episodes to the run's trace stream (the ``"effective"`` cohort as
        annotations), in order, as ``FileMonitor`` does; full chunks that are final by now
        (sealed, without ``compress``: rolled past) are then handed to W&B.

        :param episodes: verifiers episodes, pydantic models, objects with ``to_record()``, or
            Mappings (``Records``).
        :param step: The training step they belong to.
        :param kind: ``"train"`` or ``"eval"``.
        :param subset: ``"all"`` or ``"effective"``.
        :raises TraceWriteError: The disk refused a write (what was lost is counted).
        :raises RuntimeError: The monitor is not started, or finalized.
        """
        running = self._check_open()
        check_kind(kind, subset)
        batch = list(episodes)
        if not self._ledger.take(len(batch), unless=self._refusing(running)):
            return
        traces = self._trace_log()
        await traces.log(batch, self._ledger, self._records, step=step, kind=kind, subset=subset)
        await self._save_full_chunks()

    async def _save_full_chunks(self) -> None:
        for stream in self._opened_streams():
            if stream.waiting():
                await self._hand_over(stream, final=False)

    async def log_annotations(
        self, updates: Iterable[Mapping[str, Any]], *, step: int | None = None
    ) -> None:
        """Append trace updates to this producer's annotation stream, as ``FileMonitor``
        does; its sealed chunks and index are saved to the run as the episodes' are.
        Counted in ``annotation_stats()`` as ``FileMonitor`` counts them; with
        ``mode="disabled"`` they are lost as ``disabled``, as its episodes.

        :raises TypeError: An update is not a Mapping with a string ``trace_id``.
        :raises TraceWriteError: The disk refused a write.
        :raises RuntimeError: The monitor is not started, or finalized.
        """
        running = self._check_open()
        batch = check_updates(updates)
        ledger = self._annotations_ledger
        if not ledger.take(len(batch), unless=self._refusing(running)):
            return
        await self._trace_log().annotate(batch, ledger, step=step)
        await self._save_full_chunks()

    async def _hand_over(self, stream: _Stream, *, final: bool) -> None:
        """Save the stream's full chunks that are final and not saved yet (``final``: every
        chunk left, and the index) with policy "now", in a thread. A failure is logged, not
        raised: the files stay in the run's directory, and ``finalize`` tries again."""
        async with stream.lock:
            if not final and not stream.waiting():
                return  # another call handed them over meanwhile
            try:
                await anyio.to_thread.run_sync(self._save_in_thread, stream, final)
            except Exception:
                log.warning("W&B monitor: cannot save files of %s", stream.directory, exc_info=True)

    def _save_in_thread(self, stream: _Stream, final: bool) -> None:
        """``run.save`` each full chunk not saved yet whose file is final, in order (with
        ``final``, the writer closed: every chunk left, and then the index), and note it in
        ``stream.saved``.

        A chunk's final file is its sealed one once that exists (it is renamed into place
        whole, so it may be saved while the plain one is still being removed). Before
        ``final`` a plain chunk is saved only without ``compress``: with it, the plain
        chunk is about to be replaced, or (its seal failed) waits for the seal ``close``
        tries again. At ``final`` a chunk still plain stays so: it is saved plain.
        """
        run = self.run
        assert run is not None
        directory = stream.directory
        if final:
            listing = scan(directory)
            sealed = set(listing.sealed)
            chunks = [n for n in listing.chunks if n not in stream.saved]
        else:
            chunks = sorted(stream.unsaved)
            sealed = {n for n in chunks if sealed_path(directory, n).exists()}
        for n in chunks:
            if n in sealed:
                path = sealed_path(directory, n)
            elif final or not self.compress:
                path = chunk_path(directory, n)
            else:
                continue  # sealing in the background: a later call saves it
            # Literal file names (no glob metacharacters) under base_path=run.dir: W&B finds
            # them already in its files directory and just registers them.
            run.save(str(path), base_path=run.dir, policy="now")
            stream.saved.add(n)
            stream.unsaved.discard(n)
        index = stream.writer.index
        if final and index.exists():
            run.save(str(index), base_path=run.dir, policy="now")
