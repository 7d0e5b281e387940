"""One NDJSON batch being assembled: hashed and gzipped in the monitor's worker thread.

The loop hands complete lines over in pieces of about ``PIECE_BYTES``. In the worker each
piece is joined into one buffer (``bytes.join`` releases the GIL on large joins), then hashed
(SHA-256 of the uncompressed bytes: the ``Idempotency-Key``) and compressed (python-isal or
zlib, see ``_gzip``), one call each; both release the GIL.

The loop then waits until at most ``AHEAD_BYTES`` of handed-over bytes are still waiting for
the worker before it encodes the next line. ``AHEAD_BYTES = 0`` (wait for every piece) was
chosen by measurement over a pipeline (encoding the next line while the worker compresses):

- The GIL. The worker needs the GIL back after each C call (join, hash, each output block of
  the compressor, the hand-back of its result). While the loop encodes it releases and
  retakes the GIL every 0.1 ms (each encoder checkpoint polls the selector), which restarts
  the worker's 5 ms wait for a forced switch, and the loop thread retakes the GIL before the
  woken worker can: the worker waits until the loop really sleeps. Measured with the loop
  busy like this, one C call in the worker took 4-5x longer (isal, 1 MiB: 2.5 -> 10 ms; zlib:
  22 -> 100 ms), and encode + isal gave the same ~155-160 MB/s pipelined (8 MiB ahead) as
  one after the other, with a higher loop lag max (8 against 6.5 ms).
- The cores. On a 2-core machine a pipeline that did overlap would take the core that the
  server (in tests and benchmarks) and the rest of the trainer need.

So the worker compresses while the loop is idle (serving other tasks and I/O), and
throughput is bounded by encode + gzip: 1 / (1/encode + 1/gzip).

After each piece the worker gives up its core (``os.sched_yield``). A long line is handed
over as tens of pieces at once, and the worker then runs for as long as they take; on a
machine with more runnable threads than cores, the loop's thread, woken meanwhile, often
waited behind it in the same core's run queue (the load test's schedstat waits). Yielding
every piece (~3.5 ms of CPU) lets it in: 300 production episodes through a local server, 4
runs each way, loop lag samples over 5 ms fell from 192-219 to 93-117, lag max from 16-21 to
12-15.5 ms, at the same throughput.

Closing a batch hands over its last piece, waits for it, and queues the flush and framing
(a few µs) whose result the upload awaits. A closed batch keeps its compressed pieces, so a
retry sends exactly the same bytes under the same key.

Only a retry may reuse a key. The key is the hash of the lines, so a batch that repeats an
earlier one's lines (a step's "effective" episodes logged after the same "all" episodes)
would have its key, and the service would answer it as a replay of the first: committed,
but stored once, under the first upload's context. So the newline that ends a batch's last
line is held back until the batch closes, and ``Keys`` picks the ending: ``"\n"``, or, for a
repeat, the fewest spaces before it that give a key this monitor has not used (a space
after a JSON value is still the same JSON value). A batch of several lines keeps room for
``ENDING_ROOM`` spaces, so that a repeat stays within the service's batch limit.
"""

from __future__ import annotations

import hashlib
import os
from collections import OrderedDict, deque
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import orjson

from ._body import Body, frame, new_boundary
from ._gzip import Backend, compressor
from ._worker import Worker, result

__all__ = ["AHEAD_BYTES", "ENDING_ROOM", "PIECE_BYTES", "Batch", "BatchBuilder", "Keys"]

#: Encoded bytes handed to the worker thread in one job.
PIECE_BYTES = 1 << 20
#: Handed-over bytes that may still wait for the worker when the loop moves on to encode the
#: next line (see the module docstring for why 0).
AHEAD_BYTES = 0
#: Bytes a batch of several lines leaves free below ``batch_bytes`` for the spaces that give
#: a repeated batch its own key (one per earlier batch of the same lines).
ENDING_ROOM = 16


def _yield_core() -> None:
    """Let a thread waiting for this core run (see the module docstring); a no-op where the
    platform has no ``sched_yield``."""
    if _SCHED_YIELD is not None:
        _SCHED_YIELD()


_SCHED_YIELD = getattr(os, "sched_yield", None)


class Keys:
    """The Idempotency-Keys a monitor has given its batches, the latest ``remember`` of them,
    so that no two uploads share one (see the module docstring). Used only in the worker
    thread, where batches close one at a time."""

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
        backend: Backend | None = None,
    ) -> None:
        self.kind = kind
        self.subset = subset
        self.records = 0
        self.size = 0  # uncompressed bytes, pending ones included
        self.first_step: int | None = None
        self.last_step: int | None = None
        self._worker = worker
        self._keys = keys
        self._pending: list[bytes] = []
        self._pending_bytes = 0
        self._jobs: deque[tuple[Future[None], int]] = deque()  # handed over, with their bytes
        self._ahead = 0  # bytes in self._jobs
        self._closed = False
        # Touched only in the worker thread, one job at a time:
        self._hash = hashlib.sha256()
        self._zip = compressor(gzip_level, backend=backend)
        self._compressed: list[bytes] = []
        self._boundary = new_boundary()
        self._seam = b""  # the last len(boundary) - 1 compressed bytes
        self._clash = False  # the boundary occurs in the compressed bytes (never, in practice)

    def fits(self, length: int, *, batch_bytes: int, batch_lines: int) -> bool:
        """Whether a line of ``length`` bytes may join (an empty batch takes any line)."""
        if self.records == 0:
            return True
        return self.records < batch_lines and self.size + length + ENDING_ROOM <= batch_bytes

    async def add(self, chunks: list[bytes], length: int, *, step: int) -> None:
        """Add one complete line (its encoded chunks, ``length`` bytes in all, the last
        ending in ``"\n"``): hand its pieces over, then wait until at most ``AHEAD_BYTES``
        wait for the worker. The line's newline is held back until the next line or close."""
        assert not self._closed, "add after close"
        assert chunks[-1].endswith(b"\n"), "a line ends with a newline"
        # The previous line's newline first; this line's own is held back.
        chunks = [b"\n"] * (self.records > 0) + [*chunks[:-1], chunks[-1][:-1]]
        self.size += length
        self.records += 1
        if self.first_step is None:
            self.first_step = step
        self.last_step = step
        for chunk in chunks:
            self._pending.append(chunk)  # a new list after each hand-over
            self._pending_bytes += len(chunk)
            if self._pending_bytes >= PIECE_BYTES:
                self._hand_over()
        await self._settle(AHEAD_BYTES)

    def _hand_over(self) -> None:
        pieces, size = self._pending, self._pending_bytes
        self._pending, self._pending_bytes = [], 0
        self._jobs.append((self._worker.submit(self._digest, pieces), size))
        self._ahead += size

    async def _settle(self, ahead: int) -> None:
        """Wait until at most ``ahead`` handed-over bytes wait for the worker; raise a job's
        failure."""
        jobs = self._jobs
        done, rest = 0, self._ahead
        for _, size in jobs:
            if rest <= ahead:
                break
            rest -= size
            done += 1
        if not done:
            return
        # The worker runs jobs in order: once this one is done, so is every earlier one.
        await result(jobs[done - 1][0])
        for _ in range(done):
            future, size = jobs.popleft()
            self._ahead -= size
            future.result(timeout=0)

    async def close(self, context: dict[str, Any]) -> Future[Batch]:
        """Hand over the last piece and wait for every piece, then queue the flush and the
        framing (with ``context`` as metadata), whose future ``Batch`` is returned."""
        assert not self._closed, "closed twice"
        self._closed = True
        if self._pending:
            self._hand_over()
        await self._settle(0)
        metadata = orjson.dumps({"schema_version": 1, "context": context})
        return self._worker.submit(self._finish, metadata)

    def abandon(self) -> None:
        """Drop the batch: cancel its jobs that have not started."""
        self._closed = True
        for future, _ in self._jobs:
            future.cancel()
        self._jobs.clear()
        self._ahead = 0

    # -- in the worker thread -------------------------------------------------------------

    def _digest(self, pieces: list[bytes]) -> None:
        data = pieces[0] if len(pieces) == 1 else b"".join(pieces)
        self._hash.update(data)
        self._keep(self._zip.compress(data))
        _yield_core()

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
