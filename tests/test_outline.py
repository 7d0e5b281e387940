"""``monitors.traces._outline``: the byte spans of a record's fields, traces and nodes.

Differential: every span parses (``orjson.loads`` of its bytes) to the value at that path in
the whole line parsed, for records shaped like episodes written by orjson (compact and
indented), by ``json.dumps`` with odd separators, and by a writer of our own that spells keys
and strings with escapes, repeats keys and puts whitespace anywhere. The outline is the same
whatever the step budget, on EpisodeMaker's and verifiers' own records too; malformed lines
raise ``ValueError`` naming a byte offset.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from test_verifiers_records import episodes as verifiers_episodes
from verifiers.v1.episode import WireEpisode  # type: ignore[import-untyped]

import encoder
from monitors.testing import EpisodeMaker
from monitors.traces._outline import (
    STEP_BYTES,
    NodeOutline,
    Outline,
    OutlineScan,
    TraceOutline,
    aoutline,
    count_items,
    outline,
)

BAD = r"at byte (\d+)"
#: Budgets from a byte a step (every token split across steps) to the default.
BUDGETS = [1, 7, 1000, STEP_BYTES]
#: Per-token arrays in EpisodeMaker's and verifiers' nodes.
TOKEN_KEYS = ("token_ids", "mask", "is_content", "logprobs", "advantages")

# -- records shaped like episodes ---------------------------------------------------------------

#: Characters that matter to a scanner: quotes, backslashes, brackets, separators, controls,
#: 2-, 3- and 4-byte UTF-8, U+2028.
CHARS = st.sampled_from(list('ab "\\/[]{}:,\n\t\r\x00\x1f\x7fé€\u2028😀'))
TEXT = st.one_of(st.text(CHARS, max_size=12), st.text(max_size=6))
KEYS = st.one_of(
    TEXT, st.sampled_from(["traces", "nodes", "id", "message", "token_ids", "", "tr\\aces"])
)
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63) + 1, 2**63 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    TEXT,
)
JSON = st.recursive(
    SCALARS,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(KEYS, kids, max_size=4)),
    max_leaves=10,
)
#: Arrays of scalars, as the per-token arrays are.
TOKENS = st.lists(
    st.one_of(st.integers(0, 200_000), st.floats(-30, 0), st.booleans(), st.none()), max_size=12
)


@st.composite
def objects(draw: st.DrawFn, /, values: st.SearchStrategy[Any], **extra: Any) -> dict[str, Any]:
    """A dict of drawn keys, with each of ``extra`` (a strategy) maybe inserted at a drawn
    position."""
    items = list(draw(st.dictionaries(KEYS, values, max_size=4)).items())
    for key, strategy in extra.items():
        if draw(st.integers(0, 3)):  # mostly there
            items.insert(draw(st.integers(0, len(items))), (key, draw(strategy)))
    return dict(items)


NODE_VALUES = st.one_of(JSON, TOKENS)
NODE_LISTS = st.lists(
    st.one_of(*[objects(NODE_VALUES, message=JSON, token_ids=TOKENS)] * 3, JSON), max_size=5
)
#: Mostly lists of mostly objects; at times anything else.
NODES = st.one_of(NODE_LISTS, NODE_LISTS, JSON)
TRACE_LISTS = st.lists(st.one_of(*[objects(JSON, nodes=NODES)] * 3, JSON), max_size=4)
TRACES = st.one_of(TRACE_LISTS, TRACE_LISTS, JSON)
#: "traces" and "nodes" arrays where they are not walked (in a node, or "traces" in a trace).
LOOKALIKES = st.lists(
    st.dictionaries(st.sampled_from(["traces", "nodes", "id"]), st.lists(JSON, max_size=2)),
    max_size=2,
)
#: Records with traces and nodes for sure.
EPISODES = st.fixed_dictionaries(
    {
        "traces": st.lists(
            st.fixed_dictionaries(
                {
                    "nodes": st.lists(
                        objects(NODE_VALUES, token_ids=TOKENS, nodes=LOOKALIKES, traces=LOOKALIKES),
                        min_size=1,
                    )
                },
                optional={"id": TEXT, "agent": JSON, "traces": LOOKALIKES},
            ),
            min_size=1,
            max_size=3,
        )
    },
    optional={"id": TEXT, "env": JSON},
)
#: Those, and records of any shape.
RECORDS = st.one_of(EPISODES, objects(JSON, traces=TRACES), objects(JSON, traces=TRACES))

# -- writers ------------------------------------------------------------------------------------

_SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\r": "\\r", "\t": "\\t", "/": "\\/"}
_BLANKS = " \t\n\r"


def _blank(rnd: random.Random) -> str:
    return "".join(rnd.choice(_BLANKS) for _ in range(rnd.choice((0, 0, 0, 1, 3))))


def _string(text: str, rnd: random.Random) -> str:
    """``text`` as a JSON string, each character as itself, a short escape or ``\\u``."""
    out = ['"']
    for char in text:
        code = ord(char)
        how = rnd.random()
        if how < 0.3 or char in '"\\' or code < 0x20:
            if char in _SHORT_ESCAPES and how < 0.6:
                out.append(_SHORT_ESCAPES[char])
            elif code > 0xFFFF:
                high, low = divmod(code - 0x10000, 0x400)
                out.append(f"\\u{0xD800 + high:04x}\\u{0xDC00 + low:04X}")
            else:
                out.append(f"\\u{code:04x}")
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


#: Values a repeated key has first (the last one wins): arrays of objects with walked keys too.
_DECOYS: list[Any] = [1, "x", None, [], [{"nodes": [{"a": 1}]}, 2], {"traces": []}, [[1]]]


def spell(value: Any, rnd: random.Random) -> str:
    """``value`` as JSON text a parser reads back equal to it, written oddly: whitespace
    around any token, keys and strings spelled with escapes, and keys repeated with an
    earlier value that the last one overrides."""
    if isinstance(value, dict):
        parts = []
        for key, item in value.items():
            if rnd.random() < 0.2:
                parts.append(_member(key, rnd.choice(_DECOYS), rnd))
            parts.append(_member(key, item, rnd))
        return "{" + _blank(rnd) + ",".join(parts) + "}"
    if isinstance(value, list):
        items = [_blank(rnd) + spell(item, rnd) + _blank(rnd) for item in value]
        return "[" + (",".join(items) if items else _blank(rnd)) + "]"
    if isinstance(value, str):
        return _string(value, rnd)
    return orjson.dumps(value).decode()


def _member(key: str, value: Any, rnd: random.Random) -> str:
    blank = _blank
    return (
        f"{blank(rnd)}{_string(key, rnd)}{blank(rnd)}:{blank(rnd)}{spell(value, rnd)}{blank(rnd)}"
    )


def write(value: Any, how: str, rnd: random.Random) -> bytes:
    """``value`` as a line, by writer ``how``, maybe between whitespace and with a newline."""
    if how == "orjson":
        line = orjson.dumps(value)
    elif how == "indent":
        line = orjson.dumps(value, option=orjson.OPT_INDENT_2)
    elif how == "json-ascii":
        line = json.dumps(value, ensure_ascii=True, separators=(" ,\n", "\t: ")).encode()
    elif how == "json-utf8":
        line = json.dumps(
            value, ensure_ascii=False, indent="\t", separators=("\r\n,", ":")
        ).encode()
    else:
        line = spell(value, rnd).encode()
    return _blank(rnd).encode() + line + rnd.choice([b"", b"\n", b" \r\n"])


WRITERS = st.sampled_from(["orjson", "indent", "json-ascii", "json-utf8", "spell"])

# -- checks -------------------------------------------------------------------------------------


def check_fields(line: bytes, fields: dict[str, tuple[int, int]], value: Any) -> None:
    """``fields`` are the dict ``value``'s keys, each with the span of its (last) value."""
    if not isinstance(value, dict):
        assert fields == {}
        return
    assert fields.keys() == value.keys()
    for key, span in fields.items():
        check_span(line, span, value[key])


def check_span(line: bytes, span: tuple[int, int], value: Any) -> None:
    """The bytes at ``span`` are exactly one JSON value (no whitespace around) equal to
    ``value``."""
    start, end = span
    assert 0 <= start < end <= len(line)
    part = line[start:end]
    assert part == part.strip(b" \t\n\r")
    assert orjson.loads(part) == value
    if isinstance(value, list) and all(
        item is None or isinstance(item, (bool, int, float)) for item in value
    ):
        assert count_items(line, span) == len(value)
    elif isinstance(value, list) and value:
        with pytest.raises(ValueError, match=BAD):
            count_items(line, span)


def check(line: bytes, got: Outline | None = None) -> Outline:
    """``line``'s outline agrees with ``orjson.loads(line)`` at every path; the outline."""
    value = orjson.loads(line)
    got = outline(line) if got is None else got
    assert got.size == len(line)
    check_fields(line, got.fields, value)
    traces = value.get("traces")
    if not isinstance(traces, list):
        assert got.traces == []
        return got
    assert len(got.traces) == len(traces)
    for trace, want in zip(got.traces, traces, strict=True):
        check_span(line, trace.span, want)
        check_fields(line, trace.fields, want)
        nodes = want.get("nodes") if isinstance(want, dict) else None
        if not isinstance(nodes, list):
            assert trace.nodes == []
            continue
        assert len(trace.nodes) == len(nodes)
        for node, node_value in zip(trace.nodes, nodes, strict=True):
            check_span(line, node.span, node_value)
            check_fields(line, node.fields, node_value)
    return got


def stepped(line: bytes | bytearray | memoryview, budgets: list[int]) -> Outline:
    """The outline by ``step`` driven by hand, the budgets taken in turn."""
    scan = OutlineScan(line)
    for steps in range(10 * len(line) + 10):
        done = scan.step(budgets[steps % len(budgets)])
        if done is not None:
            assert scan.step(1) is done  # and the same once done
            return done
    raise AssertionError("no progress")


def attempt(line: bytes, budget: int) -> Outline | str:
    """The outline of ``line`` by steps of ``budget``, or the message of its ``ValueError``."""
    try:
        return stepped(line, [budget])
    except ValueError as exc:
        return str(exc)


def offset(error: pytest.ExceptionInfo[ValueError], line: bytes) -> int:
    """The byte offset a ``ValueError`` names (within the line)."""
    found = re.search(BAD, str(error.value))
    assert found is not None, str(error.value)
    at = int(found.group(1))
    assert 0 <= at <= len(line)
    return at


# -- agreement with a parser --------------------------------------------------------------------


@given(record=RECORDS, how=WRITERS, rnd=st.randoms(use_true_random=False))
def test_spans_parse_to_the_values_at_their_paths(
    record: dict[str, Any], how: str, rnd: random.Random
) -> None:
    line = write(record, how, rnd)
    assert orjson.loads(line) == record  # the writer's own check
    check(line)


@given(record=RECORDS, how=WRITERS, rnd=st.randoms(use_true_random=False), data=st.data())
def test_any_budget_gives_the_same_outline(
    record: dict[str, Any], how: str, rnd: random.Random, data: st.DataObject
) -> None:
    line = write(record, how, rnd)
    want = outline(line)
    for budget in BUDGETS:
        assert stepped(line, [budget]) == want
    # Budgets that change from step to step, larger and smaller.
    mixed = data.draw(st.lists(st.sampled_from([1, 2, 7, 64, 1000, 5000]), min_size=1))
    assert stepped(line, mixed) == want


@given(record=RECORDS, how=WRITERS, rnd=st.randoms(use_true_random=False))
def test_bytearrays_and_views(record: dict[str, Any], how: str, rnd: random.Random) -> None:
    """A bytearray, a view of a whole bytes and a view of part of a buffer outline alike
    (offsets into what was given)."""
    line = write(record, how, rnd)
    want = outline(line)
    assert outline(bytearray(line)) == want
    assert outline(memoryview(line)) == want
    padded = b"xx" + line + b"yy"
    assert outline(memoryview(padded)[2:-2]) == want
    assert outline(memoryview(bytearray(line))) == want


def test_a_small_record_exactly() -> None:
    """Spans, decoded keys, repeated keys and members that are not objects, by hand."""
    line = (
        b' {"id" : "a\\"}", "tr\\u0061ces": [ {"no\\u0064es": [ {"x": [1, 2]}, 7 ],'
        b' "nodes": [{"m": {"c": "]"}}, "s"]}, 3, {"nodes": 5} ],\n"z": null}\n'
    )
    got = outline(line)

    def at(text: bytes, start: int = 0, size: int = 0) -> tuple[int, int]:
        """The span of ``text`` (or of its first ``size`` bytes) found from ``start``."""
        i = line.index(text, start)
        return (i, i + (size or len(text)))

    traces = at(b'[ {"no')[0], at(b"} ]")[1]
    first = at(b'{"no')[0], at(b'"s"]}')[1]
    nodes = at(b'[{"m"')[0], at(b'"s"]')[1]
    last = at(b'{"nodes": 5}')
    assert got == Outline(
        size=len(line),
        fields={"id": at(b'"a\\"}"'), "traces": traces, "z": at(b"null")},
        traces=[
            TraceOutline(
                span=first,
                fields={"nodes": nodes},
                nodes=[
                    NodeOutline(span=at(b'{"m": {"c": "]"}}'), fields={"m": at(b'{"c": "]"}')}),
                    NodeOutline(span=at(b'"s"'), fields={}),
                ],
            ),
            TraceOutline(span=at(b"3, {", size=1), fields={}, nodes=[]),
            TraceOutline(span=last, fields={"nodes": at(b"5}", last[0], size=1)}, nodes=[]),
        ],
    )
    check(line, got)


@pytest.mark.parametrize(
    "line",
    [
        b'{"traces": 1}',
        b'{"traces": {"nodes": []}}',
        b'{"traces": [{"nodes": [1]}], "traces": "later"}',
        b'{"a": {"traces": [{}]}}',
        b"{}",
    ],
)
def test_no_traces_array_no_traces(line: bytes) -> None:
    got = outline(line)
    assert got.traces == []
    check(line, got)


def test_walked_keys_only_at_their_level() -> None:
    """ "traces" arrays are walked only at the top, "nodes" arrays only in a trace."""
    line = (
        b'{"a": {"traces": [{}]}, "traces": [{"traces": [{"nodes": [{}]}],'
        b' "nodes": [{"nodes": [{"x": 1}], "traces": [{"nodes": []}]}]}]}'
    )
    got = check(line)
    assert len(got.traces) == 1
    assert [list(node.fields) for node in got.traces[0].nodes] == [["nodes", "traces"]]


def test_the_last_of_repeated_walked_keys_wins() -> None:
    line = (
        b'{"traces": 1, "traces": [{"nodes": [{"a": 1}, {"a": 2}], "nodes": [{"b": 3}]},'
        b' {"nodes": [{}], "nodes": null}]}'
    )
    got = check(line)
    assert [len(trace.nodes) for trace in got.traces] == [1, 0]
    assert list(got.traces[0].nodes[0].fields) == ["b"]


def test_strings_ending_in_backslashes() -> None:
    """A quote after an even run of backslashes ends its string; after an odd run, it does
    not (runs longer than the scanner's first window of 64 too)."""
    for run in (1, 2, 63, 64, 65, 127, 128, 129, 5000, 5001):
        text = "\\" * (run // 2) + ('"' if run % 2 else "") + "]"
        record = {"traces": [{"nodes": [{"s": text, "t": [1]}, {"k" * run: text}]}]}
        line = orjson.dumps(record)
        assert line.count(b"\\" * run) >= 1
        got = check(line)
        for budget in (1, 100, STEP_BYTES):
            assert stepped(line, [budget]) == got


def test_long_values_and_deep_nesting_across_steps() -> None:
    """Values far longer than a step, and 10,000 levels of nesting inside a node's value
    (deeper than orjson reads: that span is checked by where it was put)."""
    first: dict[str, Any] = {"token_ids": list(range(50_000)), "deep": 0, "s": '"[{' * 40_000}
    second = {"mask": [True, False] * 30_000}
    record = {"id": "x" * 300_000, "traces": [{"nodes": [first, second]}]}
    shallow = orjson.dumps(record)
    check(shallow)
    deep = b'[{"k": ' * 5_000 + b'"]}"' + b"}]" * 5_000
    at = shallow.index(b'"deep":0') + len(b'"deep":')
    line = shallow[:at] + deep + shallow[at + 1 :]
    got = outline(line)
    nodes = got.traces[0].nodes
    assert nodes[0].fields["deep"] == (at, at + len(deep))
    for key, (start, end) in nodes[0].fields.items():
        if key != "deep":
            assert orjson.loads(line[start:end]) == first[key]
    assert orjson.loads(line[slice(*nodes[1].span)]) == second
    assert orjson.loads(line[slice(*got.fields["id"])]) == record["id"]
    for budget in (7, 1000, 4096, STEP_BYTES):
        assert stepped(line, [budget]) == got


# -- EpisodeMaker's and verifiers' records ------------------------------------------------------


@pytest.mark.parametrize(("seed", "size"), [(1, 20_000), (2, 300_000), (3, 4_000_000)])
def test_episode_maker_records(seed: int, size: int) -> None:
    record = EpisodeMaker(seed=seed).episode(size, index=seed).to_record()
    for option in (0, orjson.OPT_INDENT_2):
        line = orjson.dumps(record, option=option) + b"\n"
        got = check(line)
        assert len(got.traces) == len(record["traces"]) > 0
        for trace, want in zip(got.traces, record["traces"], strict=True):
            for node, node_value in zip(trace.nodes, want["nodes"], strict=True):
                for key in TOKEN_KEYS:
                    if key in node_value:
                        assert count_items(line, node.fields[key]) == len(node_value[key])
        budgets = [STEP_BYTES] if size > 1_000_000 else [1000, STEP_BYTES]
        for budget in budgets:
            assert stepped(line, [budget]) == got


@pytest.mark.parametrize("seed", [1, 2])
def test_verifiers_model_records(seed: int) -> None:
    """EpisodeMaker's record as verifiers' ``WireEpisode``, written by the encoder (the line
    a monitor writes) and by ``to_record``."""
    record = EpisodeMaker(seed=seed).episode(50_000, index=seed).to_record()
    episode = WireEpisode.model_validate(record)
    for line in (encoder.encode(episode), orjson.dumps(episode.to_record())):
        got = check(line)
        assert len(got.traces) == len(record["traces"])
        assert stepped(line, [1000]) == got


@given(episode=verifiers_episodes())
def test_verifiers_graph_built_episodes(episode: Any) -> None:
    """Episodes grown with verifiers' own graph code (tests/test_verifiers_records.py)."""
    line = encoder.encode(episode)
    got = check(line)
    assert len(got.traces) == len(episode.traces)
    assert stepped(line, [7]) == got


# -- bounded steps ------------------------------------------------------------------------------


def test_a_step_crosses_at_most_its_budget() -> None:
    """A long string and a long array take a step per budget of bytes."""
    for bulk in ("x" * 2_000_000, list(range(400_000))):
        line = orjson.dumps({"traces": [{"nodes": [{"v": bulk}]}]})
        scan = OutlineScan(line)
        steps = 1
        while scan.step(65536) is None:
            steps += 1
        assert steps >= len(line) // 65536
        check(line, scan.step())


def test_tokens_count_against_the_budget() -> None:
    """20,000 small nodes: each step handles about budget / 1024 tokens, not all of them."""
    line = orjson.dumps({"traces": [{"nodes": [{}] * 20_000}]})
    scan = OutlineScan(line)
    steps = 1
    while scan.step(STEP_BYTES) is None:
        steps += 1
    assert steps >= 2 * 20_000 // (STEP_BYTES // 1024)
    assert len(check(line, scan.step()).traces[0].nodes) == 20_000


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_aoutline_gives_the_loop_back(backend: str) -> None:
    line = orjson.dumps(EpisodeMaker(seed=4).episode(3_000_000, index=0).to_record()) + b"\n"
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0)

    async def main() -> tuple[Outline, int]:
        async with anyio.create_task_group() as group:
            group.start_soon(tick)
            await anyio.sleep(0)
            start = ticks
            got = await aoutline(line)
            others = ticks - start
            group.cancel_scope.cancel()
        return got, others

    got, others = anyio.run(main, backend=backend)
    assert got == outline(line)
    check(line, got)
    assert others >= len(line) // STEP_BYTES  # the ticker ran between steps


# -- count_items ---------------------------------------------------------------------------------


@given(
    items=TOKENS,
    indent=st.booleans(),
    pad=st.integers(0, 3),
    view=st.sampled_from(["bytes", "bytearray", "whole", "part"]),
)
def test_count_items(items: list[Any], indent: bool, pad: int, view: str) -> None:
    array = orjson.dumps(items, option=orjson.OPT_INDENT_2 if indent else 0)
    if not items:
        array = b"[" + b" \n" * pad + b"]"
    line = b"{" * pad + array + b"}" * pad
    span = (pad, pad + len(array))
    ways: dict[str, bytes | bytearray | memoryview] = {
        "bytes": line,
        "bytearray": bytearray(line),
        "whole": memoryview(line),
        "part": memoryview(b"[1,2]" + line)[5:],
    }
    given_as = ways[view]
    assert count_items(given_as, span) == len(items)


@pytest.mark.parametrize(
    ("line", "span"),
    [
        (b'[1, "a,b"]', (0, 10)),
        (b"[1, [2, 3]]", (0, 11)),
        (b'[{"a": 1}]', (0, 10)),
        (b"[1, 2]", (1, 6)),
        (b"[1, 2]", (0, 5)),
        (b"[1, 2]", (0, 7)),
        (b"[1, 2]", (3, 3)),
    ],
)
def test_count_items_refuses_what_is_no_array_of_scalars(
    line: bytes, span: tuple[int, int]
) -> None:
    with pytest.raises(ValueError, match=BAD):
        count_items(line, span)
    with pytest.raises(ValueError, match=BAD):
        count_items(memoryview(b"  " + line)[2:], span)


# -- malformed lines ----------------------------------------------------------------------------

#: Malformed lines, each with the offset its error names and what it says.
MALFORMED = [
    (b"", 0, "ends before its value"),
    (b"   \n", 4, "ends before its value"),
    (b"[1, 2]", 0, "not a JSON object"),
    (b'"record"', 0, "not a JSON object"),
    (b"null", 0, "not a JSON object"),
    (b"{", 1, "ends before its value"),
    (b'{"a": 1', 7, "ends before its value"),
    (b'{"a": 1} x', 9, "more after"),
    (b"{} {}", 3, "more after"),
    (b'{"a": 1}]', 8, "more after"),
    (b'{"a" 1}', 5, "expected ':'"),
    (b'{"a": 1 "b": 2}', 8, "expected ',' or '}'"),
    (b'{"a": 1,}', 8, "expected a key"),
    (b"{1: 2}", 1, "expected a key"),
    (b'{"a": }', 6, "expected a value"),
    (b'{"a": tru}', 6, "expected a value"),
    (b'{"a": [1, 2}', 11, "does not close"),
    (b'{"a": {"b": [}]}', 13, "does not close"),
    (b'{"a": [1, 2]]}', 12, "expected ',' or '}'"),
    (b'{"a": [1, 2', 11, "ends inside a value"),
    (b'{"a": "abc', 10, "ends inside a string"),
    (b'{"a": {"b": "c', 14, "ends inside a string"),
    (b'{"a": "abc\\"}', 13, "ends inside a string"),
    (b'{"a\\": 1}', 9, "ends inside a string"),
    (b'{"traces": [{} {}]}', 15, "expected ',' or ']'"),
    (b'{"traces": [1 2]}', 14, "expected ',' or ']'"),
    (b'{"traces": [}', 12, "expected a value"),
    (b'{"traces": [{},]}', 15, "expected a value"),
    (b'{"traces": [{"nodes": [1, ]}]}', 26, "expected a value"),
    (b'{"traces": [{"nodes": [{"a": 1, }]}]}', 32, "expected a key"),
    (b'{"traces": [{"nodes": [{"x" 1}]}]}', 28, "expected ':'"),
    (b'{"traces": [{"nodes": [{"x": 1]}]}', 30, "expected ',' or '}'"),
    (b'{"traces": [{"nodes": [{"x": 1}}]}', 31, "expected ',' or ']'"),
    (b'{"traces": [{"nodes": [{"x": 1}]]}', 32, "expected ',' or '}'"),
    (b'{"traces": [{"nodes": [{"x": [1}]}]}', 31, "does not close"),
    (b'{"\\x": 1}', 1, "does not decode"),
    (b'{"a\xff": 1}', 1, "does not decode"),
]


@pytest.mark.parametrize(("line", "at", "what"), MALFORMED)
def test_malformed_lines_raise_at_their_offset(line: bytes, at: int, what: str) -> None:
    for budget in (1, 3, 1000, STEP_BYTES):
        scan = OutlineScan(line)
        with pytest.raises(ValueError, match=BAD) as error:
            stepped_scan(scan, budget)
        assert offset(error, line) == at
        assert what in str(error.value)
        with pytest.raises(ValueError, match=BAD):
            scan.step()  # and again, not a half-done outline
    try:
        value = orjson.loads(line)
    except orjson.JSONDecodeError:
        return  # truly malformed
    assert not isinstance(value, dict)  # or no record


def stepped_scan(scan: OutlineScan, budget: int) -> None:
    while scan.step(budget) is None:
        pass


@pytest.mark.parametrize("seed", [1, 2])
def test_every_cut_of_a_record_raises(seed: int) -> None:
    """A line cut short (a torn write) is never taken for a record: cuts every few bytes of
    an EpisodeMaker record, compact and indented."""
    record = EpisodeMaker(seed=seed).episode(20_000, index=seed).to_record()
    for option in (0, orjson.OPT_INDENT_2):
        line = orjson.dumps(record, option=option)
        for cut in range(0, len(line), 37):
            with pytest.raises(ValueError, match=BAD) as error:
                outline(line[:cut])
            assert offset(error, line[:cut]) <= cut


@given(record=RECORDS, how=WRITERS, rnd=st.randoms(use_true_random=False), data=st.data())
def test_a_cut_record_raises(
    record: dict[str, Any], how: str, rnd: random.Random, data: st.DataObject
) -> None:
    line = write(record, how, rnd).rstrip()
    cut = data.draw(st.integers(0, len(line) - 1))
    with pytest.raises(ValueError, match=BAD):
        stepped(line[:cut], [data.draw(st.sampled_from(BUDGETS))])


@given(record=RECORDS, data=st.data())
def test_damaged_bytes_raise_value_error_or_agree(
    record: dict[str, Any], data: st.DataObject
) -> None:
    """Bytes changed anywhere: ``ValueError`` naming an offset, or an outline; where orjson
    reads the damaged line too, the outline agrees with it."""
    line = bytearray(orjson.dumps(record))
    for _ in range(data.draw(st.integers(1, 3))):
        if not line:
            break
        at = data.draw(st.integers(0, len(line) - 1))
        line[at : at + 1] = data.draw(
            st.sampled_from(
                [b"", b"{", b"}", b"[", b"]", b'"', b"\\", b",", b":", b" ", b"\n", b"1", b"\xff"]
            )
        )
    damaged = bytes(line)
    got = attempt(damaged, data.draw(st.sampled_from(BUDGETS)))
    if isinstance(got, str):
        assert re.search(BAD, got)
        return
    try:
        value = orjson.loads(damaged)
    except orjson.JSONDecodeError:
        return  # values inside are only skipped over, not validated
    assert isinstance(value, dict)
    check(damaged, got)


@given(junk=st.binary(max_size=200))
def test_arbitrary_bytes_end(junk: bytes) -> None:
    """Any bytes: an outline or ``ValueError`` (never another error, never a hang)."""
    got = attempt(junk, 7)
    assert not isinstance(got, str) or re.search(BAD, got)
