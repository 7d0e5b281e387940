"""The gzip compressor of traces batches: python-isal, which releases the GIL while it
compresses (docs/design.md D10).

``gzip_level`` is zlib's 0-9 scale. Levels 1-9 map to the isal level of about the same ratio;
level 0 means store, which isal cannot do (its level 0 still compresses), so it takes zlib's
stored blocks.
"""

from __future__ import annotations

import zlib
from typing import Protocol

from isal import isal_zlib

__all__ = ["Compressor", "compressor", "isal_level"]

_GZIP_WBITS = 31  # 16 + 15: a gzip member (header and CRC) around a deflate stream


class Compressor(Protocol):
    """What ``compressobj`` returns, in isal and in zlib."""

    def compress(self, data: bytes | memoryview, /) -> bytes: ...

    def flush(self, mode: int = ..., /) -> bytes: ...


def isal_level(gzip_level: int) -> int:
    """The isal level (1-3) for ``gzip_level`` 1-9: about the same ratio, 4-9 at isal's best."""
    if not 1 <= gzip_level <= 9:
        raise ValueError(f"gzip_level {gzip_level!r} has no isal level (0 stores, 1-9 compress)")
    return min(gzip_level, 3)


def compressor(gzip_level: int) -> Compressor:
    """A fresh compressor writing one gzip member at ``gzip_level`` (0-9; 0 stores)."""
    if gzip_level == 0:
        return zlib.compressobj(0, zlib.DEFLATED, _GZIP_WBITS)
    return isal_zlib.compressobj(isal_level(gzip_level), isal_zlib.DEFLATED, _GZIP_WBITS)
