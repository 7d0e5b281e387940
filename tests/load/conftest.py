"""The production-sized load tests (marked ``load``; ``make test`` runs them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from monitors.testing import WANDB_CREDENTIALS, wandb_offline_env

from .loadcheck import out_dir


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    """Where a run writes its trace files; removed as soon as the test ends."""
    yield from out_dir(tmp_path)


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb offline, every file it writes under tmp_path, nothing sent anywhere."""
    for name in WANDB_CREDENTIALS:
        monkeypatch.delenv(name, raising=False)
    for name, value in wandb_offline_env(tmp_path / "wandb-home").items():
        monkeypatch.setenv(name, value)
