"""verifiers' own ``Episode`` objects through every monitor, read back with verifiers' models.

The episodes are verifiers 0.4.0 ``WireEpisode`` objects: some built turn by turn with
verifiers' own graph code (``prepare_turn(...).commit(...)``, ``record_reward``,
``record_run``), the rest made by verifiers' model validation from production-sized records
(``EpisodeMaker``); each monitor calls verifiers' own ``to_record()``. What the file and W&B
trace streams hold must load back with verifiers' models as the same records; what
TracesServer stored must be the same records keyed to the run, as prime-runs keys them, on
the episode and on every member trace.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import orjson
import pytest
import verifiers.v1.episode as vf_episode  # type: ignore[import-untyped]
import verifiers.v1.graph as vf_graph  # type: ignore[import-untyped]
import verifiers.v1.trace as vf_trace  # type: ignore[import-untyped]
import verifiers.v1.types as vf_types  # type: ignore[import-untyped]
from prime_runs.sinks import stamp_run
from streams import index_rows, stream_lines
from verifiers.v1.configs.agent import WireAgentConfig  # type: ignore[import-untyped]
from verifiers.v1.episode import WireEpisode
from verifiers.v1.state import State  # type: ignore[import-untyped]
from verifiers.v1.task import WireTaskData  # type: ignore[import-untyped]

from monitors import FileMonitor, Monitors, PrimeMonitor, WandbMonitor
from monitors.records import Kind
from monitors.testing import EpisodeMaker, TracesServer
from monitors.traces import read_records

KEY = "sk-verifiers-test"
RUN = "run-verifiers-1"
SIZES = (20_000, 150_000, 1_000_000, 3_000_000)


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def built_episode(seed: int, kind: Kind, *, turns: int, tokens: int) -> Any:
    """An episode as a verifiers env builds one: a trace grown turn by turn from model
    responses (prompt and completion token ids, logprobs), a reward, the run recorded."""
    rng = random.Random(seed)
    task = vf_trace.TraceTask[WireTaskData](
        type="Task", data=WireTaskData.model_validate({"prompt": f"Task {seed}: add 2 and 2."})
    )
    agent = vf_trace.AgentInfo[WireAgentConfig](config=WireAgentConfig.model_validate({}))
    trace = vf_trace.Trace[WireTaskData, State, WireAgentConfig](task=task, agent=agent)
    prompt: list[Any] = [vf_types.UserMessage(content=f"Task {seed}: what is 2 + 2?")]
    prompt_ids: list[int] = []
    for turn in range(turns):
        pending = vf_graph.prepare_turn(trace, prompt)
        prompt_ids = prompt_ids + [rng.randrange(150_000) for _ in range(tokens // 4)]
        completion = [rng.randrange(150_000) for _ in range(tokens)]
        response = vf_types.Response(
            id=f"resp-{seed}-{turn}",
            created=1_700_000_000 + turn,
            model="policy",
            message=vf_types.AssistantMessage(content=f"turn {turn}: " + "four " * 40),
            finish_reason="stop",
            tokens=vf_types.TurnTokens(
                prompt_ids=prompt_ids,
                completion_ids=completion,
                completion_logprobs=[-rng.random() * 3 for _ in completion],
            ),
        )
        pending.commit(response)
        prompt_ids = prompt_ids + completion
        prompt = [*prompt, response.message, vf_types.UserMessage(content=f"Go on ({turn}).")]
    trace.record_reward("correct", 1.0)
    episode = WireEpisode(task=task, traces=[trace])
    if kind == "train":
        work = vf_episode.TrainWorkInfo(step=3, policy=vf_episode.PolicySpan(start=2, end=3))
        episode.record_run(vf_episode.TrainRunInfo(id="local-run", name="local", work=work))
    else:
        episode.record_run(vf_episode.EvalRunInfo(id="local-run", name="local"))
    return episode


@pytest.mark.anyio
@pytest.mark.usefixtures("wandb_offline")
@pytest.mark.parametrize(("kind", "decimals"), [("train", 4), ("eval", 4), ("train", None)])
async def test_verifiers_episodes_through_every_monitor(
    tmp_path: Path, kind: Kind, decimals: int | None
) -> None:
    """Each monitor writes verifiers' ``to_record(float_decimals=...)`` of each episode, with
    the monitors' ``float_decimals`` (4 by default, as verifiers and prime-rl) passed on."""
    maker = EpisodeMaker(seed=21)
    made = [maker.episode(size, index=i).to_record() for i, size in enumerate(SIZES)]
    episodes = [WireEpisode.model_validate(record) for record in made]
    episodes += [built_episode(i, kind, turns=3 + i, tokens=500 * (i + 1)) for i in range(3)]
    # verifiers' own JSON form
    records = [episode.to_record(float_decimals=decimals) for episode in episodes]
    given = {} if decimals == 4 else {"float_decimals": decimals}
    with TracesServer(api_key=KEY, keep_lines=True) as server:
        files = FileMonitor(tmp_path / "files", **given)
        prime = PrimeMonitor(
            api_key=KEY, traces_url=server.url, base_url=server.url, run_id=RUN, **given
        )
        wandb = WandbMonitor(project="verifiers", mode="offline", dir=tmp_path / "wandb", **given)
        async with Monitors(files, prime, wandb) as monitors:
            await monitors.log_episodes(episodes, step=3, kind=kind, subset="all")
        for monitor in (files, prime, wandb):
            stats = monitor.stats()
            assert (stats.submitted, stats.delivered, stats.lost) == (7, 7, {}), monitor
        stored = server.lines()
        traces = [r for r in server.requests() if r["path"] == "/api/v1/traces"]
    # The file and W&B streams: verifiers' records, byte for byte, loaded back by verifiers'
    # models.
    lines = [orjson.dumps(record) + b"\n" for record in records]
    assert wandb.run is not None
    runs = {files: tmp_path / "files", wandb: Path(wandb.run.dir)}
    for monitor, run in runs.items():
        stream = monitor.stream_dir
        assert stream == run / "monitors" / "file" / "traces" / "stream"
        assert stream_lines(stream) == lines
        read = list(read_records(run))
        assert [WireEpisode.model_validate(r).to_record(float_decimals=None) for r in read] == read
        # The index: prime-rl's row of each episode, with the kind it was logged as.
        rows = index_rows(stream)
        assert [row.fields["id"] for row in rows] == [r["id"] for r in records]
        assert [(row.kind, row.step) for row in rows] == [(kind, 3)] * len(records)
        assert [row.fields["trace_ids"] for row in rows] == [
            [t["id"] for t in r["traces"]] for r in records
        ]
    # The service's copy: the same records keyed to the run, as prime-runs keys them.
    assert sorted(stored) == sorted(orjson.dumps(stamp_run(r, RUN, kind)) for r in records)
    for line in stored:
        episode: dict[str, Any] = orjson.loads(line)
        assert episode["run"]["id"] == RUN
        assert episode["run"]["type"] == kind
        assert episode["traces"]
        assert all(t["run"]["id"] == RUN and t["run"]["type"] == kind for t in episode["traces"])
        WireEpisode.model_validate(episode)  # still a verifiers episode
    assert {r["headers"]["x-prime-line-format"] for r in traces} == {"episode"}
    assert {r["metadata"]["context"]["run_type"] for r in traces} == {kind}
