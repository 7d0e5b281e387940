"""Looking at a trace stream as tests do: its chunk files, plain or sealed alike, and its
command line."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from monitors.traces._layout import list_chunks
from monitors.traces._sealed import open_chunk


def chunk_bytes(directory: Path, chunk: int) -> bytes:
    """Chunk ``chunk``'s bytes, uncompressed (from the sealed file when it is sealed)."""
    with open_chunk(directory, chunk) as f:
        return f.read()


def stream_lines(directory: Path) -> list[bytes]:
    """Every record line of a stream, its newline kept, in order across its chunks."""
    data = b"".join(chunk_bytes(directory, chunk) for chunk in list_chunks(directory))
    return data.splitlines(keepends=True)


def cli(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """``python -m monitors.traces ARGS``, run from the repository's root."""
    return subprocess.run(
        [sys.executable, "-m", "monitors.traces", *map(str, args)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        timeout=120,
        check=False,
    )
