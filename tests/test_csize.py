"""The optional C size check (``encoder._csize``) against a plain recursive reference, and the
walker's pure-Python fallback (used where no C compiler built the extension) against orjson."""

from __future__ import annotations

import shutil
import sysconfig
from datetime import date, datetime
from typing import Any

import orjson
import pytest
from conftest import JSON_FILES
from hypothesis import example, given
from hypothesis import strategies as st
from strategies import any_values, chunk_sizes, json_values, options, orjson_or_error

from encoder import EncodeError, _size
from encoder._chunks import Chunker
from encoder._settings import DEFAULT_LIMITS
from encoder._walk import Walker

BIG = 1 << 62
DEEP = BIG + 1

csize = _size._csize
GROUP_BYTES = DEFAULT_LIMITS.group_bytes


def test_the_extension_is_built_where_a_compiler_is() -> None:
    # setup.py marks it optional; here, with a compiler, a failed build is a regression.
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    assert shutil.which(compiler) is None or csize is not None, "encoder._csize was not built"


def reference(value: Any, leaves: tuple[type, ...], depth: int = 0) -> int:
    """What ``_csize.size`` estimates, with no early stop."""
    t = type(value)
    if t is str:
        return len(value) + 2
    if t is int:
        return 8
    if t is float:
        return 20
    if value is None or t is bool:
        return 5
    if t in (list, tuple, dict):
        if depth >= 254:
            return DEEP
        if t is dict:
            parts = [2]
            for k, v in value.items():
                parts.append(len(k) + 4 if type(k) is str else 24)
                parts.append(reference(v, leaves, depth + 1))
        else:
            parts = [2 + len(value)] + [reference(v, leaves, depth + 1) for v in value]
        return DEEP if DEEP in parts else BIG if BIG in parts else sum(parts)
    if t in leaves:
        return 40
    return BIG


needs_csize = pytest.mark.skipif(csize is None, reason="encoder._csize is not built")

leaf_types = (datetime, date)
sized_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()
    | st.text(max_size=40)
    | st.datetimes()
    | st.dates()
    | st.just(b"bytes")  # anything else: must be walked
    | st.builds(lambda s: type("Sub", (str,), {})(s), st.text(max_size=3)),
    lambda kids: (
        st.lists(kids, max_size=6)
        | st.lists(kids, max_size=6).map(tuple)
        | st.dictionaries(st.text(max_size=8) | st.integers(), kids, max_size=6)
    ),
    max_leaves=40,
)


@needs_csize
@given(values=st.lists(sized_values, max_size=4), limit=st.integers(0, 2000))
def test_size_matches_the_reference(values: list[Any], limit: int) -> None:
    assert csize is not None
    expected = sum(reference(v, leaf_types) for v in values)
    got = csize.size(values, limit, leaf_types)
    if expected <= limit:
        assert got == expected
    else:
        assert got > limit
    assert csize.size(tuple(values), limit, leaf_types) == got


def _nested(depth: int) -> Any:
    value: Any = "leaf"
    for i in range(depth):
        value = [value] if i % 2 else {"k": value}
    return value


@needs_csize
@pytest.mark.parametrize(("depth", "deep"), [(254, False), (255, True), (10_000, True)])
def test_size_says_when_nesting_is_deeper_than_orjson_writes(depth: int, deep: bool) -> None:
    assert csize is not None
    got = csize.size([_nested(depth)], BIG, ())
    assert (got == DEEP) is deep
    assert reference(_nested(depth), ()) == got


@needs_csize
def test_size_stops_at_the_limit_without_looking_further() -> None:
    assert csize is not None
    # Past the limit before the bytes object: "too big", not "must be walked".
    assert 100 < csize.size(["x" * 200, b"bytes"], 100, ()) < BIG
    assert csize.size([b"bytes", "x" * 200], 100, ()) == BIG
    # The same inside a long run of numbers (read in a loop of its own).
    assert 100 < csize.size([[1] * 10_000 + [b"bytes"]], 100, ()) < BIG
    assert 100 < csize.size([[2.5, 1] * 5_000, b"bytes"], 100, ()) < BIG


@needs_csize
@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([[1, 2.5, True, None, "ab"]], 2 + 5 + 8 + 20 + 5 + 5 + 4),
        ([[1, 2, b"bytes", 3]], BIG),
        ([[1.5, [2, [3.5]]]], 2 + 2 + 20 + 2 + 2 + 8 + 2 + 1 + 20),
    ],
)
def test_a_run_of_numbers_ends_at_the_first_other_value(values: Any, expected: int) -> None:
    assert csize is not None
    assert csize.size(values, BIG, ()) == expected == sum(reference(v, ()) for v in values)


@needs_csize
def test_a_long_list_whose_first_items_project_past_the_limit_is_too_big() -> None:
    assert csize is not None
    # 16 items of 12 bytes, then 112 of 2: 546 bytes in all, but 1,536 at the first items' rate.
    projected = ["x" * 10] * 16 + [""] * 112
    assert reference(projected, ()) == 546
    assert 600 < csize.size([projected], 600, ()) < BIG
    assert csize.size([projected], 1600, ()) == 546  # projected under the limit: read to the end
    assert csize.size([projected[:63]], 100, ()) > 100  # too short to project: read to the limit
    assert 600 < csize.size([["x" * 10] * 16 + [b"bytes"] + [""] * 111], 600, ()) < BIG


@needs_csize
def test_a_long_dict_whose_first_items_project_past_the_limit_is_too_big() -> None:
    assert csize is not None
    # 16 items of 8 + 12 bytes, then 112 of 8 + 2: 1,442 bytes, but 2,560 at the first rate.
    projected = {f"k{i:03}": "x" * 10 if i < 16 else "" for i in range(128)}
    assert reference(projected, ()) == 1442
    assert 2000 < csize.size([projected], 2000, ()) < BIG
    assert csize.size([projected], 2600, ()) == 1442  # projected under the limit: to the end
    short = dict(list(projected.items())[:63])
    assert csize.size([short], 400, ()) > 400  # too short to project: read to the limit
    assert csize.size([short], 10_000, ()) == reference(short, ())
    with_bytes = {**projected, "k016": b"bytes"}
    assert 2000 < csize.size([with_bytes], 2000, ()) < BIG  # not read as far as the bytes
    assert csize.size([with_bytes], 10_000, ()) == BIG


@needs_csize
@pytest.mark.parametrize("kind", ["list", "dict"])
def test_a_container_projected_too_big_is_walked_to_the_same_bytes_and_errors(kind: str) -> None:
    assert csize is not None
    # Under GROUP_BYTES in all, but its first items project it past that.
    values = ["x" * (GROUP_BYTES // 32)] * 16 + [""] * 112
    small: Any = values if kind == "list" else {f"k{i:03}": v for i, v in enumerate(values)}
    assert csize.size([small], GROUP_BYTES, ()) > GROUP_BYTES >= reference(small, ())
    pieces = [p for p in Walker({"a": small}) if p]
    assert len(pieces) > 1  # walked, not written whole
    assert b"".join(pieces) == orjson.dumps({"a": small})
    # A value that must be walked, past the first items, is still found, with its path.
    if kind == "list":
        bad, path = [*small[:16], b"bytes", *small[17:]], "$.a[16]"
    else:
        bad, path = {**small, "k016": b"bytes"}, "$.a.k016"
    with pytest.raises(EncodeError) as err:
        b"".join(Walker({"a": bad}))  # type: ignore[arg-type]
    assert err.value.path == path


def reference_plan(block: list[Any], is_map: bool, limit: int) -> list[tuple[int, int, int]]:
    """``Walker.plan``'s rule, each element measured by ``size`` alone."""
    assert csize is not None
    plan: list[tuple[int, int, int]] = []
    run_start, run_bytes = -1, 0
    for idx, element in enumerate(block):
        key, value = element if is_map else (None, element)
        size = len(value) + 2 if type(value) is str else csize.size([value], limit, leaf_types)
        if size == DEEP:
            return plan  # compared no further: the walker stops measuring below this
        if is_map:
            size += len(key) if type(key) is str else 8
        if size > limit:
            if run_start >= 0:
                plan.append((run_start, idx, 0))
                run_start = -1
            plan.append((idx, idx + 1, 2 if size != BIG else 1))
            continue
        if run_start >= 0 and run_bytes + size > limit:
            plan.append((run_start, idx, 0))
            run_start = -1
        if run_start < 0:
            run_start, run_bytes = idx, 0
        run_bytes += size
    if run_start >= 0:
        plan.append((run_start, len(block), 0))
    return plan


def _block(value: Any) -> list[Any]:
    return list(value.items()) if type(value) is dict else list(value)


@needs_csize
@given(
    value=st.lists(sized_values, max_size=8)
    | st.dictionaries(st.text(max_size=8), sized_values, max_size=8),
    limit=st.integers(0, 400),
)
def test_plan_matches_the_reference_and_its_sizes_plan_the_same(value: Any, limit: int) -> None:
    assert csize is not None
    is_map = type(value) is dict
    block = _block(value)
    plan, deep = csize.plan(block, is_map, limit, leaf_types, None)
    expected = reference_plan(block, is_map, limit)
    assert [segment[:3] for segment in plan][: len(expected)] == expected
    assert not deep
    for segment in plan:
        if len(segment) == 4:
            # A large short container: the sizes measured on the way are what measuring each
            # element alone gives, and planning it with them cuts it as planning it afresh.
            start, _, kind, sizes = segment  # type: ignore[misc]
            assert kind == 2
            inner = block[start][1] if is_map else block[start]
            assert type(inner) in (list, tuple, dict)
            assert len(sizes) == len(inner) <= 32
            inner_block, inner_map = _block(inner), type(inner) is dict
            for element, size in zip(inner_block, sizes, strict=True):
                child = element[1] if inner_map else element
                alone = csize.size([child], limit, leaf_types)
                assert size == -1 or size == alone or (size > limit and alone > limit)
            with_sizes, _ = csize.plan(inner_block, inner_map, limit, leaf_types, sizes)
            afresh, _ = csize.plan(inner_block, inner_map, limit, leaf_types, None)
            assert [g[:3] for g in with_sizes] == [g[:3] for g in afresh]


class _Record:
    pass


def _dict_layouts() -> list[dict[Any, Any]]:
    """Dicts laid out every way the C check reads them: deleted entries, keys other than str,
    an instance's split table, and hash tables with 1, 2 and 4-byte indices."""
    emptied = {"a": 1}
    del emptied["a"]
    holes = {f"k{i}": "x" * (i % 7) for i in range(300)}  # 512 slots: 2-byte indices
    for i in range(0, 300, 3):
        del holes[f"k{i}"]
    short_holes = {f"k{i}": [i] * (i % 3) for i in range(20)}
    for i in (0, 5, 19):
        del short_holes[f"k{i}"]
    record = _Record()
    record.a = "xyz"  # type: ignore[attr-defined]
    record.b = [1, 2.5]  # type: ignore[attr-defined]
    return [
        {},
        emptied,
        holes,
        short_holes,
        {1: "a", "b": 2.5, 3.5: None, None: [1]},
        vars(record),
        {f"k{i}": i for i in range(70_000)},  # 4-byte indices
    ]


@needs_csize
def test_every_dict_layout_is_read_item_by_item_as_python_sees_it() -> None:
    assert csize is not None
    for value in _dict_layouts():
        assert csize.size([value], BIG - 1, ()) == reference(value, ()), list(value)[:3]
        if 0 < len(value) <= 32:
            # A short dict just over the limit: its elements measured one by one on the way,
            # in the order its items come, all but the last (where the limit was passed).
            plan, _ = csize.plan([value], False, reference(value, ()) - 1, (), None)
            assert len(plan[0]) == 4
            sizes = plan[0][3]  # type: ignore[misc]
            expected = tuple(reference(v, ()) for v in value.values())
            assert sizes[:-1] == expected[:-1], list(value)[:3]


long_lists = st.lists(sized_values | st.floats() | st.integers(), min_size=33, max_size=100)


@needs_csize
@given(
    block=st.lists(long_lists | sized_values, min_size=1, max_size=4),
    limit=st.integers(0, 3000),
)
# First 16 items project it past 1,200 (172 bytes of 116 items), all of it is 1,090: too big.
@example(block=[["x" * 50] + [1] * 115], limit=1200)
def test_a_long_list_in_a_plan_comes_with_its_first_elements_sizes(
    block: list[Any], limit: int
) -> None:
    assert csize is not None
    plan, _ = csize.plan(block, False, limit, leaf_types, None)
    # Read as size() reads it (up to the limit, projected from its first 16 elements), so
    # the plan cuts the block as measuring each element alone does.
    expected = reference_plan(block, False, limit)
    assert [segment[:3] for segment in plan][: len(expected)] == expected
    for segment in plan:
        if len(segment) == 4 and len(block[segment[0]]) > 32:
            # Its first 16 elements' sizes, for the walk to plan them without reading again.
            sizes = segment[3]  # type: ignore[misc]
            assert len(sizes) == 16
            for child, size in zip(block[segment[0]][:16], sizes, strict=True):
                alone = csize.size([child], limit, leaf_types)
                assert size == -1 or size == alone or (size > limit and alone > limit)


@needs_csize
def test_a_long_lists_first_elements_are_measured_once(load_corpus: Any) -> None:
    """twitter.json's 100 statuses: the plan of the top-level dict reads the first 16 before
    projecting the list too big; the walk writes those from the sizes it read."""
    assert csize is not None
    value = load_corpus("twitter.json")
    checked: list[int] = []

    class Counting:
        plan = staticmethod(csize.plan)
        numbers = staticmethod(csize.numbers)

        @staticmethod
        def size(values: list[Any], limit: int, leaves: tuple[type, ...]) -> int:
            for v in values:
                checked.extend(map(id, v) if type(v) is list else [id(v)])
            return csize.size(values, limit, leaves)  # type: ignore[union-attr]

    walker = Walker(value)
    walker.sizer.c = Counting()
    assert b"".join(walker) == orjson.dumps(value)  # type: ignore[arg-type]
    statuses = value["statuses"]
    assert not {id(s) for s in statuses[:16]} & set(checked)
    assert {id(s) for s in statuses[16:]} <= set(checked)


@needs_csize
def test_plan_reads_a_large_element_only_up_to_the_limit() -> None:
    assert csize is not None
    node = {"a": "x" * 300, "b": [1.5] * 40, "c": b"bytes"}  # past 400 in "b"; "c" unread
    plan, deep = csize.plan([node, 7], False, 400, (), None)
    assert not deep
    assert plan[0][:3] == (0, 1, 2)
    assert plan[1] == (1, 2, 0)
    assert plan[0][3] == (302, -1, -1)  # type: ignore[misc]
    # Nesting deeper than orjson writes: the element is walked, and the walker told.
    plan, deep = csize.plan(["x", _nested(300), [1]], False, BIG - 1, (), None)
    assert deep
    assert plan == [(0, 1, 0), (1, 2, 1), (2, 3, 1)]
    # Sizes that do not fit the block are ignored, not trusted.
    assert csize.plan([1, 2], False, 400, (), (999,)) == ([(0, 2, 0)], False)
    assert csize.plan([1, 2], False, 400, (), (999, 999)) == ([(0, 1, 2), (1, 2, 2)], False)


@needs_csize
def test_plan_refuses_what_it_cannot_plan() -> None:
    assert csize is not None
    with pytest.raises(ValueError, match="32"):
        csize.plan([1] * 33, False, 10, (), None)
    with pytest.raises(TypeError):
        csize.plan([1], True, 10, (), None)  # a map's block holds pairs
    with pytest.raises(TypeError):
        csize.plan({"a": 1}, True, 10, (), None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        csize.plan([], False, 10, [str], None)  # type: ignore[arg-type]


@needs_csize
@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], 0),
        ([1, 2, True], 24),
        ((1, 2.5), 40),
        ([1, float("nan")], 40),
        ([1, "2"], BIG),
        ([1, [2]], BIG),
        ([1, type("Int", (int,), {})(2)], BIG),
    ],
)
def test_numbers(values: Any, expected: int) -> None:
    assert csize is not None
    assert csize.numbers(values) == expected


@needs_csize
def test_bad_arguments_are_refused() -> None:
    assert csize is not None
    with pytest.raises(TypeError):
        csize.size({"a": 1}, 10, ())  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        csize.size([], 10, [str])  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        csize.numbers(iter([1]))  # type: ignore[arg-type]


# -- the pure-Python fallback --------------------------------------------------------------


def _walked(value: Any, *, option: int = 0, chunk_size: int = 65536) -> bytes:
    walker = Walker(value, option=option, native=False)
    assert walker.sizer.c is None
    data = b"".join(walker)  # type: ignore[arg-type]
    for k in {chunk_size, 1 + len(data) // 3}:
        chunker = Chunker(k)
        walk = Walker(value, option=option, native=False)
        pieces = [c for p in walk for c in chunker.add(p) or []]  # type: ignore[arg-type]
        last = chunker.flush()
        assert b"".join(pieces + ([last] if last else [])) == data
    return data


@given(value=json_values() | any_values(), option=options, chunk_size=chunk_sizes)
def test_pure_python_fallback_matches_orjson(value: Any, option: int, chunk_size: int) -> None:
    expected, error = orjson_or_error(value, option=option)
    if error is None:
        assert _walked(value, option=option, chunk_size=chunk_size) == expected
    else:
        with pytest.raises(EncodeError):
            _walked(value, option=option, chunk_size=chunk_size)


def test_pure_python_fallback_on_the_corpus(load_corpus: Any) -> None:
    for name in JSON_FILES:
        value = load_corpus(name)
        assert _walked(value) == orjson.dumps(value), name


def test_both_checks_group_a_large_document_alike(load_corpus: Any) -> None:
    """Both checks cut twitter.json into steps of at most about GROUP_BYTES each."""
    value = load_corpus("twitter.json")
    for native in (True, False):
        pieces = [p for p in Walker(value, native=native) if p]
        assert b"".join(pieces) == orjson.dumps(value)  # type: ignore[arg-type]
        assert max(map(len, pieces)) < 4 * GROUP_BYTES
        assert len(pieces) > len(orjson.dumps(value)) // (4 * GROUP_BYTES)
