"""Cut a stream of pieces of any size into chunks of at most ``chunk_size`` bytes (sans-IO)."""

from __future__ import annotations

from ._walk import Piece

__all__ = ["Chunker"]


class Chunker:
    """Collects pieces; hands back full chunks as they form, never an empty one."""

    __slots__ = ("buf", "size")

    def __init__(self, chunk_size: int) -> None:
        if not isinstance(chunk_size, int) or isinstance(chunk_size, bool) or chunk_size < 1:
            raise ValueError(f"chunk_size must be a positive int, not {chunk_size!r}")
        self.size = chunk_size
        self.buf = bytearray()

    def add(self, piece: Piece) -> list[bytes] | None:
        """Take one piece; return the chunks it completed, or None."""
        buf, size = self.buf, self.size
        room = size - len(buf)
        n = len(piece)
        if n < room:
            buf += piece
            return None
        view = memoryview(piece)
        buf += view[:room]
        out = [bytes(buf)]
        buf.clear()
        pos = room
        while n - pos >= size:
            out.append(bytes(view[pos : pos + size]))
            pos += size
        buf += view[pos:]
        return out

    def flush(self) -> bytes | None:
        """The last, partial chunk (None when nothing is left)."""
        if not self.buf:
            return None
        out = bytes(self.buf)
        self.buf.clear()
        return out
