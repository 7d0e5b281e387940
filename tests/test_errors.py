"""The error contract: ``EncodeError`` (a ``TypeError``) naming the JSON path of the node."""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

import anyio
import orjson
import pytest
from strategies import Custom, Opaque, Point, collect_async, custom_default, drain

import encoder
from encoder import EncodeError, adump, dump, encode, iterencode

PAD = "p" * 100_000  # a sibling that makes the value too big for one orjson call


def _sync_iter(value: Any, **kwargs: Any) -> list[bytes]:
    return list(iterencode(value, chunk_size=kwargs.pop("chunk_size", 1000), **kwargs))


def _dump(value: Any, **kwargs: Any) -> int:
    return dump(value, io.BytesIO(), **kwargs)


def _adump(value: Any, **kwargs: Any) -> int:
    async def write(chunk: bytes) -> None:
        await anyio.sleep(0)

    async def main() -> int:
        return await adump(value, write, **kwargs)

    return anyio.run(main)


DRIVERS: dict[str, Callable[..., Any]] = {
    "encode": encode,
    "iterencode": _sync_iter,
    "dump": _dump,
    "aiterencode": collect_async,
    "aiterencode-trio": lambda v, **kw: collect_async(v, backend="trio", **kw),
    "adump": _adump,
}


@pytest.fixture(params=list(DRIVERS))
def run(request: pytest.FixtureRequest) -> Callable[..., Any]:
    return DRIVERS[request.param]


def _raises(run: Callable[..., Any], value: Any, **kwargs: Any) -> EncodeError:
    with pytest.raises(EncodeError) as info:
        run(value, **kwargs)
    err = info.value
    assert isinstance(err, TypeError)
    assert err.path in str(err)
    assert err.message in str(err)
    return err


@pytest.mark.parametrize("big", [False, True])
def test_lone_surrogate_path(run: Callable[..., Any], big: bool) -> None:
    value: dict[str, Any] = {"a": [0, 1, {"b": "\ud800"}]}
    if big:
        value["pad"] = PAD
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(value)
    assert _raises(run, value).path == "$.a[2].b"


def test_lone_surrogate_in_long_string_path(run: Callable[..., Any]) -> None:
    value = {"a": ["ok", "x" * 200_000 + "\udfff" + "y" * 10]}
    assert _raises(run, value).path == "$.a[1]"


def test_lone_surrogate_in_key_path(run: Callable[..., Any]) -> None:
    value = {"a": {"\ud800": 1}, "pad": PAD}
    err = _raises(run, value)
    assert err.path.startswith("$.a[")


@pytest.mark.parametrize(
    ("value", "path"),
    [
        ({"x": [{"y": 2**64}]}, "$.x[0].y"),
        ({"x": [{"y": -(2**63) - 1}], "pad": PAD}, "$.x[0].y"),
        ([0] * 10_000 + [2**64], "$[10000]"),
        ({"n": [1.5] * 3000 + [2**70] + [1] * 3000}, "$.n[3000]"),
        # Found by fuzz/encode.py: a long list of numbers just before bad ints, in a long
        # list, once looped forever (the group cut to one element never shrank).
        ([{}] * 20 + [[23901, -6.9e307] * 2900] + [-(2**70)] * 200, "$[21]"),
    ],
)
def test_int_out_of_range_path(run: Callable[..., Any], value: Any, path: str) -> None:
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(value)
    assert _raises(run, value).path == path


def test_strict_integer_path(run: Callable[..., Any]) -> None:
    value = {"a": [1, 2, 2**53 + 1], "pad": PAD}
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(value, option=orjson.OPT_STRICT_INTEGER)
    assert _raises(run, value, option=orjson.OPT_STRICT_INTEGER).path == "$.a[2]"


@pytest.mark.parametrize(
    ("key", "path"),
    [(1, "$.a[1]"), (None, "$.a[None]"), ((1, 2), "$.a[(1, 2)]"), (2.5, "$.a[2.5]")],
)
def test_non_str_key_without_option_names_the_key(
    run: Callable[..., Any], key: Any, path: str
) -> None:
    value = {"a": {"ok": 1, key: "x"}, "pad": PAD}
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(value)
    assert _raises(run, value).path == path


def test_unsupported_key_with_non_str_keys_option(run: Callable[..., Any]) -> None:
    value = {"a": {(1, 2): "x"}, "pad": PAD}
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(value, option=orjson.OPT_NON_STR_KEYS)
    assert _raises(run, value, option=orjson.OPT_NON_STR_KEYS).path == "$.a[(1, 2)]"


def test_unsupported_object_deep_in_a_big_structure(run: Callable[..., Any]) -> None:
    nodes = [{"content": "x" * 1000}] * 20 + [{"content": object()}]
    value = {"traces": [{"nodes": nodes}] * 4}
    err = _raises(run, value)
    assert err.path == "$.traces[0].nodes[20].content"
    assert "object" in err.message


@pytest.mark.parametrize(
    ("key", "rendered"),
    [
        ("odd key", '$["odd key"]'),
        ('q"uote', '$["q\\"uote"]'),
        ("1st", '$["1st"]'),
        ("_ok9", "$._ok9"),
    ],
)
def test_path_rendering_of_keys(run: Callable[..., Any], key: str, rendered: str) -> None:
    value = {key: Opaque(), "pad": PAD}
    assert _raises(run, value).path == rendered


def test_unsupported_inside_dataclass_and_subclasses(run: Callable[..., Any]) -> None:
    value = [PAD, Point(x=[1, {"deep": Opaque()}], y=2)]
    assert _raises(run, value).path == "$[1].x[1].deep"


def test_default_raising_chains_the_original(run: Callable[..., Any]) -> None:
    class Boom(Exception):
        pass

    def default(obj: Any) -> Any:
        if isinstance(obj, Custom):
            return obj.payload
        raise Boom(f"no {type(obj).__name__}")

    value = {"list": [1, 2, Custom({"inner": [Opaque()]})], "pad": PAD}
    err = _raises(run, value, default=default)
    assert err.path == "$.list[2].inner[0]"
    assert isinstance(err.__cause__, Boom)
    assert "Opaque" in str(err.__cause__)


def test_default_without_support_raises(run: Callable[..., Any]) -> None:
    value = {"a": [Custom(1), Opaque()], "pad": PAD}
    err = _raises(run, value, default=custom_default)
    assert err.path == "$.a[1]"


# -- cycles -------------------------------------------------------------------------------------


def _circular(err: EncodeError) -> None:
    assert "circular" in err.message.lower()


def test_cycle_in_list(run: Callable[..., Any]) -> None:
    a: list[Any] = [1, "x"]
    a.append(a)
    err = _raises(run, a)
    _circular(err)
    assert err.path == "$[2]"


def test_cycle_in_big_list(run: Callable[..., Any]) -> None:
    a: list[Any] = [PAD, [1, 2]]
    a[1].append(a)
    err = _raises(run, {"root": a})
    _circular(err)
    assert err.path == "$.root[1][2]"


def test_cycle_in_dict(run: Callable[..., Any]) -> None:
    d: dict[str, Any] = {"a": 1}
    d["self"] = d
    err = _raises(run, d)
    _circular(err)
    assert err.path == "$.self"


def test_cycle_through_dict_and_list(run: Callable[..., Any]) -> None:
    d: dict[str, Any] = {"pad": PAD, "items": []}
    d["items"].append({"parent": d})
    err = _raises(run, d)
    _circular(err)
    assert err.path == "$.items[0].parent"


def test_cycle_in_dataclass(run: Callable[..., Any]) -> None:
    p = Point(x=1, y=None)
    p.y = [p]
    _circular(_raises(run, p))


class Node:
    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[Node] = []


def test_cycle_through_default_returning_the_same_dict(run: Callable[..., Any]) -> None:
    """default returns the object's own ``__dict__``: the same container each time."""
    a, b = Node("a"), Node("b")
    a.children.append(b)
    b.children.append(a)
    _circular(_raises(run, a, default=vars))


def _fresh_dict_default(obj: Any) -> Any:
    if isinstance(obj, Node):
        return {"name": obj.name, "children": list(obj.children)}
    raise TypeError(type(obj).__name__)


@pytest.mark.timeout(120)
def test_cycle_through_default_returning_fresh_dicts() -> None:
    """default builds a new dict per call (the usual way to write one): the cycle goes through
    the Node objects, not through any one container. orjson stops (recursion limit); we must
    raise too, soon, rather than write an endless document: at orjson's other limit, 255
    ``default`` calls along one path."""
    a, b = Node("a"), Node("b")
    a.children.append(b)
    b.children.append(a)
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(a, default=_fresh_dict_default)
    # orjson gives up after 254 levels (~40 bytes each here); an encoder still going after
    # 64 KiB will never stop.
    with pytest.raises(EncodeError) as info:
        drain(iterencode(a, default=_fresh_dict_default, chunk_size=256), 256, limit=64 * 1024)
    assert info.value.message == "default serializer exceeds recursion limit"
    assert info.value.path.count(".children[0]") == 255  # the 256th call is refused


# -- argument checking --------------------------------------------------------------------------


@pytest.mark.parametrize("option", [1 << 20, -1, 1 << 32 | 1, orjson.OPT_SORT_KEYS | (1 << 25)])
def test_invalid_option(run: Callable[..., Any], option: int) -> None:
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(1, option=option)
    _raises(run, {"a": 1}, option=option)


def test_default_not_callable(run: Callable[..., Any]) -> None:
    with pytest.raises(orjson.JSONEncodeError):
        orjson.dumps(Opaque(), default=42)
    with pytest.raises(EncodeError):
        run(Opaque(), default=42)


@pytest.mark.parametrize("chunk_size", [0, -1, True, 1.5])
def test_bad_chunk_size(chunk_size: Any) -> None:
    with pytest.raises(ValueError, match="chunk_size"):
        list(iterencode([1], chunk_size=chunk_size))
    with pytest.raises(ValueError, match="chunk_size"):
        dump([1], io.BytesIO(), chunk_size=chunk_size)
    with pytest.raises(ValueError, match="chunk_size"):
        collect_async([1], chunk_size=chunk_size)
    with pytest.raises(ValueError, match="chunk_size"):
        _adump([1], chunk_size=chunk_size)


@pytest.mark.parametrize("budget", [0, 0.0, -1.0, float("nan")])
def test_bad_budget(budget: float) -> None:
    with pytest.raises(ValueError, match="budget"):
        collect_async([1], budget=budget)
    with pytest.raises(ValueError, match="budget"):
        _adump([1], budget=budget)
    with pytest.raises(ValueError, match="budget"):
        collect_async([1], budget=budget, backend="trio")


@pytest.mark.parametrize("float_decimals", [2.5, "4", True])
def test_bad_float_decimals(run: Callable[..., Any], float_decimals: Any) -> None:
    with pytest.raises(ValueError, match="float_decimals"):
        run([1.5], float_decimals=float_decimals)


@pytest.mark.parametrize("float_decimals", [-1, 18, 400])
def test_any_int_is_round_s_ndigits(float_decimals: int) -> None:
    """As ``round`` (and verifiers' ``to_record``) takes it: negative rounds to tens."""
    value = [1234.5678, 1.2345678912345678e-10, 5e-324]
    want = orjson.dumps([round(v, float_decimals) for v in value])
    assert encode(value, float_decimals=float_decimals) == want
    assert b"".join(_sync_iter(value, float_decimals=float_decimals)) == want


# -- what a failing stream looks like -----------------------------------------------------------


@pytest.mark.parametrize("chunk_size", [1, 100, 4096])
def test_failing_stream_yields_a_prefix_then_raises(chunk_size: int) -> None:
    """The chunks before the error are a prefix of the document the value would make had its
    bad leaf been good, and the iterator ends with EncodeError, never normally."""
    good = {"head": [PAD, {"n": list(range(5000))}], "tail": {"bad": None}}
    bad = {"head": [PAD, {"n": list(range(5000))}], "tail": {"bad": Opaque()}}
    full = orjson.dumps(good)
    got: list[bytes] = []
    it = iterencode(bad, chunk_size=chunk_size)
    with pytest.raises(EncodeError) as info:
        drain(it, chunk_size, into=got)
    assert info.value.path == "$.tail.bad"
    prefix = b"".join(got)
    assert len(prefix) > 100_000
    assert full.startswith(prefix)
    with pytest.raises(StopIteration):  # a failed stream stays failed
        next(it)


def test_failing_async_stream_yields_a_prefix_then_raises() -> None:
    good = {"head": [PAD, list(range(5000))], "tail": [None]}
    bad = {"head": [PAD, list(range(5000))], "tail": [Opaque()]}
    full = orjson.dumps(good)

    async def main() -> tuple[bytes, EncodeError]:
        got: list[bytes] = []
        chunks = encoder.aiterencode(bad, chunk_size=512, budget=1e-6)
        try:
            async for chunk in chunks:
                got.append(chunk)
        except EncodeError as exc:
            return b"".join(got), exc
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]
        raise AssertionError("the stream ended normally")

    prefix, err = anyio.run(main)
    assert err.path == "$.tail[0]"
    assert len(prefix) > 100_000
    assert full.startswith(prefix)


def test_dump_writes_a_prefix_before_raising() -> None:
    buf = io.BytesIO()
    with pytest.raises(EncodeError):
        dump([PAD, Opaque()], buf, chunk_size=1024)
    assert orjson.dumps([PAD, None]).startswith(buf.getvalue())
    assert len(buf.getvalue()) >= 100_000


def test_error_is_a_type_error_and_carries_message_and_path() -> None:
    with pytest.raises(TypeError) as info:
        encode({"a": [Opaque()]})
    err = info.value
    assert isinstance(err, EncodeError)
    assert err.path == "$.a[0]"
    assert "Opaque" in err.message
    assert str(err) == f"{err.message} at {err.path}"
