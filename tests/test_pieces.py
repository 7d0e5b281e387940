"""Every value cut into pieces: the walk under tiny ``Limits`` writes orjson's bytes.

With default limits most values go to orjson in one call, so the walk's own paths (element
by element, strings in slices, numbers in slices, arrays row by row, big dicts sorted in runs
and merged) only meet large documents. Tiny limits make them meet every value: each test
here checks the bare walk, the sync driver loop (``_iterencode``, down to 1-byte chunks) and
the async one (``_aiterencode``, under asyncio and trio) against ``orjson.dumps``; where
orjson raises, each raises ``EncodeError`` with orjson's message.

Not generated here (documented differences): nesting deeper than 254 and cycles.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import anyio
import numpy as np
import orjson
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context
from strategies import (
    SMALLEST,
    Boom,
    Countdown,
    Custom,
    Fanout,
    MyInt,
    Relay,
    any_values,
    big_dicts,
    budgets,
    chain_default,
    chain_lengths,
    chain_values,
    check_chunks,
    chunk_sizes,
    custom_default,
    dataclass_default,
    dataclass_values,
    datetime_default,
    datetime_options,
    datetime_values,
    defaults,
    hard_strings,
    json_values,
    numpy_values,
    options,
    orjson_or_error,
    short_strings,
    small_json,
    small_leaves,
    tolist_default,
)

from encoder import EncodeError
from encoder._chunks import Chunker
from encoder._settings import Limits
from encoder._walk import AnextRequest, Walker
from encoder.aio import _aiterencode
from encoder.sync import _iterencode

#: Limits small enough that every value is cut into pieces: containers walked element by
#: element, strings sliced, number lists and arrays sliced, big dicts sorted in runs.
tiny_limits = st.builds(
    Limits,
    group_bytes=st.integers(1, 400),
    str_bytes=st.integers(1, 64),
    number_bytes=st.integers(1, 200),
    max_group=st.integers(1, 8),
    plan_elements=st.integers(1, 32),
    sort_run=st.integers(1, 8),
    model_list=st.integers(0, 20),
)

#: For the broad strategies (test_parity runs them at full size with the default limits):
#: under tiny limits each example is thousands of steps, four times over, so half as many.
broad = settings(max_examples=max(10, settings().max_examples // 2))

#: Chunk sizes, 1 often.
piece_chunk_sizes = st.one_of(st.just(1), st.integers(1, 64), chunk_sizes)

#: orjson's options, or None (which orjson reads as 0).
options_or_none = st.one_of(options, st.none())

Run = Callable[[], bytes]


def joined(walker: Walker) -> bytes:
    """The whole document from the bare walk (the pieces are bytes or memoryviews)."""
    pieces = []
    for piece in walker:
        assert not isinstance(piece, AnextRequest)
        pieces.append(piece)
    return b"".join(pieces)


def _drivers(
    make: Callable[[], Any],
    *,
    option: int | None,
    default: Callable[[Any], Any] | None,
    limits: Limits,
    chunk_size: int,
    budget: float,
) -> dict[str, Run]:
    """Each way of running the walk, as a call that returns the whole document."""

    def walker(allow_async: bool = False) -> Walker:
        return Walker(
            make(), option=option, default=default, limits=limits, allow_async=allow_async
        )

    def walk() -> bytes:
        return joined(walker())

    def sync() -> bytes:
        chunks = list(_iterencode(walker(), Chunker(chunk_size)))
        check_chunks(chunks, chunk_size)
        return b"".join(chunks)

    def in_loop(backend: str) -> Run:
        def run() -> bytes:
            async def main() -> list[bytes]:
                out: list[bytes] = []
                async with aclosing(
                    _aiterencode(walker(allow_async=True), Chunker(chunk_size), budget)
                ) as chunks:
                    async for chunk in chunks:
                        out.append(chunk)
                return out

            chunks = anyio.run(main, backend=backend)
            check_chunks(chunks, chunk_size)
            return b"".join(chunks)

        return run

    return {
        "walk": walk,
        "iterencode": sync,
        "asyncio": in_loop("asyncio"),
        "trio": in_loop("trio"),
    }


def assert_pieces(
    value: Any,
    *,
    option: int | None = 0,
    default: Callable[[Any], Any] | None = None,
    limits: Limits = SMALLEST,
    chunk_size: int = 1,
    budget: float = 1e-4,
    fresh: bool = False,
) -> bytes | None:
    """The walk under ``limits``, by every driver, against orjson; returns orjson's bytes
    (None where it raised). ``fresh``: each run gets its own deep copy of ``value`` (for
    values a ``default`` changes)."""

    def make() -> Any:
        return copy.deepcopy(value) if fresh else value

    # (Without ``default=None``: given it, orjson words some errors differently.)
    kwargs = {"default": default} if default is not None else {}
    expected, err = orjson_or_error(make(), option=option, **kwargs)
    if currently_in_test_context():
        event("orjson raised" if err is not None else "orjson wrote")
    # Tiny chunks, slices and budgets are for small documents: a megabyte cut into bytes
    # proves no more than a kilobyte does, and takes a minute. At most a few thousand chunks,
    # a few thousand steps and a turn of the loop every 0.1 ms for the large ones.
    size = len(expected or b"")
    chunk_size = max(chunk_size, size // 5000)
    if size > 8_000:
        least = size // 4_000
        limits = dataclasses.replace(
            limits,
            group_bytes=max(limits.group_bytes, least),
            str_bytes=max(limits.str_bytes, least),
            number_bytes=max(limits.number_bytes, least),
        )
        budget = max(budget, 1e-4)
    runs = _drivers(
        make, option=option, default=default, limits=limits, chunk_size=chunk_size, budget=budget
    )
    if err is None:
        for name, run in runs.items():
            assert run() == expected, name
        return expected
    paths = set()
    for name, run in runs.items():
        with pytest.raises(EncodeError) as info:
            run()
        ours = info.value
        assert isinstance(ours, TypeError)
        assert ours.path.startswith("$"), (name, ours.path)
        assert ours.message == str(err), name
        if default is None:
            assert ours.__cause__ is None, name
        else:
            theirs = err.__cause__
            assert type(ours.__cause__) is type(theirs), name
            assert getattr(ours.__cause__, "args", None) == getattr(theirs, "args", None), name
        paths.add(ours.path)
    assert len(paths) == 1, paths  # every driver names the same node
    return None


# -- the shared strategies ------------------------------------------------------------------------


@broad
@given(
    value=json_values(),
    option=options_or_none,
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
    budget=budgets,
)
def test_json_values_in_pieces(
    value: Any, option: int | None, limits: Limits, chunk_size: int, budget: float
) -> None:
    assert_pieces(value, option=option, limits=limits, chunk_size=chunk_size, budget=budget)


@broad
@given(
    value=any_values(errors=False),
    option=st.one_of(options, options.map(lambda o: o | orjson.OPT_SERIALIZE_NUMPY)),
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_any_values_in_pieces(value: Any, option: int, limits: Limits, chunk_size: int) -> None:
    """Subclasses, dataclasses, datetimes, enums, uuids, numpy, fragments, and objects a
    ``default`` turns into JSON."""
    assert_pieces(
        value, option=option, default=custom_default, limits=limits, chunk_size=chunk_size
    )


@broad
@given(
    value=any_values(),
    option=options_or_none,
    default=defaults,
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_refused_leaves_in_pieces(
    value: Any, option: int | None, default: Any, limits: Limits, chunk_size: int
) -> None:
    """Values that may hold leaves orjson refuses: the same bytes, or the same error."""
    assert_pieces(value, option=option, default=default, limits=limits, chunk_size=chunk_size)


# -- dataclasses ----------------------------------------------------------------------------------


@given(
    value=dataclass_values(),
    option=st.one_of(options, options.map(lambda o: o | orjson.OPT_PASSTHROUGH_DATACLASS)),
    default=st.sampled_from([None, custom_default, dataclass_default]),
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_dataclasses_in_pieces(
    value: Any, option: int, default: Any, limits: Limits, chunk_size: int
) -> None:
    """Plain, slotted, ``__slots__`` over a ``__dict__`` base, inherited, frozen, with
    private/ClassVar/InitVar fields, undecorated subclasses, extra attributes."""
    assert_pieces(value, option=option, default=default, limits=limits, chunk_size=chunk_size)


# -- default chains -------------------------------------------------------------------------------


@given(
    value=chain_values(),
    option=options_or_none,
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_default_chains_in_pieces(
    value: Any, option: int | None, limits: Limits, chunk_size: int
) -> None:
    """``default`` answering with itself changed, with fresh objects, with containers of
    objects that need it again, or raising."""
    assert_pieces(
        value,
        option=option,
        default=chain_default,
        limits=limits,
        chunk_size=chunk_size,
        fresh=True,
    )


def _wrap(kind: str, obj: Any) -> Any:
    if kind == "top":
        return obj
    if kind == "list":
        return [1, "x" * 30, obj, 2]
    if kind == "dict":
        return {"a": [None, {"b": obj}], "z": "y" * 30}
    return [[[[obj]]]]


wraps = st.sampled_from(["top", "list", "dict", "deep"])


@given(
    n=st.one_of(st.sampled_from([0, 1, 2, 253, 254, 255, 256]), chain_lengths),
    wrap=wraps,
    payload=small_json,
    kind=st.sampled_from([Countdown, Relay]),
    limits=tiny_limits,
)
def test_default_chain_limit_in_pieces(
    n: int, wrap: str, payload: Any, kind: type, limits: Limits
) -> None:
    """``default`` may answer with something that needs it again 254 times, not 255."""
    value = _wrap(wrap, kind(n, payload))
    expected = assert_pieces(value, default=chain_default, limits=limits, fresh=True)
    assert (expected is not None) == (n <= 254)


@given(
    depth=st.integers(0, 5),
    width=st.integers(1, 3),
    payload=st.one_of(
        small_leaves, st.builds(Relay, st.integers(0, 5), small_leaves), st.just(Boom("deep"))
    ),
    wrap=wraps,
    option=options_or_none,
    limits=tiny_limits,
)
def test_default_returning_containers_in_pieces(
    depth: int, width: int, payload: Any, wrap: str, option: int | None, limits: Limits
) -> None:
    assert_pieces(
        _wrap(wrap, Fanout(depth, width, payload)),
        option=option,
        default=chain_default,
        limits=limits,
        fresh=True,
    )


@given(wrap=wraps, limits=tiny_limits, chunk_size=piece_chunk_sizes)
def test_default_raising_in_pieces(wrap: str, limits: Limits, chunk_size: int) -> None:
    """orjson's message for the object, and the raised exception as ``__cause__``."""
    boom = ValueError("no thanks")

    def default(obj: Any) -> Any:
        if isinstance(obj, Custom):
            return obj.payload
        raise boom

    value = _wrap(wrap, Custom([Custom(Boom("x"))]))
    with pytest.raises(orjson.JSONEncodeError) as theirs:
        orjson.dumps(value, default=default)
    assert theirs.value.__cause__ is boom
    runs = _drivers(
        lambda: value, option=0, default=default, limits=limits, chunk_size=chunk_size, budget=1e-4
    )
    for name, run in runs.items():
        with pytest.raises(EncodeError) as info:
            run()
        assert info.value.message == str(theirs.value) == "Type is not JSON serializable: Boom"
        assert info.value.__cause__ is boom, name


# -- numpy ----------------------------------------------------------------------------------------


@given(
    value=numpy_values(),
    option=st.one_of(options.map(lambda o: o | orjson.OPT_SERIALIZE_NUMPY), options),
    default=st.sampled_from([None, custom_default, tolist_default]),
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_numpy_in_pieces(
    value: Any, option: int, default: Any, limits: Limits, chunk_size: int
) -> None:
    """Arrays of every dtype orjson writes, 0 to 3 dimensions, C-contiguous or not, native
    or swapped byte order; numpy scalars and 0-d arrays."""
    assert_pieces(value, option=option, default=default, limits=limits, chunk_size=chunk_size)


@pytest.mark.parametrize("dtype", ["longlong", "ulonglong"])
@pytest.mark.parametrize("shape", [(3,), (2, 3), (25,)])
def test_numpy_long_long_arrays_in_pieces(dtype: str, shape: tuple[int, ...]) -> None:
    """orjson writes an array of C ``long long`` (its scalars it refuses)."""
    array = np.arange(np.prod(shape)).astype(dtype).reshape(shape)
    option = orjson.OPT_SERIALIZE_NUMPY
    assert orjson.dumps(array, option=option) == orjson.dumps(array.tolist())
    assert assert_pieces(array, option=option) is not None
    assert assert_pieces([array], option=option) is not None


@pytest.mark.parametrize(
    "array",
    [
        np.array(0.5),
        np.arange(6.0)[::2],
        np.arange(6).reshape(2, 3).T,
        np.array([1 + 2j]),
        np.array([1.5], dtype=np.longdouble),
    ],
    ids=["zero-d", "strided", "transposed", "complex", "longdouble"],
)
@pytest.mark.parametrize("big", [False, True])
def test_default_failing_on_refused_array_in_pieces(array: np.ndarray, big: bool) -> None:
    """An array orjson will not write itself goes to ``default``; when that fails too, the
    message is orjson's ("Type is not JSON serializable: numpy.ndarray"), under tiny and
    under default limits."""
    value = [array, "x" * 200_000] if big else [array]
    option = orjson.OPT_SERIALIZE_NUMPY
    assert assert_pieces(value, option=option, default=custom_default) is None
    assert assert_pieces(value, option=option, default=custom_default, limits=Limits()) is None
    with pytest.raises(orjson.JSONEncodeError, match=r"^Type is not JSON serializable: numpy"):
        orjson.dumps(value, option=option, default=custom_default)


# -- datetimes ------------------------------------------------------------------------------------


@given(
    value=datetime_values(),
    option=datetime_options,
    default=st.sampled_from([None, datetime_default]),
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_datetimes_in_pieces(
    value: Any, option: int, default: Any, limits: Limits, chunk_size: int
) -> None:
    """Naive and aware datetimes, dates and times, as values and keys, under every
    combination of OPT_NAIVE_UTC, OPT_OMIT_MICROSECONDS, OPT_UTC_Z, OPT_PASSTHROUGH_DATETIME."""
    assert_pieces(value, option=option, default=default, limits=limits, chunk_size=chunk_size)


# -- big sorted dicts, keys of every kind, hard strings -------------------------------------------


@broad
@given(
    value=big_dicts(),
    option=options.map(lambda o: o | orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS),
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_big_sorted_dicts_in_pieces(
    value: dict[Any, Any], option: int, limits: Limits, chunk_size: int
) -> None:
    """Hundreds of keys of mixed kinds (int, float, bool, None, str, long str, enum,
    datetime, date, time, uuid), sorted in runs and merged as orjson sorts: by the text."""
    assert_pieces(value, option=option, limits=limits, chunk_size=chunk_size)


@broad
@given(
    value=big_dicts(str_keys=True),
    option=options.map(lambda o: o | orjson.OPT_SORT_KEYS),
    wrap=st.booleans(),
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_big_sorted_str_dicts_in_pieces(
    value: dict[Any, Any], option: int, wrap: bool, limits: Limits, chunk_size: int
) -> None:
    """Hundreds of str keys, short and long, sorted without OPT_NON_STR_KEYS."""
    document: Any = [value, {"n": value}] if wrap else value
    assert_pieces(document, option=option, limits=limits, chunk_size=chunk_size)


@pytest.mark.parametrize(
    "option", [orjson.OPT_SORT_KEYS, orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS]
)
@pytest.mark.parametrize("limits", [SMALLEST, Limits()], ids=["smallest", "default"])
def test_sorted_dict_reports_a_bad_key_before_values(option: int, limits: Limits) -> None:
    """With OPT_SORT_KEYS orjson reads every key of a dict (to sort them) before it writes
    any value: a bad key is the error, not a bad value sorted before it."""
    value = {"a": 2**64, "\ud800": 1, "pad": "p" * 200_000}
    with pytest.raises(orjson.JSONEncodeError, match="surrogates not allowed"):
        orjson.dumps(value, option=option)
    assert assert_pieces(value, option=option, limits=limits) is None


hard_values = st.recursive(
    st.one_of(hard_strings, small_leaves),
    lambda kids: st.one_of(
        st.lists(kids, max_size=5),
        st.dictionaries(st.one_of(hard_strings, short_strings), kids, max_size=5),
    ),
    max_leaves=8,
)


@given(
    value=hard_values,
    option=options_or_none,
    limits=tiny_limits,
    chunk_size=piece_chunk_sizes,
)
def test_hard_strings_in_pieces(
    value: Any, option: int | None, limits: Limits, chunk_size: int
) -> None:
    """Escape-heavy, astral and long strings as values and keys (sliced anywhere, even
    inside a 4-byte character); lone surrogates raise."""
    assert_pieces(value, option=option, limits=limits, chunk_size=chunk_size)


# -- options --------------------------------------------------------------------------------------

#: Any int as an option: orjson refuses unknown bits (and reads a few odd ints as valid).
int_options = st.one_of(
    st.integers(0, 1 << 13),
    st.integers(-(2**33), 2**33),
    st.integers(-(2**70), 2**70),
    st.builds(lambda k, o: k * 2**32 + o, st.integers(-4, 4), options),
)
#: Options that are not ints (None is 0; the rest orjson refuses).
odd_options: st.SearchStrategy[Any] = st.sampled_from(
    [None, True, False, 1.0, "1", b"", [], MyInt(0), MyInt(1)]
)


@given(value=small_json, option=st.one_of(int_options, odd_options), limits=tiny_limits)
def test_any_option_in_pieces(value: Any, option: Any, limits: Limits) -> None:
    """Both accept the same options, and write the same for them; or both raise."""
    assert_pieces(value, option=option, limits=limits)


@given(value=small_json, limits=tiny_limits, chunk_size=piece_chunk_sizes)
def test_option_none_is_zero_in_pieces(value: Any, limits: Limits, chunk_size: int) -> None:
    expected = assert_pieces(value, option=None, limits=limits, chunk_size=chunk_size)
    assert expected == orjson.dumps(value, option=0)


@pytest.mark.parametrize(
    "option", [-1, 1 << 12, 1 << 20, 2**32 - 1, True, 1.0, "1", [], MyInt(1)], ids=repr
)
def test_invalid_options_in_pieces(option: Any) -> None:
    values: list[Any] = [[], {"a": [1, "x" * 50]}]
    for value in values:
        with pytest.raises(orjson.JSONEncodeError, match="Invalid opts"):
            orjson.dumps(value, option=option)
        assert assert_pieces(value, option=option) is None
