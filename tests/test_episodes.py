"""The episode maker (``monitors.testing.episodes``): records in verifiers 0.4.0's schema (checked
with verifiers' own models), unique ids, exact sizes, shared bodies, fresh copies, seeding."""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import orjson
import pytest

from monitors.testing.episodes import (
    BODIES,
    CAP_BYTES,
    MEDIAN_BYTES,
    MIN_BYTES,
    Episode,
    EpisodeMaker,
    lognormal_sizes,
)

ARRAYS = ("token_ids", "mask", "is_content", "logprobs", "advantages")
UUID_HEX = re.compile(r"[0-9a-f]{12}4[0-9a-f]{3}[89ab][0-9a-f]{15}")


@pytest.fixture(scope="module")
def maker() -> EpisodeMaker:
    """One maker for the module: its bodies are built once."""
    return EpisodeMaker(seed=11)


@pytest.fixture(scope="module")
def verifiers_v1() -> Any:
    """verifiers' v1 record models (a test dependency: a missing install fails here)."""
    import verifiers.v1.episode

    return verifiers.v1.episode


def objects(value: Any) -> Iterator[Any]:
    """Every str, list and dict in a JSON-ready value, keys included, but the one-character
    and empty strs (the interpreter's own singletons, all ASCII here)."""
    if isinstance(value, (list, dict)) or (isinstance(value, str) and len(value) > 1):
        yield value
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from objects(item)
    elif isinstance(value, list) and not all(isinstance(x, (int, float)) for x in value):
        for item in value:
            yield from objects(item)


@pytest.mark.parametrize(
    "target", [MIN_BYTES, 50_000, 1_000_000, MEDIAN_BYTES, CAP_BYTES], ids=lambda t: f"{t}B"
)
def test_records_round_trip_through_verifiers_models(
    maker: EpisodeMaker, verifiers_v1: Any, target: int
) -> None:
    """verifiers reads the record and writes back exactly the same JSON: every field has
    verifiers' name, type, order and default, the floats its rounding, and the token counts
    are the ones verifiers computes from the model calls."""
    from verifiers.v1.graph import RECORD_FLOAT_DECIMALS

    assert RECORD_FLOAT_DECIMALS == 4
    episode = maker.episode(target, index=target)
    data = orjson.dumps(episode.to_record())
    wire = verifiers_v1.WireEpisode.model_validate(orjson.loads(data))
    again = wire.to_record(float_decimals=RECORD_FLOAT_DECIMALS)
    assert orjson.dumps(again) == data
    assert wire.id == episode.id
    assert [t.id for t in wire.traces] == list(episode.trace_ids)


def test_traces_hold_verifiers_conversations(maker: EpisodeMaker, verifiers_v1: Any) -> None:
    """Each trace is one chain of messages whose token arrays line up, whose sampled nodes
    are the assistant's (with logprobs and advantages), and whose model calls account for
    every token of it."""
    from verifiers.v1.trace import WireTrace
    from verifiers.v1.types import AssistantMessage, ToolMessage

    episode = maker.episode(3_000_000, index=1)
    record = episode.to_record()
    roles: set[str] = set()
    for raw in record["traces"]:
        trace = WireTrace.model_validate(raw)  # (its own to_record keeps None fields)
        assert trace.num_branches == 1
        (branch,) = trace.branches
        assert len(branch.token_ids) == trace.calls[-1].usage.total_tokens
        assert trace.num_total_tokens == len(branch.token_ids)
        assert trace.num_output_tokens == sum(branch.sampled_mask)
        called = {c.id for m in trace.assistant_messages for c in m.tool_calls or []}
        assert called == {m.tool_call_id for m in trace.tool_messages}
        for node in trace.nodes:
            roles.add(node.message.role)
            assert len(node.token_ids) == len(node.mask) == len(node.is_content) > 0
            assert node.sampled == isinstance(node.message, AssistantMessage)
            if node.sampled:
                assert node.message.content
                assert node.message.reasoning_content
                assert len(node.logprobs) == sum(node.mask) == len(node.advantages) > 0
                assert all(round(x, 4) == x <= 0 for x in node.logprobs)
            else:
                assert not any(node.mask)
                assert node.logprobs == []
                assert node.advantages is None
            if isinstance(node.message, ToolMessage):
                assert node.message.tool_call_id in called
    assert roles == {"system", "user", "assistant", "tool"}
    assert record["num_total_tokens"] == sum(t["num_total_tokens"] for t in record["traces"])


def test_every_episode_and_trace_id_is_unique(maker: EpisodeMaker) -> None:
    episodes = maker.episodes(1_000, median=200_000, p90=1_000_000, cap=3_000_000)
    episodes += maker.episodes(1_000, size=40_000, start=1_000)
    episodes.append(maker.episode(50_000, index=0))  # an index again, another size
    trace_ids = [t for e in episodes for t in e.trace_ids]
    assert sum(len(e.bodies) > 1 for e in episodes) > 500
    ids = [e.id for e in episodes] + trace_ids
    assert len(set(ids)) == len(ids) == len(episodes) + len(trace_ids)
    assert all(UUID_HEX.fullmatch(i) for i in ids)
    for episode in episodes[::97]:
        record = episode.to_record()
        assert record["id"] == episode.id
        assert [t["id"] for t in record["traces"]] == list(episode.trace_ids)


def test_sizes_are_exact_and_on_target(maker: EpisodeMaker) -> None:
    targets = [MIN_BYTES, MIN_BYTES + 1, 17_345, 33_333, 123_456, 2_200_000, 9_999_999]
    targets += lognormal_sizes(30, seed=5, median=400_000, p90=2_000_000, cap=8_000_000)
    for index, target in enumerate(targets):
        episode = maker.episode(target, index=index)
        assert len(orjson.dumps(episode.to_record())) == episode.size
        assert abs(episode.size - target) <= 0.02 * target, (target, episode)
    with pytest.raises(ValueError, match="at least"):
        maker.episode(MIN_BYTES - 1, index=0)


def test_per_token_arrays_are_most_of_the_bytes(maker: EpisodeMaker) -> None:
    for target in (1_000_000, MEDIAN_BYTES, 20_000_000):
        episode = maker.episode(target, index=7)
        nodes = [n for t in episode.to_record()["traces"] for n in t["nodes"]]
        arrays = sum(len(orjson.dumps(n[k])) for n in nodes for k in ARRAYS if k in n)
        assert 0.7 < arrays / episode.size < 0.9, (target, arrays / episode.size)


def test_text_holds_what_json_escapes(maker: EpisodeMaker) -> None:
    data = orjson.dumps(maker.episode(MEDIAN_BYTES, index=3).to_record())
    text = data.decode()
    for needle in ('\\"', "\\\\", "\\n", "\\u001b", "é", "中文", "🚀"):
        assert needle in text, needle
    assert data.isascii() is False


def test_expected_pieces_are_the_record_bytes(maker: EpisodeMaker) -> None:
    for episode in maker.episodes(12, median=300_000, p90=2_000_000, cap=5_000_000, start=50):
        data = orjson.dumps(episode.to_record())
        pieces = list(maker.expected_pieces(episode))
        assert b"".join(pieces) == data
        assert len(pieces) == 2 * len(episode.bodies) + 1
        assert maker.matches(data, episode) is None
        damaged = bytearray(data)
        damaged[len(damaged) // 3] ^= 1
        assert maker.matches(damaged, episode) is not None
        assert maker.matches(data[:-1], episode) is not None
    maker.forget_bytes()


def test_episodes_share_bodies_but_not_traces(maker: EpisodeMaker) -> None:
    a, b = maker.episodes(2, size=CAP_BYTES, start=100)
    shared = set(a.bodies) & set(b.bodies)
    assert shared
    ra, rb = a.to_record(), b.to_record()
    for i in shared:
        ta, tb = ra["traces"][a.bodies.index(i)], rb["traces"][b.bodies.index(i)]
        assert ta is not tb
        assert ta["id"] != tb["id"]
        for key in ("tools", "nodes", "calls"):
            assert ta[key] is tb[key] is maker.body(i)[key]
    assert len(maker.targets) == BODIES


def test_fresh_copies_share_nothing_but_numbers(maker: EpisodeMaker) -> None:
    episode = maker.episode(2_000_000, index=9)
    shared = episode.to_record()
    fresh = episode.to_record(fresh=True)
    again = episode.to_record(fresh=True)
    assert orjson.dumps(fresh) == orjson.dumps(shared) == orjson.dumps(again)
    seen = {id(o) for o in objects(shared)}
    seen |= {id(o) for b in episode.bodies for o in objects(maker.body(b))}
    assert not [o for o in objects(fresh) if id(o) in seen]
    assert not {id(o) for o in objects(fresh)} & {id(o) for o in objects(again)}


def test_same_seed_same_episodes(maker: EpisodeMaker) -> None:
    twin = EpisodeMaker(seed=11)
    other = EpisodeMaker(seed=12)
    for index, target in enumerate((MIN_BYTES, 250_000, 4_000_000)):
        one, two = maker.episode(target, index=index), twin.episode(target, index=index)
        assert (one.id, one.trace_ids, one.size) == (two.id, two.trace_ids, two.size)
        assert orjson.dumps(one.to_record()) == orjson.dumps(two.to_record())
        assert other.episode(target, index=index).id != one.id
    assert lognormal_sizes(50, seed=1) == lognormal_sizes(50, seed=1) != lognormal_sizes(50, seed=2)


def test_repr(maker: EpisodeMaker) -> None:
    episode = maker.episode(MIN_BYTES, index=0)
    assert isinstance(episode, Episode)
    assert repr(episode) == f"Episode(id={episode.id!r}, size={episode.size}, traces=1)"
    assert episode.bodies == (0,) or episode.bodies == (1,)
