"""Reading a trace stream's chunk files as tests look at them: plain or sealed alike."""

from __future__ import annotations

from pathlib import Path

from monitors.traces._sealed import open_chunk


def chunk_bytes(directory: Path, chunk: int) -> bytes:
    """Chunk ``chunk``'s bytes, uncompressed (from the sealed file when it is sealed)."""
    with open_chunk(directory, chunk) as f:
        return f.read()
