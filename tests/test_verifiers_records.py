"""verifiers 0.4.0 episodes and traces walked by the encoder, byte for byte ``to_record()``.

The episodes are built with verifiers' own construction API, as an env builds them: turns
committed from model responses (``prepare_turn(...).commit(...)``), tool calls and their
results, a second branch from a rewritten prompt, model calls with usage, errors
(``record_error``), timeouts (``record_timeout``), rewards and metrics, the run recorded
(``record_run``) for train and eval work, ``mm_token_type_id_map`` with int keys, advantages
and the other per-token floats at full precision (so that rounding matters). Every way of
encoding one must give ``orjson.dumps(obj.to_record(float_decimals=d))``, for every ``d``.
"""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import orjson
import pytest
import trio
import verifiers.v1.episode as vf_episode  # type: ignore[import-untyped]
import verifiers.v1.graph as vf_graph  # type: ignore[import-untyped]
import verifiers.v1.trace as vf_trace  # type: ignore[import-untyped]
import verifiers.v1.types as vf_types  # type: ignore[import-untyped]
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from verifiers.v1.configs.agent import WireAgentConfig  # type: ignore[import-untyped]
from verifiers.v1.episode import WireEpisode
from verifiers.v1.state import State  # type: ignore[import-untyped]
from verifiers.v1.task import WireTaskData  # type: ignore[import-untyped]

import encoder
from encoder._settings import Limits
from encoder._walk import Walker
from monitors.testing import EpisodeMaker

#: Text that JSON escapes, astral characters, and plain words.
TEXT = st.text(
    st.sampled_from(
        ["a", "b", " ", "\n", '"', "\\", "\x00", "\x1f", "é", "€", "𝄞", "😀", "<", "\u2028"]
    ),
    max_size=40,
)
#: Per-token floats at full precision, near rounding ties among them.
FLOAT = st.one_of(
    st.floats(min_value=-30, max_value=0, allow_nan=False),
    st.integers(-(10**6), 10**6).map(lambda k: (k + 0.5) / 10**4),
    st.floats(allow_nan=False, allow_infinity=False, width=64),
)
KEY = "sk-records"
RUN = "run-records"
#: Every ``float_decimals`` verifiers takes: None, and any int (``round``'s).
DECIMALS = st.sampled_from([None, 0, 1, 2, 3, 4, 6, 8, 12, 17, 18, 25, 400, -1, -3])
#: Every node cut into pieces: every list of models walked a model at a time, every list of
#: floats rounded in C a slice at a time.
TINY = Limits(
    group_bytes=64,
    str_bytes=12,
    number_bytes=40,
    max_group=3,
    plan_elements=2,
    sort_run=3,
    model_list=0,
    model_floats=0,
)


class ToolFailed(Exception):
    status_code = 503


def _response(draw: Any, i: int, prompt_len: int, message: Any) -> Any:
    completion = draw(st.lists(st.integers(0, 200_000), max_size=30))
    logprobs = [draw(FLOAT) for _ in completion]
    return vf_types.Response(
        id=f"resp-{i}",
        created=1_700_000_000 + i,
        model="policy",
        message=message,
        finish_reason=draw(st.sampled_from(["stop", "length", "tool_calls"])),
        tokens=vf_types.TurnTokens(
            prompt_ids=[7] * prompt_len,
            completion_ids=completion,
            completion_logprobs=logprobs,
            mm_token_type_id_map=draw(
                st.none() | st.dictionaries(st.integers(0, 200_000), st.integers(0, 2), max_size=2)
            ),
        ),
    )


@st.composite
def traces(draw: Any) -> Any:
    """One agent's trace, grown turn by turn with verifiers' graph code."""
    task = vf_trace.TraceTask[WireTaskData](
        type="Task", data=WireTaskData.model_validate({"prompt": draw(TEXT), "n": 1})
    )
    agent = vf_trace.AgentInfo[WireAgentConfig](config=WireAgentConfig.model_validate({}))
    trace = vf_trace.Trace[WireTaskData, State, WireAgentConfig](task=task, agent=agent)
    roots = draw(st.integers(1, 2))  # two roots: a rewritten prompt, a second branch
    for root in range(roots):
        prompt: list[Any] = [vf_types.UserMessage(content=draw(TEXT) + f" ({root})")]
        for turn in range(draw(st.integers(0, 3))):
            pending = vf_graph.prepare_turn(trace, prompt)
            calls = draw(st.integers(0, 2))
            tool_calls = [
                vf_types.ToolCall(id=f"call-{root}-{turn}-{c}", name="search", arguments=draw(TEXT))
                for c in range(calls)
            ]
            message = vf_types.AssistantMessage(content=draw(TEXT), tool_calls=tool_calls or None)
            response = _response(draw, turn, draw(st.integers(0, 20)), message)
            node = pending.commit(response)
            usage = vf_types.Usage(
                prompt_tokens=draw(st.integers(0, 5000)),
                completion_tokens=draw(st.integers(0, 5000)),
                cost=draw(st.none() | st.floats(0, 1)),
            )
            trace.calls.append(
                vf_trace.ModelCall(node=node, model="policy", usage=usage, finish_reason="stop")
            )
            prompt = [*prompt, message]
            prompt += [
                vf_types.ToolMessage(tool_call_id=call.id, content=draw(TEXT))
                for call in tool_calls
            ]
            if not tool_calls:
                prompt.append(vf_types.UserMessage(content=draw(TEXT)))
    for node in trace.nodes:
        if node.sampled and draw(st.booleans()):
            node.advantages = [draw(FLOAT) for _ in node.logprobs]
        if node.sampled and draw(st.booleans()):
            node.reference_logprobs = [draw(FLOAT) for _ in node.logprobs]
            node.entropies = [abs(draw(FLOAT)) for _ in node.logprobs]
    for name in draw(st.lists(st.sampled_from(["correct", "format", "length"]), unique=True)):
        trace.record_reward(name, draw(FLOAT), draw(st.floats(0, 2)))
    if draw(st.booleans()):
        trace.record_metric("turns", draw(FLOAT))
    if draw(st.booleans()):
        try:
            raise ToolFailed(draw(TEXT))
        except ToolFailed as exc:
            trace.record_error(exc)
    if draw(st.booleans()):
        trace.record_timeout("agent")
    else:
        trace.stop("agent_completed")
    return trace


@st.composite
def episodes(draw: Any) -> Any:
    members = draw(st.lists(traces(), max_size=3))
    episode = WireEpisode(
        task=members[0].task
        if members
        else vf_trace.TraceTask[WireTaskData](type="Task", data=WireTaskData.model_validate({})),
        traces=members,
        ok=draw(st.booleans()),
    )
    episode.is_timeout = draw(st.booleans())
    if draw(st.booleans()):
        episode.group = vf_episode.GroupInfo(id=draw(TEXT))
    run = draw(st.sampled_from(["train", "eval", None]))
    if run == "train":
        work = vf_episode.TrainWorkInfo(step=3, policy=vf_episode.PolicySpan(start=2, end=3))
        episode.record_run(vf_episode.TrainRunInfo(id="local-run", work=work))
    elif run == "eval":
        episode.record_run(vf_episode.EvalRunInfo(id="local-run", name=draw(TEXT)))
    if draw(st.booleans()):
        episode.errors.append(vf_trace.Error(type="Boom", message=draw(TEXT)))
    return episode


def expected(obj: Any, decimals: int | None) -> bytes:
    return orjson.dumps(obj.to_record(float_decimals=decimals))


async def _adrain(obj: Any, decimals: int | None) -> bytes:
    parts = [c async for c in encoder.aiterencode(obj, float_decimals=decimals, budget=0.0005)]
    return b"".join(parts)


SLOW = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SLOW
@given(episode=episodes(), decimals=DECIMALS)
def test_an_episode_is_to_record_through_every_encoder(episode: Any, decimals: int | None) -> None:
    want = expected(episode, decimals)
    assert encoder.encode(episode, float_decimals=decimals) == want
    for size in (1, 7, 4096):
        got = b"".join(encoder.iterencode(episode, chunk_size=size, float_decimals=decimals))
        assert got == want
    assert asyncio.run(_adrain(episode, decimals)) == want
    assert trio.run(_adrain, episode, decimals) == want
    # Every node cut into pieces, every list of floats sliced.
    assert b"".join(Walker(episode, float_decimals=decimals, limits=TINY)) == want  # type: ignore[misc]


@SLOW
@given(trace=traces(), decimals=DECIMALS)
def test_a_trace_is_to_record(trace: Any, decimals: int | None) -> None:
    want = expected(trace, decimals)
    assert encoder.encode(trace, float_decimals=decimals) == want
    assert b"".join(Walker(trace, float_decimals=decimals, limits=TINY)) == want  # type: ignore[misc]


@SLOW
@given(episode=episodes(), kind=st.sampled_from(["train", "eval"]))
def test_prime_stamps_the_record_as_prime_runs_does(episode: Any, kind: str) -> None:
    """PrimeMonitor's stamp, an edit of each walked model, gives prime-runs' ``stamp_run``
    of the record, the run set (or added last) on the episode and on every member trace."""
    from prime_runs.sinks import stamp_run

    from monitors.prime._stamp import Stamp

    want = orjson.dumps(stamp_run(episode.to_record(), RUN, kind))
    for limits in (TINY, Limits()):
        stamp = Stamp(RUN, kind)
        view = encoder.record_dump(episode, 4, edit=stamp)
        assert b"".join(Walker(view, limits=limits)) == want  # type: ignore[misc]
        assert stamp.traces


@SLOW
@given(episode=episodes())
def test_an_episode_among_plain_data(episode: Any) -> None:
    """In a dict, with plain floats beside it rounded by ``float_decimals``: the episode is
    its ``to_record(float_decimals=2)``, its own timestamps and rewards not rounded again."""
    doc = {"step": 3, "loss": 0.123456789, "episodes": [episode, episode]}
    record = episode.to_record(float_decimals=2)
    want = orjson.dumps({"step": 3, "loss": 0.12, "episodes": [record, record]})
    assert encoder.encode(doc, float_decimals=2) == want
    assert b"".join(Walker(doc, float_decimals=2, limits=TINY)) == want  # type: ignore[misc]


@pytest.mark.parametrize("size", [20_000, 1_000_000, 6_400_000])
@pytest.mark.parametrize("decimals", [None, 4, 2])
def test_production_sized_episodes(size: int, decimals: int | None) -> None:
    """EpisodeMaker's records in verifiers' models (``WireEpisode.model_validate``), as a
    consumer without the run's packages loads them."""
    record = EpisodeMaker(seed=size).episode(size, index=0).to_record(fresh=True)
    episode = WireEpisode.model_validate(record)
    want = expected(episode, decimals)
    assert b"".join(encoder.iterencode(episode, float_decimals=decimals)) == want
    assert asyncio.run(_adrain(episode, decimals)) == want


def test_options_apply_to_the_record() -> None:
    """orjson's options act on the record as on ``to_record()``'s dict: sorted keys, indent,
    a newline."""
    record = EpisodeMaker(seed=5).episode(200_000, index=0).to_record(fresh=True)
    episode = WireEpisode.model_validate(record)
    for option in (orjson.OPT_SORT_KEYS, orjson.OPT_INDENT_2, orjson.OPT_APPEND_NEWLINE):
        want = orjson.dumps(episode.to_record(), option=option)
        assert encoder.encode(episode, option=option, float_decimals=4) == want
        assert b"".join(Walker(episode, option=option, float_decimals=4, limits=TINY)) == want  # type: ignore[misc]


def test_no_container_per_token_list_outlives_its_step() -> None:
    """The walk keeps no garbage: a 6.4 MB episode sets off no more young collections than
    the objects it builds and frees at once allow (``to_record()`` builds a dict per node
    and a list per token stream, and keeps them all until the end)."""
    record = EpisodeMaker(seed=9).episode(6_400_000, index=0).to_record(fresh=True)
    episode = WireEpisode.model_validate(record)
    counts: dict[str, int] = {}

    def count(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            counts[str(info["generation"])] = counts.get(str(info["generation"]), 0) + 1

    def collections(run: Any) -> dict[str, int]:
        counts.clear()
        gc.collect()
        gc.callbacks.append(count)
        try:
            run()
        finally:
            gc.callbacks.remove(count)
        return dict(counts)

    walked = collections(lambda: b"".join(encoder.iterencode(episode, float_decimals=4)))
    built = collections(lambda: orjson.dumps(episode.to_record()))
    assert sum(walked.values()) < sum(built.values())
    assert walked.get("2", 0) == 0


def test_without_verifiers_loaded_nothing_of_it_is_imported() -> None:
    """A plain dict never brings verifiers in (the walk asks ``sys.modules``)."""
    import subprocess
    import sys

    code = (
        "import sys, encoder, monitors; "
        "encoder.encode({'a': [1.5] * 10}, float_decimals=1); "
        "assert not any(m.startswith('verifiers') for m in sys.modules), 'imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


@settings(
    max_examples=6,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(batch=st.lists(episodes(), min_size=1, max_size=4), decimals=DECIMALS)
def test_built_episodes_through_the_file_and_prime_monitors(
    tmp_path_factory: pytest.TempPathFactory, batch: list[Any], decimals: int | None
) -> None:
    """What FileMonitor writes is ``to_record(float_decimals=d)``'s line, byte for byte; what
    TracesServer stores from PrimeMonitor is prime-runs' ``stamp_run`` of that record."""
    from prime_runs.sinks import stamp_run
    from streams import stream_lines

    from monitors import FileMonitor, PrimeMonitor
    from monitors.testing import TracesServer

    root = tmp_path_factory.mktemp("run")
    records = [episode.to_record(float_decimals=decimals) for episode in batch]

    async def log(server: TracesServer) -> None:
        files = FileMonitor(root, float_decimals=decimals)
        prime = PrimeMonitor(
            api_key=KEY,
            traces_url=server.url,
            base_url=server.url,
            run_id=RUN,
            float_decimals=decimals,
        )
        async with files, prime:
            await files.log_episodes(batch, step=1, subset="all")
            await prime.log_episodes(batch, step=1, kind="eval", subset="all")
        for monitor in (files, prime):
            stats = monitor.stats()
            assert (stats.delivered, stats.lost) == (len(batch), {})

    with TracesServer(api_key=KEY, keep_lines=True) as server:
        asyncio.run(log(server))
        stored = server.lines()
    assert stream_lines(root / "monitors" / "file" / "traces" / "stream") == [
        orjson.dumps(r) + b"\n" for r in records
    ]
    assert sorted(stored) == sorted(orjson.dumps(stamp_run(r, RUN, "eval")) for r in records)


def test_another_verifiers_series_is_built_by_its_own_to_record(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Only the 0.4 series is walked: the bytes were proven against it. Another version's
    episode is built by its own ``to_record`` in one step, and written the same."""
    import encoder._models as models

    monkeypatch.setitem(models._KNOWN, "verifiers", False)
    record = EpisodeMaker(seed=11).episode(300_000, index=0).to_record(fresh=True)
    episode = WireEpisode.model_validate(record)
    called: list[int | None] = []
    real = type(episode).to_record

    def spy(self: Any, float_decimals: int | None = 4) -> Any:
        called.append(float_decimals)
        return real(self, float_decimals=float_decimals)

    monkeypatch.setattr(type(episode), "to_record", spy)
    for decimals in (None, 2):
        want = orjson.dumps(real(episode, float_decimals=decimals))
        assert b"".join(Walker(episode, float_decimals=decimals, limits=TINY)) == want  # type: ignore[misc]
    assert called == [None, 2]
