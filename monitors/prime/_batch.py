"""One NDJSON batch being assembled: its lines hashed and gzipped in the monitor's worker thread.

The loop hands a line over in pieces of about ``PIECE_BYTES`` and waits for every piece
before it encodes the next line; the worker yields its core after each piece (docs/design.md
D10). A closed batch keeps its compressed pieces, so a retry sends the same bytes under the
same key; a batch repeating earlier lines gets a key of its own by its ending (D12).
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections import OrderedDict
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import orjson

from ._body import Body, frame, new_boundary
from ._gzip import compressor
from ._worker import Worker, result

__all__ = ["ENDING_ROOM", "PIECE_BYTES", "Batch", "BatchBuilder", "Keys", "Piece"]

#: Bytes of a line: a view of a line read from the disk, or bytes the encoder made.
Piece = bytes | memoryview

#: Encoded bytes handed to the worker thread in one job.
PIECE_BYTES = 1 << 20
#: Bytes a batch of several lines leaves free below ``batch_bytes`` for the spaces that give
#: a repeated batch its own key (one per earlier batch of the same lines).
ENDING_ROOM = 16

#: Called in the worker after each piece, to let a thread waiting for its core run.
_SCHED_YIELD: Callable[[], None] = getattr(os, "sched_yield", lambda: None)


class Keys:
    """The Idempotency-Keys given so far (the latest ``remember``), so that only a retry
    reuses one. A batch's final newline is held back until it closes; a batch whose lines
    repeat an earlier one's ends them in the fewest spaces that give an unused key (a space
    after a JSON value is the same value). Used only in the worker thread."""

    def __init__(self, *, remember: int = 1 << 16) -> None:
        self.remember = remember
        self._used: OrderedDict[str, None] = OrderedDict()

    def claim(self, lines: hashlib._Hash) -> tuple[str, bytes]:
        """The key and the ending (spaces, then ``"\n"``) for a batch whose lines hash to
        ``lines`` (a sha256 object, fed everything but that ending)."""
        spaces = 0
        while True:
            ending = b" " * spaces + b"\n"
            digest = lines.copy()
            digest.update(ending)
            key = "sha256:" + digest.hexdigest()
            if key not in self._used:
                break
            spaces += 1
        self._used[key] = None
        if len(self._used) > self.remember:
            self._used.popitem(last=False)
        return key, ending


@dataclass(frozen=True)
class Batch:
    """A closed batch, ready to upload (and to upload again, byte for byte). ``spaces``:
    how many spaces end its last line, to keep its key distinct (0 but for a repeat)."""

    body: Body
    key: str
    records: int
    uncompressed_bytes: int
    compressed_bytes: int
    spaces: int = 0

    def lines(self) -> list[bytes]:
        """The batch's lines, each without its newline (or the spaces that ended the last):
        to resubmit part of it. Decompresses the whole batch: call it in the worker."""
        compressed = self.body.pieces[1:-1]  # between the framing's head and tail
        data = gzip.decompress(b"".join(compressed))
        return [line.rstrip(b" ") for line in data.split(b"\n")[:-1]]


class BatchBuilder:
    """Lines go in with ``add``; ``close`` returns the future ``Batch``. Not for concurrent
    use; its jobs run in ``worker``, in order."""

    def __init__(
        self,
        *,
        worker: Worker,
        keys: Keys,
        gzip_level: int,
        kind: str,
        subset: str,
        line_format: str = "episode",
    ) -> None:
        self.kind = kind
        self.subset = subset
        self.line_format = line_format  # "episode" or "trace": one format a batch
        self.records = 0
        self.size = 0  # uncompressed bytes, pending ones included
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.first_line: int | None = None  # the stream's line numbers (outbox mode)
        self.last_line: int | None = None
        self._worker = worker
        self._keys = keys
        self._pending: list[Piece] = []
        self._pending_bytes = 0
        self._closed = False
        # Touched only in the worker thread, one job at a time:
        self._hash = hashlib.sha256()
        self._zip = compressor(gzip_level)
        self._compressed: list[bytes] = []
        self._boundary = new_boundary()
        self._seam = b""  # the last len(boundary) - 1 compressed bytes
        self._clash = False  # the boundary occurs in the compressed bytes (never, in practice)

    def context(self, run_id: str) -> dict[str, str]:
        """The batch's metadata context. The service takes only strings here (prime-traces
        types it ``Dict[str, str]``); ``source`` and ``run_type`` as prime-runs sends them.
        A batch of rows without a step (prime-rl's, a rebuilt one) names none."""
        context = {"source": "nodewise", "run_type": self.kind, "run_id": run_id}
        if self.last_step is not None:
            context["step"] = str(self.last_step)
            context["first_step"] = str(self.first_step)
        context["subset"] = self.subset
        return context

    def fits(self, length: int, *, batch_bytes: int, batch_lines: int) -> bool:
        """Whether a line of ``length`` bytes may join (an empty batch takes any line)."""
        if self.records == 0:
            return True
        return self.records < batch_lines and self.size + length + ENDING_ROOM <= batch_bytes

    async def add(
        self,
        chunks: Sequence[Piece],
        length: int,
        *,
        step: int | None,
        line: int | None = None,
    ) -> None:
        """Add one complete line (its encoded chunks, ``length`` bytes in all, the last a
        ``bytes`` ending in ``"\n"``): hand over its full pieces and wait for them
        (docs/design.md D10). The line's newline is held back until the next line or close.
        ``line``: its number in the stream it was read from (outbox mode)."""
        assert not self._closed, "add after close"
        last = chunks[-1]
        assert isinstance(last, bytes), "a line's last piece is bytes"
        assert last.endswith(b"\n"), "a line ends with a newline"
        # The previous line's newline first; this line's own is held back.
        chunks = [*[b"\n"] * (self.records > 0), *chunks[:-1], last[:-1]]
        self.size += length
        self.records += 1
        if self.records == 1:
            self.first_step, self.first_line = step, line
        self.last_step, self.last_line = step, line
        jobs = []
        for chunk in chunks:
            self._pending.append(chunk)  # a new list after each hand-over
            self._pending_bytes += len(chunk)
            if self._pending_bytes >= PIECE_BYTES:
                jobs.append(self._hand_over())
        await _wait_for(jobs)

    def _hand_over(self) -> Future[None]:
        pieces, self._pending, self._pending_bytes = self._pending, [], 0
        return self._worker.submit(self._digest, pieces)

    async def close(self, context: dict[str, Any]) -> Future[Batch]:
        """Hand over the last piece and wait for it, then queue the flush and the framing
        (with ``context`` as metadata), whose future ``Batch`` is returned."""
        assert not self._closed, "closed twice"
        self._closed = True
        if self._pending:
            await _wait_for([self._hand_over()])
        metadata = orjson.dumps({"schema_version": 1, "context": context})
        return self._worker.submit(self._finish, metadata)

    # -- in the worker thread -------------------------------------------------------------

    def _digest(self, pieces: list[Piece]) -> None:
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self._hash.update(data)
        self._keep(self._zip.compress(data))
        _SCHED_YIELD()

    def _keep(self, out: bytes) -> None:
        if not out:
            return
        boundary, seam = self._boundary, self._seam
        keep = len(boundary) - 1
        if boundary in out or boundary in seam + out[:keep]:
            self._clash = True
        self._seam = out[-keep:] if len(out) >= keep else (seam + out)[-keep:]
        self._compressed.append(out)

    def _finish(self, metadata: bytes) -> Batch:
        key, ending = self._keys.claim(self._hash)
        self._keep(self._zip.compress(ending))
        self._keep(self._zip.flush())
        compressed, self._compressed = self._compressed, []
        body = frame(metadata, compressed, boundary=self._boundary, checked=not self._clash)
        return Batch(
            body=body,
            key=key,
            records=self.records,
            uncompressed_bytes=self.size + len(ending) - 1,
            compressed_bytes=sum(map(len, compressed)),
            spaces=len(ending) - 1,
        )


async def _wait_for(jobs: list[Future[None]]) -> None:
    """Wait for ``jobs`` and raise a failure of theirs. The worker runs jobs in order, so
    once the last is done, so is every earlier one."""
    if jobs:
        await result(jobs[-1])
        for job in jobs:
            job.result(timeout=0)
