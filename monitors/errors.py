"""Errors the monitors raise; foreign errors are translated into these at the boundary."""

from __future__ import annotations

__all__ = ["MonitorError", "TraceFormatError", "TraceWriteError", "UploadError"]


class MonitorError(Exception):
    """Base of every error a monitor raises."""


class TraceWriteError(MonitorError):
    """A record could not be written to a trace stream (disk full, permissions, ...).

    The stream stays readable up to its last complete record.
    """


class TraceFormatError(MonitorError):
    """A trace stream holds bytes that are not a complete JSON record, or a file that is not
    a readable chunk.

    ``chunk`` is the file's name and ``offset`` the (uncompressed) byte where the bad line
    starts, or None when the file as a whole is bad (a stray file in a stream's directory, a
    sealed chunk whose seek table is damaged).

    :param message: What is wrong.
    :param chunk: The chunk file's name (or the stray file's).
    :param offset: The byte in the chunk where the bad line starts, if known.
    """

    def __init__(self, message: str, *, chunk: str, offset: int | None = None) -> None:
        where = f"in {chunk}" if offset is None else f"in {chunk} at byte {offset}"
        super().__init__(f"{message} ({where})")
        self.chunk = chunk
        self.offset = offset


class UploadError(MonitorError):
    """An upload was refused or could not be delivered."""
