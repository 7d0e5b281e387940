"""The live progress display: one tqdm bar per run, on stderr.

tqdm (pure Python, no dependencies of its own) renders on the thread that updates it and
nowhere else once its monitor thread is off, so the display costs the event loop a few
tens of microseconds four times a second and never competes for the GIL from a thread of
its own (rich's live display refreshes from one).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

__all__ = ["Bar", "Progress"]

MB = 1_000_000


class Bar:
    """One run's bar: records accounted for (delivered or lost) of those to submit."""

    def __init__(self, bar: Any | None) -> None:
        self._bar = bar

    def update(self, *, done: int, submitted: int, mbps: float, lag_max: float) -> None:
        bar = self._bar
        if bar is None:
            return
        bar.n = done
        bar.set_postfix_str(
            f"logged {submitted}, {mbps:.0f} MB/s, lag max {lag_max:.1f} ms", refresh=False
        )
        bar.refresh()

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


class Progress:
    """Makes bars when ``enabled`` (and tqdm is importable), else silent ones."""

    def __init__(self, *, enabled: bool) -> None:
        self._tqdm: Any = None
        if enabled:
            try:
                tqdm: Any = importlib.import_module("tqdm")  # untyped: used as Any
            except ImportError:  # a dependency; only a broken install lacks it
                print("(no progress display: tqdm is not installed)", file=sys.stderr)
            else:
                tqdm.tqdm.monitor_interval = 0  # no monitor thread
                self._tqdm = tqdm.tqdm

    def bar(self, label: str, total: int) -> Bar:
        if self._tqdm is None:
            return Bar(None)
        return Bar(
            self._tqdm(
                total=total,
                desc=f"{label:<24}",
                unit="rec",
                file=sys.stderr,
                dynamic_ncols=True,
                mininterval=0.0,
                smoothing=0.1,
                leave=True,
            )
        )
