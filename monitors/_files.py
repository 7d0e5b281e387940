"""Blocking file helpers the writers share (run them in a worker thread)."""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["last_newline_end", "write_all"]

_BLOCK = 1 << 20


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may take part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def last_newline_end(path: Path, size: int) -> int:
    """Offset just past the last b"\\n" in the first ``size`` bytes of the file (0 when
    there is none), read backwards a block at a time."""
    with open(path, "rb") as f:
        end = size
        while end > 0:
            start = max(0, end - _BLOCK)
            f.seek(start)
            block = f.read(end - start)
            at = block.rfind(b"\n")
            if at >= 0:
                return start + at + 1
            end = start
    return 0
