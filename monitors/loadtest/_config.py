"""What a load test runs: ``LoadtestConfig``, checked once when it is made."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

from ..testing.episodes import CAP_BYTES, MEDIAN_BYTES, MIN_BYTES, P90_BYTES
from ..traces import DEFAULT_CHUNK_BYTES
from .errors import LoadtestError

__all__ = ["MONITORS", "LoadtestConfig", "MonitorName"]

MonitorName = Literal["file", "prime", "wandb"]
#: The monitors a load test can run, in their default order.
MONITORS: Final[tuple[MonitorName, ...]] = ("file", "prime", "wandb")


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise LoadtestError(f"{name} must be a positive integer, not {value!r}")


def _number(name: str, value: object, *, positive: bool = False) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (positive and value == 0):  # type: ignore[operator]
        kind = "> 0" if positive else ">= 0"
        raise LoadtestError(f"{name} must be a finite number {kind}, not {value!r}")


@dataclass(frozen=True, kw_only=True)
class LoadtestConfig:
    """Everything a load test run depends on (the CLI's options, in bytes and seconds).

    Episodes arrive in steps of ``step_size``: one ``log_episodes([episode], subset="all")``
    call per episode as it arrives, then (``effective``) the step's whole batch once with
    ``subset="effective"``, as an orchestrator logs them, so every monitor gets
    ``2 * episodes`` records (``episodes`` without ``effective``). Before each call the
    driver waits while more than ``ahead`` records are still pending in the monitor
    (``stats().pending``), as a trainer that goes on only so far ahead of its uploads would
    (0: never wait; the queue and the drain decide).
    """

    monitors: tuple[MonitorName, ...] = MONITORS
    episodes: int = 1_000
    #: Every episode about this many bytes; None draws production sizes (lognormal).
    size: int | None = None
    size_median: int = MEDIAN_BYTES
    size_p90: int = P90_BYTES
    size_cap: int = CAP_BYTES
    step_size: int = 16
    effective: bool = True
    ahead: int = 64
    seed: int = 0
    #: Injected by the TracesServer on every API request: seconds, and body bytes per second
    #: (0: no limit).
    latency: float = 0.0
    bandwidth: float = 0.0
    in_flight: int = 8
    #: The TracesServer's niceness above this process. It stands in for a remote service but
    #: shares the cores here, spending as much CPU per byte as the client (gunzip, hash and
    #: parse every line): at equal priority it takes the loop's core whenever they are
    #: contended. 0 leaves it at this process's priority.
    server_nice: int = 10
    drain_timeout: float = 60.0
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    #: Where file and W&B monitors write, kept afterwards; None: a temporary directory,
    #: each monitor's files removed as soon as its run ends.
    out: Path | None = None
    lag_interval: float = 0.001
    progress: bool = True
    #: Check that trace files fit on the disk before starting (``NotEnoughDiskError``).
    check_disk: bool = True
    #: Once a monitor has started, ``gc.freeze()`` what is alive then (imported modules,
    #: wandb's among them, and the shared episode bodies), as a latency-minded orchestrator
    #: does after its own start-up: a full collection then scans only what was made since,
    #: instead of stalling the loop for a time that grows with every module ever imported.
    gc_freeze: bool = True

    def __post_init__(self) -> None:
        if not self.monitors:
            raise LoadtestError("name at least one monitor (file, prime, wandb)")
        unknown = [m for m in self.monitors if m not in MONITORS]
        if unknown:
            raise LoadtestError(f"unknown monitor(s) {unknown}; choose among {list(MONITORS)}")
        if len(set(self.monitors)) != len(self.monitors):
            raise LoadtestError(f"a monitor is named twice: {list(self.monitors)}")
        for name in ("episodes", "step_size", "in_flight", "chunk_bytes"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.server_nice, bool) or not isinstance(self.server_nice, int):
            raise LoadtestError(f"server_nice must be an integer, not {self.server_nice!r}")
        if isinstance(self.ahead, bool) or not isinstance(self.ahead, int) or self.ahead < 0:
            raise LoadtestError(f"ahead must be an integer >= 0, not {self.ahead!r}")
        if self.size is not None:
            _positive_int("size", self.size)
            if self.size < MIN_BYTES:
                raise LoadtestError(f"size must be at least {MIN_BYTES} bytes, not {self.size}")
        else:
            if not MIN_BYTES <= self.size_median < self.size_p90:
                raise LoadtestError(
                    f"need {MIN_BYTES} <= size median < size p90, not "
                    f"{self.size_median} and {self.size_p90}"
                )
            if self.size_cap < self.size_median:
                raise LoadtestError(
                    f"size cap ({self.size_cap}) must be at least the median ({self.size_median})"
                )
        _number("latency", self.latency)
        _number("bandwidth", self.bandwidth)
        _number("drain_timeout", self.drain_timeout, positive=True)
        _number("lag_interval", self.lag_interval, positive=True)

    @property
    def records(self) -> int:
        """Records each monitor is given: every episode once as "all", and once more as
        "effective" unless ``effective`` is off."""
        return (2 if self.effective else 1) * self.episodes
