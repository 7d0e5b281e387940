"""``nodewise loadtest``: production-sized episodes through every monitor, measured.

    nodewise loadtest                          # 1,000 production episodes, file + prime + wandb
    nodewise loadtest --episodes 100 --baseline --plot lag.png
    python -m monitors.loadtest --monitors prime --size 2.2MB --episodes 10000 \\
        --latency 100ms --bandwidth 100 --in-flight 8

What it proves is what the project is for: an orchestrator can log ~8.5 GB of episodes a
step to a file, the Prime Traces API (here a real ``TracesServer`` in its own process) and
W&B (offline) without stalling its event loop, and every record is accounted for.

From Python::

    report = await run_loadtest(LoadtestConfig(monitors=("prime",), episodes=50))
    report.result("prime").delivered
"""

from ._config import BASELINES, MONITORS, LoadtestConfig, MonitorName
from ._report import plot, table, targets, text, to_json
from ._run import LoadtestReport, RunResult, make_episodes, run_loadtest
from .errors import LoadtestError, NotEnoughDiskError

__all__ = [
    "BASELINES",
    "MONITORS",
    "LoadtestConfig",
    "LoadtestError",
    "LoadtestReport",
    "MonitorName",
    "NotEnoughDiskError",
    "RunResult",
    "make_episodes",
    "plot",
    "run_loadtest",
    "table",
    "targets",
    "text",
    "to_json",
]
