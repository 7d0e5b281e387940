"""What a load test measures beside loop lag: peak memory, garbage collections and CPU time.

``bench`` reuses these, so each exists once.
"""

from __future__ import annotations

import gc
import logging
import os
import re
import resource
import sys
import time
from typing import Any

__all__ = ["GcWatch", "PeakRss", "lower_priority", "process_cpu"]

log = logging.getLogger("monitors.loadtest")

_STATUS = "/proc/self/status"
_CLEAR = "/proc/self/clear_refs"
_FIELD = re.compile(r"^(VmHWM|VmRSS):\s+(\d+)\s+kB", re.MULTILINE)


def _status() -> dict[str, int]:
    with open(_STATUS) as f:
        return {name: int(kb) * 1024 for name, kb in _FIELD.findall(f.read())}


class PeakRss:
    """The process's peak resident memory since ``reset()``, in bytes (``peak()``).

    On Linux the kernel keeps the peak and resets it on request, so runs sharing a process
    each get their own; elsewhere only the whole process's peak is known, and
    ``resettable`` is False.
    """

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
        """Start a new window."""
        if self.resettable:
            with open(_CLEAR, "w") as f:
                f.write("5")

    def peak(self) -> int:
        """The highest RSS since ``reset()`` (or since the process began)."""
        if self.resettable:
            return _status()["VmHWM"]
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return rss if sys.platform == "darwin" else rss * 1024  # bytes on macOS, KiB elsewhere


class GcWatch:
    """Records every garbage collection while installed: ``with GcWatch() as watch``.

    ``collections`` holds (generation, pause in ms) of each; a collector pause stalls the
    loop like a long step does, so a lag report says how many were full and how long.
    """

    def __init__(self) -> None:
        self.collections: list[tuple[int, float]] = []
        self._t0 = 0.0

    def _callback(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            self.collections.append(
                (int(info["generation"]), (time.perf_counter() - self._t0) * 1e3)
            )

    def __enter__(self) -> GcWatch:
        gc.callbacks.append(self._callback)
        return self

    def __exit__(self, *exc: object) -> None:
        gc.callbacks.remove(self._callback)

    @property
    def full(self) -> int:
        """Full (generation 2) collections."""
        return sum(1 for generation, _ in self.collections if generation == 2)

    @property
    def longest(self) -> float:
        """The longest pause of any collection, in ms."""
        return max((pause for _, pause in self.collections), default=0.0)


def process_cpu(pid: int | None = None) -> float | None:
    """CPU seconds (user + system) this process (``pid`` None) or process ``pid`` has used
    so far; None where ``/proc`` cannot tell."""
    if pid is None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def lower_priority(pid: int, nice: int) -> None:
    """Run process ``pid`` at ``nice`` above this process (best effort; 0 leaves it)."""
    if nice > 0 and hasattr(os, "setpriority"):
        try:
            os.setpriority(os.PRIO_PROCESS, pid, os.getpriority(os.PRIO_PROCESS, 0) + nice)
        except OSError as exc:
            log.warning("process %d's priority was not lowered: %s", pid, exc)
