"""The runs a browser serves: their names, their index tables and metrics, read as they grow.

A run is named by a slug of its directory's name; a client names runs, lines, traces and nodes,
never paths, and every file read is checked to lie inside the run's own directory (a symlink
out of it is refused).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any, Final

import anyio
import orjson

from .._index import Growing
from .._layout import RUN_STREAM, index_path, stream_of
from ._table import IndexTable

__all__ = ["OutsideRun", "Run", "inside", "open_runs"]

#: Bytes of an index or metrics file read at one look (a worker thread reads them).
_READ: Final = 4 << 20


class OutsideRun(Exception):
    """A file the run's layout names resolves to a place outside the run's directory."""


def inside(path: Path, root: Path) -> Path:
    """``path`` resolved, when that is inside ``root``; else ``OutsideRun``."""
    real = path.resolve()
    if not real.is_relative_to(root):
        raise OutsideRun(f"{path.name} resolves outside the run's directory")
    return real


class Run:
    """One run directory (nodewise's or prime-rl's) or stream directory, as served."""

    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path
        given = path.resolve()
        monitor = given / RUN_STREAM.parent.parent
        if monitor.is_dir():  # a run's directory (its stream may not be written yet)
            self.stream = given / RUN_STREAM
            #: Every file served lies inside this directory (symlinks resolved).
            self.root = given
        else:  # a stream's directory: its index is beside it
            self.stream = stream_of(given)
            monitor = self.stream.parent.parent  # in a run's layout: .../monitors/file
            in_run = self.stream.parent.name == RUN_STREAM.parent.name
            self.root = monitor if in_run else self.stream.parent
        self.metrics_path = monitor / "metrics.jsonl"
        self.table = IndexTable()
        self._index = Growing(index_path(self.stream), block=_READ)
        self._metrics = Growing(self.metrics_path, block=_READ)
        self.metric_steps: list[Any] = []
        self.metric_rows: list[dict[str, float]] = []
        self.metric_names: dict[str, None] = {}
        self._lock = anyio.Lock()

    async def refresh(self) -> None:
        """Take the index rows and metrics rows written since the last look."""
        async with self._lock:
            while True:
                restarted, lines = await anyio.to_thread.run_sync(self._read, self._index)
                if restarted:
                    self.table = IndexTable()
                if not lines:
                    break
                await self.table.take(lines)
            while True:
                restarted, lines = await anyio.to_thread.run_sync(self._read, self._metrics)
                if restarted:
                    self.metric_steps, self.metric_rows, self.metric_names = [], [], {}
                if not lines:
                    break
                self._take_metrics(lines)
                await anyio.sleep(0)

    def _read(self, growing: Growing) -> tuple[bool, list[bytes]]:
        """What ``growing.read`` gives, when the file is inside the run (else nothing)."""
        try:
            inside(growing.path, self.root)
        except OutsideRun:
            return False, []
        return growing.read()

    def _take_metrics(self, lines: Iterable[bytes]) -> None:
        for raw in lines:
            try:
                row = orjson.loads(raw)
            except orjson.JSONDecodeError:
                continue
            if not isinstance(row, dict):
                continue
            numbers = {}
            for key, value in row.items():
                if key in ("step", "time"):
                    continue
                if type(value) in (int, float) and math.isfinite(value):
                    numbers[key] = value
                    self.metric_names.setdefault(key, None)
            step = row.get("step")
            self.metric_steps.append(step if type(step) is int else None)
            self.metric_rows.append(numbers)

    def metrics(self) -> dict[str, Any]:
        """The metrics as columns, one entry per row (null where a row lacks the metric)."""
        return {
            "step": self.metric_steps,
            "metrics": {
                name: [row.get(name) for row in self.metric_rows] for name in self.metric_names
            },
        }

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": str(self.path),
            "episodes": len(self.table),
            "steps": sorted(self.table.steps),
            "metrics": bool(self.metric_names),
        }


def open_runs(paths: Sequence[Path]) -> dict[str, Run]:
    """The runs at ``paths``, by slug (a directory's name, ``-2``... when names repeat)."""
    runs: dict[str, Run] = {}
    for path in paths:
        base = "".join(c if c.isalnum() or c in "-_." else "-" for c in path.resolve().name)
        base = base.strip(".") or "run"
        name, n = base, 1
        while name in runs:
            n += 1
            name = f"{base}-{n}"
        runs[name] = Run(name, path)
    return runs
