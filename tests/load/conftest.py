"""The production-sized load tests (marked ``load``; ``make test`` runs them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .loadcheck import WANDB_ENV, out_dir


@pytest.fixture
def out(tmp_path: Path) -> Iterator[Path]:
    """Where a run writes its trace files; removed as soon as the test ends."""
    yield from out_dir(tmp_path)


@pytest.fixture(autouse=True)
def wandb_offline(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """wandb offline, every file it writes under tmp_path, nothing sent anywhere."""
    for name in ("WANDB_API_KEY", "WANDB_ENTITY", "WANDB_PROJECT", "WANDB_RUN_ID", "WANDB_NAME"):
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "wandb-home"
    for name in ("WANDB_DIR", "WANDB_CONFIG_DIR", "WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        path = home / name.lower()
        path.mkdir(parents=True)
        monkeypatch.setenv(name, str(path))
    for name, value in WANDB_ENV.items():
        monkeypatch.setenv(name, value)
