"""Test doubles for the monitors: ``TracesServer``, a real Prime Traces API server on
127.0.0.1 in its own process, with fault injection and counts of what it stored;
``EpisodeMaker``, production-sized episodes in verifiers' record schema; and
``wandb_offline_env``, the environment that keeps a wandb run offline under one folder.

Imported lazily, so that ``python -m monitors.testing.server`` does not find its own module
already imported by this package (runpy warns about that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._wandb import WANDB_CREDENTIALS, wandb_offline_env

if TYPE_CHECKING:
    from .episodes import Episode, EpisodeMaker
    from .server import Faults, FaultsError, TracesServer

__all__ = [
    "WANDB_CREDENTIALS",
    "Episode",
    "EpisodeMaker",
    "Faults",
    "FaultsError",
    "TracesServer",
    "wandb_offline_env",
]


def __getattr__(name: str) -> Any:
    if name in ("Faults", "FaultsError", "TracesServer"):
        from . import server

        return getattr(server, name)
    if name in ("Episode", "EpisodeMaker"):
        from . import episodes

        return getattr(episodes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
