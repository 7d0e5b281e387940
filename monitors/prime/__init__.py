"""The Prime monitor: episodes to the Prime Traces API, metrics to the Prime API."""

from ._monitor import PrimeMonitor

__all__ = ["PrimeMonitor"]
