"""``Restamp``: a stored line stamped as bytes gives what the in-memory path gives.

The in-memory path is the PrimeMonitor's: ``Records(None).value(record, edit=Stamp(...))``
encoded with ``line_option(0)``. Every test holds the byte scanner to it: on arbitrary JSON,
on records whose ``"run"`` and ``"traces"`` take every kind of value in every order, on keys
spelled with escapes, on whitespace, on EpisodeMaker's and verifiers' real shapes, on values
far past a step's budget and nested 10,000 deep; and a line that is not JSON raises
``ValueError`` naming the byte, never anything else, and never loops.
"""

from __future__ import annotations

import json
import re
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import json_values, nest, plain_json_values, short_strings, small_json
from verifiers.v1.episode import WireEpisode

import encoder
from monitors.prime._batch import PIECE_BYTES
from monitors.prime._restamp import Restamp, restamp
from monitors.prime._stamp import Stamp
from monitors.records import Records, line_option
from monitors.testing import EpisodeMaker

RUN_ID = "run-outbox"
RUN_TYPES = st.sampled_from(["train", "eval"])
#: Budgets from a byte a step (every token split across steps) to the default.
BUDGETS = st.sampled_from([1, 2, 5, 64, 1000, 4096, 1 << 16, 1 << 20])
BAD = r"not one JSON value at byte \d+"

# -- records that exercise the stamp ------------------------------------------------------------

#: Keys beside "run" and "traces", some of them near misses.
OTHER_KEYS = st.one_of(
    short_strings,
    st.sampled_from(["id", "type", "Run", "runs", "ru", "un", "trace", "Traces", 'r"un', "r\\un"]),
).filter(lambda key: key not in ("run", "traces"))
#: Every value ``or`` treats as false: a member with one takes the episode's run.
FALSY = st.sampled_from([None, False, 0, 0.0, -0.0, "", [], {}])
RUN_OBJECTS = st.one_of(
    st.dictionaries(OTHER_KEYS, small_json, max_size=4),
    st.fixed_dictionaries(
        {"type": small_json, "name": st.text(max_size=5), "id": small_json, "work": small_json}
    ),
    st.fixed_dictionaries({"id": st.text(max_size=5)}),
)
#: JSON whose objects have "run" and "traces" keys too: below the levels stamped, untouched.
NESTED = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), short_strings
    ),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4),
        st.dictionaries(
            st.one_of(st.sampled_from(["run", "traces"]), short_strings), kids, max_size=4
        ),
    ),
    max_leaves=10,
)
RUNS = st.one_of(FALSY, RUN_OBJECTS, NESTED)


@st.composite
def objects(draw: st.DrawFn, values: st.SearchStrategy[Any], **extra: Any) -> dict[str, Any]:
    """A dict of other keys with each entry of ``extra`` (a strategy, or None: left out)
    inserted at a drawn position."""
    items = list(draw(st.dictionaries(OTHER_KEYS, values, max_size=4)).items())
    for key, strategy in extra.items():
        if draw(st.booleans()):
            items.insert(draw(st.integers(0, len(items))), (key, draw(strategy)))
    return dict(items)


#: Members with, without or with a falsy run (and a "traces" of their own), and not objects.
MEMBERS = st.one_of(objects(NESTED, run=RUNS, traces=NESTED), objects(NESTED), NESTED)
TRACES = st.one_of(st.lists(MEMBERS, max_size=5), NESTED, FALSY)
RECORDS = objects(NESTED, run=RUNS, traces=TRACES)
#: Records with a bulky value beside them, so that a scan takes many steps.
BULKY_RECORDS = objects(plain_json_values(), run=RUNS, traces=st.lists(MEMBERS, max_size=3))

# -- the two paths ------------------------------------------------------------------------------


def in_memory(value: Any, run_type: str) -> tuple[bytes, bool]:
    """The PrimeMonitor's line for ``value`` and its ``Stamp.traces``; a value that is not a
    record (not a Mapping: ``Records.value`` refuses it) is its line unchanged."""
    if not isinstance(value, dict):
        return encoder.encode(value, option=line_option(0)), False
    stamp = Stamp(RUN_ID, run_type)
    record = Records(None).value(value, edit=stamp)
    return encoder.encode(record, option=line_option(0)), stamp.traces


def scanned(line: bytes, run_type: str, *, budget: int = 1 << 20) -> tuple[bytes, Restamp]:
    """``line`` stamped by ``Restamp`` (``budget`` a step), its pieces checked."""
    scan = Restamp(line, run_id=RUN_ID, run_type=run_type)
    steps = 0
    while not scan.step(budget=budget):
        steps += 1
        assert steps <= 2 * len(line) + 10, "no progress"
    return check_pieces(scan, line), scan


def check_pieces(scan: Restamp, line: bytes) -> bytes:
    """The stamped line, after checking its pieces are what ``BatchBuilder.add`` takes:
    views of ``line`` or new ``bytes``, none over ``PIECE_BYTES``, the last a ``bytes``
    ending the line, ``length`` their total."""
    pieces = scan.pieces
    assert isinstance(pieces[-1], bytes)
    assert pieces[-1].endswith(b"\n")
    for piece in pieces:
        assert 0 < len(piece) <= PIECE_BYTES
        assert isinstance(piece, bytes | memoryview)
        if isinstance(piece, memoryview):
            assert piece.obj is line  # a slice of the original, not a copy
    data = b"".join(pieces)
    assert scan.length == len(data)
    assert data.count(b"\n") == 1
    return data


def attempt(line: bytes, run_type: str, *, budget: int) -> tuple[bytes, Restamp] | str:
    """``scanned``, or the message of the ``ValueError`` it raised."""
    try:
        return scanned(line, run_type, budget=budget)
    except ValueError as exc:
        return str(exc)


def reencoded(line: bytes) -> bytes:
    """``line`` as orjson writes what it reads there (key order kept)."""
    return orjson.dumps(orjson.loads(line), option=orjson.OPT_APPEND_NEWLINE)


def check(line: bytes, run_type: str, budget: int = 1 << 20) -> None:
    """The scan of ``line`` is byte for byte the in-memory path of its parsed value."""
    want, traces = in_memory(orjson.loads(line), run_type)
    got, scan = scanned(line, run_type, budget=budget)
    assert got == want
    assert scan.traces is traces


# -- the stamp, against the in-memory path ------------------------------------------------------


@given(value=json_values(), run_type=RUN_TYPES, budget=BUDGETS)
def test_any_json_value(value: Any, run_type: str, budget: int) -> None:
    """Arbitrary JSON: an object stamped, anything else passed on unchanged."""
    try:
        line = orjson.dumps(value)
    except orjson.JSONEncodeError:
        return  # not JSON orjson writes (ints past 64 bits): never a stored line
    check(line, run_type, max(budget, len(line) // 500))


@given(record=RECORDS, run_type=RUN_TYPES, budget=BUDGETS, newline=st.booleans())
def test_records_with_run_and_traces(
    record: dict[str, Any], run_type: str, budget: int, newline: bool
) -> None:
    """ "run" before, after or without "traces"; either holding objects, falsy values or
    anything else; members with, without or with a falsy run, and members not objects."""
    check(orjson.dumps(record) + b"\n" * newline, run_type, budget)


@given(record=BULKY_RECORDS, run_type=RUN_TYPES, budget=st.sampled_from([1 << 12, 1 << 16]))
def test_bulky_records_across_steps(record: dict[str, Any], run_type: str, budget: int) -> None:
    check(orjson.dumps(record), run_type, budget)


#: Spellings of "run" and "traces" with escapes (the longest: every character escaped).
RUN_SPELLINGS = [rb"r\u0075n", rb"\u0072un", rb"ru\u006E", rb"\u0072\u0075\u006e"]
TRACES_SPELLINGS = [rb"\u0074races", rb"trace\u0073", rb"\u0074\u0072\u0061\u0063\u0065\u0073"]


@given(
    record=RECORDS,
    run_type=RUN_TYPES,
    run=st.sampled_from(RUN_SPELLINGS),
    traces=st.sampled_from(TRACES_SPELLINGS),
    budget=BUDGETS,
)
def test_keys_spelled_with_escapes(
    record: dict[str, Any], run_type: str, run: bytes, traces: bytes, budget: int
) -> None:
    """A key is compared decoded: ``"r\\u0075n"`` is "run". Respelling a key inside a JSON
    string keeps its value, so the input means the same; the scan keeps the spelling, and
    spelling it back gives the in-memory bytes (orjson never writes these escapes)."""
    line = orjson.dumps(record)
    spelled = line.replace(b'"run":', b'"' + run + b'":')
    spelled = spelled.replace(b'"traces":', b'"' + traces + b'":')
    assert orjson.loads(spelled) == orjson.loads(line)
    want, want_traces = in_memory(orjson.loads(line), run_type)
    got, scan = scanned(spelled, run_type, budget=budget)
    got = got.replace(b'"' + run + b'":', b'"run":').replace(b'"' + traces + b'":', b'"traces":')
    assert got == want
    assert scan.traces is want_traces


def test_near_misses_are_other_keys() -> None:
    """Keys close to "run" or "traces", escaped or not, are not them."""
    keys = [rb"Run", rb"ru", rb"runs", rb"r\\un", rb"r\"un", rb"\u0072u", rb"trace", rb"tr\u0061ce"]
    for key in keys:
        line = b'{"' + key + b'":1,"traces":[{"' + key + b'":{}}]}'
        got, scan = scanned(line, "train")
        assert reencoded(got) == in_memory(orjson.loads(line), "train")[0]
        assert got.count(b'"run":') == 2
        assert scan.traces


def test_strings_that_end_in_backslashes() -> None:
    """A string ends at the first quote after an even run of backslashes (``"a\\\\"`` ends at
    its second quote), however long the run; astral characters pass through."""
    for run in [0, 1, 2, 3, 63, 64, 65, 127, 128, 4095, 4096, 4097, 10_000]:
        for text in ["\\" * run, "\\" * run + '"', '"' + "\\" * run, "😀\\" * run + "}]"]:
            record = {text: text, "traces": [{text: [text, {text: text}], "x": text}], "r": "u"}
            check(orjson.dumps(record), "eval", 1 << 12)
            check(orjson.dumps([record, text]), "eval")


def test_a_falsy_member_run_takes_the_episodes() -> None:
    """Every falsy "run" orjson parses (``1e-400`` too: it reads 0.0) gives way to the
    episode's run, even where the episode's run comes after the traces."""
    falsy = [b"null", b"false", b"0", b"-0", b"0.0", b"-0.0e5", b"1e-400", b'""', b"[]", b"{}"]
    truthy = [b"true", b"1", b"-1e-300", b'" "', b"[0]", b"[[]]", b'{"a":null}', b'"\\u0000"']
    for value in falsy + truthy:
        for line in [
            b'{"run":{"a":1},"traces":[{"run":' + value + b"}]}",
            b'{"traces":[{"x":1,"run":' + value + b',"y":2}],"run":{"a":1}}',
            b'{"traces":[{"run":' + value + b"}]}",
            b'{"traces":[{"run":' + value + b'}],"run":' + value + b"}",
        ]:
            check(line, "train")


def test_repeated_keys() -> None:
    """A line with a key twice (not one orjson writes): every "run" gets the run of the last
    (as a parser keeping the last sees it), and every "traces" array its members stamped,
    so a parser keeping either the first or the last of a key reads the stamped record."""
    line = (
        b'{"run":{"a":1},"traces":[{"run":null}],"traces":[{"run":{"b":2},"run":[]},{}],'
        b'"run":{"c":3}}'
    )
    got, scan = scanned(line, "train")
    assert scan.traces
    assert orjson.loads(got) == orjson.loads(in_memory(orjson.loads(line), "train")[0])
    first = json.loads(got, object_pairs_hook=lambda pairs: dict(reversed(pairs)))
    run = {"c": 3, "id": RUN_ID, "type": "train"}
    assert first["run"] == run
    assert first["traces"] == [{"run": run}]


# -- real shapes ---------------------------------------------------------------------------------


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("run_type", ["train", "eval"])
def test_episode_maker_records(seed: int, run_type: str) -> None:
    record = EpisodeMaker(seed=seed).episode(20_000, index=seed).to_record()
    for variant in _variants(record):
        line = encoder.encode(Records(None).value(variant), option=line_option(0))
        want, traces = in_memory(variant, run_type)
        for budget in (1 << 10, 1 << 20):
            got, scan = scanned(line, run_type, budget=budget)
            assert got == want
            assert scan.traces is traces


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("run_type", ["train", "eval"])
def test_verifiers_episodes(seed: int, run_type: str) -> None:
    """verifiers' own model, walked by the encoder with the stamp as an edit: the line it
    writes unstamped, stamped as bytes, is what it writes stamped."""
    record = EpisodeMaker(seed=seed).episode(20_000, index=seed).to_record()
    for variant in _variants(record):
        episode = WireEpisode.model_validate(variant)
        line = encoder.encode(Records(None).value(episode), option=line_option(0))
        stamp = Stamp(RUN_ID, run_type)
        want = encoder.encode(Records(None).value(episode, edit=stamp), option=line_option(0))
        got, scan = scanned(line, run_type, budget=1 << 12)
        assert got == want
        assert scan.traces is stamp.traces


def _variants(record: dict[str, Any]) -> list[dict[str, Any]]:
    """The record; without its run; its run moved after the traces; members with runs."""
    bare = {k: v for k, v in record.items() if k != "run"}
    moved = {**bare, "run": {**record["run"], "id": "earlier"}}
    members = dict(record)
    members["traces"] = [
        {**trace, "run": run}
        for trace, run in zip(
            record["traces"], [None, {"id": "x", "k": [1]}, {}, "r"] * 4, strict=False
        )
    ]
    return [record, bare, moved, members]


# -- whitespace ----------------------------------------------------------------------------------


@given(record=RECORDS, run_type=RUN_TYPES, ascii_only=st.booleans(), budget=BUDGETS)
def test_json_with_spaces(
    record: dict[str, Any], run_type: str, ascii_only: bool, budget: int
) -> None:
    """``json.dumps`` with spaces after separators (and its own escapes and float spelling):
    the bytes left as given, the stamped value, in order, is the in-memory one (orjson keeps
    key order, so its bytes of the result compare order too)."""
    value = orjson.loads(orjson.dumps(record))  # NaN and infinities as orjson writes them: null
    line = json.dumps(value, separators=(", ", ": "), ensure_ascii=ascii_only).encode()
    want, traces = in_memory(orjson.loads(line), run_type)
    got, scan = scanned(b"  " + line + b" \r\n", run_type, budget=budget)
    assert reencoded(got) == want
    assert scan.traces is traces
    assert got.count(b", ") >= line.count(b", ") - _run_bytes(value).count(b", ")


def _run_bytes(record: dict[str, Any]) -> bytes:
    """What of a record's spaced JSON is its runs (replaced by the stamp)."""
    parts = [record.get("run")]
    traces = record.get("traces")
    if isinstance(traces, list):
        parts += [m.get("run") for m in traces if isinstance(m, dict)]
    return json.dumps(parts, separators=(", ", ": ")).encode()


def test_whitespace_stays_as_given() -> None:
    """Whitespace inside the value is kept byte for byte; the new runs are compact, an added
    one goes just before the brace; what is around the value is dropped."""
    line = (
        b' \t{ "a" : [1, 2] ,\t"traces": [ {"run" : null } , { } ,{"b":1 } , 3 ] ,'
        b' "run" : { "x" : 1 } } \r\n'
    )
    run = b'{"x":1,"id":"run-outbox","type":"eval"}'
    want = (
        b'{ "a" : [1, 2] ,\t"traces": [ {"run" : '
        + run
        + b" } , { "
        + b'"run":'
        + run
        + b'} ,{"b":1 ,"run":'
        + run
        + b"} , 3 ] ,"
        + b' "run" : '
        + run
        + b" }\n"
    )
    got, scan = scanned(line, "eval")
    assert got == want
    assert scan.traces
    assert reencoded(got) == in_memory(orjson.loads(line), "eval")[0]


# -- bounded steps -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "bulk",
    [
        "x" * 5_000_000,
        list(range(700_000)),  # 5 MB of numbers
        ['é\\"😀' * 3] * 80_000,  # strings with escapes
    ],
    ids=["string", "numbers", "strings"],
)
def test_a_step_does_a_budget_of_work(bulk: Any) -> None:
    """Inside a 5 MB string or array a step stops after its budget: many steps, each at
    most ``budget`` bytes further on, and the right line at the end."""
    record = {"big": bulk, "traces": [{"big": bulk}], "run": {"a": 1}}
    line = orjson.dumps(record)
    assert len(line) > 5_000_000
    scan = Restamp(line, run_id=RUN_ID, run_type="train")
    steps = 1
    while not scan.step(budget=65536):
        steps += 1
    assert steps >= len(line) // 65536
    assert check_pieces(scan, line) == in_memory(record, "train")[0]
    assert len(scan.pieces) > len(line) // PIECE_BYTES  # the views are cut to size


def test_tokens_count_against_the_budget() -> None:
    """Dense tokens (an escaped quote every 2 bytes, a bracket every byte) cost Python work
    each: a step stops after a number of them in proportion to its budget, well before its
    bytes run out."""
    for bulk in ['"' * 100_000, [[]] * 50_000]:
        line = orjson.dumps({"v": bulk})
        scan = Restamp(line, run_id=RUN_ID, run_type="train")
        steps = 1
        while not scan.step(budget=65536):
            steps += 1
        assert steps > 20 * (len(line) // 65536 + 1)
        assert check_pieces(scan, line) == in_memory({"v": bulk}, "train")[0]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_restamp_gives_the_loop_back(backend: str) -> None:
    """``restamp`` lets other tasks run while it scans (each ``budget_s``), and its result is
    the scan's."""
    record = EpisodeMaker(seed=4).episode(3_000_000, index=0).to_record()
    line = orjson.dumps(record) + b"\n"
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await anyio.sleep(0)

    async def main(budget_s: float) -> Restamp:
        nonlocal steps
        async with anyio.create_task_group() as group:
            group.start_soon(tick)
            await anyio.sleep(0)
            start = ticks
            scan = await restamp(line, run_id=RUN_ID, run_type="eval", budget_s=budget_s)
            steps = ticks - start  # how often the other task ran meanwhile
            group.cancel_scope.cancel()
        return scan

    steps = 0
    want = in_memory(record, "eval")[0]
    scan = anyio.run(main, 0.0, backend=backend)
    assert check_pieces(scan, line) == want
    assert steps > 10  # given back after every step
    scan = anyio.run(main, 60.0, backend=backend)
    assert check_pieces(scan, line) == want
    assert steps == 0  # never: the budget was not spent


# -- deep nesting --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["list", "dict", "mixed"])
def test_nesting_10000_deep(kind: str) -> None:
    """No recursion: 10,000 levels around, inside members and as the whole line."""
    deep = nest("x]}\\", 10_000, kind, tuples=False)
    record = {"a": deep, "traces": [{"b": deep}, deep, {"run": None, "c": deep}], "run": {"k": 1}}
    line = encoder.encode(record)
    got, scan = scanned(line, "train", budget=1 << 14)
    assert got == in_memory(record, "train")[0]
    assert scan.traces
    line = encoder.encode(deep)
    assert scanned(line, "train")[0] == in_memory(deep, "train")[0]
    with pytest.raises(ValueError, match=BAD):
        scanned(line[:-1], "train")


# -- malformed lines -----------------------------------------------------------------------------

MALFORMED = [
    b"",
    b"\n",
    b"   ",
    b"{",
    b"[",
    b'"',
    b'"abc',
    b'"abc\\"',
    b'{"run"',
    b'{"run":',
    b'{"run":{"a":1}',
    b'{"traces":[{"run":1}]',
    b'{"traces":[{"run":1},',
    b'{"a":"b}',
    b'{"a":"b\\"}',
    b"{}}",
    b"{}]",
    b"[}",
    b"{]",
    b'{"a":[1,2}',
    b'{"a":{"b":1]}',
    b"[[[[]]]",
    b"]",
    b"}",
    b'{"a" 1}',
    b'{"a":1 "b":2}',
    b'{"a":1,}',
    b"{,}",
    b"{1:2}",
    b'{"a":tru}',
    b'{"a":-}',
    b'{"a":01}',
    b'{"a":1}x',
    b'{"a":1} {"b":2}',
    b'{"a":\n1}',
    b'{"a":"x\ny"}',
    b'{"a":[1,\n2]}',
    b'\n{"a":1}',
    b'{"traces":[1 2]}',
    b'{"traces":[{"run":1}}',
    b'{"run":{"a":}}',
    b'{"traces":[{"run":1e400}]}',
    b'{"r\\u00zzn":1}',
]


@pytest.mark.parametrize("line", MALFORMED)
def test_malformed_lines_raise(line: bytes) -> None:
    for budget in (1, 3, 1 << 20):
        scan = Restamp(line, run_id=RUN_ID, run_type="train")
        with pytest.raises(ValueError, match=BAD):
            _run_to_end(scan, budget)
        with pytest.raises(ValueError, match=BAD):
            scan.step()  # and again, not a half-done result


def _run_to_end(scan: Restamp, budget: int) -> None:
    while not scan.step(budget=budget):
        pass


@given(record=RECORDS, data=st.data())
def test_a_cut_object_raises(record: dict[str, Any], data: st.DataObject) -> None:
    """A line cut short (a write torn by a crash) is never taken for a record."""
    line = orjson.dumps(record)
    cut = data.draw(st.integers(0, len(line) - 1))
    with pytest.raises(ValueError, match=BAD):
        scanned(line[:cut], "train", budget=data.draw(BUDGETS))


@given(record=RECORDS, data=st.data())
def test_damaged_bytes_raise_value_error_or_stamp(
    record: dict[str, Any], data: st.DataObject
) -> None:
    """Bytes changed anywhere: the scan ends, with ``ValueError`` or with a line; where
    orjson reads the damaged line too, that line is its stamp."""
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
    result = attempt(damaged, "train", budget=data.draw(BUDGETS))
    if isinstance(result, str):
        assert re.match(BAD, result)
        return
    try:
        value = orjson.loads(damaged)
    except orjson.JSONDecodeError:
        return  # passed through: values inside are only skipped over
    got = result[0]
    if isinstance(value, dict):
        assert orjson.loads(got) == orjson.loads(in_memory(value, "train")[0])
    else:
        assert got == damaged.strip(b" \t\r\n") + b"\n"


@given(junk=st.binary(max_size=200))
def test_arbitrary_bytes_end(junk: bytes) -> None:
    """Any bytes: the scan ends, with a line or ``ValueError``."""
    result = attempt(junk, "train", budget=7)
    assert not isinstance(result, str) or re.match(BAD, result)
