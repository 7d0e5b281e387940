"""orjson's documented behaviours, as examples, through every driver.

Each group follows a section of orjson's README (github.com/ijl/orjson, README.md), with
values of our own. Every example states the bytes the README documents for it, checks that
orjson itself writes them (so the example is right about orjson), then that each driver
writes them too: ``encode``, ``iterencode`` (1-byte and default chunks), ``aiterencode``
under asyncio and trio, and the walk itself under the smallest ``Limits`` (bare, and driven
by the sync and async loops), since ``encode`` hands a value orjson accepts to orjson whole.
"""

from __future__ import annotations

import copy
import dataclasses
import datetime as dt
import decimal
import enum
import typing
import uuid
import zoneinfo
from collections.abc import Callable
from contextlib import aclosing
from typing import Any

import anyio
import numpy as np
import orjson
import pytest
from strategies import SMALLEST, collect_async, nest

from encoder import EncodeError, encode, iterencode
from encoder._chunks import Chunker
from encoder._walk import AnextRequest, Walker
from encoder.aio import _aiterencode
from encoder.sync import _iterencode


def _tiny_walk(value: Any, **kwargs: Any) -> bytes:
    pieces = []
    for piece in Walker(value, limits=SMALLEST, **kwargs):
        assert not isinstance(piece, AnextRequest)
        pieces.append(piece)
    return b"".join(pieces)


def _tiny_iterencode(value: Any, **kwargs: Any) -> bytes:
    return b"".join(_iterencode(Walker(value, limits=SMALLEST, **kwargs), Chunker(1)))


def _tiny_aiterencode(backend: str) -> Callable[..., bytes]:
    def run(value: Any, **kwargs: Any) -> bytes:
        async def main() -> bytes:
            walker = Walker(value, limits=SMALLEST, allow_async=True, **kwargs)
            out = []
            async with aclosing(_aiterencode(walker, Chunker(3), 1e-6)) as chunks:
                async for chunk in chunks:
                    out.append(chunk)
            return b"".join(out)

        return anyio.run(main, backend=backend)

    return run


DRIVERS: dict[str, Callable[..., bytes]] = {
    "encode": encode,
    "iterencode-1": lambda v, **kw: b"".join(iterencode(v, chunk_size=1, **kw)),
    "iterencode": lambda v, **kw: b"".join(iterencode(v, **kw)),
    "aiterencode-asyncio": lambda v, **kw: b"".join(collect_async(v, **kw)),
    "aiterencode-trio": lambda v, **kw: b"".join(collect_async(v, backend="trio", **kw)),
    "tiny-walk": _tiny_walk,
    "tiny-iterencode": _tiny_iterencode,
    "tiny-aiterencode-asyncio": _tiny_aiterencode("asyncio"),
    "tiny-aiterencode-trio": _tiny_aiterencode("trio"),
}

Driver = Callable[..., bytes]


@pytest.fixture(params=list(DRIVERS))
def run(request: pytest.FixtureRequest) -> Driver:
    return DRIVERS[request.param]


def documented(
    run: Driver, value: Any, expected: bytes, *, fresh: bool = False, **kwargs: Any
) -> None:
    """orjson writes ``expected`` for ``value``, and so does the driver. ``fresh``: each
    gets its own copy (for values ``default`` changes)."""

    def make() -> Any:
        return copy.deepcopy(value) if fresh else value

    assert orjson.dumps(make(), **kwargs) == expected
    assert run(make(), **kwargs) == expected


def documented_error(
    run: Driver, value: Any, message: str, *, fresh: bool = False, **kwargs: Any
) -> EncodeError:
    """orjson raises ``message`` for ``value``; the driver raises EncodeError (a
    TypeError) with the same message and a path."""

    def make() -> Any:
        return copy.deepcopy(value) if fresh else value

    with pytest.raises(orjson.JSONEncodeError) as theirs:
        orjson.dumps(make(), **kwargs)
    assert str(theirs.value) == message
    with pytest.raises(EncodeError) as ours:
        run(make(), **kwargs)
    assert isinstance(ours.value, TypeError)
    assert ours.value.message == message
    assert ours.value.path.startswith("$")
    return ours.value


# -- Quickstart -----------------------------------------------------------------------------------


def test_quickstart(run: Driver) -> None:
    # README "Quickstart": options combined with |, datetime, emoji, numpy in one document.
    value = {
        "kind": "task",
        "at": dt.datetime(2001, 2, 3, 4, 5, 6),
        "mood": "🙂",
        "grid": np.array([[5, 6], [7, 8]]),
    }
    documented(
        run,
        value,
        b'{"kind":"task","at":"2001-02-03T04:05:06+00:00","mood":"\xf0\x9f\x99\x82",'
        b'"grid":[[5,6],[7,8]]}',
        option=orjson.OPT_NAIVE_UTC | orjson.OPT_SERIALIZE_NUMPY,
    )


# -- Serialize ------------------------------------------------------------------------------------


class Pair(typing.NamedTuple):
    left: int
    right: int


class Shape(typing.TypedDict):
    sides: int


def test_native_types(run: Driver) -> None:
    # README "Serialize": str, dict, list, tuple, int, float, bool, None, TypedDict.
    value = {"s": "x", "d": {}, "l": [1], "t": (2, 3), "i": -4, "f": 0.5, "b": False, "n": None}
    documented(
        run,
        value,
        b'{"s":"x","d":{},"l":[1],"t":[2,3],"i":-4,"f":0.5,"b":false,"n":null}',
    )
    documented(run, [Shape(sides=3)], b'[{"sides":3}]')


def test_subclasses_serialized_but_not_tuple_subclasses(run: Driver) -> None:
    # README "Serialize": subclasses of str, int, dict, list are serialized; a tuple
    # subclass (a namedtuple) is not.
    class Name(str):
        pass

    class Count(int):
        pass

    class Bag(dict):  # type: ignore[type-arg]
        pass

    class Row(list):  # type: ignore[type-arg]
        pass

    value = [Name("ann"), Count(3), Bag(k=Row([1, 2]))]
    documented(run, value, b'["ann",3,{"k":[1,2]}]')
    documented_error(run, [Pair(1, 2)], "Type is not JSON serializable: Pair")


def test_unsupported_type(run: Driver) -> None:
    # README "Serialize": "Type is not JSON serializable: ..."
    documented_error(run, decimal.Decimal("2.50"), "Type is not JSON serializable: decimal.Decimal")
    documented_error(run, {"tags": {"a"}}, "Type is not JSON serializable: set")


def test_invalid_utf8_str(run: Driver) -> None:
    # README "Serialize" and "str": a str that is not valid UTF-8 (a lone surrogate).
    message = "str is not valid UTF-8: surrogates not allowed"
    documented_error(run, "\udc80", message)
    documented_error(run, {"k": ["ok", "a\ud83dz"]}, message)


def test_integer_range(run: Driver) -> None:
    # README "Serialize" and "int": 64 bits by default, 53 with OPT_STRICT_INTEGER.
    documented(
        run,
        [9223372036854775807, -9223372036854775808, 18446744073709551615],
        b"[9223372036854775807,-9223372036854775808,18446744073709551615]",
    )
    documented_error(run, [18446744073709551616], "Integer exceeds 64-bit range")
    documented_error(run, {"n": -9223372036854775809}, "Integer exceeds 64-bit range")


def test_dict_key_must_be_str(run: Driver) -> None:
    # README "Serialize": non-str keys need OPT_NON_STR_KEYS.
    documented_error(run, {7: "seven"}, "Dict key must be str")


def test_error_is_type_error() -> None:
    # README "Serialize": JSONEncodeError is a subclass of TypeError.
    assert issubclass(orjson.JSONEncodeError, TypeError)
    assert issubclass(EncodeError, TypeError)


def test_recursion_limit_and_beyond(run: Driver) -> None:
    # README "Serialize": "Recursion limit reached". orjson refuses nesting deeper than 254;
    # the encoder writes it (docs/encoder.md, "Beyond orjson").
    assert orjson.dumps(nest(0, 254, "list")) == b"[" * 254 + b"0" + b"]" * 254
    with pytest.raises(orjson.JSONEncodeError, match="Recursion limit reached"):
        orjson.dumps(nest(0, 255, "list"))
    assert run(nest(0, 255, "list")) == b"[" * 255 + b"0" + b"]" * 255


def test_circular_reference(run: Driver) -> None:
    # README "Serialize": circular references raise. orjson says "Recursion limit
    # reached"; the encoder names the cycle and its path (docs/encoder.md).
    loop: dict[str, Any] = {"a": [1]}
    loop["a"].append(loop)
    with pytest.raises(orjson.JSONEncodeError, match="Recursion limit reached"):
        orjson.dumps(loop)
    with pytest.raises(EncodeError) as info:
        run(loop)
    assert info.value.message == "Circular reference detected"
    assert info.value.path == "$.a[1]"


# -- default --------------------------------------------------------------------------------------


def decimal_default(obj: Any) -> Any:
    if isinstance(obj, decimal.Decimal):
        return str(obj)
    raise TypeError


def test_default(run: Driver) -> None:
    # README "default": a callable returning a supported type; raising for the rest.
    documented(
        run,
        {"price": decimal.Decimal("19.9900000000000000001")},
        b'{"price":"19.9900000000000000001"}',
        default=decimal_default,
    )
    err = documented_error(
        run,
        [decimal.Decimal(1), {3, 4}],
        "Type is not JSON serializable: set",
        default=decimal_default,
    )
    assert err.path == "$[1]"
    assert type(err.__cause__) is TypeError


def test_default_returning_none_implicitly(run: Driver) -> None:
    # README "default": a default that forgets to raise returns None, written as null.
    def lenient(obj: Any) -> Any:
        if isinstance(obj, decimal.Decimal):
            return str(obj)
        return None

    documented(
        run,
        {"set": {1, 2}, "d": decimal.Decimal("0.5")},
        b'{"set":null,"d":"0.5"}',
        default=lenient,
    )


def test_default_exception_is_the_cause(run: Driver) -> None:
    # README "Serialize": an exception raised in default is chained as __cause__.
    boom = LookupError("not mine")

    def default(obj: Any) -> Any:
        raise boom

    with pytest.raises(orjson.JSONEncodeError) as theirs:
        orjson.dumps({"x": object()}, default=default)
    assert theirs.value.__cause__ is boom
    err = documented_error(
        run, {"x": [object()]}, "Type is not JSON serializable: object", default=default
    )
    assert err.__cause__ is boom
    assert err.path == "$.x[0]"


class Hop:
    """default answers with a fresh Hop one step shorter, then with the number of hops."""

    def __init__(self, left: int, done: int = 0) -> None:
        self.left = left
        self.done = done


def hop_default(obj: Any) -> Any:
    if isinstance(obj, Hop):
        return Hop(obj.left - 1, obj.done + 1) if obj.left else obj.done
    raise TypeError


@pytest.mark.parametrize("hops", [1, 100, 254])
def test_default_may_recurse_254_times(run: Driver, hops: int) -> None:
    # README "default": default's result may need default again, up to 254 times.
    documented(run, [Hop(hops)], f"[{hops}]".encode(), default=hop_default)


@pytest.mark.parametrize("hops", [255, 400])
def test_default_recursing_too_deep(run: Driver, hops: int) -> None:
    # README "Serialize": "... recurses to handling by default more than 254 levels deep".
    documented_error(
        run, {"h": Hop(hops)}, "default serializer exceeds recursion limit", default=hop_default
    )


# -- option ---------------------------------------------------------------------------------------


def test_opt_append_newline(run: Driver) -> None:
    # README "OPT_APPEND_NEWLINE".
    documented(run, {}, b"{}")
    documented(run, {}, b"{}\n", option=orjson.OPT_APPEND_NEWLINE)
    documented(
        run,
        {"a": [1]},
        b'{\n  "a": [\n    1\n  ]\n}\n',
        option=orjson.OPT_APPEND_NEWLINE | orjson.OPT_INDENT_2,
    )


def test_opt_indent_2(run: Driver) -> None:
    # README "OPT_INDENT_2".
    value = {"x": "y", "inner": {"ok": False}, "nums": [3, 4], "empty": [], "none": {}}
    documented(run, value, b'{"x":"y","inner":{"ok":false},"nums":[3,4],"empty":[],"none":{}}')
    documented(
        run,
        value,
        b'{\n  "x": "y",\n  "inner": {\n    "ok": false\n  },\n  "nums": [\n    3,\n    4\n'
        b'  ],\n  "empty": [],\n  "none": {}\n}',
        option=orjson.OPT_INDENT_2,
    )


def test_opt_naive_utc(run: Driver) -> None:
    # README "OPT_NAIVE_UTC": naive datetimes as UTC; aware ones unchanged.
    naive = dt.datetime(1999, 12, 31, 23, 59, 59)
    aware = dt.datetime(1999, 12, 31, 23, 59, 59, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
    documented(run, [naive], b'["1999-12-31T23:59:59"]')
    documented(
        run,
        [naive, aware],
        b'["1999-12-31T23:59:59+00:00","1999-12-31T23:59:59-05:00"]',
        option=orjson.OPT_NAIVE_UTC,
    )


def test_opt_non_str_keys(run: Driver) -> None:
    # README "OPT_NON_STR_KEYS": keys of str, int, float, bool, None, datetime, date, time,
    # enum and uuid, written as they would be as values and respecting their options.
    key = uuid.UUID("12345678-1234-5678-1234-567812345678")
    documented(
        run,
        {key: ["v"]},
        b'{"12345678-1234-5678-1234-567812345678":["v"]}',
        option=orjson.OPT_NON_STR_KEYS,
    )
    documented(
        run,
        {dt.datetime(2020, 5, 17, 8, 0): 1},
        b'{"2020-05-17T08:00:00+00:00":1}',
        option=orjson.OPT_NON_STR_KEYS | orjson.OPT_NAIVE_UTC,
    )
    documented(
        run,
        {1: "i", 1.5: "f", False: "b", None: "n", dt.date(2000, 1, 2): "d", dt.time(3, 4): "t"},
        b'{"1":"i","1.5":"f","false":"b","null":"n","2000-01-02":"d","03:04:00":"t"}',
        option=orjson.OPT_NON_STR_KEYS,
    )


def test_opt_non_str_keys_int_ignores_strict_integer(run: Driver) -> None:
    # README "OPT_NON_STR_KEYS": int keys do not respect OPT_STRICT_INTEGER.
    documented(
        run,
        {2**60: 1},
        b'{"1152921504606846976":1}',
        option=orjson.OPT_NON_STR_KEYS | orjson.OPT_STRICT_INTEGER,
    )


def test_opt_non_str_keys_duplicates(run: Driver) -> None:
    # README "OPT_NON_STR_KEYS": a non-str key may write the same text as a str key; both
    # are written, in the dict's order.
    documented(
        run, {"2": "str", 2: "int"}, b'{"2":"str","2":"int"}', option=orjson.OPT_NON_STR_KEYS
    )


def test_opt_non_str_keys_sorted(run: Driver) -> None:
    # README "OPT_NON_STR_KEYS": compatible with OPT_SORT_KEYS (sorted by the key's text).
    value = {"zeta": 1, dt.date(2024, 3, 9): 2, dt.date(2024, 3, 1): 3, 10: 4, 9: 5}
    documented(
        run,
        value,
        b'{"10":4,"2024-03-01":3,"2024-03-09":2,"9":5,"zeta":1}',
        option=orjson.OPT_NON_STR_KEYS | orjson.OPT_SORT_KEYS,
    )


def test_opt_omit_microseconds(run: Driver) -> None:
    # README "OPT_OMIT_MICROSECONDS": on datetime and time.
    value = [dt.datetime(2010, 6, 7, 8, 9, 10, 42), dt.time(1, 2, 3, 999999)]
    documented(run, value, b'["2010-06-07T08:09:10.000042","01:02:03.999999"]')
    documented(
        run, value, b'["2010-06-07T08:09:10","01:02:03"]', option=orjson.OPT_OMIT_MICROSECONDS
    )


@dataclasses.dataclass
class Account:
    handle: str
    email: str
    token: str


def account_default(obj: Any) -> Any:
    if isinstance(obj, Account):
        return {"handle": obj.handle}
    raise TypeError


def test_opt_passthrough_dataclass(run: Driver) -> None:
    # README "OPT_PASSTHROUGH_DATACLASS": dataclasses go to default.
    value = Account("kim", "k@example.org", "s3cret")
    documented(run, value, b'{"handle":"kim","email":"k@example.org","token":"s3cret"}')
    documented_error(
        run,
        value,
        "Type is not JSON serializable: Account",
        option=orjson.OPT_PASSTHROUGH_DATACLASS,
    )
    documented(
        run,
        [value],
        b'[{"handle":"kim"}]',
        option=orjson.OPT_PASSTHROUGH_DATACLASS,
        default=account_default,
    )


def http_date(obj: Any) -> Any:
    if isinstance(obj, dt.datetime):
        return obj.strftime("%a, %d %b %Y %H:%M:%S GMT")
    raise TypeError


def test_opt_passthrough_datetime(run: Driver) -> None:
    # README "OPT_PASSTHROUGH_DATETIME": datetimes go to default (not in dict keys).
    value = {"seen": dt.datetime(2004, 2, 29, 13, 14, 15)}
    documented(run, value, b'{"seen":"2004-02-29T13:14:15"}')
    documented_error(
        run,
        value,
        "Type is not JSON serializable: datetime.datetime",
        option=orjson.OPT_PASSTHROUGH_DATETIME,
    )
    documented(
        run,
        value,
        b'{"seen":"Sun, 29 Feb 2004 13:14:15 GMT"}',
        option=orjson.OPT_PASSTHROUGH_DATETIME,
        default=http_date,
    )
    documented(
        run,
        {dt.datetime(2004, 2, 29): dt.datetime(2004, 2, 29)},
        b'{"2004-02-29T00:00:00":"Sun, 29 Feb 2004 00:00:00 GMT"}',
        option=orjson.OPT_PASSTHROUGH_DATETIME | orjson.OPT_NON_STR_KEYS,
        default=http_date,
    )


class Password(str):
    pass


def mask(obj: Any) -> Any:
    if isinstance(obj, Password):
        return "###"
    raise TypeError


def test_opt_passthrough_subclass(run: Driver) -> None:
    # README "OPT_PASSTHROUGH_SUBCLASS": subclasses of builtins go to default (not as keys).
    documented(run, Password("hunter2"), b'"hunter2"')
    documented_error(
        run,
        Password("hunter2"),
        "Type is not JSON serializable: Password",
        option=orjson.OPT_PASSTHROUGH_SUBCLASS,
    )
    documented(
        run,
        {"pw": Password("hunter2")},
        b'{"pw":"###"}',
        option=orjson.OPT_PASSTHROUGH_SUBCLASS,
        default=mask,
    )
    documented(
        run,
        {Password("key"): Password("value")},
        b'{"key":"###"}',
        option=orjson.OPT_PASSTHROUGH_SUBCLASS | orjson.OPT_NON_STR_KEYS,
        default=mask,
    )


def test_opt_serialize_dataclass_and_uuid_have_no_effect(run: Driver) -> None:
    # README "OPT_SERIALIZE_DATACLASS", "OPT_SERIALIZE_UUID": deprecated, no effect.
    value = [Account("a", "b", "c"), uuid.UUID(int=1)]
    expected = b'[{"handle":"a","email":"b","token":"c"},"00000000-0000-0000-0000-000000000001"]'
    documented(run, value, expected)
    documented(run, value, expected, option=orjson.OPT_SERIALIZE_DATACLASS)
    documented(run, value, expected, option=orjson.OPT_SERIALIZE_UUID)


def test_opt_sort_keys(run: Driver) -> None:
    # README "OPT_SORT_KEYS": sorted; not collation/locale aware.
    documented(run, {"m": 1, "z": 2, "a": 3}, b'{"m":1,"z":2,"a":3}')
    documented(run, {"m": 1, "z": 2, "a": 3}, b'{"a":3,"m":1,"z":2}', option=orjson.OPT_SORT_KEYS)
    documented(
        run,
        {"é": 1, "e": 2, "E": 3, "f": 4},
        b'{"E":3,"e":2,"f":4,"\xc3\xa9":1}',
        option=orjson.OPT_SORT_KEYS,
    )


@dataclasses.dataclass
class Unsorted:
    zulu: int
    alpha: int


def test_opt_sort_keys_leaves_dataclasses_alone(run: Driver) -> None:
    # README "OPT_SORT_KEYS": dataclasses serialize as maps, but are not sorted.
    documented(
        run,
        {"b": Unsorted(1, 2), "a": 0},
        b'{"a":0,"b":{"zulu":1,"alpha":2}}',
        option=orjson.OPT_SORT_KEYS,
    )


def test_opt_strict_integer(run: Driver) -> None:
    # README "OPT_STRICT_INTEGER" and "int": the 53-bit limit.
    documented(run, [2**53], b"[9007199254740992]")
    documented(
        run,
        [2**53 - 1, -(2**53) + 1],
        b"[9007199254740991,-9007199254740991]",
        option=orjson.OPT_STRICT_INTEGER,
    )
    for n in (2**53, -(2**53)):
        documented_error(run, [n], "Integer exceeds 53-bit range", option=orjson.OPT_STRICT_INTEGER)


def test_opt_utc_z(run: Driver) -> None:
    # README "OPT_UTC_Z": a UTC timezone written as Z.
    value = [
        dt.datetime(2033, 4, 5, 6, 7, 8, tzinfo=zoneinfo.ZoneInfo("UTC")),
        dt.datetime(2033, 4, 5, 6, 7, 8, tzinfo=dt.timezone.utc),
    ]
    documented(run, value, b'["2033-04-05T06:07:08+00:00","2033-04-05T06:07:08+00:00"]')
    documented(
        run, value, b'["2033-04-05T06:07:08Z","2033-04-05T06:07:08Z"]', option=orjson.OPT_UTC_Z
    )


def test_invalid_option(run: Driver) -> None:
    # README "option": each option is an int constant of orjson; others are refused.
    for option in (1 << 12, -1, 1.0, "4"):
        documented_error(run, [], "Invalid opts", option=option)


# -- Fragment -------------------------------------------------------------------------------------


def test_fragment(run: Driver) -> None:
    # README "Fragment": included as it is, from bytes or str, never reformatted.
    value = {"id": 5, "cached": orjson.Fragment(b'{"x": [1,  2], "y": null}')}
    documented(run, value, b'{"id":5,"cached":{"x": [1,  2], "y": null}}')
    documented(
        run,
        [orjson.Fragment("[true]"), orjson.Fragment(b"{\n}")],
        b"[\n  [true],\n  {\n}\n]",
        option=orjson.OPT_INDENT_2,
    )


def test_fragment_not_validated_nor_escaped(run: Driver) -> None:
    # README "Fragment": no validation, no escaping.
    documented(run, [orjson.Fragment(b'"\n'), orjson.Fragment("{")], b'["\n,{]')


def test_fragment_str_must_be_utf8(run: Driver) -> None:
    # README "Fragment": a str input that is not valid UTF-8 raises.
    documented_error(
        run, [orjson.Fragment("\ud800")], "str is not valid UTF-8: surrogates not allowed"
    )


# -- dataclass ------------------------------------------------------------------------------------


@dataclasses.dataclass
class Seat:
    row: int
    taken: bool = dataclasses.field(default=False)


@dataclasses.dataclass
class Hall:
    name: str
    seats: list[Seat]


@dataclasses.dataclass(slots=True, frozen=True)
class SlottedFrozen:
    a: int
    b: str = "b"


@dataclasses.dataclass
class ChildHall(Hall):
    floor: int = 0


def test_dataclass(run: Driver) -> None:
    # README "dataclass": maps, every attribute, in the order of the class definition.
    value = Hall("main", [Seat(3, True), Seat(4)])
    documented(
        run, value, b'{"name":"main","seats":[{"row":3,"taken":true},{"row":4,"taken":false}]}'
    )


def test_dataclass_variants(run: Driver) -> None:
    # README "dataclass": __slots__, frozen, optional/default attributes, subclasses.
    value = [SlottedFrozen(1), ChildHall("side", [], 2)]
    documented(run, value, b'[{"a":1,"b":"b"},{"name":"side","seats":[],"floor":2}]')


# -- datetime -------------------------------------------------------------------------------------


def test_datetime(run: Driver) -> None:
    # README "datetime": RFC 3339, as isoformat(); zoneinfo, timezone.utc, naive.
    value = [
        dt.datetime(2019, 11, 2, 3, 4, 5, 6, tzinfo=zoneinfo.ZoneInfo("Asia/Kolkata")),
        dt.datetime(2077, 1, 2, 3, 4, 5).replace(tzinfo=zoneinfo.ZoneInfo("UTC")),
        dt.datetime(2077, 1, 2, 3, 4, 5),
    ]
    documented(
        run,
        value,
        b'["2019-11-02T03:04:05.000006+05:30","2077-01-02T03:04:05+00:00","2077-01-02T03:04:05"]',
    )
    assert orjson.loads(orjson.dumps(value)) == [v.isoformat() for v in value]


def test_time_and_date(run: Driver) -> None:
    # README "datetime": time (no tzinfo) and date.
    documented(
        run, [dt.time(9, 30, 0, 120), dt.date(1901, 12, 13)], b'["09:30:00.000120","1901-12-13"]'
    )


def test_time_with_tzinfo(run: Driver) -> None:
    # README "datetime": datetime.time objects must not have a tzinfo.
    documented_error(
        run,
        {"at": dt.time(9, 30, tzinfo=dt.timezone.utc)},
        "datetime.time must not have tzinfo set",
    )


# -- enum -----------------------------------------------------------------------------------------


class Epoch(enum.Enum):
    START = dt.datetime(1970, 1, 1, 0, 0, 0)


class Payload:
    def __init__(self, val: Any) -> None:
        self.val = val


def payload_default(obj: Any) -> Any:
    if isinstance(obj, Payload):
        return obj.val
    raise TypeError


class Boxed(enum.Enum):
    ONE = Payload([1, "one"])


class Flags(enum.IntFlag):
    READ = 4


def test_enum(run: Driver) -> None:
    # README "enum": enums natively; options apply to their values.
    documented(run, [Epoch.START], b'["1970-01-01T00:00:00"]')
    documented(run, [Epoch.START], b'["1970-01-01T00:00:00+00:00"]', option=orjson.OPT_NAIVE_UTC)
    documented(run, {"f": Flags.READ}, b'{"f":4}')


def test_enum_with_unsupported_value(run: Driver) -> None:
    # README "enum": members of unsupported types through default.
    documented(run, {"b": Boxed.ONE}, b'{"b":[1,"one"]}', default=payload_default)


# -- float ----------------------------------------------------------------------------------------


def test_nan_and_infinity_are_null(run: Driver) -> None:
    # README "float": NaN, Infinity and -Infinity are written as null.
    documented(run, [float("nan"), float("inf"), -float("inf"), 1e300], b"[null,null,null,1e+300]")


def test_float_round_trip(run: Driver) -> None:
    # README "float": no loss of precision, consistent rounding.
    value = [0.1, 1 / 3, 5e-324, 1.7976931348623157e308, -0.0]
    documented(run, value, b"[0.1,0.3333333333333333,5e-324,1.7976931348623157e+308,-0.0]")
    assert orjson.loads(run(value)) == value


# -- numpy ----------------------------------------------------------------------------------------


def test_numpy_array(run: Driver) -> None:
    # README "numpy": ndarray with OPT_SERIALIZE_NUMPY.
    documented(
        run,
        np.array([[7, 8, 9], [10, 11, 12]]),
        b"[[7,8,9],[10,11,12]]",
        option=orjson.OPT_SERIALIZE_NUMPY,
    )
    documented_error(run, [np.array([1])], "Type is not JSON serializable: numpy.ndarray")


NUMPY_SCALARS = [
    (np.float64(0.25), b"0.25"),
    (np.float32(0.1), b"0.1"),
    (np.float16(0.5), b"0.5"),
    (np.int64(-9), b"-9"),
    (np.int32(9), b"9"),
    (np.int16(-9), b"-9"),
    (np.int8(9), b"9"),
    (np.uint64(18446744073709551615), b"18446744073709551615"),
    (np.uint32(9), b"9"),
    (np.uint16(9), b"9"),
    (np.uint8(255), b"255"),
    (np.intp(-3), b"-3"),
    (np.uintp(3), b"3"),
    (np.bool_(True), b"true"),
    (np.datetime64("2022-06-30T10:20:30"), b'"2022-06-30T10:20:30"'),
]


@pytest.mark.parametrize(
    ("scalar", "expected"), NUMPY_SCALARS, ids=[type(s).__name__ for s, _ in NUMPY_SCALARS]
)
def test_numpy_scalars(run: Driver, scalar: Any, expected: bytes) -> None:
    # README "numpy": the scalar types it lists.
    documented(run, [scalar], b"[" + expected + b"]", option=orjson.OPT_SERIALIZE_NUMPY)


def test_numpy_float32_not_via_double(run: Driver) -> None:
    # README "numpy": float32 is written as float32, not as tolist()'s double.
    array = np.array([0.1, 2.2], dtype=np.float32)
    documented(run, array, b"[0.1,2.2]", option=orjson.OPT_SERIALIZE_NUMPY)
    assert orjson.dumps(array.tolist()) == b"[0.10000000149011612,2.200000047683716]"


def test_numpy_datetime64(run: Driver) -> None:
    # README "numpy": datetime64 as RFC 3339; the datetime options apply.
    value = np.datetime64("2023-07-08T09:10:11.654")
    numpy = orjson.OPT_SERIALIZE_NUMPY
    documented(run, value, b'"2023-07-08T09:10:11.654000"', option=numpy)
    documented(
        run,
        [value],
        b'["2023-07-08T09:10:11+00:00"]',
        option=numpy | orjson.OPT_NAIVE_UTC | orjson.OPT_OMIT_MICROSECONDS,
    )
    documented(
        run,
        np.array(["2023-07-08", "1969-07-20"], dtype="datetime64[D]"),
        b'["2023-07-08T00:00:00","1969-07-20T00:00:00"]',
        option=numpy,
    )


def tolist(obj: Any) -> Any:
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    raise TypeError


@pytest.mark.parametrize(
    "array",
    [
        np.arange(8).reshape(2, 4)[:, ::2],
        np.asfortranarray(np.arange(6).reshape(2, 3)),
        np.array(["ab", "c"]),
        np.array([1, "x", None], dtype=object),
    ],
    ids=["strided", "fortran", "unicode", "object"],
)
def test_numpy_falls_through_to_default(run: Driver, array: np.ndarray) -> None:
    # README "numpy": not C-contiguous or an unsupported dtype: default is called.
    value = {"a": array}
    expected = orjson.dumps({"a": array.tolist()})
    documented(run, value, expected, option=orjson.OPT_SERIALIZE_NUMPY, default=tolist)


def test_numpy_not_native_endianness(run: Driver) -> None:
    # README "numpy": an array not in the native byte order raises.
    documented_error(
        run,
        [np.arange(3, dtype=">i4")],
        "numpy array is not native-endianness",
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


def test_numpy_unsupported_datetime_unit(run: Driver) -> None:
    # README "numpy": a datetime64 in an unsupported representation (picoseconds).
    documented_error(
        run,
        [np.datetime64(5, "ps")],
        "unsupported numpy.datetime64 unit: picoseconds",
        option=orjson.OPT_SERIALIZE_NUMPY,
    )


# -- uuid -----------------------------------------------------------------------------------------


def test_uuid(run: Driver) -> None:
    # README "uuid": RFC 4122 format.
    documented(
        run,
        [uuid.uuid5(uuid.NAMESPACE_DNS, "example.org"), uuid.UUID(int=0)],
        b'["aad03681-8b63-5304-89e0-8ca8f49461b5","00000000-0000-0000-0000-000000000000"]',
    )


# -- past bugs, found by orjson's own test suite (docs/design.md D6) -----------------------------


def test_option_none_is_zero(run: Driver) -> None:
    # README "Serialize": option is Optional[int]; None is no option.
    documented(run, [], b"[]", option=None)
    documented(run, {"a": [1, "x"]}, b'{"a":[1,"x"]}', option=None)


class Mixin:
    pass


@dataclasses.dataclass
class SlotsOverDict(Mixin):
    __slots__ = ("x",)
    x: int


def test_slotted_dataclass_with_dict_from_base(run: Driver) -> None:
    # README "dataclass": __slots__ dataclasses; the declared fields even though a base
    # class gives the instance a __dict__.
    documented(run, SlotsOverDict(1), b'{"x":1}')
    p = SlotsOverDict(1)
    p.extra = 2  # type: ignore[attr-defined]
    documented(run, p, b'{"x":1}')
    documented(run, {"ps": [p, SlotsOverDict(3)]}, b'{"ps":[{"x":1},{"x":3}]}')


class R:
    """default hands back the same object, ``n`` one less, until 0: then ``n`` (0)."""

    def __init__(self, n: int) -> None:
        self.n = n


def r_default(obj: Any) -> Any:
    if isinstance(obj, R):
        if obj.n == 0:
            return 0
        obj.n -= 1
        return obj
    raise TypeError


@pytest.mark.parametrize("n", [1, 2, 254])
def test_default_returning_the_same_object_changed(run: Driver, n: int) -> None:
    # README "default": default may return an object that needs default again (here the
    # same object, changed): not a cycle.
    documented(run, R(n), b"0", default=r_default, fresh=True)
    documented(run, {"r": [R(n), R(n)]}, b'{"r":[0,0]}', default=r_default, fresh=True)


def test_default_returning_the_same_object_255_times(run: Driver) -> None:
    documented_error(
        run, [R(255)], "default serializer exceeds recursion limit", default=r_default, fresh=True
    )
