"""FileMonitor: metrics to a JSONL file, episodes to one trace stream per (kind, subset)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

import anyio

import encoder

from .base import DeliveryStats, Ledger, Monitor, finite_metrics
from .errors import TraceWriteError
from .records import Kind, Subset, build_record, check_kind, line_option
from .traces import DEFAULT_CHUNK_BYTES, TraceWriter

__all__ = ["FileMonitor"]

log = logging.getLogger("monitors.file")


async def write_episodes(
    writer: TraceWriter,
    batch: list[Any],
    ledger: Ledger,
    *,
    step: int,
    kind: Kind,
    subset: Subset,
) -> int:
    """Append each episode's record to ``writer``, in order, counting each in ``ledger``:
    delivered once written, else lost as ``bad_record`` (``to_record()`` raised, the rest go
    on), ``encode_error`` (likewise), ``write_error`` or ``cancelled`` (this one and the rest,
    then the error is raised).

    :param writer: The stream to append to.
    :param batch: The episodes.
    :param ledger: Where deliveries and losses are counted.
    :param step: The training step, written into each index row (as are kind and subset).
    :param kind: ``"train"`` or ``"eval"``.
    :param subset: ``"all"`` or ``"effective"``.
    :returns: The highest chunk number written to (-1: none).
    :raises TraceWriteError: The disk refused a write.
    """
    chunk = -1
    for i, episode in enumerate(batch):
        try:
            record = build_record(episode)
        except Exception as exc:
            ledger.lost["bad_record"] += 1
            log.warning("step %d: episode %d has no record: %r", step, i, exc)
            continue
        try:
            row = await writer.append(record, step=step, kind=kind, subset=subset)
        except encoder.EncodeError as exc:
            ledger.lost["encode_error"] += 1
            log.warning("step %d: episode %d not written: %s", step, i, exc)
        except TraceWriteError:
            ledger.lost["write_error"] += len(batch) - i
            raise
        except BaseException:
            ledger.lost["cancelled"] += len(batch) - i
            raise
        else:
            ledger.delivered += 1
            chunk = max(chunk, row.chunk)
    return chunk


class FileMonitor(Monitor):
    """Writes a run to ``root``:

        root/metrics.jsonl                      {"step", "time", "metrics"} per call
        root/traces/<kind>/<subset>/00000.jsonl  one episode per line (see monitors.traces)

    ``log_episodes`` returns once its episodes are written, in order, while the event loop
    keeps serving other tasks (encoding is cooperative, file writes run in a worker thread).
    A record that cannot be encoded is counted lost (``encode_error``) and the rest of the
    call goes on; a disk that refuses raises ``TraceWriteError`` after counting what was lost
    (``write_error``), and the stream stays readable up to its last complete record.

    :param root: The run's directory, created by ``start``.
    :param chunk_bytes: Most bytes in one chunk file before its stream rolls to the next.
    :param option: orjson's ``OPT_*`` flags for every record (``OPT_INDENT_2`` is refused).
    :param default: Called with each object orjson cannot write; returns one it can.
    :param fsync: Flush chunks and indexes to the disk when they roll and at ``finalize``.
    :raises ValueError: ``option`` includes ``OPT_INDENT_2``.
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        option: int = 0,
        default: Callable[[Any], Any] | None = None,
        fsync: bool = True,
    ) -> None:
        self.root = Path(root)
        self.chunk_bytes = chunk_bytes
        self.option = option
        line_option(option)  # refuse an option no JSON Lines record can take, now
        self.default = default
        self.fsync = fsync
        self._ledger = Ledger()
        self._streams: dict[tuple[str, str], TraceWriter] = {}
        self._metrics_lock = anyio.Lock()
        self._finalized = False

    def stream_dir(self, kind: Kind, subset: Subset) -> Path:
        """Where a (kind, subset) stream lives: ``root/traces/<kind>/<subset>``.

        :param kind: ``"train"`` or ``"eval"``.
        :param subset: ``"all"`` or ``"effective"``.
        """
        return self.root / "traces" / kind / subset

    def _stream(self, kind: Kind, subset: Subset) -> TraceWriter:
        key = (kind, subset)
        writer = self._streams.get(key)
        if writer is None:
            writer = TraceWriter(
                self.stream_dir(kind, subset),
                chunk_bytes=self.chunk_bytes,
                option=self.option,
                default=self.default,
                fsync=self.fsync,
            )
            self._streams[key] = writer
        return writer

    async def start(self) -> None:
        await anyio.to_thread.run_sync(lambda: self.root.mkdir(parents=True, exist_ok=True))

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        self._check_open()
        line = encoder.encode(
            {"step": step, "time": time.time(), "metrics": finite_metrics(metrics, step=step)},
            option=self.option | encoder.OPT_APPEND_NEWLINE | encoder.OPT_SERIALIZE_NUMPY,
            default=self.default,
        )
        path = self.root / "metrics.jsonl"

        def append() -> None:
            path.parent.mkdir(parents=True, exist_ok=True)
            with open(path, "ab") as f:
                f.write(line)

        async with self._metrics_lock:
            try:
                await anyio.to_thread.run_sync(append)
            except OSError as exc:
                raise TraceWriteError(f"cannot append to {path}: {exc}") from exc

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
        ledger.submitted += len(batch)
        await write_episodes(
            self._stream(kind, subset), batch, ledger, step=step, kind=kind, subset=subset
        )

    async def finalize(self) -> None:
        if self._finalized:
            return
        self._finalized = True
        failures = []
        for writer in self._streams.values():
            try:
                await writer.close()
            except TraceWriteError as exc:  # logged; the other streams still get closed
                failures.append(exc)
        if failures:
            raise failures[0]

    def stats(self) -> DeliveryStats:
        return self._ledger.snapshot()

    def _check_open(self) -> None:
        if self._finalized:
            raise RuntimeError("FileMonitor is finalized")
