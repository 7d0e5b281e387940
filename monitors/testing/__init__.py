"""Test doubles for the monitors: ``TracesServer``, a real Prime Traces API server on
127.0.0.1 in its own process, with fault injection and counts of what it stored.

Imported lazily, so that ``python -m monitors.testing.server`` does not find its own module
already imported by this package (runpy warns about that).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .server import Faults, FaultsError, TracesServer

__all__ = ["Faults", "FaultsError", "TracesServer"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from . import server

        return getattr(server, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
