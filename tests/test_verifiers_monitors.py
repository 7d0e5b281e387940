"""verifiers' own ``Episode`` objects through every monitor, read back with verifiers' models.

The episodes are verifiers 0.4.0 ``WireEpisode`` objects, made by verifiers' own model
validation from production-like records (``EpisodeMaker``), so each monitor calls verifiers'
own ``to_record()``. What the file and W&B trace streams hold must load back with verifiers'
models as the same records; what TracesServer stored must be the same records keyed to the
run, as prime-runs keys them, on the episode and on every member trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import orjson
import pytest
from prime_runs.sinks import stamp_run
from verifiers.v1.episode import WireEpisode  # type: ignore[import-untyped]

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


@pytest.mark.anyio
@pytest.mark.usefixtures("wandb_offline")
@pytest.mark.parametrize("kind", ["train", "eval"])
async def test_verifiers_episodes_through_every_monitor(tmp_path: Path, kind: Kind) -> None:
    maker = EpisodeMaker(seed=21)
    made = [maker.episode(size, index=i).to_record() for i, size in enumerate(SIZES)]
    episodes = [WireEpisode.model_validate(record) for record in made]
    records = [episode.to_record() for episode in episodes]  # verifiers' own JSON form
    with TracesServer(api_key=KEY, keep_lines=True) as server:
        files = FileMonitor(tmp_path / "files")
        prime = PrimeMonitor(api_key=KEY, traces_url=server.url, base_url=server.url, run_id=RUN)
        wandb = WandbMonitor(project="verifiers", mode="offline", dir=tmp_path / "wandb")
        async with Monitors(files, prime, wandb) as monitors:
            await monitors.log_episodes(episodes, step=3, kind=kind, subset="all")
        for monitor in (files, prime, wandb):
            stats = monitor.stats()
            assert (stats.submitted, stats.delivered, stats.lost) == (4, 4, {}), monitor
        stored = server.lines()
        traces = [r for r in server.requests() if r["path"] == "/api/v1/traces"]
    # The file and W&B streams: verifiers' records, loaded back by verifiers' models.
    for monitor in (files, wandb):
        read = list(read_records(monitor.stream_dir(kind, "all")))
        assert read == records
        assert [WireEpisode.model_validate(r).to_record() for r in read] == records
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
