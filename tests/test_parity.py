"""Differential tests: every driver writes exactly ``orjson.dumps``'s bytes, or raises
``EncodeError`` where orjson raises, except where we go beyond orjson on purpose (nesting
deeper than 254, cycles)."""

from __future__ import annotations

import json
import sys
from contextlib import aclosing
from typing import Any

import anyio
import ijson
import numpy as np
import orjson
import pytest
from hypothesis import event, given
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from strategies import (
    Custom,
    Mode,
    Opaque,
    StrWithStr,
    SubPoint,
    any_values,
    budgets,
    check_chunks,
    chunk_sizes,
    collect_async,
    custom_default,
    deep_values,
    defaults,
    drain,
    json_values,
    layout_options,
    nest,
    options,
    orjson_or_error,
    plain_json_values,
)

import encoder
from encoder import EncodeError, encode, iterencode


def _size_class(data: bytes | None) -> str:
    n = len(data or b"")
    return "< 1 KiB" if n < 1024 else "< 64 KiB" if n < 65536 else ">= 64 KiB"


def assert_parity(
    value: Any,
    *,
    option: int = 0,
    default: Any = None,
    chunk_size: int = 65536,
    budget: float = encoder.DEFAULT_BUDGET,
    backend: str = "asyncio",
) -> bytes | None:
    """All three drivers against orjson; returns orjson's bytes (None if it raised)."""
    expected, err = orjson_or_error(value, option=option, default=default)
    kwargs = {"option": option, "default": default}
    if currently_in_test_context():
        event("orjson raised" if err is not None else "orjson wrote " + _size_class(expected))
    if err is None:
        # At most ~100,000 chunks a run: tiny chunks are for small documents (a megabyte in
        # one-byte chunks proves nothing more than a kilobyte does, and takes seconds).
        chunk_size = max(chunk_size, len(expected) // 100_000)
        assert encode(value, **kwargs) == expected
        chunks = list(iterencode(value, chunk_size=chunk_size, **kwargs))
        check_chunks(chunks, chunk_size)
        assert b"".join(chunks) == expected
        achunks = collect_async(
            value, backend=backend, chunk_size=chunk_size, budget=budget, **kwargs
        )
        check_chunks(achunks, chunk_size)
        assert b"".join(achunks) == expected
        return expected
    with pytest.raises(EncodeError) as info:
        encode(value, **kwargs)
    assert isinstance(info.value, TypeError)
    assert info.value.path.startswith("$")
    with pytest.raises(EncodeError):
        drain(iterencode(value, chunk_size=chunk_size, **kwargs), chunk_size)
    with pytest.raises(EncodeError):
        collect_async(value, backend=backend, chunk_size=chunk_size, budget=budget, **kwargs)
    return None


# -- property tests -----------------------------------------------------------------------------


@given(value=json_values(), option=options, chunk_size=chunk_sizes, budget=budgets)
def test_parity_json_values(value: Any, option: int, chunk_size: int, budget: float) -> None:
    assert_parity(value, option=option, chunk_size=chunk_size, budget=budget)


@given(
    value=any_values(errors=False),
    option=st.one_of(options, options.map(lambda o: o | orjson.OPT_SERIALIZE_NUMPY)),
    chunk_size=chunk_sizes,
    budget=budgets,
)
def test_parity_any_values(value: Any, option: int, chunk_size: int, budget: float) -> None:
    """Extended values (subclasses, dataclasses, datetimes, enums, uuids, numpy, fragments,
    objects a ``default`` turns into JSON), mostly ones orjson accepts."""
    assert_parity(
        value, option=option, default=custom_default, chunk_size=chunk_size, budget=budget
    )


@given(value=any_values(), option=options, default=defaults, chunk_size=chunk_sizes)
def test_parity_with_refused_leaves(value: Any, option: int, default: Any, chunk_size: int) -> None:
    """Values that may hold leaves orjson refuses: both raise, or both write the same."""
    assert_parity(value, option=option, default=default, chunk_size=chunk_size, budget=1e-5)


@given(value=any_values(), option=options, default=defaults, chunk_size=chunk_sizes)
def test_parity_any_values_trio(value: Any, option: int, default: Any, chunk_size: int) -> None:
    assert_parity(value, option=option, default=default, chunk_size=chunk_size, backend="trio")


def _deep_expected(leaf: Any, depth: int, kind: str, option: int) -> bytes:
    """The bytes orjson would write for ``nest(leaf, depth, kind)`` had it no depth limit."""
    indent = bool(option & orjson.OPT_INDENT_2)
    inner = orjson.dumps(leaf, option=option & ~orjson.OPT_APPEND_NEWLINE)
    if indent:
        inner = inner.replace(b"\n", b"\n" + b"  " * depth)
    opens: list[bytes] = []
    closes: list[bytes] = []
    for level in range(depth):  # level 0 is the innermost wrapper
        k = kind if kind != "mixed" else ("list", "dict", "tuple")[level % 3]
        at = depth - 1 - level  # indentation level of this wrapper
        if k == "dict":
            if indent:
                opens.append(b"{\n" + b"  " * (at + 1) + b'"k": ')
                closes.append(b"\n" + b"  " * at + b"}")
            else:
                opens.append(b'{"k":')
                closes.append(b"}")
        elif indent:
            opens.append(b"[\n" + b"  " * (at + 1))
            closes.append(b"\n" + b"  " * at + b"]")
        else:
            opens.append(b"[")
            closes.append(b"]")
    out = b"".join(reversed(opens)) + inner + b"".join(closes)
    if option & orjson.OPT_APPEND_NEWLINE:
        out += b"\n"
    return out


def test_deep_expected_matches_orjson_below_its_limit() -> None:
    """The hand-built expectation agrees with orjson where orjson can answer."""
    for kind in ("list", "dict", "tuple", "mixed"):
        for leaf in (None, 1, "x", [], {}, [1, 2], {"a": [1]}):
            for option in (0, orjson.OPT_INDENT_2, orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE):
                value = nest(leaf, 40, kind)
                assert _deep_expected(leaf, 40, kind, option) == orjson.dumps(value, option=option)


@given(deep=deep_values, option=layout_options, chunk_size=chunk_sizes)
def test_deeper_than_orjson(deep: tuple[Any, int, str, Any], option: int, chunk_size: int) -> None:
    """Nesting past orjson's limit encodes (to the bytes orjson would write without a limit)."""
    value, depth, kind, leaf = deep
    expected, err = orjson_or_error(value, option=option)
    if err is not None:
        assert "Recursion limit" in str(err)
        expected = _deep_expected(leaf, depth, kind, option)
    ours = encode(value, option=option)
    assert ours == expected
    chunks = list(iterencode(value, option=option, chunk_size=chunk_size))
    check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == expected
    assert b"".join(collect_async(value, option=option, chunk_size=chunk_size, budget=1e-5)) == (
        expected
    )
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 3 * depth + 1000))  # json.loads recurses per level
    try:
        assert json.loads(ours) == nest(leaf, depth, kind, tuples=False)
    finally:
        sys.setrecursionlimit(limit)


@given(value=plain_json_values(), option=layout_options, chunk_size=chunk_sizes)
def test_parse_back_with_ijson(value: Any, option: int, chunk_size: int) -> None:
    """Chunks fed one by one to ijson's push parser give back the value."""
    raw = orjson.dumps(value, option=option)
    expected = orjson.loads(raw)
    # yajl re-scans a token split across sends from its start, so a long string cut into tiny
    # chunks is quadratic in ijson (not in us): keep to ~200 chunks per document.
    chunk_size = max(chunk_size, len(raw) // 200)
    items = ijson.sendable_list()
    parser = ijson.items_coro(items, "", use_float=True)
    chunks = iterencode(value, option=option, chunk_size=chunk_size)
    for chunk in chunks:
        assert 1 <= len(chunk) <= chunk_size
        parser.send(chunk)
    parser.close()
    assert items == [expected]
    if option & orjson.OPT_SORT_KEYS and isinstance(expected, dict):
        assert list(items[0]) == sorted(expected)


@given(value=plain_json_values(), chunk_size=chunk_sizes)
def test_parse_back_events_match_orjson(value: Any, chunk_size: int) -> None:
    """ijson's event stream over our chunks is the one over orjson's bytes."""
    raw = orjson.dumps(value)
    chunk_size = max(chunk_size, len(raw) // 200)  # see test_parse_back_with_ijson
    ours = ijson.sendable_list()
    parser = ijson.parse_coro(ours, use_float=True)
    for chunk in iterencode(value, chunk_size=chunk_size):
        parser.send(chunk)
    parser.close()
    theirs = list(ijson.parse(raw, use_float=True))
    assert ours == theirs


# -- default hooks ------------------------------------------------------------------------------


class HugeResult:
    """default() turns it into a list of 100,000 ints."""


def huge_default(obj: Any) -> Any:
    if isinstance(obj, HugeResult):
        return list(range(100_000))
    raise TypeError(type(obj).__name__)


@pytest.mark.parametrize("wrap", [lambda h: h, lambda h: {"data": h, "n": 1}, lambda h: [1, h, 2]])
def test_default_huge_result_is_walked(wrap: Any) -> None:
    value = wrap(HugeResult())
    expected = orjson.dumps(value, default=huge_default)
    chunks = list(iterencode(value, default=huge_default, chunk_size=4096))
    check_chunks(chunks, 4096)
    assert len(chunks) > 10
    assert b"".join(chunks) == expected
    assert encode(value, default=huge_default) == expected


def test_default_huge_result_gives_the_loop_turns() -> None:
    """The default's result is walked in bounded steps: with a tiny budget another task runs
    many times while it is encoded (one orjson call for all of it would give it ~1 turn)."""
    value = {"data": HugeResult()}
    expected = orjson.dumps(value, default=huge_default)

    async def main() -> tuple[bytes, int]:
        turns = 0
        done = False

        async def probe() -> None:
            nonlocal turns
            while not done:
                await anyio.sleep(0)
                turns += 1

        out = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(probe)
            await anyio.sleep(0)
            start = turns
            async with aclosing(
                encoder.aiterencode(value, default=huge_default, budget=1e-6, chunk_size=1 << 20)
            ) as chunks:
                async for chunk in chunks:
                    out.append(chunk)
            done = True
            return b"".join(out), turns - start

    data, turns = anyio.run(main)
    assert data == expected
    assert turns > 10


@given(value=any_values(), option=options, chunk_size=chunk_sizes)
def test_default_into_structures(value: Any, option: int, chunk_size: int) -> None:
    """Custom objects turned into dicts, lists and strs by ``default``, anywhere."""
    wrapped = {"c": Custom({"inner": Custom([Custom("s"), value])}), "v": [Custom(value)]}
    assert_parity(wrapped, option=option, default=custom_default, chunk_size=chunk_size)


def test_default_raises_gives_path_and_cause() -> None:
    boom = ValueError("boom")

    def default(obj: Any) -> Any:
        raise boom

    value = {"a": [1, {"b": Opaque()}], "big": "x" * 100_000}
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(value, default=default)
    for run in (
        lambda: encode(value, default=default),
        lambda: list(iterencode(value, default=default, chunk_size=100)),
        lambda: collect_async(value, default=default),
    ):
        with pytest.raises(EncodeError) as info:
            run()
        assert info.value.path == "$.a[1].b"
        assert info.value.__cause__ is boom


class Link:
    """default() replaces it with the next link, ``n`` times, then with 0."""

    def __init__(self, n: int) -> None:
        self.n = n


def chain_default(obj: Any) -> Any:
    if isinstance(obj, Link):
        return Link(obj.n - 1) if obj.n > 0 else 0
    raise TypeError(type(obj).__name__)


@pytest.mark.parametrize("n", [0, 1, 100, 252, 253, 254, 255, 256, 400])
@pytest.mark.parametrize("wrap", ["top", "nested"])
def test_default_chain_limit_matches_orjson(n: int, wrap: str) -> None:
    """A default that keeps returning unsupported objects: we stop exactly where orjson does."""
    value: Any = Link(n) if wrap == "top" else {"x": ["y" * 70_000, Link(n)]}
    assert_parity(value, default=chain_default, chunk_size=1000)


def test_default_returning_unsupported_forever_raises() -> None:
    def default(obj: Any) -> Any:
        return Opaque()

    value = {"a": [Opaque()], "pad": "p" * 100_000}
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(value, default=default)
    with pytest.raises(EncodeError) as info:
        list(iterencode(value, default=default))
    assert info.value.path == "$.a[0]"
    with pytest.raises(EncodeError):
        encode(value, default=default)
    with pytest.raises(EncodeError):
        collect_async(value, default=default)


# -- known walker-path corner cases (each found by the property tests above) -------------------


@pytest.mark.parametrize("chunk_size", [1, 65536])
def test_str_mixin_enum_on_the_walker_path(chunk_size: int) -> None:
    """orjson writes a ``(str, Enum)`` member as its str data."""
    for value in (Mode.READ, [Mode.READ, "x" * 70_000], {"m": Mode.WRITE, "pad": "p" * 70_000}):
        assert_parity(value, chunk_size=chunk_size)


def test_str_subclass_with_own_str_on_the_walker_path() -> None:
    """orjson writes a str subclass's data, not what its ``__str__`` returns."""
    for value in (StrWithStr("data"), StrWithStr("d" * 70_000), ["x" * 70_000, StrWithStr("d")]):
        assert_parity(value)


def test_undecorated_dataclass_subclass_is_refused_like_orjson() -> None:
    """orjson only serializes classes that are dataclasses themselves."""
    for value in (SubPoint(1, 2), {"p": SubPoint(1, 2), "pad": "p" * 70_000}):
        assert_parity(value)


@pytest.mark.parametrize(
    "keys",
    [
        [1, "a", "a!"],
        [1, "b", "b\x00"],
        ["x\n", 2, "x"],
        [None, "n", "n "],
        [*range(40), "a", "a!"],
    ],
)
@pytest.mark.parametrize("big_values", [False, True])
def test_sorted_non_str_keys_on_the_walker_path(keys: list[Any], big_values: bool) -> None:
    """OPT_SORT_KEYS with mixed key types sorts as orjson does (by the key's text), also for
    a dict the walker writes item by item."""
    value = {k: ("v" * 70_000 if big_values else i) for i, k in enumerate(keys)}
    value["zz"] = "z" * 70_000
    option = orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS
    assert_parity(value, option=option)
    assert_parity(value, option=option | orjson.OPT_INDENT_2)


class LyingList(list):  # type: ignore[type-arg]
    """A list subclass whose item access says something else: orjson reads the list itself."""

    def __getitem__(self, index: Any) -> Any:
        return "lie"


def test_list_subclass_overriding_getitem() -> None:
    for value in (LyingList([1, 2, 3]), {"l": LyingList(["a", "b"]), "pad": "p" * 70_000}):
        assert_parity(value)


@given(st.data())
def test_large_default_results_with_options(data: st.DataObject) -> None:
    """A default result big enough to be walked, under any options."""
    value = data.draw(json_values())
    option = data.draw(options)
    wrapped = [Custom(value), Custom([value])]
    assert_parity(wrapped, option=option, default=custom_default, chunk_size=data.draw(chunk_sizes))


@pytest.mark.parametrize("option", [0, orjson.OPT_SERIALIZE_NUMPY])
@pytest.mark.parametrize(
    "value",
    [
        [-1, np.uint8(0)],
        [1, np.int64(2**63 - 1), np.int64(2**63 - 1)],
        [0.5, np.float32(1.5), "x"],
        [-1, np.uint8(0), "x" * 70_000],
        [2**64, np.float64(1)],
    ],
    ids=["uint8", "int64-overflow", "float32", "uint8-big", "bigint"],
)
def test_numpy_scalars_among_python_numbers(value: list[Any], option: int) -> None:
    """A list that starts like a list of numbers but holds numpy scalars (whose arithmetic
    with Python ints can overflow or warn): orjson's bytes, or EncodeError, nothing else."""
    assert_parity(value, option=option)
