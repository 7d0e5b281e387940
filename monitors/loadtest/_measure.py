"""Peak resident memory of this process, per load test run.

On Linux the kernel keeps the peak (``VmHWM`` in ``/proc/self/status``) and resets it when
``5`` is written to ``/proc/self/clear_refs``, so each run gets a peak of its own though the
runs share one process. Elsewhere only the whole process's peak is known
(``ru_maxrss``), and ``PeakRss.resettable`` says so.
"""

from __future__ import annotations

import re
import resource
import sys

__all__ = ["PeakRss"]

_STATUS = "/proc/self/status"
_CLEAR = "/proc/self/clear_refs"
_FIELD = re.compile(r"^(VmHWM|VmRSS):\s+(\d+)\s+kB", re.MULTILINE)


def _status() -> dict[str, int]:
    with open(_STATUS) as f:
        return {name: int(kb) * 1024 for name, kb in _FIELD.findall(f.read())}


class PeakRss:
    """``reset()`` starts a new window; ``peak()`` is the highest RSS since, in bytes."""

    def __init__(self) -> None:
        self.resettable = False
        try:
            _status()
            with open(_CLEAR, "w") as f:
                f.write("5")
            self.resettable = True
        except (OSError, ValueError):
            pass

    def reset(self) -> None:
        if self.resettable:
            with open(_CLEAR, "w") as f:
                f.write("5")

    def peak(self) -> int:
        if self.resettable:
            return _status()["VmHWM"]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB elsewhere

    def current(self) -> int:
        """The RSS now (0 where it cannot be read cheaply)."""
        try:
            return _status()["VmRSS"]
        except (OSError, KeyError):
            return 0
