"""Monitor backends for a training orchestrator: files, the Prime Traces API and W&B.

Every monitor logs metrics and episodes without blocking the event loop and accounts for
every record it was given: delivered, or lost with a reason (``Monitor.stats()``,
docs/design.md D8).
"""

from .base import DeliveryStats, Monitor, Monitors
from .errors import MonitorError, TraceFormatError, TraceWriteError, UploadError
from .file import FileMonitor
from .lag import LagStats, LoopLagProbe
from .prime import PrimeMonitor
from .records import Kind, Subset
from .wandb_monitor import WandbMonitor

__all__ = [
    "DeliveryStats",
    "FileMonitor",
    "Kind",
    "LagStats",
    "LoopLagProbe",
    "Monitor",
    "MonitorError",
    "Monitors",
    "PrimeMonitor",
    "Subset",
    "TraceFormatError",
    "TraceWriteError",
    "UploadError",
    "WandbMonitor",
]
