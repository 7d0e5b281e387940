"""One NDJSON batch being assembled: hashed and gzipped in a worker thread as lines arrive.

SHA-256 (of the uncompressed bytes: the ``Idempotency-Key``) and zlib both release the GIL, so
the loop only hands over about 1 MiB of encoded lines at a time. A closed batch keeps its
framed, compressed body, so a retry sends exactly the same bytes under the same key.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass
from typing import Any

import anyio
import orjson

from ._body import frame

__all__ = ["Batch", "BatchBuilder"]

#: Encoded bytes handed to the worker thread at once.
PIECE_BYTES = 1 << 20


@dataclass(frozen=True)
class Batch:
    """A closed batch, ready to upload (and to upload again, byte for byte)."""

    body: bytes
    content_type: str
    key: str
    records: int
    uncompressed_bytes: int
    compressed_bytes: int


class BatchBuilder:
    """Lines go in with ``add``; ``close`` returns the ``Batch``. Not for concurrent use."""

    def __init__(self, *, gzip_level: int, kind: str, subset: str) -> None:
        self.kind = kind
        self.subset = subset
        self.records = 0
        self.size = 0  # uncompressed bytes, pending ones included
        self.first_step: int | None = None
        self.last_step: int | None = None
        self._hash = hashlib.sha256()
        self._zip = zlib.compressobj(gzip_level, zlib.DEFLATED, 31)  # 31: a gzip member
        self._compressed: list[bytes] = []
        self._pending: list[bytes] = []
        self._pending_bytes = 0

    def fits(self, length: int, *, batch_bytes: int, batch_lines: int) -> bool:
        """Whether a line of ``length`` bytes may join (an empty batch takes any line)."""
        if self.records == 0:
            return True
        return self.records < batch_lines and self.size + length <= batch_bytes

    async def add(self, chunks: list[bytes], length: int, *, step: int) -> None:
        """Add one complete line (its encoded chunks, ``length`` bytes in all)."""
        self._pending.extend(chunks)
        self._pending_bytes += length
        self.size += length
        self.records += 1
        if self.first_step is None:
            self.first_step = step
        self.last_step = step
        if self._pending_bytes >= PIECE_BYTES:
            pieces, self._pending, self._pending_bytes = self._pending, [], 0
            await anyio.to_thread.run_sync(self._digest, pieces)

    def _digest(self, pieces: list[bytes]) -> None:
        update, compress, out = self._hash.update, self._zip.compress, self._compressed
        for piece in pieces:
            update(piece)
            data = compress(piece)
            if data:
                out.append(data)

    async def close(self, context: dict[str, Any]) -> Batch:
        """Finish hashing and compressing and frame the body (in a worker thread)."""
        pieces, self._pending, self._pending_bytes = self._pending, [], 0
        metadata = orjson.dumps({"schema_version": 1, "context": context})
        return await anyio.to_thread.run_sync(self._finish, pieces, metadata)

    def _finish(self, pieces: list[bytes], metadata: bytes) -> Batch:
        self._digest(pieces)
        self._compressed.append(self._zip.flush())
        compressed, self._compressed = self._compressed, []
        content_type, body = frame(metadata, compressed)
        return Batch(
            body=body,
            content_type=content_type,
            key="sha256:" + self._hash.hexdigest(),
            records=self.records,
            uncompressed_bytes=self.size,
            compressed_bytes=sum(map(len, compressed)),
        )
