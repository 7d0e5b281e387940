"""The Prime monitor: episodes to the Prime Traces API, metrics to the Prime API."""

from ._config import METRICS_PATH, TRACES_PATH
from ._monitor import PrimeMonitor

__all__ = ["METRICS_PATH", "TRACES_PATH", "PrimeMonitor"]
