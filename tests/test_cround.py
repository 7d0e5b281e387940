"""``round_slice`` (encoder/_cround.c, and its pure-Python fallback in encoder/_models.py) is
Python's ``round(v, ndigits)`` over ``values[start:stop]``, bit for bit.

The C fast path rounds by arithmetic (``nearbyint(x * 10**d) / 10**d``) and hands near-ties,
large products and odd ``ndigits`` to Python's ``round``; the values here aim at exactly the
edges of that split: decimal ties and their neighbouring doubles, products at and above
2**51, subnormals, signed zeros, NaNs and infinities, and every ``ndigits`` from 0 to 22 along
with some outside that range.
"""

from __future__ import annotations

import importlib.util
import math
import shutil
import struct
import sys
import sysconfig
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import encoder
import encoder._models

RoundSlice = Callable[[list[Any], int, int, int], list[float]]

MODELS_SOURCE = Path(encoder.__file__).resolve().parent / "_models.py"


def _fallback_round_slice() -> RoundSlice:
    """The ``except ImportError`` branch of encoder/_models.py: the module's source run as a
    fresh module (never put in ``sys.modules``) while ``encoder._cround`` cannot be imported.
    The real ``encoder._models`` and ``encoder._cround`` are left as they are."""
    spec = importlib.util.spec_from_file_location("encoder._models_fallback", MODELS_SOURCE)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "encoder._cround", None)  # import of it raises ImportError
        spec.loader.exec_module(module)
    func: RoundSlice = module.round_slice
    # A Python function (the fallback), not the C one.
    assert hasattr(func, "__code__"), func
    return func


FALLBACK = _fallback_round_slice()

C_ROUND_SLICE: RoundSlice | None
try:
    from encoder._cround import round_slice as _c_round_slice
except ImportError:  # built without a C compiler: only the fallback is checked
    C_ROUND_SLICE = None
else:
    C_ROUND_SLICE = _c_round_slice


#: The implementations there are: the fallback always, the C one where it was built (and it
#: is, wherever a C compiler is: ``test_the_extension_is_built_where_a_compiler_is``).
IMPLS = {"fallback": FALLBACK} | ({"c": C_ROUND_SLICE} if C_ROUND_SLICE is not None else {})


@pytest.fixture(params=sorted(IMPLS))
def round_slice(request: pytest.FixtureRequest) -> RoundSlice:
    return IMPLS[request.param]


def test_the_extension_is_built_where_a_compiler_is() -> None:
    # setup.py marks it optional; here, with a compiler, a failed build is a regression.
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    assert shutil.which(compiler) is None or C_ROUND_SLICE is not None, "not built"


def _bits(x: float) -> bytes:
    return struct.pack("<d", x)


def _double(bits: int) -> float:
    (value,) = struct.unpack("<d", bits.to_bytes(8, "little"))
    return float(value)


def _same(got: float, expected: float) -> bool:
    """Bit for bit, except that any NaN equals any NaN."""
    if math.isnan(expected):
        return type(got) is float and math.isnan(got)
    return type(got) is float and _bits(got) == _bits(expected)


def assert_rounds(values: list[Any], ndigits: int, start: int = 0, stop: int | None = None) -> bool:
    """Every implementation gives Python's doubles for ``values[start:stop]`` (True), or raises
    what Python's ``round`` raises (``round(1.7e308, -308)`` overflows; False)."""
    if stop is None:
        stop = len(values)
    try:
        expected = [float(round(v, ndigits)) for v in values[start:stop]]
    except (OverflowError, TypeError) as exc:
        for name, func in IMPLS.items():
            with pytest.raises(type(exc)):
                func(values, start, stop, ndigits)
            assert name
        return False
    for name, func in IMPLS.items():
        got = func(values, start, stop, ndigits)
        assert type(got) is list, name
        assert len(got) == len(expected), (name, len(got), len(expected))
        for i, (g, e) in enumerate(zip(got, expected, strict=True)):
            assert _same(g, e), (name, values[start + i], ndigits, g, e, _bits(g), _bits(e))
    return True


def test_the_module_uses_the_c_function_when_built() -> None:
    """``encoder._models.round_slice`` is the C one where it is built, else the fallback."""
    if C_ROUND_SLICE is None:
        assert hasattr(encoder._models.round_slice, "__code__")
    else:
        assert encoder._models.round_slice is C_ROUND_SLICE
        assert not hasattr(C_ROUND_SLICE, "__code__")
    assert "encoder._models_fallback" not in sys.modules


# -- values -------------------------------------------------------------------------------------

FAST_NDIGITS = st.integers(0, 22)
OTHER_NDIGITS = st.sampled_from([-400, -309, -308, -30, -3, -1, 23, 25, 30, 300, 323, 400])
NDIGITS = st.one_of(FAST_NDIGITS, FAST_NDIGITS, OTHER_NDIGITS)


@st.composite
def near_ties(draw: st.DrawFn, ndigits: int) -> list[float]:
    """(k + 0.5) / 10**d, and a few doubles either side of it, with either sign; k from tiny
    to past 2**51 (so that the scaled value leaves the fast path)."""
    d = max(0, min(ndigits, 22))
    digits = draw(st.integers(0, 18))
    k = draw(st.integers(0, 10**digits))
    x = (k + 0.5) / 10**d
    if draw(st.booleans()):
        x = -x
    out = [x]
    for direction in (math.inf, -math.inf):
        y = x
        for _ in range(draw(st.integers(1, 4))):
            y = math.nextafter(y, direction)
            out.append(y)
    # The exact decimal tie, read as the nearest double (differs from x for large k).
    out.append(float(f"{'-' if x < 0 else ''}{k}.5e-{d}"))
    return out


@st.composite
def scaled_near_2_51(draw: st.DrawFn, ndigits: int) -> float:
    """A value whose product with 10**d lies between 2**42 and 2**65: around the fast path's
    bound (2**51), where the double nearest the product may be a different integer."""
    d = max(0, min(ndigits, 22))
    m = draw(st.integers(2**52, 2**53 - 1))
    x = math.ldexp(m, draw(st.integers(-10, 12))) / float(10**d)
    return -x if draw(st.booleans()) else x


subnormals = st.builds(
    lambda mantissa, negative: _double(mantissa | (negative << 63)),
    st.integers(1, 2**52 - 1),
    st.booleans(),
)
any_bits = st.integers(0, 2**64 - 1).map(_double)  # NaNs with payloads, infinities, all
huge = st.builds(
    lambda m, e, negative: math.ldexp(m, e) * (-1 if negative else 1),
    st.integers(2**52, 2**53 - 1),
    st.integers(-52 - 75, 971),  # from ~2**-75 (scaled by 1e22: past 2**51) up to DBL_MAX
    st.booleans(),
)
specials = st.sampled_from(
    [
        0.0,
        -0.0,
        math.nan,
        -math.nan,
        math.inf,
        -math.inf,
        5e-324,
        -5e-324,
        2.2250738585072014e-308,
        1.7976931348623157e308,
        -1.7976931348623157e308,
        0.5,
        -0.5,
        1.5,
        2.5,
        -2.5,
        2.675,
        1.005,
        0.125,
        0.375,
        2.0**51,
        2.0**51 + 0.5,
        2.0**52 - 0.5,
        -(2.0**51) - 0.5,
        4503599627370495.5,
        1e22,
        1e23,
        1e-22,
        0.49999999999999994,
        -0.49999999999999994,
    ]
)
plain_floats = st.floats(allow_nan=True, allow_infinity=True, allow_subnormal=True)


@st.composite
def float_lists(draw: st.DrawFn, ndigits: int) -> list[float]:
    values: list[float] = []
    for _ in range(draw(st.integers(1, 6))):
        kind = draw(st.integers(0, 6))
        if kind == 0:
            values.extend(draw(near_ties(ndigits)))
        elif kind == 6:
            values.extend(draw(st.lists(scaled_near_2_51(ndigits), min_size=1, max_size=8)))
        elif kind == 1:
            values.append(draw(subnormals))
        elif kind == 2:
            values.append(draw(huge))
        elif kind == 3:
            values.append(draw(specials))
        elif kind == 4:
            values.append(draw(any_bits))
        else:
            values.append(draw(plain_floats))
    return values


# -- properties ----------------------------------------------------------------------------------


@settings(max_examples=1500, deadline=None)
@given(data=st.data(), ndigits=NDIGITS)
def test_floats_round_as_python_does(data: st.DataObject, ndigits: int) -> None:
    values = data.draw(float_lists(ndigits))
    assert_rounds(values, ndigits)


@settings(max_examples=1000, deadline=None)
@given(data=st.data(), ndigits=FAST_NDIGITS)
def test_near_ties_on_the_fast_path(data: st.DataObject, ndigits: int) -> None:
    values = data.draw(near_ties(ndigits))
    assert_rounds(values, ndigits)


@settings(max_examples=500, deadline=None)
@given(values=st.lists(st.one_of(subnormals, huge), min_size=1, max_size=20), ndigits=NDIGITS)
def test_subnormals_and_huge_values(values: list[float], ndigits: int) -> None:
    assert_rounds(values, ndigits)


@pytest.mark.parametrize("ndigits", [*range(23), -3, -1, 25, 300])
def test_every_tie_of_a_range(ndigits: int) -> None:
    """Deterministic: (k + 0.5) / 10**d for k in a few ranges (small, around 10**d, and where
    the scaled value nears 2**51), each with its two neighbouring doubles, both signs."""
    d = max(0, min(ndigits, 22))
    ks = [*range(200), *range(10**6 - 100, 10**6 + 100), *range(2**51 - 100, 2**51 + 100)]
    values: list[float] = []
    for k in ks:
        x = (k + 0.5) / 10**d
        for y in (x, math.nextafter(x, math.inf), math.nextafter(x, -math.inf)):
            values.append(y)
            values.append(-y)
    assert_rounds(values, ndigits)


def test_signed_zero_and_non_finite(round_slice: RoundSlice) -> None:
    values = [-0.0, 0.0, -0.001, -0.4, math.inf, -math.inf, math.nan]
    for ndigits in (0, 2, 22, 25, -3):
        got = round_slice(values, 0, len(values), ndigits)
        assert _bits(got[0]) == _bits(-0.0)
        assert _bits(got[1]) == _bits(0.0)
        assert _bits(got[2]) == _bits(float(round(-0.001, ndigits))), ndigits
        if ndigits in (0, 2, -3):  # rounds to a negative zero, not to 0.0
            assert _bits(got[2]) == _bits(-0.0), ndigits
        assert _bits(got[3]) == _bits(float(round(-0.4, ndigits)))
        assert got[4] == math.inf
        assert got[5] == -math.inf
        assert math.isnan(got[6])


@settings(max_examples=500, deadline=None)
@given(
    values=st.lists(st.one_of(plain_floats, specials), max_size=12),
    start=st.integers(0, 16),
    stop=st.integers(0, 16),
    ndigits=NDIGITS,
)
def test_slices_are_clamped(values: list[float], start: int, stop: int, ndigits: int) -> None:
    """Non-negative bounds past the end (or ``start > stop``) are clamped as slicing does."""
    assert_rounds(values, ndigits, start, stop)


@pytest.mark.parametrize(("start", "stop"), [(-2, 3), (0, -1), (-3, -1)])
def test_negative_bounds_are_slice_bounds(start: int, stop: int) -> None:
    values: list[Any] = [1.25, 2.5, 3.75]
    assert C_ROUND_SLICE is not None
    assert C_ROUND_SLICE(values, start, stop, 1) == FALLBACK(values, start, stop, 1)


@settings(max_examples=500, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.booleans(), st.integers(-(2**70), 2**70), plain_floats), max_size=12
    ),
    ndigits=NDIGITS,
)
def test_ints_and_bools_become_floats(values: list[Any], ndigits: int) -> None:
    if assert_rounds(values, ndigits):  # else round overflows, as each implementation does
        for func in IMPLS.values():
            assert all(type(v) is float for v in func(values, 0, len(values), ndigits))


@pytest.mark.parametrize(("value", "ndigits"), [(True, 0), (False, 3), (7, 2), (15, -1), (25, -1)])
def test_int_and_bool_values(round_slice: RoundSlice, value: Any, ndigits: int) -> None:
    (got,) = round_slice([value], 0, 1, ndigits)
    assert type(got) is float
    assert got == float(round(value, ndigits))


@pytest.mark.parametrize(
    ("value", "ndigits"), [(10**400, 2), (1.7976931348623157e308, -308), (-1.7e308, -308)]
)
def test_overflow_raises_as_round_does(round_slice: RoundSlice, value: Any, ndigits: int) -> None:
    """An int too large for a float, or a float rounded past the largest double."""
    with pytest.raises(OverflowError):
        float(round(value, ndigits))
    with pytest.raises(OverflowError):
        round_slice([1.0, value], 0, 2, ndigits)


class _MyFloat(float):
    pass


def test_float_subclasses_round_as_floats(round_slice: RoundSlice) -> None:
    values = [_MyFloat(2.675), _MyFloat(-0.5), _MyFloat(1e300)]
    for ndigits in (0, 2, 25, -3):
        got = round_slice(values, 0, 3, ndigits)
        assert [type(g) for g in got] == [float] * 3
        assert [_bits(g) for g in got] == [_bits(float(round(v, ndigits))) for v in values]


@pytest.mark.parametrize("bad", ["1.5", None, Decimal("1.5"), 1j, [1.5], b"1"])
def test_anything_else_raises_type_error(round_slice: RoundSlice, bad: Any) -> None:
    values = [1.5, 2.5, bad, 3.5]
    with pytest.raises(TypeError, match=type(bad).__name__):
        round_slice(values, 0, 4, 1)
    # Outside the slice it is not looked at.
    assert round_slice(values, 0, 2, 1) == [1.5, 2.5]
    assert round_slice(values, 3, 4, 0) == [4.0]


def test_a_new_list_every_time(round_slice: RoundSlice) -> None:
    values = [1.0, 2.0]
    first = round_slice(values, 0, 2, 3)
    second = round_slice(values, 0, 2, 3)
    assert first == second == values
    assert first is not values
    assert first is not second
    assert round_slice(values, 0, 0, 3) == []


def _chunks(n: int, size: int) -> Iterator[tuple[int, int]]:
    for i in range(0, n, size):
        yield i, i + size


def test_a_long_list_by_slices(round_slice: RoundSlice) -> None:
    """The way the walk reads per-token floats: slice after slice of one long list."""
    values = [((i * 7919) % 100_003) / 997 - 50.0 for i in range(20_000)]
    values[100:120] = [(k + 0.5) / 1e4 for k in range(20)]
    joined: list[float] = []
    for start, stop in _chunks(len(values), 777):
        joined.extend(round_slice(values, start, stop, 4))
    expected = [round(v, 4) for v in values]
    assert [_bits(x) for x in joined] == [_bits(x) for x in expected]


@pytest.mark.parametrize("ndigits", [2**63, -(2**63) - 1, 10**30])
def test_ndigits_beyond_a_c_long(ndigits: int) -> None:
    values: list[Any] = [1.5, -2.5, 1e300]
    expected = [float(round(v, ndigits)) for v in values]
    assert [_bits(x) for x in FALLBACK(values, 0, 3, ndigits)] == [_bits(x) for x in expected]
    assert C_ROUND_SLICE is not None
    assert [_bits(x) for x in C_ROUND_SLICE(values, 0, 3, ndigits)] == [_bits(x) for x in expected]


@settings(max_examples=200, deadline=None)
@given(
    values=st.lists(
        st.one_of(st.booleans(), st.integers(-(2**60), 2**60), plain_floats, specials), max_size=12
    )
)
def test_no_ndigits_is_each_value_as_a_float(values: list[Any]) -> None:
    """``ndigits=None``: what pydantic writes into a float field (verifiers' per-token floats
    with ``float_decimals=None``): floats as they are, ints and bools as floats."""
    for impl in IMPLS.values():
        got = impl(values, 0, len(values), None)  # type: ignore[arg-type]
        assert [_bits(x) for x in got] == [_bits(float(v)) for v in values]
        assert all(type(x) is float for x in got)
