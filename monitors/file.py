"""FileMonitor: a run directory in prime-rl's layout: metrics rows, one trace stream, its
annotations."""

from __future__ import annotations

import errno
import logging
import os
import secrets
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

import anyio

import encoder

from ._files import last_newline_end, write_all
from ._tracelog import RunDir, TraceLog, check_updates, writer_for
from .base import START_FAILED, DeliveryStats, Ledger, Monitor, finite_metrics
from .errors import TraceWriteError
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
from .traces._sealed import DEFAULT_LEVEL

__all__ = ["FileMonitor"]

log = logging.getLogger("monitors.file")


def ensure_writable_dir(root: Path) -> None:
    """Create ``root`` (with its parents) and check that files can be created in it, by
    creating and removing a probe file. Blocking: run it in a worker thread.

    Done when a monitor starts, so that a wrong path fails there, with its reason, rather
    than at the first record (or, for W&B, inside ``wandb.init``).

    :raises OSError: ``root`` cannot be created or written; ``strerror`` says why.
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
    except FileExistsError as exc:  # what mkdir says of a file (or dangling link) in the way
        why = "it is a file, not a directory" if root.is_file() else "it is not a directory"
        raise NotADirectoryError(errno.ENOTDIR, why, str(root)) from exc
    except NotADirectoryError as exc:
        above = next((p for p in root.parents if p.exists() and not p.is_dir()), None)
        why = "not a directory" if above is None else f"{above} is a file, not a directory"
        raise NotADirectoryError(errno.ENOTDIR, why, str(root)) from exc
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot create it ({_why(exc)})", str(root)) from exc
    probe = root / f".nodewise-probe-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError as exc:
        raise type(exc)(exc.errno, f"cannot create a file in it ({_why(exc)})", str(root)) from exc
    os.close(fd)
    probe.unlink()


async def close_streams(writers: Iterable[TraceWriter]) -> list[TraceWriteError]:
    """Close every stream at once, so that their last seals run side by side (one core
    each), and return what failed (logged already), in the streams' order, rather than stop
    at the first: every stream gets closed."""
    failures: dict[int, TraceWriteError] = {}

    async def close(i: int, writer: TraceWriter) -> None:
        try:
            await writer.close()
        except TraceWriteError as exc:
            failures[i] = exc

    async with anyio.create_task_group() as group:
        for i, writer in enumerate(writers):
            group.start_soon(close, i, writer)
    return [failures[i] for i in sorted(failures)]


#: The keys of a metrics row of its own, before the metrics.
ROW_KEYS: Final = ("step", "time")


def metrics_row(
    metrics: Mapping[str, Any], *, step: int, producer: str | None = None
) -> dict[str, Any]:
    """One ``metrics.jsonl`` row, as prime-rl's file monitor writes it: ``{"step": step,
    "time": now, **metrics}`` (and ``"producer"`` last, when given), the metrics finite
    (``finite_metrics``). A metric named ``step`` or ``time`` (or ``producer``, when given)
    would overwrite the row's own key: it is dropped and named."""
    kept = finite_metrics(metrics, step=step)
    own = ROW_KEYS if producer is None else (*ROW_KEYS, "producer")
    clashing = [key for key in own if key in kept]
    if clashing:
        log.warning(
            "step %d: dropped metrics named as a row's own keys: %s", step, ", ".join(clashing)
        )
        for key in clashing:
            del kept[key]
    row = {"step": step, "time": time.time(), **kept}
    if producer is not None:
        row["producer"] = producer
    return row


def degraded(writers: Iterable[TraceWriter], records: Records) -> dict[str, int]:
    """``DeliveryStats.degraded`` of these streams: ``{"seal_failed": n}`` for the ``n``
    chunks left plain because sealing them failed, ``{"slow_to_record": n}`` for the ``n``
    episodes whose ``to_record()`` held the event loop (``SLOW_TO_RECORD``); nothing that
    did not happen."""
    counts = {
        "seal_failed": sum(len(writer.seal_failures) for writer in writers),
        "slow_to_record": records.slow,
    }
    return {kind: n for kind, n in counts.items() if n}


def _why(exc: OSError) -> str:
    """An OSError's reason in words, without the errno and path ``str`` repeats."""
    return exc.strerror or str(exc)


def _append_whole(fd: int, line: bytes) -> None:
    """Append ``line`` to ``fd`` (opened ``O_APPEND``), all of it or none: a write that fails
    part-way (a full disk) is cut back off, so the file never ends in a partial line for the
    next one to be glued onto.

    :raises OSError: The write failed (the file is as it was, unless cutting failed too,
        which is logged).
    """
    before = os.fstat(fd).st_size
    try:
        write_all(fd, line)
    except OSError:
        try:
            os.ftruncate(fd, before)
        except OSError as cut:
            log.error("cannot cut a partial metrics line back off (fd %d): %s", fd, cut)
        raise


def _mend_tail(fd: int, path: Path) -> int:
    """Cut a torn last line (a crash mid-write) off the end of ``fd``: the file then ends
    just after its last newline. Returns the bytes cut (0 when the file was whole)."""
    size = os.fstat(fd).st_size
    end = last_newline_end(path, size)
    if end < size:
        os.ftruncate(fd, end)
        log.warning(
            "%s ended in a torn line (a crash mid-write?): cut %d bytes off its end",
            path,
            size - end,
        )
    return size - end


class FileMonitor(Monitor):
    """Writes a run to its directory ``root`` in prime-rl's file-monitor layout, which
    prime-rl's own tools (its dashboard, eval resume, scripts) read:

        root/monitors/file/metrics.jsonl                 {"step", "time", **metrics} per call
        root/monitors/file/traces/stream/00000.jsonl.zst every episode, train and eval, one
                                                         per line in arrival order, sealed
                                                         with zstd once full
        root/monitors/file/traces/stream/00001.jsonl     the live chunk, plain until finalize
        root/monitors/file/traces/stream.index.jsonl     a row per episode: prime-rl's
                                                         index_row (reward, tokens, ...) and
                                                         where it is (line, chunk, offset)
        root/monitors/file/traces/annotations/<producer>/  updates naming traces (the
                                                         shipped cohort, log_annotations)

    Each episode is written once. ``log_episodes(..., subset="effective")`` writes no second
    copy: it marks the episodes' traces as shipped at that step in the annotation stream
    (``monitors.traces.read_records(..., fold=True)`` folds them back on), and writes an
    episode to the stream first only if it is not there yet.

    ``start`` creates ``root`` and checks it can be written, so that a wrong path fails
    there. ``log_episodes`` returns once its episodes are written, in order, while the event
    loop keeps serving other tasks (encoding is cooperative, file writes run in a worker
    thread). A record that cannot be encoded is counted lost (``encode_error``) and the rest
    of the call goes on; a disk that refuses raises ``TraceWriteError`` after counting what
    was lost (``write_error``), and the stream stays readable up to its last complete record.
    A metrics line is written whole or not at all (a failed write is cut back off), and a
    torn last line left by a crash is cut off before the first metrics of a new monitor.

    A chunk that fails to seal (a full disk) stays plain and readable; ``stats()`` counts it
    in ``degraded["seal_failed"]`` (docs/design.md D8, D9).

    :param root: The run's directory, created by ``start``.
    :param chunk_bytes: Most bytes in one chunk file before its stream rolls to the next.
    :param option: orjson's ``OPT_*`` flags for every record (``OPT_INDENT_2`` is refused).
    :param default: Called with each object orjson cannot write; returns one it can.
    :param fsync: Flush chunks and indexes to the disk when they roll and at ``finalize``.
    :param compress: Seal each full chunk with zstd (``NNNNN.jsonl.zst``, in a background
        thread, the plain file removed); False keeps every chunk plain JSONL.
    :param level: zstd's compression level for sealing.
    :param seal_on_finalize: Seal each stream's live chunk too at ``finalize`` (when
        ``compress``); False leaves it plain.
    :param float_decimals: verifiers' ``to_record(float_decimals=...)``: the per-token floats
        (logprobs, advantages, ...) of verifiers episodes rounded to this many decimals,
        verifiers' and prime-rl's default; None writes every digit. A dict or another
        model is written as given.
    :param producer: This process's name among a run's writers: added to each metrics row
        (``"producer"``) and naming its annotation stream (None: ``"unknown"``), as
        prime-rl's.
    :raises ValueError: ``option`` includes ``OPT_INDENT_2``, or ``float_decimals`` is
        neither None nor an int.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        option: int = 0,
        default: Callable[[Any], Any] | None = None,
        fsync: bool = True,
        compress: bool = True,
        level: int = DEFAULT_LEVEL,
        seal_on_finalize: bool = True,
        float_decimals: int | None = DEFAULT_FLOAT_DECIMALS,
        producer: str | None = None,
    ) -> None:
        self.root = Path(root)
        self.producer = producer
        self.run = RunDir(self.root)
        #: The episodes' stream (``root/monitors/file/traces/stream``).
        self.stream_dir = self.run.stream
        self.chunk_bytes = chunk_bytes
        self.option = option
        line_option(option)  # refuse an option no JSON Lines record can take, now
        self.default = default
        self.fsync = fsync
        self.compress = compress
        self.level = level
        self.seal_on_finalize = seal_on_finalize
        self.float_decimals = check_float_decimals(float_decimals)
        self._records = Records(self.float_decimals)
        self._ledger = Ledger()
        self._metrics_ledger = Ledger()
        self._annotations_ledger = Ledger()
        self._traces = TraceLog(self.run, producer=producer, writer=writer_for(self))
        self._metrics_lock = anyio.Lock()
        #: Whether metrics.jsonl is known to end with a whole line (else it is mended first).
        self._metrics_whole = False
        self._finalized = False

    async def start(self) -> None:
        """Create ``root`` and check that it can be written (in a worker thread).

        :raises TraceWriteError: ``root`` is a file, lies under one, or cannot be written;
            the message names it and says why. What the monitor is given then is counted
            lost as ``start_failed``.
        """
        with self._keeping_start_error():
            try:
                await anyio.to_thread.run_sync(ensure_writable_dir, self.root)
            except OSError as exc:
                raise TraceWriteError(f"cannot write to {self.root}: {_why(exc)}") from exc

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        """Append one line to ``metrics.jsonl``, flat as prime-rl writes it: ``{"step": N,
        "time": t, **metrics}`` (non-finite values dropped and named; so is a metric named
        ``step`` or ``time``, which would take the row's own key).

        Counted in ``metrics_stats()``: delivered once written, else lost as
        ``encode_error`` (logged; nothing raised), ``write_error`` or ``start_failed``.

        :param metrics: Metric names and their values.
        :param step: The training step they belong to.
        :raises TraceWriteError: The disk refused the write; the file is left ending in a
            whole line.
        :raises RuntimeError: The monitor is finalized.
        """
        self._check_open()
        ledger = self._metrics_ledger
        if not ledger.take(1, unless=self._refusing()):
            return
        try:
            line = encoder.encode(
                metrics_row(metrics, step=step, producer=self.producer),
                option=self.option | encoder.OPT_APPEND_NEWLINE | encoder.OPT_SERIALIZE_NUMPY,
                default=self.default,
            )
        except encoder.EncodeError as exc:
            ledger.lost["encode_error"] += 1
            log.warning("step %d: metrics not written: %s", step, exc)
            return
        path = self.run.metrics
        try:
            async with self._metrics_lock:
                await anyio.to_thread.run_sync(self._append_metrics, path, line)
        except OSError as exc:
            ledger.lost["write_error"] += 1
            raise TraceWriteError(f"cannot append to {path}: {exc}") from exc
        except BaseException:
            ledger.lost["cancelled"] += 1
            raise
        ledger.delivered += 1

    def _append_metrics(self, path: Path, line: bytes) -> None:
        """Append one metrics line whole (in a worker thread). The first time (a crash may
        have torn the last line), and after a failed write (cutting it back off may have
        failed too), first cut a torn last line off."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            if not self._metrics_whole:
                _mend_tail(fd, path)
                self._metrics_whole = True
            try:
                _append_whole(fd, line)
            except OSError:
                self._metrics_whole = False  # should cutting have failed too: look next time
                raise
        finally:
            os.close(fd)

    async def log_episodes(
        self,
        episodes: Iterable[Any],
        *,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        self._check_open()
        check_kind(kind, subset)
        batch = list(episodes)
        ledger = self._ledger
        if not ledger.take(len(batch), unless=self._refusing()):
            return
        await self._traces.log(batch, ledger, self._records, step=step, kind=kind, subset=subset)

    async def log_annotations(
        self, updates: Iterable[Mapping[str, Any]], *, step: int | None = None
    ) -> None:
        """Append trace updates (prime-rl's ``make_update``: ``{"version", "trace_id",
        "info", "branches"}``) to this producer's annotation stream, in order, each with
        its index row (``trace_id``, ``info``, where it is). Readers fold them onto the
        episodes' traces when asked (``read_records(..., fold=True)``).

        Counted in ``annotation_stats()``: delivered once written, else lost as
        ``encode_error`` (logged; the rest go on), ``write_error``, ``cancelled`` or
        ``start_failed``.

        :param updates: The updates.
        :param step: The training step, kept in each index row.
        :raises TypeError: An update is not a Mapping with a string ``trace_id`` (nothing of
            the call is written or counted: the caller's bug).
        :raises TraceWriteError: The disk refused a write.
        :raises RuntimeError: The monitor is finalized.
        """
        self._check_open()
        batch = check_updates(updates)
        ledger = self._annotations_ledger
        if not ledger.take(len(batch), unless=self._refusing()):
            return
        await self._traces.annotate(batch, ledger, step=step)

    async def finalize(self) -> None:
        if self._finalized:
            return
        self._finalized = True
        if self.start_error is not None:
            self._report_start_failure(
                episodes=self._ledger.submitted,
                metrics_rows=self._metrics_ledger.submitted,
                annotations=self._annotations_ledger.submitted,
            )
        failures = await close_streams(self._traces.writers())
        if failures:
            raise failures[0]

    def stats(self) -> DeliveryStats:
        """Episodes: submitted, written, lost by reason; ``degraded``: chunks left plain
        because sealing them failed (``seal_failed``), ``to_record()`` calls that held the
        event loop (``slow_to_record``)."""
        return self._ledger.snapshot(degraded=degraded(self._traces.writers(), self._records))

    def annotation_stats(self) -> DeliveryStats:
        """Updates given to ``log_annotations``: submitted, written, lost by reason."""
        return self._annotations_ledger.snapshot()

    def metrics_stats(self) -> DeliveryStats:
        """Metrics rows (one per ``log_metrics`` call): submitted, written, lost by reason."""
        return self._metrics_ledger.snapshot()

    def _refusing(self) -> str | None:
        """Why what the monitor is given is lost at once: its start failed; else None."""
        return START_FAILED if self.start_error is not None else None

    def _check_open(self) -> None:
        if self._finalized:
            raise RuntimeError("FileMonitor is finalized")
