"""Cut a stream of pieces of any size into chunks of at most ``chunk_size`` bytes (sans-IO)."""

from __future__ import annotations

from ._walk import Piece

__all__ = ["Chunker"]


class Chunker:
    """Collects pieces; hands back chunks as they form: never empty, never over ``size``
    bytes, and, all but the last, at least half full.

    Small pieces are joined until they fill half a chunk; a ``bytes`` piece that fills half
    a chunk by itself is handed on as it is, without a copy (most of what orjson writes for
    groups and number slices). Every other output byte is copied once (docs/design.md D5).
    """

    __slots__ = ("half", "pending", "pending_bytes", "size")

    def __init__(self, chunk_size: int) -> None:
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, not {chunk_size!r}")
        self.size = chunk_size
        self.half = (chunk_size + 1) // 2
        self.pending: list[Piece] = []
        self.pending_bytes = 0

    def add(self, piece: Piece) -> list[bytes] | None:
        """Take one piece; return the chunks it completed, or None."""
        n = len(piece)
        total = self.pending_bytes + n
        if total < self.half:
            if n:
                self.pending.append(piece)
                self.pending_bytes = total
            return None
        size = self.size
        pending = self.pending
        if total <= size:
            if not pending and type(piece) is bytes:
                return [piece]
            pending.append(piece)
            out = [b"".join(pending)]
            pending.clear()
            self.pending_bytes = 0
            return out
        room = size - self.pending_bytes
        view = memoryview(piece)
        pending.append(view[:room])
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
