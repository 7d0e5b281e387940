"""Errors ``nodewise loadtest`` raises: bad settings, a missing extra, too little disk."""

from __future__ import annotations

from ..errors import MonitorError

__all__ = ["LoadtestError", "NotEnoughDiskError"]


class LoadtestError(MonitorError):
    """The load test cannot run as asked (a bad option, a missing optional package, ...)."""


class NotEnoughDiskError(LoadtestError):
    """The trace files of a run would not fit on the disk: ``needed`` and ``free`` bytes at
    ``path``, so a caller can say by how much (``shortfall``)."""

    def __init__(self, *, path: str, needed: int, free: int, what: str) -> None:
        self.path = path
        self.needed = needed
        self.free = free
        super().__init__(
            f"{what} needs ~{needed / 1e9:.1f} GB of disk in {path} but only "
            f"{free / 1e9:.1f} GB are free ({self.shortfall / 1e9:.1f} GB short); free some "
            "space, point --out elsewhere, or run fewer episodes"
        )

    @property
    def shortfall(self) -> int:
        return max(0, self.needed - self.free)
