"""Sealed chunks: a plain chunk compressed in zstd's seekable format, and read back a frame
at a time (blocking I/O; docs/design.md D9).

The format is standard zstd frames of at most ``FRAME_BYTES`` of input each, then a seek
table in a skippable frame (so ``zstd -dc`` reads a sealed chunk as any other ``.zst``).
pyzstd's ``SeekableZstdFile`` writes it. Reading is done here, from the seek table, so that
a damaged frame is reported by its place and can be skipped, and a record is read by
decompressing only the frames it spans.
"""

from __future__ import annotations

import bisect
import os
import struct
from pathlib import Path
from types import TracebackType
from typing import BinaryIO

import pyzstd

from ..errors import TraceFormatError
from ._layout import chunk_path, sealed_path, sealing_path

__all__ = [
    "DEFAULT_LEVEL",
    "FRAME_BYTES",
    "DamagedFrame",
    "SealedChunk",
    "open_chunk",
    "seal",
]

#: Input bytes per zstd frame: what reading one record decompresses at least.
FRAME_BYTES = 4 << 20
#: zstd's level for sealing: 4.8-7x on episodes in verifiers' schema at ~230 MB/s a core;
#: level 1 is ~40% faster for ~40% more disk, level 6 takes 2.4x the CPU for 7% less
#: (docs/benchmarks.md, python -m bench.seal).
DEFAULT_LEVEL = 3
_SKIPPABLE_MAGIC = 0x184D2A5E
_SEEKABLE_MAGIC = 0x8F92EAB1
_FOOTER = struct.Struct("<IBI")  # frames, descriptor, magic
_HEADER = struct.Struct("<II")  # skippable magic, frame size
_COPY = 1 << 20


class DamagedFrame(Exception):
    """A frame of a sealed chunk does not decompress to what its seek table says.

    :param frame: The frame's number.
    :param start: Its first uncompressed byte.
    :param end: The uncompressed byte just past it (where reading goes on).
    """

    def __init__(self, path: Path, frame: int, start: int, end: int, why: str) -> None:
        super().__init__(f"frame {frame} (bytes {start} to {end}) is damaged: {why}")
        self.path = path
        self.frame = frame
        self.start = start
        self.end = end


def _seek_table(path: Path, f: BinaryIO) -> tuple[list[int], list[int]]:
    """Cumulative compressed and uncompressed frame starts (one more than the frames)."""

    def bad(why: str) -> TraceFormatError:
        return TraceFormatError(f"not a whole sealed chunk: {why}", chunk=path.name)

    size = f.seek(0, os.SEEK_END)
    if size < _HEADER.size + _FOOTER.size:
        raise bad(f"{size} bytes, too short for a seek table (truncated?)")
    f.seek(size - _FOOTER.size)
    frames, descriptor, magic = _FOOTER.unpack(f.read(_FOOTER.size))
    if magic != _SEEKABLE_MAGIC:
        raise bad("it does not end with a seek table (truncated, or not sealed by nodewise)")
    entry = 12 if descriptor & 0x80 else 8
    table_bytes = _HEADER.size + frames * entry + _FOOTER.size
    if descriptor & 0x7C or table_bytes > size:
        raise bad(f"its seek table is damaged ({frames} frames in {size} bytes)")
    f.seek(size - table_bytes)
    table = f.read(table_bytes)
    skippable, content = _HEADER.unpack_from(table)
    if skippable != _SKIPPABLE_MAGIC or content != table_bytes - _HEADER.size:
        raise bad("its seek table's frame header is damaged")
    c_starts, d_starts = [0], [0]
    for i in range(frames):
        c_size, d_size = struct.unpack_from("<II", table, _HEADER.size + i * entry)
        c_starts.append(c_starts[-1] + c_size)
        d_starts.append(d_starts[-1] + d_size)
    if c_starts[-1] != size - table_bytes:
        where = "past" if c_starts[-1] > size - table_bytes else "short of"
        raise bad(f"its seek table points {where} the end of the frames")
    return c_starts, d_starts


class SealedChunk:
    """A sealed chunk opened for reading: a read-only, seekable file of its uncompressed
    bytes, one frame decompressed at a time.

    :param path: The ``.jsonl.zst`` file.
    :raises TraceFormatError: The file has no intact seek table (truncated, or not sealed).
    :raises OSError: It cannot be opened.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._f = open(path, "rb")  # noqa: SIM115 - closed by close()
        try:
            self._c, self._d = _seek_table(path, self._f)
        except BaseException:
            self._f.close()
            raise
        self.size = self._d[-1]
        self._pos = 0
        self._frame = -1  # the frame held in _data
        self._data = b""

    @property
    def frames(self) -> int:
        """How many frames the chunk holds."""
        return len(self._d) - 1

    def _load(self, frame: int) -> None:
        start, end = self._d[frame], self._d[frame + 1]
        self._f.seek(self._c[frame])
        raw = self._f.read(self._c[frame + 1] - self._c[frame])
        try:
            data = pyzstd.decompress(raw)
        except pyzstd.ZstdError as exc:
            self._pos = end  # reading goes on at the next frame
            raise DamagedFrame(self.path, frame, start, end, str(exc)) from exc
        if len(data) != end - start:
            self._pos = end
            raise DamagedFrame(
                self.path, frame, start, end, f"{len(data)} bytes, not {end - start}"
            )
        self._frame, self._data = frame, data

    def read(self, n: int = -1) -> bytes:
        """Up to ``n`` bytes (all that is left when negative) from the current position;
        fewer when a damaged frame follows the sound bytes read (the next read raises).

        :raises DamagedFrame: The frame at the current position is damaged (the position is
            then past it).
        """
        left = self.size - self._pos if n < 0 else min(n, self.size - self._pos)
        parts: list[bytes] = []
        while left > 0:
            frame = bisect.bisect_right(self._d, self._pos) - 1
            if frame != self._frame:
                try:
                    self._load(frame)
                except DamagedFrame:
                    if not parts:
                        raise
                    # A short read: the bytes before the damaged frame are sound; the next
                    # read raises.
                    self._pos = self._d[frame]
                    break
            at = self._pos - self._d[frame]
            part = self._data[at : at + left]
            parts.append(part)
            self._pos += len(part)
            left -= len(part)
        return b"".join(parts)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        """Move to an uncompressed offset (nothing is decompressed until the next read)."""
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.size}[whence]
        self._pos = max(0, min(base + offset, self.size))
        return self._pos

    def tell(self) -> int:
        return self._pos

    def close(self) -> None:
        self._f.close()
        self._data = b""

    def __enter__(self) -> SealedChunk:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def open_chunk(directory: Path, chunk: int) -> BinaryIO | SealedChunk:
    """Chunk ``chunk`` for reading: the plain file while it exists, else the sealed one
    (a seal that finishes meanwhile leaves an open plain file readable to its end).

    :raises TraceFormatError: The sealed chunk has no intact seek table.
    :raises FileNotFoundError: Neither exists.
    """
    try:
        return open(chunk_path(directory, chunk), "rb")
    except FileNotFoundError:
        return SealedChunk(sealed_path(directory, chunk))


def chunk_size(directory: Path, chunk: int) -> int:
    """Uncompressed bytes in chunk ``chunk`` (plain or sealed)."""
    try:
        return chunk_path(directory, chunk).stat().st_size
    except FileNotFoundError:
        with SealedChunk(sealed_path(directory, chunk)) as sealed:
            return sealed.size


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def seal(directory: Path, chunk: int, *, level: int = DEFAULT_LEVEL, fsync: bool = True) -> int:
    """Compress plain chunk ``chunk`` into its sealed file, then remove the plain one.

    The sealed file is written under a temporary name, fsynced and renamed into place before
    the plain chunk is unlinked, so a crash at any moment leaves a whole plain chunk, a whole
    sealed one, or both (``recover`` sorts it out). On failure (a full disk) the temporary
    file is removed and the plain chunk stays as it was.

    :returns: The sealed file's size.
    :raises OSError: Reading, writing or renaming failed.
    """
    plain = chunk_path(directory, chunk)
    temp = sealing_path(directory, chunk)
    options: dict[int, int] = {
        pyzstd.CParameter.compressionLevel: level,
        pyzstd.CParameter.checksumFlag: 1,
    }
    try:
        with open(plain, "rb") as src, open(temp, "wb") as raw:
            with pyzstd.SeekableZstdFile(
                raw, "wb", level_or_option=options, max_frame_content_size=FRAME_BYTES
            ) as dst:
                while block := src.read(_COPY):
                    dst.write(block)
            raw.flush()
            if fsync:
                os.fsync(raw.fileno())
            size = raw.tell()
        os.replace(temp, sealed_path(directory, chunk))
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    if fsync:
        _fsync_dir(directory)
    plain.unlink()
    return size
