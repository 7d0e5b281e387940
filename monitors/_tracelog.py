"""A run's traces as prime-rl lays them out: one stream of every episode, written once, and
annotation streams of what is learnt about its traces later (docs/design.md D9, D17).

```
RUN/monitors/file/metrics.jsonl
RUN/monitors/file/traces/stream/                  every episode, in arrival order
RUN/monitors/file/traces/stream.index.jsonl       a row per episode (prime-rl's index_row)
RUN/monitors/file/traces/annotations/<producer>/  updates naming traces (prime-rl's update.py)
RUN/monitors/file/traces/annotations/<producer>.index.jsonl
```
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, Protocol

import anyio

import encoder

from .base import Ledger
from .errors import TraceWriteError
from .records import Kind, Records, Subset
from .traces import TraceWriter
from .traces._layout import RUN_ANNOTATIONS, RUN_STREAM, IndexRow, decode_row
from .traces._summary import Summary, episode_ids, episode_row

__all__ = [
    "UPDATE_VERSION",
    "RunDir",
    "TraceLog",
    "annotation_row",
    "check_updates",
    "shipped_update",
    "writer_for",
]

log = logging.getLogger("monitors.file")

#: prime-rl's ``UPDATE_VERSION``: the version of the update records written.
UPDATE_VERSION: Final = 1
#: The annotation stream of a monitor given no producer (prime-rl's name for it).
DEFAULT_PRODUCER: Final = "unknown"


class RunDir:
    """Where prime-rl's file monitor keeps a run's files, under the run's directory
    ``root``."""

    def __init__(self, root: Path) -> None:
        self.root = root
        #: The episodes' stream (its index is ``stream.index.jsonl`` beside it).
        self.stream = root / RUN_STREAM
        self.annotations = root / RUN_ANNOTATIONS
        #: ``root/monitors/file``: everything the file monitor writes.
        self.monitor = self.stream.parent.parent
        self.metrics = self.monitor / "metrics.jsonl"

    def annotation_stream(self, producer: str | None) -> Path:
        """The annotation stream a producer writes (one writer per stream)."""
        return self.annotations / (producer or DEFAULT_PRODUCER)


def annotation_row(update: Any, top: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """An annotation's index row (prime-rl's ``update_index_row``): its trace and scalars;
    the per-token streams stay in the stream. (``top``: a ``Summary``'s, unused.)"""
    update = update if isinstance(update, Mapping) else {}
    return {
        "trace_id": update.get("trace_id"),
        "chunk": None,
        "offset": None,
        "info": update.get("info") or {},
    }


def shipped_update(trace_id: str, *, step: int, kind: Kind) -> dict[str, Any]:
    """The update that marks a trace as part of the cohort shipped at ``step`` (what
    ``log_episodes(..., subset="effective")`` writes in place of a second copy)."""
    return {
        "version": UPDATE_VERSION,
        "trace_id": trace_id,
        "info": {"shipped": {"step": step, "kind": kind}},
        "branches": [],
    }


def check_updates(updates: Any) -> list[Mapping[str, Any]]:
    """``updates`` as a list, each a Mapping with a string ``trace_id``.

    :raises TypeError: One is not; the message names which.
    """
    batch = list(updates)
    for i, update in enumerate(batch):
        if not isinstance(update, Mapping) or type(update.get("trace_id")) is not str:
            raise TypeError(
                f"update {i} must be a Mapping with a string 'trace_id' "
                f"(prime-rl's make_update), not {update!r:.80}"
            )
    return batch


class StreamOptions(Protocol):
    """A monitor's options for its trace streams (FileMonitor's and WandbMonitor's)."""

    chunk_bytes: int
    option: int
    default: Callable[[Any], Any] | None
    fsync: bool
    compress: bool
    level: int
    seal_on_finalize: bool


def writer_for(monitor: StreamOptions) -> Callable[[Path, Summary], TraceWriter]:
    """What makes the writers of ``monitor``'s streams, with its options."""

    def writer(directory: Path, summary: Summary) -> TraceWriter:
        return TraceWriter(
            directory,
            chunk_bytes=monitor.chunk_bytes,
            option=monitor.option,
            default=monitor.default,
            fsync=monitor.fsync,
            compress=monitor.compress,
            level=monitor.level,
            seal_on_close=monitor.seal_on_finalize,
            summary=summary,
        )

    return writer


class TraceLog:
    """The trace streams of one run directory, opened as first written to.

    :param run: Where the streams live.
    :param producer: The name of this writer's annotation stream (None: ``"unknown"``).
    :param writer: Makes the writer of a stream in a directory, its rows summed up by the
        given ``Summary``.
    """

    def __init__(
        self, run: RunDir, *, producer: str | None, writer: Callable[[Path, Summary], TraceWriter]
    ) -> None:
        self.run = run
        self.producer = producer
        self._writer = writer
        self.stream = writer(run.stream, episode_row)
        self.annotations: TraceWriter | None = None
        #: The ids of the episodes in the stream (read from its index when first needed).
        self._ids: set[Any] | None = None

    def writers(self) -> list[TraceWriter]:
        """Every stream opened, the episodes' first."""
        return [self.stream] + ([self.annotations] if self.annotations is not None else [])

    def _annotation_writer(self) -> TraceWriter:
        if self.annotations is None:
            self.annotations = self._writer(
                self.run.annotation_stream(self.producer), annotation_row
            )
        return self.annotations

    async def log(
        self,
        batch: list[Any],
        ledger: Ledger,
        records: Records,
        *,
        step: int,
        kind: Kind,
        subset: Subset,
    ) -> int:
        """Write a batch the way ``log_episodes`` promises, counting each episode in
        ``ledger``; return the highest chunk of the episodes' stream written to (-1: none).

        ``"all"``: each episode appended to the stream. ``"effective"``: each episode's
        traces marked as shipped at ``step`` in the annotation stream (``shipped_update``),
        the episode first appended to the stream if it is not there yet (by its id), so
        nothing is written twice and nothing is lost. An episode is delivered once all of
        that is written; else lost as ``bad_record`` (not a record, or ``to_record()``
        raised; the rest go on), ``encode_error`` (likewise), ``write_error`` or
        ``cancelled`` (this one and the rest, then the error is raised).

        :raises TraceWriteError: The disk refused a write.
        """
        with _rest_lost(ledger, len(batch)):  # a stream that cannot be opened keeps nothing
            ids = await self._known_ids() if subset == "effective" else None
        annotations = self._annotation_writer() if subset == "effective" else None
        chunk = -1
        for i, episode in enumerate(batch):
            try:
                value = records.value(episode)
            except Exception as exc:
                ledger.lost["bad_record"] += 1
                log.warning("step %d: episode %d has no record: %r", step, i, exc)
                continue
            with _rest_lost(ledger, len(batch) - i):
                record_id, trace_ids = episode_ids(value)
                if ids is None or not _id_like(record_id) or record_id not in ids:
                    written = await _append(self.stream, value, ledger, step=step, kind=kind, i=i)
                    if written is None:
                        continue
                    chunk = max(chunk, written.chunk)
                    self.note(written.id)
                if annotations is not None:
                    for trace_id in trace_ids:
                        update = shipped_update(trace_id, step=step, kind=kind)
                        await annotations.append(update, step=step)
            ledger.delivered += 1
        return chunk

    async def annotate(
        self, updates: list[Mapping[str, Any]], ledger: Ledger, *, step: int | None
    ) -> None:
        """Append updates to this producer's annotation stream, in order, counting each in
        ``ledger``: delivered once written, else lost as ``encode_error`` (the rest go on),
        ``write_error`` or ``cancelled`` (this one and the rest, then the error is raised).

        :raises TraceWriteError: The disk refused a write.
        """
        writer = self._annotation_writer()
        for i, update in enumerate(updates):
            with _rest_lost(ledger, len(updates) - i):
                try:
                    await writer.append(update, step=step)
                except encoder.EncodeError as exc:
                    ledger.lost["encode_error"] += 1
                    log.warning("update %d (trace %s) not written: %s", i, update["trace_id"], exc)
                    continue
            ledger.delivered += 1

    async def _known_ids(self) -> set[Any]:
        """The ids of the episodes in the stream: read from its index once (in a worker
        thread), then kept up to date by ``note``."""
        if self._ids is None:
            await self.stream.open()
            index = self.stream.index

            def read() -> set[Any]:
                found: set[Any] = set()
                with open(index, "rb") as f:
                    for line in f:
                        try:
                            record_id = decode_row(line).id
                        except ValueError:
                            continue  # a damaged row: its episode may be written again
                        if _id_like(record_id):
                            found.add(record_id)
                return found

            self._ids = await anyio.to_thread.run_sync(read)
        return self._ids

    def note(self, record_id: Any) -> None:
        """Remember that the episode ``record_id`` is in the stream."""
        if self._ids is not None and _id_like(record_id):
            self._ids.add(record_id)


@contextmanager
def _rest_lost(ledger: Ledger, left: int) -> Iterator[None]:
    """Around writing a record: a disk that refuses (``write_error``) or a cancellation
    (``cancelled``) loses it and the ``left - 1`` after it; the error goes on up."""
    try:
        yield
    except TraceWriteError:
        ledger.lost["write_error"] += left
        raise
    except BaseException:
        ledger.lost["cancelled"] += left
        raise


def _id_like(record_id: Any) -> bool:
    """Whether an episode is known by ``record_id``: a string or an int (not a bool)."""
    return type(record_id) is str or type(record_id) is int


async def _append(
    writer: TraceWriter, value: Any, ledger: Ledger, *, step: int, kind: Kind, i: int
) -> IndexRow | None:
    """Append one record; an encoding failure is counted lost and gives None."""
    try:
        return await writer.append(value, step=step, kind=kind)
    except encoder.EncodeError as exc:
        ledger.lost["encode_error"] += 1
        log.warning("step %d: episode %d not written: %s", step, i, exc)
        return None
