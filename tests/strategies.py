"""Shared hypothesis strategies (and the small helpers the tests share).

Large values are built with ``st.builds`` (repeat a short drawn piece) so hypothesis only
draws a few bytes for a value that encodes to hundreds of kilobytes: the walker's slicing
paths (long strings, long number lists, big numpy arrays, big containers) are hit without
making generation slow.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import decimal
import enum
import functools
import math
import operator
import uuid
import zoneinfo
from collections import OrderedDict
from contextlib import aclosing
from typing import Any, ClassVar

import anyio
import numpy as np
import orjson
from hypothesis import strategies as st

import encoder
from encoder._settings import Limits

# -- option flags, chunk sizes, budgets ---------------------------------------------------------

ALL_FLAGS = (
    orjson.OPT_APPEND_NEWLINE,
    orjson.OPT_INDENT_2,
    orjson.OPT_NAIVE_UTC,
    orjson.OPT_NON_STR_KEYS,
    orjson.OPT_OMIT_MICROSECONDS,
    orjson.OPT_PASSTHROUGH_DATACLASS,
    orjson.OPT_PASSTHROUGH_DATETIME,
    orjson.OPT_PASSTHROUGH_SUBCLASS,
    orjson.OPT_SERIALIZE_NUMPY,
    orjson.OPT_SORT_KEYS,
    orjson.OPT_STRICT_INTEGER,
    orjson.OPT_UTC_Z,
)


def _or_all(flags: Any) -> int:
    return functools.reduce(operator.or_, flags, 0)


#: Any subset of orjson's option flags.
options = st.sets(st.sampled_from(ALL_FLAGS)).map(_or_all)

#: Options that do not change the shape of plain JSON values (for parse-back).
layout_options = st.sets(
    st.sampled_from((orjson.OPT_APPEND_NEWLINE, orjson.OPT_INDENT_2, orjson.OPT_SORT_KEYS))
).map(_or_all)

#: Chunk sizes 1..200,000, biased to small ones.
chunk_sizes = st.one_of(
    st.integers(1, 16),
    st.integers(1, 1024),
    st.integers(1, 200_000),
    st.sampled_from([1, 2, 3, 7, 64, 4096, 65536]),
)

#: Async budgets in seconds.
budgets = st.one_of(
    st.floats(1e-6, 1e-2, allow_nan=False, allow_infinity=False),
    st.sampled_from([1e-6, 1e-5, encoder.DEFAULT_BUDGET, 1e-2]),
)

# -- scalars ------------------------------------------------------------------------------------

INT_EDGES = [
    0,
    1,
    -1,
    2**31 - 1,
    -(2**31),
    2**53 - 1,
    2**53,
    2**53 + 1,
    -(2**53),
    -(2**53) - 1,
    2**63 - 1,
    2**63,
    -(2**63),
    -(2**63) - 1,
    2**64 - 1,
    2**64,
    -(2**64),
    10**30,
]

FLOAT_EDGES = [
    0.0,
    -0.0,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    2.225073858507201e-308,
    1.7976931348623157e308,
    -1.7976931348623157e308,
    math.nan,
    math.inf,
    -math.inf,
    0.1,
    1e16,
    1e-7,
    123456789.12345679,
    0.00025,
    1.00005,
]

ints = st.one_of(
    st.integers(-(2**31), 2**31),
    st.integers(-(2**65), 2**65),
    st.sampled_from(INT_EDGES),
)
floats = st.one_of(st.floats(), st.sampled_from(FLOAT_EDGES))
numbers = st.one_of(ints, floats, st.booleans())
#: Numbers every orjson option accepts (64-bit ints only, and within 53 bits for STRICT).
safe_numbers = st.one_of(st.integers(-(2**53) + 1, 2**53 - 1), floats, st.booleans())

#: Characters that exercise orjson's escaping: quotes, backslash, controls, U+2028, BOM,
#: 2-, 3- and 4-byte UTF-8.
ESCAPES = '"\\/\n\r\t\b\f\x00\x01\x1f\x7f\x80é\u2028\u2029\ufeff€\uffff😀\U0010ffff a'
escape_chars = st.sampled_from(ESCAPES)
small_alphabet = st.one_of(escape_chars, st.characters(max_codepoint=0x7F))

#: Lengths around the walker's 64K-character slice and well past it.
LONG_LENGTHS = [65535, 65536, 65537, 70_001, 131_072, 131_073, 200_003]


def _repeat_to(piece: str, length: int) -> str:
    return (piece * (length // len(piece) + 1))[:length]


#: Strings longer than a slice (> 64K chars), so the string-slicing path is hit.
long_strings = st.builds(
    _repeat_to,
    st.text(small_alphabet, min_size=1, max_size=6),
    st.one_of(st.sampled_from(LONG_LENGTHS), st.integers(65_537, 140_000)),
)

#: A lone surrogate (orjson refuses it: an error path).
surrogates = st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF)

short_strings = st.one_of(
    st.text(max_size=40),
    st.text(small_alphabet, max_size=40),
    st.text(escape_chars, min_size=1, max_size=8),
)
json_strings = st.one_of(short_strings, long_strings)

#: Strings that orjson may refuse (a lone surrogate somewhere, maybe inside a long one).
bad_strings = st.one_of(
    st.builds(lambda a, s, b: a + s + b, short_strings, surrogates, short_strings),
    st.builds(lambda a, s: a + s, long_strings, surrogates),
)

json_scalars = st.one_of(st.none(), st.booleans(), ints, floats, json_strings)
#: Scalars every option accepts and that round-trip through JSON (for parse-back).
plain_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63) + 1, 2**63 - 1),  # ijson (yajl) refuses -2**63 and ints past int64
    st.floats(allow_nan=False, allow_infinity=False),
    json_strings,
)

# -- long number lists --------------------------------------------------------------------------


def _numeric_list(pool: list[Any], n: int) -> list[Any]:
    return (pool * (n // len(pool) + 1))[:n]


def _numeric_list_with(pool: list[Any], n: int, intruder: Any, where: float) -> list[Any]:
    out = _numeric_list(pool, n)
    out.insert(int(where * len(out)), intruder)
    return out


#: Lists of more than 5,000 numbers (the walker cuts them in slices).
long_number_lists = st.one_of(
    st.builds(_numeric_list, st.lists(numbers, min_size=1, max_size=30), st.integers(5001, 12_000)),
    st.builds(
        _numeric_list, st.lists(safe_numbers, min_size=1, max_size=30), st.integers(5001, 12_000)
    ),
    st.builds(
        _numeric_list_with,
        st.lists(safe_numbers, min_size=1, max_size=10),
        st.integers(5001, 9000),
        st.one_of(st.none(), short_strings, st.sampled_from([2**64, -(2**64) - 1, math.nan])),
        st.floats(0, 1),
    ),
)

# -- extended values: subclasses, dataclasses, datetimes, enums, uuid, numpy, fragments ----------


class MyDict(dict):  # type: ignore[type-arg]
    pass


class MyList(list):  # type: ignore[type-arg]
    pass


class MyStr(str):
    pass


class MyInt(int):
    pass


class StrWithStr(str):
    """A str subclass whose ``__str__`` says something else: orjson writes the str data."""

    def __str__(self) -> str:
        return "<StrWithStr>"


@dataclasses.dataclass
class Point:
    x: Any
    y: Any
    _private: int = 0


@dataclasses.dataclass(slots=True)
class SlotPoint:
    label: Any
    value: Any
    _private: int = 7


class SubPoint(Point):
    """A subclass of a dataclass that is not itself decorated: orjson refuses it."""


class Color(enum.Enum):
    RED = 1
    GREEN = "green"
    BLUE = 2.5
    CONFIG = {"k": [1, 2.5, "x"], "nested": {"a": None}}  # noqa: RUF012
    NOTHING = None


class Level(enum.IntEnum):
    LOW = 1
    HUGE = 2**40


class Mode(str, enum.Enum):
    """A str-mixin enum (common before StrEnum): orjson writes its str data, ``"r"``."""

    READ = "r"
    WRITE = "w"


ZONES = [
    dt.timezone.utc,
    dt.timezone(dt.timedelta(hours=5, minutes=30)),
    dt.timezone(dt.timedelta(hours=-8)),
    zoneinfo.ZoneInfo("Europe/Paris"),
    zoneinfo.ZoneInfo("America/New_York"),
]
timezones = st.sampled_from(ZONES)

datetimes = st.one_of(
    st.datetimes(),
    st.datetimes(timezones=timezones),
    st.datetimes(
        min_value=dt.datetime(1970, 1, 1), max_value=dt.datetime(2100, 1, 1), timezones=timezones
    ),
)
dates = st.dates()
times = st.one_of(st.times(), st.times(timezones=st.just(dt.timezone.utc)))


def _array(dtype: str, shape: tuple[int, ...], seed: int, special: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    size = math.prod(shape)
    if dtype == "bool":
        flat = rng.integers(0, 2, size).astype(bool)
    elif dtype == "int64":
        flat = rng.integers(-(2**63), 2**63 - 1, size, dtype=np.int64, endpoint=True)
    elif dtype == "int32":
        flat = rng.integers(-(2**31), 2**31 - 1, size, dtype=np.int32, endpoint=True)
    else:
        flat = (rng.standard_normal(size) * 10.0 ** rng.integers(-12, 12, size)).astype(dtype)
        if special and size:
            picks = rng.integers(0, size, max(1, size // 50))
            flat[picks] = rng.choice(
                np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=dtype), len(picks)
            )
    return flat.reshape(shape)


#: Shapes with 1-3 dimensions; many above 2,048 elements so the array-slicing path is hit.
array_shapes = st.one_of(
    st.tuples(st.integers(0, 40)),
    st.tuples(st.integers(2049, 20_000)),
    st.tuples(st.integers(0, 6), st.integers(0, 6)),
    st.tuples(st.integers(1, 300), st.integers(1, 40)),
    st.tuples(st.integers(1, 3), st.integers(2049, 5000)),
    st.tuples(st.integers(1, 20), st.integers(1, 10), st.integers(1, 40)),
    st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(2049, 3000)),
)

numpy_arrays = st.builds(
    _array,
    st.sampled_from(["int64", "float64", "float32", "bool", "int32"]),
    array_shapes,
    st.integers(0, 2**32 - 1),
    st.booleans(),
)

#: Float arrays only (for the float_decimals tests).
numpy_float_arrays = st.builds(
    _array,
    st.sampled_from(["float64", "float32"]),
    array_shapes,
    st.integers(0, 2**32 - 1),
    st.booleans(),
)

numpy_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1).map(np.int64),
    st.integers(-(2**31), 2**31 - 1).map(np.int32),
    st.integers(0, 255).map(np.uint8),
    st.integers(0, 2**64 - 1).map(np.uint64),
    st.floats().map(np.float64),
    st.floats(width=32).map(np.float32),
    st.floats(width=16).map(np.float16),
    st.booleans().map(np.bool_),
)


def _fragment(value: Any, pretty: bool, as_str: bool) -> orjson.Fragment:
    raw = orjson.dumps(value, option=orjson.OPT_INDENT_2 if pretty else 0)
    return orjson.Fragment(raw.decode() if as_str else raw)


small_json = st.recursive(
    st.one_of(
        st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(), short_strings
    ),
    lambda kids: st.one_of(
        st.lists(kids, max_size=4), st.dictionaries(short_strings, kids, max_size=4)
    ),
    max_leaves=8,
)

#: ``orjson.Fragment`` of valid JSON, sometimes with newlines (pretty-printed), sometimes str.
fragments = st.builds(_fragment, small_json, st.booleans(), st.booleans())


class Custom:
    """Unsupported by orjson; ``custom_default`` turns it into its payload."""

    __slots__ = ("payload",)

    def __init__(self, payload: Any) -> None:
        self.payload = payload

    def __repr__(self) -> str:
        return f"Custom({self.payload!r:.60})"


class Opaque:
    """Unsupported by orjson and by ``custom_default``."""

    def __repr__(self) -> str:
        return "Opaque()"


def custom_default(obj: Any) -> Any:
    """A ``default`` hook: Custom -> its payload, Decimal -> str, else TypeError."""
    if isinstance(obj, Custom):
        return obj.payload
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    raise TypeError(f"cannot encode {type(obj).__name__}")


defaults = st.sampled_from([None, custom_default])

non_str_keys = st.one_of(
    ints,
    st.floats(),
    st.booleans(),
    st.none(),
    short_strings,
    st.builds(MyStr, short_strings),
    datetimes,
    dates,
    st.sampled_from([Color.RED, Color.GREEN, Level.LOW]),
    st.uuids(),
    st.just((1, 2)),
)

extended_leaves = st.one_of(
    st.builds(MyStr, json_strings),
    st.builds(StrWithStr, json_strings),
    st.builds(MyInt, ints),
    datetimes,
    dates,
    times,
    st.sampled_from(list(Color) + list(Level) + list(Mode)),
    st.uuids(),
    numpy_arrays,
    numpy_scalars,
    fragments,
)

#: Leaves orjson refuses (without a ``default`` that knows them).
error_leaves = st.one_of(
    bad_strings,
    st.decimals(allow_nan=False, places=3),
    st.just(Opaque()),
    st.times(timezones=st.just(dt.timezone.utc)),
    st.sampled_from([2**64, -(2**63) - 1, 10**30]),
)

# -- recursive values ---------------------------------------------------------------------------


def _size_default(obj: Any) -> Any:
    if isinstance(obj, Custom):
        return obj.payload
    return repr(obj)


def _approx_size(value: Any) -> int:
    """About how many bytes of JSON ``value`` makes (to keep generated values bounded)."""
    try:
        return len(
            orjson.dumps(
                value,
                default=_size_default,
                option=orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS,
            )
        )
    except TypeError:
        return 100_000


def _bulk_list(value: Any, target: int) -> list[Any]:
    """Enough copies of ``value`` (shared) to make about ``target`` bytes of JSON."""
    return [value] * max(1, min(2000, target // max(1, _approx_size(value))))


def _bulk_dict(value: Any, target: int, prefix: str) -> dict[str, Any]:
    n = max(1, min(2000, target // max(1, _approx_size(value) + len(prefix) + 8)))
    return {f"{prefix}{i}": value for i in range(n)}


bulk_targets = st.integers(20_000, 150_000)


def _extend_json(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(kids, max_size=6),
        st.lists(kids, max_size=6).map(tuple),
        st.dictionaries(short_strings, kids, max_size=6),
        st.builds(_bulk_list, kids, bulk_targets),
        st.builds(_bulk_dict, kids, bulk_targets, st.text(small_alphabet, max_size=4)),
    )


def json_values(*, long: bool = True) -> st.SearchStrategy[Any]:
    """JSON-native values: dicts with str keys, lists, tuples, str, int, float, bool, None."""
    leaves = (
        json_scalars if long else st.one_of(st.none(), st.booleans(), ints, floats, short_strings)
    )
    if long:
        leaves = st.one_of(leaves, long_number_lists)
    return st.recursive(leaves, _extend_json, max_leaves=12)


def plain_json_values() -> st.SearchStrategy[Any]:
    """JSON-native values every layout option accepts and that parse back equal (no nan/inf,
    ints within 64 bits, lists not tuples)."""
    leaves = st.one_of(
        plain_scalars,
        st.builds(
            _numeric_list,
            st.lists(
                st.one_of(
                    st.integers(-(2**63) + 1, 2**63 - 1),
                    st.floats(allow_nan=False, allow_infinity=False),
                ),
                min_size=1,
                max_size=20,
            ),
            st.integers(5001, 9000),
        ),
    )
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.lists(kids, max_size=6),
            st.dictionaries(short_strings, kids, max_size=6),
            st.builds(_bulk_list, kids, bulk_targets),
            st.builds(_bulk_dict, kids, bulk_targets, st.text(small_alphabet, max_size=4)),
        ),
        max_leaves=12,
    )


def _extend_any(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        _extend_json(kids),
        st.dictionaries(non_str_keys, kids, max_size=5),
        st.builds(MyDict, st.dictionaries(short_strings, kids, max_size=5)),
        st.builds(OrderedDict, st.dictionaries(short_strings, kids, max_size=5)),
        st.builds(MyList, st.lists(kids, max_size=5)),
        st.builds(Point, kids, kids),
        st.builds(SlotPoint, kids, kids),
        st.builds(SubPoint, kids, kids),
        st.builds(Custom, kids),
    )


def any_values(*, errors: bool = True) -> st.SearchStrategy[Any]:
    """JSON-native and extended values, containers of them, and (rarely, unless ``errors`` is
    False) leaves orjson refuses."""
    good = [
        json_scalars,
        long_number_lists,
        extended_leaves,
        extended_leaves,
        st.builds(Custom, st.one_of(json_scalars, extended_leaves)),
    ]
    leaves = st.one_of(*good, error_leaves) if errors else st.one_of(*good)
    values = st.recursive(leaves, _extend_any, max_leaves=10)
    return st.one_of(
        values,
        st.builds(_bulk_list, values, bulk_targets),
        st.builds(_bulk_dict, values, bulk_targets, st.text(small_alphabet, max_size=4)),
    )


# -- deep nesting -------------------------------------------------------------------------------


def nest(leaf: Any, depth: int, kind: str, *, tuples: bool = True) -> Any:
    """``leaf`` inside ``depth`` levels of lists, dicts, tuples or a mix (built iteratively).

    With ``tuples=False`` tuples are lists: what the value parses back to.
    """
    value = leaf
    for level in range(depth):
        k = kind if kind != "mixed" else ("list", "dict", "tuple")[level % 3]
        if k == "list" or (k == "tuple" and not tuples):
            value = [value]
        elif k == "tuple":
            value = (value,)
        else:
            value = {"k": value}
    return value


deep_depths = st.one_of(st.integers(255, 320), st.sampled_from([255, 256, 300, 500, 800]))
deep_kinds = st.sampled_from(["list", "dict", "tuple", "mixed"])
deep_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    short_strings,
    st.just([]),
    st.just({}),
)

#: (value, depth, kind, leaf): nesting deeper than orjson's limit of 254.
deep_values = st.builds(
    lambda leaf, depth, kind: (nest(leaf, depth, kind), depth, kind, leaf),
    deep_leaves,
    deep_depths,
    deep_kinds,
)

# -- helpers shared by the tests ----------------------------------------------------------------


def collect_async(obj: Any, *, backend: str = "asyncio", **kwargs: Any) -> list[bytes]:
    """The chunks of ``aiterencode(obj, **kwargs)``, run to completion with ``anyio.run``."""

    async def main() -> list[bytes]:
        out: list[bytes] = []
        async with aclosing(encoder.aiterencode(obj, **kwargs)) as chunks:
            async for chunk in chunks:
                out.append(chunk)
        return out

    return anyio.run(main, backend=backend)


def drain(
    chunks: Any, chunk_size: int, *, into: list[bytes] | None = None, limit: int | None = None
) -> None:
    """Consume an iterator of chunks, checking each (non-empty, at most ``chunk_size``),
    keeping them in ``into``; fail once more than ``limit`` bytes came out."""
    total = 0
    for chunk in chunks:
        assert 1 <= len(chunk) <= chunk_size, (len(chunk), chunk_size)
        total += len(chunk)
        if into is not None:
            into.append(chunk)
        assert limit is None or total <= limit, f"more than {limit:,} bytes and still going"


def check_chunks(chunks: list[bytes], chunk_size: int) -> None:
    """Each chunk is bytes, non-empty and at most ``chunk_size``; all but the last are at
    least half full (no storm of tiny writes)."""
    for i, chunk in enumerate(chunks):
        assert type(chunk) is bytes
        assert 1 <= len(chunk) <= chunk_size, (len(chunk), chunk_size)
        if i < len(chunks) - 1:
            assert 2 * len(chunk) >= chunk_size, (i, len(chunk), chunk_size)


def orjson_or_error(obj: Any, **kwargs: Any) -> tuple[bytes | None, orjson.JSONEncodeError | None]:
    try:
        return orjson.dumps(obj, **kwargs), None
    except orjson.JSONEncodeError as exc:
        return None, exc


# -- every value cut into pieces (tests/test_pieces.py) -----------------------------------------
#
# Values for the walk under tiny ``Limits``: small (tiny limits cut even a short list into
# pieces), built so every piece of the walk meets every kind of value orjson writes.

#: Plain values nested a little (no long strings or bulk lists: the limits do the cutting).
small_leaves = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.sampled_from(INT_EDGES),
    floats,
    short_strings,
)


# - dataclasses in every slots / __dict__ / inheritance combination


@dataclasses.dataclass
class PlainDC:
    a: Any
    b: Any = None


@dataclasses.dataclass(slots=True)
class SlottedDC:
    a: Any
    b: Any = None


class Mixin:
    """A plain base class: instances of its subclasses have a ``__dict__``."""


@dataclasses.dataclass
class MixinSlotsDC(Mixin):
    """Declares ``__slots__`` yet has a ``__dict__`` (from ``Mixin``): orjson writes the
    declared fields only, ``{"x":...}``, even with an extra attribute set."""

    __slots__ = ("x",)
    x: Any


@dataclasses.dataclass
class DerivedDC(PlainDC):
    """A dataclass inheriting a dataclass: the base's fields first."""

    c: Any = None


@dataclasses.dataclass(slots=True)
class SlottedChildDC(PlainDC):
    """Slotted, over a base with a ``__dict__``: orjson writes the declared fields."""

    c: Any = None


@dataclasses.dataclass
class DictChildDC(SlottedDC):
    """Not slotted, over a slotted base: orjson writes the ``__dict__`` (``c`` and extras),
    not the base's slots."""

    c: Any = None


@dataclasses.dataclass
class ExtrasDC:
    """A private field, a ClassVar and an InitVar: orjson writes none of them, but does write
    the attribute ``__post_init__`` sets."""

    x: Any
    _hidden: Any = 0
    kind: ClassVar[str] = "extras"
    seed: dataclasses.InitVar[Any] = None

    def __post_init__(self, seed: Any) -> None:
        if seed is not None:
            self.seeded = seed


@dataclasses.dataclass(frozen=True)
class FrozenDC:
    a: Any
    b: Any = None


class UndecoratedDC(PlainDC):
    """An undecorated subclass of a dataclass: orjson refuses it (``default`` may not)."""


def _with_attribute(obj: Any, name: str, value: Any) -> Any:
    """``obj`` with an attribute set after ``__init__`` (frozen ones too)."""
    object.__setattr__(obj, name, value)
    return obj


def dataclass_instances(kids: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Instances of every dataclass kind above, their fields drawn from ``kids``."""
    with_dict = st.one_of(
        st.builds(PlainDC, kids, kids),
        st.builds(MixinSlotsDC, kids),
        st.builds(DerivedDC, kids, kids, kids),
        st.builds(SlottedChildDC, kids, kids, kids),
        st.builds(DictChildDC, kids, kids, kids),
        st.builds(ExtrasDC, kids, kids),
        st.builds(FrozenDC, kids, kids),
    )
    return st.one_of(
        with_dict,
        st.builds(SlottedDC, kids, kids),
        st.builds(ExtrasDC, kids, kids, seed=st.one_of(st.none(), kids)),
        st.builds(UndecoratedDC, kids, kids),
        st.builds(
            _with_attribute, with_dict, st.sampled_from(["extra", "_extra", "a", "zz"]), kids
        ),
    )


def dataclass_default(obj: Any) -> Any:
    """A ``default`` for the dataclass tests: an undecorated subclass (or, with
    OPT_PASSTHROUGH_DATACLASS, any dataclass) becomes a dict of its fields; else
    ``custom_default``."""
    if isinstance(obj, UndecoratedDC):
        return {"undecorated": [obj.a, obj.b]}
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        fields = [f.name for f in dataclasses.fields(obj)]
        return {"dc": type(obj).__name__, "fields": [getattr(obj, n, None) for n in fields]}
    return custom_default(obj)


def dataclass_values() -> st.SearchStrategy[Any]:
    """Dataclasses of every kind, nested in each other, in lists and dicts."""
    return st.recursive(
        st.one_of(small_leaves, st.builds(Custom, small_leaves)),
        lambda kids: st.one_of(
            st.lists(kids, max_size=4),
            st.dictionaries(short_strings, kids, max_size=4),
            dataclass_instances(kids),
            dataclass_instances(kids),
        ),
        max_leaves=10,
    )


# - default chains


class Countdown:
    """``chain_default`` hands it back itself, ``n`` one less, until ``n`` is 0: then its
    payload. orjson calls ``default`` at most 255 times along one path: n up to 254 works."""

    __slots__ = ("n", "payload")

    def __init__(self, n: int, payload: Any) -> None:
        self.n = n
        self.payload = payload

    def __repr__(self) -> str:
        return f"Countdown({self.n}, {self.payload!r:.40})"


class Relay:
    """``chain_default`` replaces it with a fresh ``Relay(n - 1)``, then at 0 its payload."""

    __slots__ = ("n", "payload")

    def __init__(self, n: int, payload: Any) -> None:
        self.n = n
        self.payload = payload

    def __repr__(self) -> str:
        return f"Relay({self.n}, {self.payload!r:.40})"


class Fanout:
    """``chain_default`` turns it into a list (even depth) or dict (odd depth) of ``width``
    Fanouts one level shallower, and at depth 0 into its payload."""

    __slots__ = ("depth", "payload", "width")

    def __init__(self, depth: int, width: int, payload: Any) -> None:
        self.depth = depth
        self.width = width
        self.payload = payload

    def __repr__(self) -> str:
        return f"Fanout({self.depth}, {self.width}, {self.payload!r:.40})"


class Boom:
    """``chain_default`` raises ``ValueError`` for it (orjson chains it as ``__cause__``)."""

    __slots__ = ("tag",)

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __repr__(self) -> str:
        return f"Boom({self.tag!r})"


def chain_default(obj: Any) -> Any:
    """A ``default`` whose answers need ``default`` again: see the classes above."""
    if isinstance(obj, Countdown):
        if obj.n <= 0:
            return obj.payload
        obj.n -= 1
        return obj
    if isinstance(obj, Relay):
        return Relay(obj.n - 1, obj.payload) if obj.n > 0 else obj.payload
    if isinstance(obj, Fanout):
        if obj.depth <= 0:
            return obj.payload
        kids = [Fanout(obj.depth - 1, obj.width, obj.payload) for _ in range(obj.width)]
        if obj.depth % 2:
            return {f"k{i}": kid for i, kid in enumerate(kids)}
        return kids
    if isinstance(obj, Boom):
        raise ValueError(f"boom: {obj.tag}")
    return custom_default(obj)


#: Chain lengths, biased to orjson's limit (254 works, 255 raises).
chain_lengths = st.one_of(st.integers(0, 20), st.integers(0, 300), st.sampled_from([253, 254, 255]))


def chain_values() -> st.SearchStrategy[Any]:
    """Objects only ``chain_default`` can write (chains, fan-outs, one that makes it raise),
    inside plain containers and inside each other's payloads. Build a fresh copy for each
    encoding (``copy.deepcopy``): ``Countdown`` is changed by ``default``."""
    return st.recursive(
        st.one_of(small_leaves, st.builds(Boom, st.text(max_size=5))),
        lambda kids: st.one_of(
            st.lists(kids, max_size=4),
            st.dictionaries(short_strings, kids, max_size=4),
            st.builds(Countdown, chain_lengths, kids),
            st.builds(Relay, chain_lengths, kids),
            st.builds(Fanout, st.integers(0, 4), st.integers(1, 3), kids),
            st.builds(Custom, kids),
        ),
        max_leaves=8,
    )


# - numpy arrays and scalars of every dtype orjson writes

NUMPY_INT_DTYPES = ["int64", "int32", "int16", "int8", "uint64", "uint32", "uint16", "uint8"]
NUMPY_FLOAT_DTYPES = ["float64", "float32", "float16"]
#: orjson writes datetime64 in these units (not in ps, fs or as).
NUMPY_DATETIME_DTYPES = [
    f"datetime64[{unit}]" for unit in ("Y", "M", "W", "D", "h", "m", "s", "ms", "us", "ns")
]
NUMPY_DTYPES = [
    *NUMPY_FLOAT_DTYPES,
    *NUMPY_INT_DTYPES,
    "bool",
    "intp",
    "uintp",
    *NUMPY_DATETIME_DTYPES,
]

#: 1970-01-01 .. 2199-12-31 in microseconds (inside datetime64[ns]'s range too).
_US_RANGE = (0, 7_258_118_400_000_000 - 1)


def _typed_array(dtype: str, shape: tuple[int, ...], seed: int, special: bool) -> np.ndarray:
    """A C-contiguous array of ``dtype``; with ``special``, floats get nan/inf/-0.0 and
    ints their extremes."""
    rng = np.random.default_rng(seed)
    size = math.prod(shape)
    kind = np.dtype(dtype).kind
    if kind == "b":
        flat = rng.integers(0, 2, size).astype(bool)
    elif kind in "iu":
        info = np.iinfo(dtype)
        flat = rng.integers(int(info.min), int(info.max), size, dtype=dtype, endpoint=True)
        if special and size:
            edges = np.array([info.min, info.max, 0], dtype=dtype)
            flat[rng.integers(0, size, max(1, size // 10))] = rng.choice(edges)
    elif kind == "f":
        with np.errstate(over="ignore"):  # float16 overflows to inf: orjson writes null
            flat = (rng.standard_normal(size) * 10.0 ** rng.integers(-8, 8, size)).astype(dtype)
        if special and size:
            picks = rng.integers(0, size, max(1, size // 10))
            flat[picks] = rng.choice(
                np.array([np.nan, np.inf, -np.inf, -0.0, 0.0], dtype=dtype), len(picks)
            )
    else:
        us = rng.integers(*_US_RANGE, size, dtype=np.int64)
        # (No NaT: orjson 3.13 writes a NaT inside an array as a wrong date, or as nothing,
        # leaving invalid JSON, so there are no bytes to compare with.)
        flat = us.astype("datetime64[us]").astype(dtype)
    return flat.reshape(shape)


def _laid_out(array: np.ndarray, layout: str) -> Any:
    """The array as is, or a view orjson refuses: not C-contiguous (a strided slice, a
    transpose, Fortran order) or not native-endian; or one of its elements (a numpy
    scalar, a 0-d array)."""
    if layout == "strided" and array.ndim and len(array) > 1:
        return array[::2]
    if layout == "transposed" and array.ndim > 1 and array.shape[0] > 1 and array.shape[1] > 1:
        return array.T
    if layout == "fortran" and array.ndim > 1 and array.shape[0] > 1 and array.shape[1] > 1:
        return np.asfortranarray(array)
    if layout == "swapped" and array.dtype.kind != "b" and array.dtype.itemsize > 1:
        return array.astype(array.dtype.newbyteorder())
    if layout == "scalar" and array.size:
        return array.reshape(-1)[0]
    if layout == "zero-d" and array.size:
        return array.reshape(-1)[:1].reshape(())
    return array


#: Shapes of 0 to 3 dimensions, mostly small (tiny limits walk anything past ~20 elements),
#: some with a few hundred elements.
typed_array_shapes = st.one_of(
    st.tuples(st.integers(0, 60)),
    st.tuples(st.integers(0, 8), st.integers(0, 8)),
    st.tuples(st.integers(1, 4), st.integers(1, 4), st.integers(1, 5)),
    st.tuples(st.integers(1, 3), st.integers(100, 300)),
    st.tuples(st.integers(200, 600)),
)

#: C-contiguous arrays of every supported dtype (orjson writes them).
typed_arrays = st.builds(
    _typed_array,
    st.sampled_from(NUMPY_DTYPES),
    typed_array_shapes,
    st.integers(0, 2**32 - 1),
    st.booleans(),
)

#: Arrays in any layout, numpy scalars and 0-d arrays of every dtype (some orjson refuses).
any_arrays = st.builds(
    _laid_out,
    typed_arrays,
    st.sampled_from(
        ["c", "c", "c", "strided", "transposed", "fortran", "swapped", "scalar", "zero-d"]
    ),
)


def numpy_values() -> st.SearchStrategy[Any]:
    """numpy arrays and scalars of every dtype, in lists and dicts with plain values."""
    return st.recursive(
        st.one_of(any_arrays, any_arrays, small_leaves),
        lambda kids: st.one_of(
            st.lists(kids, max_size=4), st.dictionaries(short_strings, kids, max_size=4)
        ),
        max_leaves=6,
    )


def tolist_default(obj: Any) -> Any:
    """A ``default`` that writes what orjson hands it of numpy as ``tolist()``, else
    ``custom_default``."""
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):
        return obj.tolist()
    return custom_default(obj)


# - datetimes, dates and times with every datetime option

DATETIME_FLAGS = (
    orjson.OPT_NAIVE_UTC,
    orjson.OPT_OMIT_MICROSECONDS,
    orjson.OPT_UTC_Z,
    orjson.OPT_PASSTHROUGH_DATETIME,
)
#: Every combination of the datetime options, sometimes with others.
datetime_options = st.builds(
    operator.or_,
    st.sets(st.sampled_from(DATETIME_FLAGS)).map(_or_all),
    st.one_of(st.just(0), options),
)

UTC_ZONES = [dt.timezone.utc, zoneinfo.ZoneInfo("UTC"), zoneinfo.ZoneInfo("Australia/Adelaide")]

any_datetimes = st.one_of(
    datetimes,
    st.datetimes(timezones=st.sampled_from(UTC_ZONES)),
    st.datetimes().map(lambda d: d.replace(microsecond=0)),
)
#: Times, naive (orjson refuses a time with tzinfo).
any_times = st.one_of(st.times(), st.times().map(lambda t: t.replace(microsecond=0)))
#: Dates, datetimes and times, and the odd aware time (refused).
temporal_leaves = st.one_of(
    any_datetimes,
    any_datetimes,
    dates,
    any_times,
    st.times(timezones=st.just(dt.timezone.utc)),
)


def datetime_default(obj: Any) -> Any:
    """A ``default`` for OPT_PASSTHROUGH_DATETIME: each kind in its own format."""
    if isinstance(obj, dt.datetime):
        return obj.strftime("%a, %d %b %Y %H:%M:%S %z").strip()
    if isinstance(obj, dt.date):
        return [obj.year, obj.month, obj.day]
    if isinstance(obj, dt.time):
        return {"t": obj.isoformat()}
    return custom_default(obj)


def datetime_values() -> st.SearchStrategy[Any]:
    """Dates, datetimes and times in lists and dicts, and as dict keys."""
    return st.recursive(
        st.one_of(temporal_leaves, temporal_leaves, small_leaves),
        lambda kids: st.one_of(
            st.lists(kids, max_size=5),
            st.dictionaries(short_strings, kids, max_size=4),
            st.dictionaries(st.one_of(any_datetimes, dates, any_times), kids, max_size=4),
        ),
        max_leaves=10,
    )


# - large dicts with sorted keys, non-str keys, long and escape-heavy keys

_KEY_TEXT_OPTIONS = [
    orjson.OPT_NON_STR_KEYS | extra
    for extra in (0, orjson.OPT_NAIVE_UTC, orjson.OPT_OMIT_MICROSECONDS, orjson.OPT_UTC_Z)
]
_KEY_TEXT_OPTIONS.append(_or_all(_KEY_TEXT_OPTIONS))


def key_texts(key: Any) -> tuple[bytes, ...]:
    """What ``key`` becomes as a dict key under each option that changes a key's text (its
    repr where orjson refuses it)."""
    out = []
    for option in _KEY_TEXT_OPTIONS:
        try:
            out.append(orjson.dumps({key: None}, option=option))
        except orjson.JSONEncodeError:
            out.append(repr(key).encode())
    return tuple(out)


def _distinct_keys(keys: list[Any]) -> list[Any]:
    """``keys`` without those whose text (under any option) some earlier key already has:
    orjson's sort is not stable, so keys of equal text have no order to test."""
    seen: set[bytes] = set()
    out = []
    for key in keys:
        texts = key_texts(key)
        if seen.isdisjoint(texts):
            seen.update(texts)
            out.append(key)
    return out


_KEY_BASE = dt.datetime(1999, 12, 31, 23, 59, 58, 999_000)


def _generated_key(kind: str, i: int, piece: str) -> Any:
    """The ``i``th key of a kind (many distinct keys from a few drawn bytes)."""
    if kind == "int":
        return i * 7919 - 10**6
    if kind == "float":
        return i / 8 - 3.0
    if kind == "str":
        return f"{piece}{i}"
    if kind == "long":
        return _repeat_to(piece or "k", 70 + i % 50) + str(i)
    if kind == "datetime":
        return _KEY_BASE + dt.timedelta(seconds=i * 3607, microseconds=i * 13)
    if kind == "aware":
        return (_KEY_BASE + dt.timedelta(hours=i)).replace(tzinfo=ZONES[i % len(ZONES)])
    if kind == "date":
        return dt.date(1970, 1, 1) + dt.timedelta(days=i * 37)
    if kind == "time":
        return dt.time(i % 24, i % 60, i % 61 % 60, i * 101 % 1_000_000)
    if kind == "uuid":
        return uuid.UUID(int=(i * 0x9E3779B97F4A7C15) % 2**128)
    return i  # pragma: no cover


KEY_KINDS = ["int", "float", "str", "long", "datetime", "aware", "date", "time", "uuid"]

#: A few keys of each kind orjson accepts with OPT_NON_STR_KEYS, chosen by hypothesis.
drawn_keys = st.one_of(
    ints,
    st.floats(),
    st.booleans(),
    st.none(),
    short_strings,
    st.text(escape_chars, min_size=1, max_size=30),
    st.text(st.characters(min_codepoint=0x10000), max_size=6),
    st.builds(_repeat_to, st.text(small_alphabet, min_size=1, max_size=5), st.integers(60, 400)),
    st.builds(MyStr, short_strings),
    datetimes,
    dates,
    any_times,
    st.sampled_from([Color.RED, Color.GREEN, Color.BLUE, Color.NOTHING, Level.LOW, Level.HUGE]),
    st.sampled_from(list(Mode)),
    st.uuids(),
)


def _big_dict(
    kinds: list[str], n: int, piece: str, extra: list[Any], values: list[Any]
) -> dict[Any, Any]:
    keys = [_generated_key(kinds[i % len(kinds)], i, piece) for i in range(n)]
    keys = _distinct_keys(extra + keys)
    # The keys in a shuffled (but drawn) order: a generated run of keys is often sorted.
    order = sorted(range(len(keys)), key=lambda i: (i * 7919) % (len(keys) or 1))
    return {keys[i]: values[i % len(values)] for i in order}


def big_dicts(*, str_keys: bool = False) -> st.SearchStrategy[dict[Any, Any]]:
    """Dicts of a few hundred keys (all str, or mixed kinds orjson accepts with
    OPT_NON_STR_KEYS), no two of the same text, with small values."""
    kinds = (
        st.lists(st.sampled_from(["str", "str", "str", "long"]), min_size=1, max_size=3)
        if str_keys
        else st.lists(st.sampled_from(KEY_KINDS), min_size=1, max_size=4)
    )
    extra = st.lists(short_strings if str_keys else drawn_keys, max_size=12)
    return st.builds(
        _big_dict,
        kinds,
        st.integers(0, 400),
        st.text(small_alphabet, max_size=4),
        extra,
        st.lists(small_json, min_size=1, max_size=5),
    )


#: Strings heavy with escapes, astral characters, and (refused) lone surrogates.
hard_strings = st.one_of(
    st.text(escape_chars, min_size=1, max_size=200),
    st.text(st.characters(min_codepoint=0x10000), min_size=1, max_size=50),
    st.builds(_repeat_to, st.text(small_alphabet, min_size=1, max_size=6), st.integers(1, 3000)),
    st.builds(lambda a, s, b: a + s + b, short_strings, surrogates, short_strings),
    st.text(max_size=80),
)


#: The smallest limits there are: every value is cut into as many pieces as the walk can.
SMALLEST = Limits(
    group_bytes=1,
    str_bytes=1,
    number_bytes=1,
    max_group=1,
    plan_elements=1,
    sort_run=1,
    chain_levels=1,
    model_list=0,  # every list of pydantic sub-models walked a model at a time
    model_floats=0,
)
