"""What we do beyond orjson: unlimited depth, float rounding, big fragments, dump, chunking."""

from __future__ import annotations

import gc
import io
import math
import time
from typing import Any

import numpy as np
import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st
from strategies import (
    Point,
    any_values,
    check_chunks,
    chunk_sizes,
    collect_async,
    custom_default,
    floats,
    json_values,
    numpy_float_arrays,
    options,
)

from encoder import EncodeError, dump, encode, iterencode
from encoder._settings import Limits
from encoder._walk import AnextRequest, Piece, Walker

# -- unlimited depth ----------------------------------------------------------------------------

DEPTH = 100_000
#: Seconds; a walk linear in depth needs well under one: 0.12-0.14 s here, 0.2-0.4 s with
#: both cores busy (a cost per level growing with depth would take minutes).
TIME_LIMIT = 10.0


def _deep(kind: str, n: int) -> tuple[Any, bytes]:
    value: Any = None if kind == "dict" else []
    for _ in range(n):
        value = {"a": value} if kind == "dict" else [value]
    if kind == "dict":
        expected = b'{"a":' * n + b"null" + b"}" * n
    else:
        expected = b"[" * (n + 1) + b"]" * (n + 1)
    return value, expected


def _timed_join(chunks: Any, started: float, what: str) -> bytes:
    out = bytearray()
    for chunk in chunks:
        out += chunk
        elapsed = time.perf_counter() - started
        assert elapsed < TIME_LIMIT, (
            f"{what}: only {len(out):,} bytes after {elapsed:.0f} s (the cost per level grows "
            "with depth)"
        )
    return bytes(out)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["list", "dict"])
def test_depth_100_000(kind: str) -> None:
    value, expected = _deep(kind, DEPTH)
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(value)
    started = time.perf_counter()
    assert _timed_join(iterencode(value, chunk_size=64), started, f"{kind} x {DEPTH}") == expected


def test_deep_mixed_with_indent() -> None:
    """Pretty-printed output grows with the square of the depth: a smaller depth here."""
    n = 1500
    value: Any = "leaf"
    for i in range(n):
        value = [value] if i % 2 else {"k": value}
    # build the expected pretty-printed bytes level by level (outermost first)
    opens = []
    closes = []
    for level in range(n):  # level 0 is the outermost
        inner_is_list = (n - 1 - level) % 2 == 1
        pad = b"\n" + b"  " * (level + 1)
        if inner_is_list:
            opens.append(b"[" + pad)
        else:
            opens.append(b"{" + pad + b'"k": ')
        closes.append(b"\n" + b"  " * level + (b"]" if inner_is_list else b"}"))
    expected = b"".join(opens) + b'"leaf"' + b"".join(reversed(closes))
    got = b"".join(iterencode(value, option=orjson.OPT_INDENT_2, chunk_size=4096))
    assert got == expected


def test_deep_nesting_async_and_encode() -> None:
    value, expected = _deep("list", 1000)
    assert encode(value) == expected
    assert b"".join(collect_async(value, chunk_size=100)) == expected
    assert b"".join(collect_async(value, chunk_size=100, backend="trio")) == expected


def test_deep_nesting_inside_big_document() -> None:
    deep, deep_bytes = _deep("dict", 1000)
    value = {"pad": "x" * 100_000, "deep": deep, "after": [1, 2, 3]}
    expected = b'{"pad":"' + b"x" * 100_000 + b'","deep":' + deep_bytes + b',"after":[1,2,3]}'
    assert b"".join(iterencode(value, chunk_size=5000)) == expected


def test_deep_error_path() -> None:
    value: Any = object()
    for _ in range(1000):
        value = [value]
    with pytest.raises(EncodeError) as info:
        encode(value)
    assert info.value.path == "$" + "[0]" * 1000


@pytest.mark.parametrize("kind", ["list", "dict"])
def test_depth_adds_no_object_for_the_collector(kind: str) -> None:
    """Nesting 100,000 deep: what the walk holds at the innermost level is a few objects, not
    one or more a level, or full collections (~100 ms each here) set off while it walks."""
    value, _ = _deep(kind, DEPTH)
    walker = Walker(value)
    pieces = iter(walker)
    gc.collect()
    before = len(gc.get_objects())
    for _ in range(DEPTH // 256 + 2):  # every level opened, 256 a step
        next(pieces)
    tracked = len(gc.get_objects()) - before
    assert len(walker.stack) <= 2
    # (a set of ids per region of memory is among them: a few dozen)
    assert tracked < DEPTH // 100, f"{tracked} more objects for the collector at depth {DEPTH}"
    assert _walked(pieces).endswith(b"]" * 100 if kind == "list" else b"}" * 100)


def _walked(pieces: Any) -> bytes:
    """The bytes of a bare walk's pieces (or of what is left of them)."""
    out: list[Piece] = []
    for piece in pieces:
        assert not isinstance(piece, AnextRequest)
        out.append(piece)
    return b"".join(out)


def _chain(kinds: str, leaf: Any) -> Any:
    value = leaf
    for k in reversed(kinds):
        value = {"k": value} if k == "d" else [value] if k == "l" else (value,)
    return value


@pytest.mark.parametrize("levels", [1, 3, 1024])
@pytest.mark.parametrize(
    "option",
    [0, orjson.OPT_INDENT_2, orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2, orjson.OPT_NON_STR_KEYS],
)
def test_chains_of_one_element_containers(option: int, levels: int) -> None:
    """Runs of one-element lists, tuples and dicts, some cut by a larger container or a long
    key, walked a few levels a step: orjson's bytes."""
    long_key = "L" * 200_000
    values = [
        _chain("l" * 7, [1, {"x": [2, 3]}]),
        _chain("dldtl" * 20, "leaf"),
        _chain("ll", {"a": _chain("dd", []), "b": _chain("t", {})}),
        {long_key: _chain("dl", 5)},
        [_chain("d", {1: [True]} if option & orjson.OPT_NON_STR_KEYS else {"1": [True]})],
    ]
    limits = Limits(group_bytes=1, chain_levels=levels)
    for value in values:
        assert _walked(Walker(value, option=option, limits=limits)) == orjson.dumps(
            value, option=option
        )


def test_a_chain_level_changed_while_walked() -> None:
    inner: list[Any] = [[["x" * 300_000]]]
    outer = {"a": [inner]}
    pieces = iter(Walker(outer, limits=Limits(chain_levels=1)))
    assert _walked(next(pieces) for _ in range(3)) == b'{"a":[['  # a level a step
    inner.append(1)  # a level already entered, one element no more
    with pytest.raises(EncodeError, match="list changed size during encoding") as info:
        _walked(pieces)
    assert info.value.path == "$.a[0]"


def test_a_cycle_through_a_chain() -> None:
    loop: list[Any] = []
    loop.append({"k": [loop]})
    with pytest.raises(EncodeError, match="Circular reference detected") as info:
        b"".join(iterencode([loop]))
    assert info.value.path == "$[0][0].k[0]"


# -- float_decimals -----------------------------------------------------------------------------


def rounded(value: Any, n: int) -> Any:
    """A copy of ``value`` with every float rounded as ``round(x, n)`` does."""
    if type(value) is float:
        return round(value, n)
    if isinstance(value, np.floating):
        return type(value)(round(float(value), n))
    if isinstance(value, np.ndarray) and value.dtype.kind == "f":
        flat = [round(x, n) for x in value.ravel().tolist()]
        return np.array(flat, dtype=value.dtype).reshape(value.shape)
    if type(value) in (list, tuple):
        return [rounded(v, n) for v in value]
    if type(value) is dict:
        return {k: rounded(v, n) for k, v in value.items()}
    return value


def _check_rounding(value: Any, n: int, *, option: int = 0, chunk_size: int = 65536) -> None:
    expected = orjson.dumps(rounded(value, n), option=option)
    chunks = list(iterencode(value, option=option, float_decimals=n, chunk_size=chunk_size))
    check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == expected
    assert encode(value, option=option, float_decimals=n) == expected
    assert b"".join(collect_async(value, option=option, float_decimals=n)) == expected


def test_rounded_helper_is_not_identity() -> None:
    assert rounded([1.23456789, {"a": (0.00016,)}], 4) == [1.2346, {"a": [0.0002]}]


@given(value=json_values(), option=options, n=st.integers(0, 6), chunk_size=chunk_sizes)
def test_float_decimals_everywhere(value: Any, option: int, n: int, chunk_size: int) -> None:
    try:
        orjson.dumps(rounded(value, n), option=option)
    except orjson.JSONEncodeError:
        with pytest.raises(EncodeError):
            encode(value, option=option, float_decimals=n)
        return
    _check_rounding(value, n, option=option, chunk_size=chunk_size)


@pytest.mark.parametrize("size", [10, 5001, 20_000])
def test_float_decimals_in_long_number_lists(size: int) -> None:
    value = {
        "mixed": [i if i % 3 else i / 7 for i in range(size)],
        "floats": [math.pi * i for i in range(size)],
        "bools": [True, False, 1.23456] * (size // 3),
        "nested": [{"x": [0.123456789] * size}],
        "big": [2**62 + 1, -(2**63), 12345678901234567] * 10,
    }
    _check_rounding(value, 4)
    _check_rounding(value, 4, option=orjson.OPT_INDENT_2, chunk_size=1000)


def test_float_decimals_leaves_ints_and_bools_alone() -> None:
    value = [True, False, 0, -1, 2**63 - 1, 2**64 - 1, {"t": True, "i": 10**15}]
    for n in (0, 4, 17):
        assert encode(value, float_decimals=n) == orjson.dumps(value)
        assert b"".join(iterencode(value, float_decimals=n)) == orjson.dumps(value)


@given(x=floats, n=st.integers(0, 17))
def test_float_decimals_is_round(x: float, n: int) -> None:
    expected = orjson.dumps([round(x, n)])
    assert encode([x], float_decimals=n) == expected
    assert b"".join(iterencode([x] * 6000, float_decimals=n)) == orjson.dumps([round(x, n)] * 6000)


@pytest.mark.parametrize("x", [2.675, 0.00025, 1e305])
@pytest.mark.parametrize("shape", [(7,), (2, 2500)])
def test_float_decimals_numpy_arrays_like_round(x: float, shape: tuple[int, ...]) -> None:
    """A float64 array rounds exactly like ``round(x, n)`` on each element (as a list would):
    ties the binary value is not on, and values too large to be scaled by 10**n."""
    array = np.full(shape, x, dtype=np.float64)
    _check_rounding(array, 4, option=orjson.OPT_SERIALIZE_NUMPY)
    _check_rounding({"a": [array, x]}, 4, option=orjson.OPT_SERIALIZE_NUMPY)


@given(array=numpy_float_arrays, n=st.integers(0, 8), option=options)
def test_float_decimals_numpy_arrays(array: np.ndarray, n: int, option: int) -> None:
    option |= orjson.OPT_SERIALIZE_NUMPY
    try:
        expected = orjson.dumps(rounded(array, n), option=option)
    except orjson.JSONEncodeError:
        with pytest.raises(EncodeError):
            encode(array, option=option, float_decimals=n)
        return
    assert b"".join(iterencode(array, option=option, float_decimals=n)) == expected
    assert b"".join(iterencode({"k": [array]}, option=option, float_decimals=n)) == (
        orjson.dumps({"k": [rounded(array, n)]}, option=option)
    )


@pytest.mark.parametrize(
    "scalar", [np.float64(1.23456789), np.float32(1.23456789), np.float64(0.00025)]
)
def test_float_decimals_numpy_scalars(scalar: Any) -> None:
    value = {"s": scalar, "pad": "x" * 100_000, "l": [scalar, 1.23456789]}
    _check_rounding(value, 4, option=orjson.OPT_SERIALIZE_NUMPY)


def test_float_decimals_in_dataclasses_and_default_results() -> None:
    value = [Point(x=1.23456789, y=[2.3456789, {"z": 3.456789}]), "x" * 100_000]
    expected = orjson.dumps([{"x": 1.2346, "y": [2.3457, {"z": 3.4568}]}, "x" * 100_000])
    assert b"".join(iterencode(value, float_decimals=4)) == expected
    from strategies import Custom

    value2 = {"c": Custom([1.23456789] * 6000)}
    assert b"".join(iterencode(value2, default=custom_default, float_decimals=4)) == (
        orjson.dumps({"c": [1.2346] * 6000})
    )


# -- fragments ----------------------------------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 100, 4096])
def test_fragment_larger_than_chunk_size(chunk_size: int) -> None:
    raw = orjson.dumps({"rows": [{"i": i, "s": "é" * 10} for i in range(5000)]})
    fragment = orjson.Fragment(raw)
    value = {"before": 1, "frag": fragment, "after": [fragment, "x" * 70_000]}
    expected = orjson.dumps(value)
    chunks = list(iterencode(value, chunk_size=chunk_size))
    check_chunks(chunks, chunk_size)
    assert len(chunks) > len(raw) // chunk_size
    assert b"".join(chunks) == expected
    assert b"".join(collect_async(value, chunk_size=chunk_size)) == expected


def test_fragment_with_newlines_under_indent() -> None:
    fragment = orjson.Fragment(b'{\n"a": [1,\n 2]\n}')
    value = {"deep": [[fragment]], "pad": ["x" * 70_000], "top": fragment}
    option = orjson.OPT_INDENT_2
    assert b"".join(iterencode(value, option=option)) == orjson.dumps(value, option=option)
    assert b"".join(iterencode([fragment], option=option)) == orjson.dumps(
        [fragment], option=option
    )


# -- dump ---------------------------------------------------------------------------------------


@given(value=any_values(errors=False), chunk_size=chunk_sizes)
def test_dump_returns_byte_count(value: Any, chunk_size: int) -> None:
    option = orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS
    try:
        expected = orjson.dumps(value, option=option, default=custom_default)
    except orjson.JSONEncodeError:
        with pytest.raises(EncodeError):
            dump(value, io.BytesIO(), option=option, default=custom_default)
        return
    buf = io.BytesIO()
    n = dump(value, buf, option=option, default=custom_default, chunk_size=chunk_size)
    assert n == len(expected)
    assert buf.getvalue() == expected


def test_dump_writes_chunks_of_bounded_size() -> None:
    sizes: list[int] = []

    class Sink:
        def write(self, data: bytes) -> int:
            sizes.append(len(data))
            return len(data)

    value = {"a": "x" * 300_000, "n": list(range(50_000))}
    n = dump(value, Sink(), chunk_size=10_000)
    assert n == len(orjson.dumps(value)) == sum(sizes)
    assert all(1 <= s <= 10_000 for s in sizes)
    assert len(sizes) > 30


# -- chunking invariants ------------------------------------------------------------------------


@given(value=any_values(errors=False), option=options, chunk_size=chunk_sizes)
def test_chunks_are_non_empty_and_bounded(value: Any, option: int, chunk_size: int) -> None:
    try:
        expected = orjson.dumps(value, option=option, default=custom_default)
    except orjson.JSONEncodeError:
        with pytest.raises(EncodeError):
            list(iterencode(value, option=option, default=custom_default, chunk_size=chunk_size))
        return
    chunks = list(iterencode(value, option=option, default=custom_default, chunk_size=chunk_size))
    check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == expected
    chunk_size = max(chunk_size, len(expected) // 100_000)  # see assert_parity
    achunks = collect_async(value, option=option, default=custom_default, chunk_size=chunk_size)
    check_chunks(achunks, chunk_size)
    assert b"".join(achunks) == expected


@given(
    sizes=st.lists(st.integers(0, 300), max_size=40),
    views=st.lists(st.booleans(), min_size=40, max_size=40),
    chunk_size=st.integers(1, 100),
)
def test_chunker_joins_small_pieces_and_passes_big_ones_on(
    sizes: list[int], views: list[bool], chunk_size: int
) -> None:
    from encoder._chunks import Chunker

    chunker = Chunker(chunk_size)
    pieces: list[bytes | memoryview] = []
    chunks: list[bytes] = []
    for i, (n, view) in enumerate(zip(sizes, views, strict=False)):
        data = bytes([65 + i % 26]) * n
        piece: bytes | memoryview = memoryview(b"<" + data + b">")[1:-1] if view else data
        pieces.append(piece)
        waiting = chunker.pending_bytes
        out = chunker.add(piece)
        if out is not None:
            assert out
            chunks += out
        # A bytes piece that fills half a chunk alone, with nothing waiting, is no copy.
        if not view and not waiting and chunk_size / 2 <= n <= chunk_size:
            assert out is not None
            assert len(out) == 1
            assert out[0] is piece
    last = chunker.flush()
    if last is not None:
        chunks.append(last)
    check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == b"".join(pieces)


def test_chunker_hands_on_a_half_full_piece_without_a_copy() -> None:
    from encoder._chunks import Chunker

    chunker = Chunker(100)
    big = b"a" * 60
    assert chunker.add(big) == [big]
    assert chunker.add(big)[0] is big
    assert chunker.add(b"b" * 10) is None  # under half: it waits
    assert chunker.add(b"c" * 45) == [b"b" * 10 + b"c" * 45]
    view = memoryview(b"<" + b"d" * 70 + b">")[1:-1]
    (chunk,) = chunker.add(view)
    assert type(chunk) is bytes
    assert chunk == b"d" * 70
    assert chunker.add(b"e" * 250) == [b"e" * 100, b"e" * 100]
    assert chunker.flush() == b"e" * 50
    assert chunker.flush() is None


# -- cost of the walk ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dataclass", "dict-subclass", "slots-dataclass"])
def test_many_small_objects_of_user_classes_walk_fast(kind: str) -> None:
    """10,000 small instances of user classes in one list: orjson takes ~1 ms; the walk may
    be some times slower, never seconds (a per-element cost that explores the class)."""
    from strategies import MyDict, SlotPoint

    make = {
        "dataclass": lambda i: Point(x=i, y="a"),
        "dict-subclass": lambda i: MyDict(a=i),
        "slots-dataclass": lambda i: SlotPoint(label="a", value=i),
    }[kind]
    value = [make(i) for i in range(10_000)]
    expected = orjson.dumps(value)
    started, started_cpu = time.perf_counter(), time.thread_time()
    got = b"".join(iterencode(value))
    # The lesser of wall and CPU time: the walk takes both, a shared host's stall only wall.
    elapsed = min(time.perf_counter() - started, time.thread_time() - started_cpu)
    assert got == expected
    # 0.04-0.08 s here, idle or with both cores busy.
    assert elapsed < 1.0, f"{elapsed:.2f} s for 10,000 {kind} instances"


@pytest.mark.parametrize("sort_run", [1, 2, 3, 1024])
def test_keys_of_the_same_text_sorted_in_the_dicts_order(sort_run: int) -> None:
    """With OPT_NON_STR_KEYS | OPT_SORT_KEYS two keys can become the same text (1 and "1");
    orjson's sort may write them either way, the walk writes them in the dict's order (a
    stable sort), wherever the runs it sorts apart are cut."""
    value: dict[Any, Any] = {"b": 0, 1: "int", "a": 0, "1": "str", None: 0, "null": 1}
    value.update({f"k{i}": i for i in range(40)})  # more than a planned dict holds

    def text(key: Any) -> str:  # what the key becomes, as orjson writes it
        written = orjson.dumps({key: None}, option=orjson.OPT_NON_STR_KEYS)
        return str(next(iter(orjson.loads(written))))

    texts = sorted(((text(k), k) for k in value), key=lambda tk: tk[0])  # stable
    option = orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS
    got = _walked(Walker(value, option=option, limits=Limits(group_bytes=1, sort_run=sort_run)))
    pairs = [f'"{t}":{orjson.dumps(value[k]).decode()}' for t, k in texts]
    assert got == ("{" + ",".join(pairs) + "}").encode()
