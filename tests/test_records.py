"""What the monitors make of what they are given (``monitors.records.Records``): pydantic
models walked as their ``model_dump(mode="json")``, objects with ``to_record()`` built (and
reported when that holds the event loop), Mappings as given; anything else lost as
``bad_record`` with a reason."""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from prime_runs.sinks import stamp_run
from pydantic import BaseModel, Field
from streams import stream_lines

from monitors import DeliveryStats, FileMonitor, PrimeMonitor
from monitors.records import SLOW_TO_RECORD, Records
from monitors.testing import TracesServer

#: Where a FileMonitor writes a run's episodes, below its root (prime-rl's layout).
STREAM = Path("monitors", "file", "traces", "stream")
KEY = "sk-records"
RUN = "run-records"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Step(BaseModel):
    role: str
    text: str
    logprobs: list[float] = Field(default_factory=list)


class Member(BaseModel):
    id: str
    steps: list[Step]
    score: float | None = None


class Rollout(BaseModel):
    """Someone's own episode model: no ``to_record()``, its bulk in lists of sub-models."""

    id: str
    run: dict[str, Any] | None = None
    reward: float = 0.123456789
    traces: list[Member]


def rollout(i: int, members: int = 20) -> Rollout:
    return Rollout(
        id=f"r-{i}",
        traces=[
            Member(
                id=f"r-{i}-{m}",
                steps=[Step(role="assistant", text="é" * 300, logprobs=[-0.123456789] * 50)] * 3,
            )
            for m in range(members)
        ],
    )


class Busy:
    """An object whose ``to_record()`` keeps the loop busy for ``seconds``."""

    def __init__(self, i: int, seconds: float) -> None:
        self.i, self.seconds = i, seconds

    def to_record(self) -> dict[str, Any]:
        end = time.perf_counter() + self.seconds
        while time.perf_counter() < end:
            pass
        return {"id": f"busy-{self.i}"}


class Busier(Busy):
    pass


@pytest.mark.anyio
async def test_a_pydantic_model_is_its_model_dump(tmp_path: Path) -> None:
    """Written as ``orjson.dumps(model.model_dump(mode="json"))``, floats not rounded
    (``float_decimals`` is verifiers' option), into the stream and the index by its id."""
    models = [rollout(i) for i in range(3)]
    async with FileMonitor(tmp_path, float_decimals=2) as monitor:
        await monitor.log_episodes(models, step=0, subset="all")
    assert monitor.stats() == DeliveryStats(3, 3, {})
    lines = stream_lines(tmp_path / STREAM)
    assert lines == [orjson.dumps(m.model_dump(mode="json")) + b"\n" for m in models]
    from monitors.traces import find_record

    assert find_record(tmp_path, "r-1")["id"] == "r-1"
    assert find_record(tmp_path / STREAM, "r-2")["id"] == "r-2"


@pytest.mark.anyio
async def test_a_pydantic_model_is_stamped_as_prime_runs_stamps_its_dump() -> None:
    """Its member traces walked one by one (more than 16), each keyed to the run."""
    models = [rollout(i, members=m) for i, m in enumerate((20, 2, 0))]
    with TracesServer(api_key=KEY, keep_lines=True) as server:
        prime = PrimeMonitor(api_key=KEY, traces_url=server.url, base_url=server.url, run_id=RUN)
        async with prime:
            await prime.log_episodes(models, step=0, kind="eval")
        stored = server.lines()
        formats = {r["headers"]["x-prime-line-format"] for r in server.requests() if r["lines"]}
    assert prime.stats() == DeliveryStats(3, 3, {})
    want = [orjson.dumps(stamp_run(m.model_dump(mode="json"), RUN, "eval")) for m in models]
    assert sorted(stored) == sorted(want)
    assert formats == {"episode"}


@pytest.mark.anyio
async def test_a_slow_to_record_is_reported_once_per_type(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each call over SLOW_TO_RECORD is counted in ``stats().degraded``; the warning names the
    type and the time, once per type; a quick one is neither."""
    slow = SLOW_TO_RECORD * 1.5
    batch: list[Any] = [Busy(0, slow), Busy(1, 0.0), Busy(2, slow), Busier(3, slow)]
    with caplog.at_level(logging.WARNING, logger="monitors.records"):
        async with FileMonitor(tmp_path) as monitor:
            await monitor.log_episodes(batch, step=0)
    assert monitor.stats() == DeliveryStats(4, 4, {}, {"slow_to_record": 3})
    warnings = [r.getMessage() for r in caplog.records if r.name == "monitors.records"]
    assert len(warnings) == 2
    assert warnings[0].startswith("Busy.to_record() held the event loop for ")
    assert warnings[1].startswith("Busier.to_record() held the event loop for ")
    assert all(" ms: " in w and "docs/monitors.md" in w for w in warnings)


def test_what_is_no_record_is_named() -> None:
    with pytest.raises(TypeError, match="a Mapping, a pydantic model or have to_record"):
        Records(4).value(object())


@pytest.mark.anyio
async def test_a_model_whose_dump_fails_is_lost_with_its_path(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A sub-model whose serializer raises: that episode alone is lost (``encode_error``),
    the warning names where; the stream holds the others, whole."""
    from pydantic import field_serializer

    class Bad(BaseModel):
        x: int

        @field_serializer("x")
        def refuse(self, x: int) -> int:
            raise ValueError("no x today")

    class Holder(BaseModel):
        id: str
        items: list[Any]

    from monitors.traces._annotations import read_annotations

    good, other = rollout(0, members=1), rollout(1, members=1)
    bad = Holder(id="bad", items=[1] * 20 + [Bad(x=1)])
    with caplog.at_level(logging.WARNING):
        async with FileMonitor(tmp_path) as monitor:
            await monitor.log_episodes([good, bad, other], step=0)
    assert monitor.stats() == DeliveryStats(3, 2, {"encode_error": 1})
    assert any("Holder.model_dump failed" in r.getMessage() for r in caplog.records)
    lines = stream_lines(tmp_path / STREAM)
    assert lines == [orjson.dumps(m.model_dump(mode="json")) + b"\n" for m in (good, other)]
    # The shipped cohort (subset "effective") is the two written, not the one lost.
    shipped = read_annotations(tmp_path / "monitors/file/traces/annotations")
    assert {trace: [u["info"] for u in updates] for trace, updates in shipped.items()} == {
        "r-0-0": [{"shipped": {"step": 0, "kind": "train"}}],
        "r-1-0": [{"shipped": {"step": 0, "kind": "train"}}],
    }
