"""Looking at a trace stream as tests do: its chunk files, plain or sealed alike, its index
beside it, and its command line."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from monitors.traces._index import iter_rows
from monitors.traces._layout import IndexRow, index_path, list_chunks
from monitors.traces._sealed import open_chunk


def chunk_bytes(directory: Path, chunk: int) -> bytes:
    """Chunk ``chunk``'s bytes, uncompressed (from the sealed file when it is sealed)."""
    with open_chunk(directory, chunk) as f:
        return f.read()


def stream_lines(directory: Path) -> list[bytes]:
    """Every record line of a stream, its newline kept, in order across its chunks."""
    data = b"".join(chunk_bytes(directory, chunk) for chunk in list_chunks(directory))
    return data.splitlines(keepends=True)


def index_lines(directory: Path) -> list[bytes]:
    """The raw lines of the stream's index (``<directory>.index.jsonl``), newlines kept (a
    torn last row too); none when there is no index."""
    try:
        return index_path(directory).read_bytes().splitlines(keepends=True)
    except FileNotFoundError:
        return []


def index_rows(directory: Path) -> list[IndexRow]:
    """Every complete row of the stream's index, decoded, in order."""
    return [row for _, row in iter_rows(index_path(directory))]


def cut_index(directory: Path, rows: int, extra: int = 0) -> int:
    """Cut the index after its first ``rows`` rows and ``extra`` bytes of the next (a torn
    row); return the index's new size."""
    lines = index_lines(directory)
    assert len(lines) > rows or (len(lines) == rows and not extra), (len(lines), rows)
    size = sum(map(len, lines[:rows])) + extra
    assert not lines[rows:] or extra < len(lines[rows])
    os.truncate(index_path(directory), size)
    return size


def copy_stream(directory: Path, target: Path) -> Path:
    """Copy a stream's directory and its index beside it to ``target``; return ``target``."""
    shutil.copytree(directory, target)
    if index_path(directory).exists():
        shutil.copyfile(index_path(directory), index_path(target))
    return target


def cli(*args: str | Path) -> subprocess.CompletedProcess[bytes]:
    """``python -m monitors.traces ARGS``, run from the repository's root."""
    return subprocess.run(
        [sys.executable, "-m", "monitors.traces", *map(str, args)],
        cwd=Path(__file__).resolve().parents[1],
        capture_output=True,
        timeout=120,
        check=False,
    )
