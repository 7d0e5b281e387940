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
    """A trace chunk holds bytes that are not a complete JSON record.

    ``chunk`` is the chunk file and ``offset`` the byte where the bad line starts.

    :param message: What is wrong with the line.
    :param chunk: The chunk file's name.
    :param offset: The byte in the chunk where the bad line starts.
    """

    def __init__(self, message: str, *, chunk: str, offset: int) -> None:
        super().__init__(f"{message} (in {chunk} at byte {offset})")
        self.chunk = chunk
        self.offset = offset


class UploadError(MonitorError):
    """An upload was refused or could not be delivered."""
