"""Recipe: hand the monitors the objects you have, as they are.

``main(directory)`` logs one episode of each kind the monitors take to a ``FileMonitor``: a
verifiers ``Episode``, a pydantic model of your own, an object with ``to_record()`` and a
plain dict; then reads the run's trace stream back and returns the lines with the records each
must equal (``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
import orjson
from pydantic import BaseModel

from monitors import FileMonitor
from monitors.traces import read_records

# --8<-- [start:objects]


class Step(BaseModel):
    role: str
    text: str
    logprobs: list[float]


class MyRollout(BaseModel):
    """Your own pydantic model: written as ``model_dump(mode="json")`` would be."""

    id: str
    reward: float
    steps: list[Step]


class Legacy:
    """Anything else with ``to_record()``: called when the episode is encoded."""

    def to_record(self) -> dict[str, Any]:
        return {"id": "legacy-1", "reward": 0.5}


async def log_each_kind(root: Path, episode: Any) -> None:
    """``episode``: a verifiers ``Episode``, as an env's ``run`` returns it."""
    # float_decimals=4 (the default) is verifiers' to_record(float_decimals=4): the
    # per-token floats of verifiers episodes only. Dicts and other models are written as given.
    async with FileMonitor(root, float_decimals=4) as files:
        rollout = MyRollout(
            id="mine-1",
            reward=0.75,
            steps=[Step(role="assistant", text="4", logprobs=[-0.0123456789])],
        )
        plain = {"id": "dict-1", "reward": 1 / 3}
        await files.log_episodes([episode, rollout, Legacy(), plain], step=0, subset="all")
    assert files.stats().delivered == 4


# --8<-- [end:objects]


def verifiers_episode() -> Any:
    """A small verifiers episode, built with verifiers' own API."""
    from verifiers.v1.configs.agent import WireAgentConfig  # type: ignore[import-untyped]
    from verifiers.v1.episode import WireEpisode  # type: ignore[import-untyped]
    from verifiers.v1.state import State  # type: ignore[import-untyped]
    from verifiers.v1.task import WireTaskData  # type: ignore[import-untyped]
    from verifiers.v1.trace import AgentInfo, Trace, TraceTask  # type: ignore[import-untyped]

    task = TraceTask[WireTaskData](type="Task", data=WireTaskData.model_validate({"q": "2+2"}))
    agent = AgentInfo[WireAgentConfig](config=WireAgentConfig.model_validate({}))
    trace = Trace[WireTaskData, State, WireAgentConfig](task=task, agent=agent)
    trace.record_reward("correct", 1.0)
    return WireEpisode(task=task, traces=[trace])


def main(directory: Path) -> tuple[list[Any], list[Any]]:
    """The records read back, and what each must be."""
    episode = verifiers_episode()
    anyio.run(log_each_kind, directory, episode)
    # Every episode is in the run's one stream, directory/monitors/file/traces/stream/;
    # read_records takes the run's directory or the stream's.
    read = list(read_records(directory))
    assert read == list(read_records(directory / "monitors" / "file" / "traces" / "stream"))
    want = [
        episode.to_record(float_decimals=4),
        {
            "id": "mine-1",
            "reward": 0.75,
            "steps": [{"role": "assistant", "text": "4", "logprobs": [-0.0123456789]}],
        },
        {"id": "legacy-1", "reward": 0.5},
        {"id": "dict-1", "reward": 1 / 3},
    ]
    return read, [orjson.loads(orjson.dumps(w)) for w in want]
