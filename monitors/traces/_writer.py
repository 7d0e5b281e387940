"""Append records to a chunked trace stream: encoded on the loop, written in a worker thread."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
from collections.abc import Callable
from contextlib import aclosing
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
from anyio.streams.memory import MemoryObjectReceiveStream

import encoder

from .._files import write_all
from ..errors import TraceFormatError, TraceWriteError
from ..records import check_float_decimals, line_option
from ._layout import IndexRow, chunk_path, decode_row, encode_row, index_path
from ._recovery import Recovery, recover
from ._sealed import DEFAULT_LEVEL, seal
from ._summary import Summary, TopFields, episode_row

__all__ = ["DEFAULT_CHUNK_BYTES", "TraceWriter"]

log = logging.getLogger("monitors.traces")

DEFAULT_CHUNK_BYTES = 5 * 2**30
"""Most bytes in one chunk file (5 GiB, as prime-rl's streams) before the stream rolls."""
#: Encoded bytes handed to the worker thread at once, and how many such batches may wait.
_BATCH_BYTES = 1 << 20
_BATCHES_IN_FLIGHT = 2
#: The nice value of the thread that fsyncs and seals a chunk (see ``_in_background``).
_BACKGROUND_NICE = 19


def _write_joined(fd: int, chunks: list[bytes]) -> None:
    """One batch: joined here, in the worker thread, so the copy is not made on the loop."""
    write_all(fd, b"".join(chunks))


class _Drain:
    """The worker side of one record's write: takes batches, writes them, keeps the error."""

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self.error: OSError | None = None

    async def run(self, batches: MemoryObjectReceiveStream[list[bytes]]) -> None:
        async with batches:
            async for chunks in batches:
                try:
                    await anyio.to_thread.run_sync(_write_joined, self.fd, chunks)
                except OSError as exc:
                    self.error = exc
                    return  # closing the stream tells the encoding side to stop


class _TooLong(Exception):
    """The record would pass ``chunk_bytes``: it must start a chunk of its own."""


class TraceWriter:
    """One trace stream: ``append`` one record per line to numbered chunk files in
    ``directory``, with an index row per record in ``<directory>.index.jsonl`` beside it
    (prime-rl's layout: see ``monitors.traces``).

    Appends never interleave; each returns once its record and index row are written.
    A record is encoded cooperatively on the event loop (``encoder.aiterencode``) while a
    worker thread writes the previous batch, so at most ~3 MiB are in flight. The stream
    rolls to a new chunk before a line would pass ``chunk_bytes`` (a line is never split; a
    larger one gets a chunk of its own). A chunk that rolls is fsynced, then sealed
    (``compress``: zstd's seekable format, the plain file removed once the sealed one is on
    the disk) in a thread of its own, so appends to the next chunk never wait for the disk.
    The next roll waits for that thread: at most one full chunk waits to be sealed. A seal
    that fails (a full disk) leaves the plain chunk whole and readable; it is logged,
    counted in ``seal_failures`` and tried again at ``close``. ``close`` fsyncs the rest,
    seals the live chunk (``seal_on_close``), and raises ``TraceWriteError`` if any fsync
    failed. Reopening a stream after a crash first mends it, and seals the full chunks left
    plain (see ``Recovery``; docs/design.md D9).

    :param directory: The stream's directory, created if missing.
    :param chunk_bytes: Most bytes in one chunk file before the stream rolls to the next.
    :param option: orjson's ``OPT_*`` flags for every record (``OPT_INDENT_2`` is refused).
    :param default: Called with each object orjson cannot write; returns one it can.
    :param budget: Seconds of encoding between two turns given to the event loop.
    :param fsync: Flush chunks and the index to the disk when a chunk rolls and at ``close``.
    :param compress: Seal full chunks with zstd; False keeps every chunk plain JSONL.
    :param level: zstd's compression level for sealing.
    :param seal_on_close: Seal the live chunk too at ``close`` (when ``compress``).
    :param float_decimals: Round floats to this many decimals on disk (the encoder's
        ``float_decimals``; the record itself is never changed), or None for every digit.
    :param summary: The fields of a record's index row besides where it is (``line``,
        ``chunk``, ``offset``, ``length``, ``step``, which the writer sets): by default
        prime-rl's episode row (``id``, ``kind``, ``reward``, ... ; a record that is no
        episode gets Nones). Called on the loop once the record is written, with the
        fields the encoder dumped for a walked model's top level (or None): it must be
        cheap.
    :raises ValueError: ``chunk_bytes`` is not positive, ``option`` includes
        ``OPT_INDENT_2``, or ``float_decimals`` is neither None nor an int.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        *,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        option: int = 0,
        default: Callable[[Any], Any] | None = None,
        budget: float = encoder.DEFAULT_BUDGET,
        fsync: bool = True,
        compress: bool = True,
        level: int = DEFAULT_LEVEL,
        seal_on_close: bool = True,
        float_decimals: int | None = None,
        summary: Summary = episode_row,
    ) -> None:
        if chunk_bytes < 1:
            raise ValueError(f"chunk_bytes must be positive, not {chunk_bytes!r}")
        self.directory = Path(directory)
        self.chunk_bytes = chunk_bytes
        self.option = line_option(option)
        self.default = default
        self.budget = budget
        self.fsync = fsync
        self.compress = compress
        self.level = level
        self.seal_on_close = seal_on_close
        self.float_decimals = check_float_decimals(float_decimals)
        self.summary = summary
        self.index = index_path(self.directory)
        self.recovery: Recovery | None = None
        self.records = 0
        self._lock = anyio.Lock()
        self._chunk = 0
        self._size = 0
        self._data_fd = -1
        self._index_fd = -1
        self._index_size = 0
        self._closed = False
        #: The fsync (and seal) of the chunk that rolled last, and what failed in any fsync.
        self._syncing: threading.Thread | None = None
        self._sync_errors: list[str] = []
        #: Full chunks whose seal failed: left plain, tried again at close.
        self.seal_failures: set[int] = set()

    @property
    def chunk(self) -> int:
        """The chunk appends go to (those below it are full)."""
        return self._chunk

    # -- opening and closing ------------------------------------------------------------

    async def open(self) -> Recovery:
        """Create or reopen the stream (mending a crash's leftovers); idempotent.

        ``append`` opens it too; ``async with`` opens and closes it.

        :returns: What reopening found and mended.
        :raises TraceWriteError: The stream is closed, or its files cannot be opened: the
            directory holds a file that is no part of a stream, or a sealed chunk without
            an intact seek table (the message names it).
        """
        async with self._lock:
            return await self._open()

    async def _open(self) -> Recovery:
        if self.recovery is not None:
            return self.recovery
        if self._closed:
            raise TraceWriteError(f"trace stream {self.directory} is closed")
        try:
            found = await anyio.to_thread.run_sync(recover, self.directory, self.summary)
            self._index_fd = await anyio.to_thread.run_sync(
                os.open, self.index, os.O_WRONLY | os.O_APPEND
            )
            self._data_fd = await anyio.to_thread.run_sync(
                os.open, chunk_path(self.directory, found.chunk), os.O_WRONLY | os.O_APPEND
            )
        except (OSError, TraceFormatError) as exc:  # a stray file, a damaged seek table
            raise TraceWriteError(f"cannot open trace stream {self.directory}: {exc}") from exc
        if found.mended:
            log.warning("trace stream %s was mended on reopening: %s", self.directory, found)
        self._chunk, self._size, self.records = found.chunk, found.chunk_size, found.records
        self._index_size = found.index_size
        self.recovery = found
        if self.compress and found.unsealed:
            self._in_background(lambda: self._seal_all(found.unsealed), "seal")
        return found

    async def close(self) -> None:
        """Wait for a rolled chunk's fsync and seal, fsync and close the files, seal the
        live chunk (``seal_on_close``) and any whose seal failed before; idempotent.
        Appending afterwards is an error.

        :raises TraceWriteError: An fsync since the stream was opened failed (the records
            were written, but may not be on the disk). A seal that fails is not an error:
            the plain chunk stays, and ``seal_failures`` says which.
        """
        async with self._lock:
            was_open = self._data_fd >= 0
            self._closed = True
            with anyio.CancelScope(shield=True):
                await self._settle()
                for fd in (self._data_fd, self._index_fd):
                    if fd >= 0:
                        try:
                            await anyio.to_thread.run_sync(self._sync_and_close, fd)
                        except OSError as exc:
                            log.error("trace stream %s: fsync failed: %s", self.directory, exc)
                            self._sync_errors.append(f"on close: {exc}")
                self._data_fd = self._index_fd = -1
                if self.compress and was_open:
                    last = [self._chunk] if self.seal_on_close and self._size else []
                    chunks = sorted(self.seal_failures) + last
                    self._in_background(lambda: self._seal_all(chunks), "seal")
                    await self._settle()
            errors, self._sync_errors = self._sync_errors, []
            if errors:
                raise TraceWriteError(
                    f"trace stream {self.directory} may not be on the disk: fsync failed "
                    + "; ".join(errors)
                )

    def _seal_all(self, chunks: list[int]) -> None:
        """Seal ``chunks`` in order (blocking); a failure is logged and kept in
        ``seal_failures``, the plain chunk left as it was."""
        for chunk in chunks:
            try:
                seal(self.directory, chunk, level=self.level, fsync=self.fsync)
            except Exception as exc:  # a full disk, mostly: the plain chunk is as it was
                log.error(
                    "trace stream %s: cannot seal chunk %d, left plain (readable): %s",
                    self.directory,
                    chunk,
                    exc,
                )
                self.seal_failures.add(chunk)
            else:
                self.seal_failures.discard(chunk)

    def _in_background(self, job: Callable[[], None], what: str) -> None:
        """Run ``job`` in a thread of its own, at the lowest CPU priority where threads have
        their own (Linux): on two cores a seal takes one whole, and the loop's thread must
        win any contest for a core; ``_settle`` waits for it (docs/design.md D9)."""

        def run() -> None:
            if sys.platform == "linux":
                with contextlib.suppress(OSError):
                    os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), _BACKGROUND_NICE)
            job()

        self._syncing = threading.Thread(target=run, name=f"nodewise-{what}", daemon=True)
        self._syncing.start()

    def _sync_and_close(self, fd: int) -> None:
        try:
            if self.fsync:
                os.fsync(fd)
        finally:
            os.close(fd)

    async def _settle(self) -> None:
        """Wait for the fsync and seal of the chunk that rolled last."""
        if self._syncing is not None:
            await anyio.to_thread.run_sync(self._syncing.join)
            self._syncing = None

    async def __aenter__(self) -> TraceWriter:
        await self.open()
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    # -- appending ----------------------------------------------------------------------

    async def append(
        self,
        value: Any,
        *,
        step: int | None = None,
        kind: str | None = None,
    ) -> IndexRow:
        """Write ``value`` as one JSON line and its index row; return the row.

        On either error below the partial line is removed, so the stream stays readable up
        to its last complete record.

        :param value: The record.
        :param step: The training step, kept in the index row.
        :param kind: The record's kind, kept in the index row (in place of the one the
            summary reads off the record).
        :returns: Where the record was written, and its row.
        :raises encoder.EncodeError: The value cannot be encoded.
        :raises TraceWriteError: The disk refused, or the stream is closed.
        """
        async with self._lock:
            await self._open()
            if self._closed:
                raise TraceWriteError(f"trace stream {self.directory} is closed")
            if self._size >= self.chunk_bytes:
                await self._roll()
            start = self._size
            top = TopFields.attach(value)
            try:
                try:
                    length = await self._stream(value, limit=self.chunk_bytes - start)
                except _TooLong:
                    await self._cut(start)
                    await self._roll()
                    start = 0
                    length = await self._stream(value, limit=None)
                fields = dict(self.summary(value, None if top is None else top.fields))
                fields["line"] = self.records + 1
                fields["offset"] = start
                fields["chunk"] = self._chunk
                fields["length"] = length
                fields["step"] = step
                if kind is not None:
                    fields["kind"] = kind
                data = encode_row(fields)
                await anyio.to_thread.run_sync(write_all, self._index_fd, data)
            except BaseException as exc:
                with anyio.CancelScope(shield=True):
                    await self._cut(start)
                    await self._cut_index()
                if isinstance(exc, OSError):
                    raise TraceWriteError(
                        f"cannot write to trace stream {self.directory}: {exc}"
                    ) from exc
                raise
            self._size = start + length
            self._index_size += len(data)
            self.records += 1
            return decode_row(data)

    async def _stream(self, value: Any, *, limit: int | None) -> int:
        """Encode ``value`` into the current chunk; raise ``_TooLong`` past ``limit`` bytes
        when the chunk already holds records."""
        drain = _Drain(self._data_fd)
        send, receive = anyio.create_memory_object_stream[list[bytes]](_BATCHES_IN_FLIGHT)
        total = 0
        failure: BaseException | None = None
        async with anyio.create_task_group() as group:
            group.start_soon(drain.run, receive)
            try:
                chunks = encoder.aiterencode(
                    value,
                    option=self.option,
                    default=self.default,
                    budget=self.budget,
                    float_decimals=self.float_decimals,
                )
                async with send, aclosing(chunks):
                    batch: list[bytes] = []
                    batch_bytes = 0
                    async for chunk in chunks:
                        total += len(chunk)
                        if limit is not None and total > limit and self._size > 0:
                            raise _TooLong
                        batch.append(chunk)
                        batch_bytes += len(chunk)
                        if batch_bytes >= _BATCH_BYTES:
                            await send.send(batch)
                            batch, batch_bytes = [], 0
                    if batch:
                        await send.send(batch)
            except anyio.BrokenResourceError:
                pass  # the drain stopped on a write error, kept in drain.error
            except Exception as exc:
                failure = exc
        if drain.error is not None:
            raise drain.error
        if failure is not None:
            raise failure
        return total

    async def _cut_index(self) -> None:
        """Remove a partial index row (a disk that filled up mid-row)."""
        try:
            await anyio.to_thread.run_sync(os.ftruncate, self._index_fd, self._index_size)
        except OSError as exc:
            log.error("cannot cut partial index row from %s: %s", self.directory, exc)

    async def _cut(self, size: int) -> None:
        """Remove whatever the current chunk holds past ``size`` (a partial record)."""
        try:
            await anyio.to_thread.run_sync(os.ftruncate, self._data_fd, size)
        except OSError as exc:
            log.error("cannot cut partial record from %s: %s", self.directory, exc)

    async def _roll(self) -> None:
        """Start the next chunk; fsync, close and seal the old one in the background. The
        next chunk is opened first: if that fails, the stream stays in the old one and the
        next append tries again (shielded from cancellation: a half-done switch would leave
        the writer holding a closed descriptor)."""
        nxt = self._chunk + 1
        with anyio.CancelScope(shield=True):
            await self._settle()  # one chunk sealing at most: the disk sets the pace
            try:
                fd = await anyio.to_thread.run_sync(
                    self._open_chunk, chunk_path(self.directory, nxt)
                )
            except OSError as exc:
                raise TraceWriteError(
                    f"cannot start chunk {nxt} of {self.directory}: {exc}"
                ) from exc
            old, self._data_fd = self._data_fd, fd
            self._after_roll(old, self._chunk)
        self._chunk, self._size = nxt, 0

    def _open_chunk(self, path: Path) -> int:
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _after_roll(self, fd: int, chunk: int) -> None:
        """fsync and close chunk ``chunk``, fsync the index (whose rows for it are written),
        then seal the chunk, in a thread of its own; an fsync failure is logged now and
        raised by ``close``, a seal failure logged and kept in ``seal_failures``."""
        index_fd = self._index_fd

        def job() -> None:
            try:
                self._sync_and_close(fd)
                if self.fsync:
                    os.fsync(index_fd)
            except OSError as exc:
                log.error(
                    "trace stream %s: fsync of chunk %d failed: %s", self.directory, chunk, exc
                )
                self._sync_errors.append(f"for chunk {chunk}: {exc}")
            if self.compress:
                self._seal_all([chunk])

        self._in_background(job, f"seal-{chunk}")
