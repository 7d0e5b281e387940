"""``nodewise loadtest``: production-sized episodes through every monitor, measured.

    nodewise loadtest                          # 1,000 production episodes, file + prime + wandb
    nodewise loadtest --episodes 100 --verbose --plot lag.png
    nodewise loadtest --monitors prime --size 2.2MB --episodes 10000 \\
        --latency 100ms --bandwidth 100 --in-flight 8

It shows what the project is for: an orchestrator logs ~8.5 GB of episodes a step to files,
the Prime Traces API (here a real ``TracesServer`` in its own process) and W&B (offline)
without stalling its event loop, and every record is accounted for. From Python::

    report = await run_loadtest(LoadtestConfig(monitors=("prime",), episodes=50))
    report.result("prime").delivered
"""

from ._config import MONITORS, LoadtestConfig, MonitorName
from ._report import plot, summary, table, targets, text, to_json
from ._run import (
    RUNS,
    Instrument,
    LoadtestReport,
    RunResult,
    RunSpec,
    make_episodes,
    run_loadtest,
)
from .errors import LoadtestError, NotEnoughDiskError

__all__ = [
    "MONITORS",
    "RUNS",
    "Instrument",
    "LoadtestConfig",
    "LoadtestError",
    "LoadtestReport",
    "MonitorName",
    "NotEnoughDiskError",
    "RunResult",
    "RunSpec",
    "make_episodes",
    "plot",
    "run_loadtest",
    "summary",
    "table",
    "targets",
    "text",
    "to_json",
]
