"""Cut a stream of pieces of any size into chunks of at most ``chunk_size`` bytes (sans-IO)."""

from __future__ import annotations

from ._walk import Piece

__all__ = ["Chunker"]


class Chunker:
    """Collects pieces; hands back full chunks as they form, never an empty one.

    Each output byte is copied once (``b"".join`` of the pieces a chunk spans); a piece that
    is a whole chunk by itself is handed on without a copy.
    """

    __slots__ = ("pending", "pending_bytes", "size")

    def __init__(self, chunk_size: int) -> None:
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, not {chunk_size!r}")
        self.size = chunk_size
        self.pending: list[Piece] = []
        self.pending_bytes = 0

    def add(self, piece: Piece) -> list[bytes] | None:
        """Take one piece; return the chunks it completed, or None."""
        n = len(piece)
        room = self.size - self.pending_bytes
        if n < room:
            if n:
                self.pending.append(piece)
                self.pending_bytes += n
            return None
        size = self.size
        view = memoryview(piece)
        pending = self.pending
        pending.append(view[:room] if n > room else piece)
        out = [b"".join(pending)]
        pending.clear()
        pos = room
        while n - pos >= size:
            out.append(bytes(view[pos : pos + size]))
            pos += size
        self.pending_bytes = n - pos
        if pos < n:
            pending.append(view[pos:])
        return out

    def flush(self) -> bytes | None:
        """The last, partial chunk (None when nothing is left)."""
        if not self.pending_bytes:
            return None
        out = b"".join(self.pending)
        self.pending.clear()
        self.pending_bytes = 0
        return out
