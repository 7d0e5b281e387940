"""The gzip compressor of traces batches: python-isal's ``isal_zlib`` where it is installed,
else the standard library's zlib.

Both release the GIL while they compress, so the monitor's worker thread compresses without
holding up the event loop. Measured here on production-like episode JSON (``python -m
bench.prime_monitor``, one core): isal level 1 compresses at ~285-310 MB/s, zlib level 1 at
~70-85 MB/s, to about the same size (ratio 0.415 against 0.42); zlib level 9, ~14 MB/s.

isal has four levels, 0 to 3, where zlib has ten. ``gzip_level`` (zlib's scale) maps to the
isal level of about the same ratio: 1, 2 and 3 to the same number (zlib 1 ~ isal 1 in size, zlib
3 ~ isal 3) and 4 to 9 to 3, isal's best. Level 0 means "store, do not compress" with either
backend (isal's level 0 still compresses), so it always uses zlib's stored blocks.
"""

from __future__ import annotations

import zlib
from typing import Literal, Protocol

try:
    from isal import isal_zlib

    HAVE_ISAL = True
except ImportError:  # pragma: no cover - isal is a dependency; zlib is the fallback
    HAVE_ISAL = False

__all__ = ["BACKEND", "HAVE_ISAL", "Backend", "Compressor", "compressor", "isal_level"]

Backend = Literal["isal", "zlib"]

#: The backend ``compressor`` uses unless told otherwise.
BACKEND: Backend = "isal" if HAVE_ISAL else "zlib"

_GZIP_WBITS = 31  # 16 + 15: a gzip member (header and CRC) around a deflate stream


class Compressor(Protocol):
    """What both backends' ``compressobj`` return."""

    def compress(self, data: bytes, /) -> bytes: ...

    def flush(self, mode: int = ..., /) -> bytes: ...


def isal_level(gzip_level: int) -> int:
    """The isal level (0-3) for ``gzip_level`` 1-9 (zlib's scale): about the same ratio."""
    if not 1 <= gzip_level <= 9:
        raise ValueError(f"gzip_level must be 1 to 9 here, not {gzip_level!r}")
    return min(gzip_level, 3)


def compressor(gzip_level: int, *, backend: Backend | None = None) -> Compressor:
    """A fresh compressor writing one gzip member at ``gzip_level`` (0-9, zlib's scale)."""
    if not 0 <= gzip_level <= 9:
        raise ValueError(f"gzip_level must be 0 to 9, not {gzip_level!r}")
    chosen = BACKEND if backend is None else backend
    if chosen == "isal" and gzip_level > 0:
        if not HAVE_ISAL:
            raise RuntimeError("python-isal is not installed")
        return isal_zlib.compressobj(isal_level(gzip_level), isal_zlib.DEFLATED, _GZIP_WBITS)
    return zlib.compressobj(gzip_level, zlib.DEFLATED, _GZIP_WBITS)
