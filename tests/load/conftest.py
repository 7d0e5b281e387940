"""The production-sized load tests (marked ``load``; ``make test`` runs them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .loadcheck import out_dir


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    """Where a run writes its trace files; removed as soon as the test ends."""
    yield from out_dir(tmp_path)


@pytest.fixture(autouse=True)
def _wandb_offline(wandb_offline: Path) -> None:
    """Every load test keeps wandb offline under its own tmp_path."""
