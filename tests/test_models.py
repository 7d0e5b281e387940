"""Generic pydantic (v2) models through the encoder: the bytes are
``orjson.dumps(model.model_dump(mode="json"), option=...)``, by every driver.

``encode``, ``iterencode`` (several chunk sizes), ``aiterencode`` under asyncio, and the bare
walk under tiny ``Limits`` (every value cut into pieces, with the C and the pure-Python size
checks) are each held to orjson's bytes for models with nested models, lists of sub-models
(short, just past the 16 dumped in one call, thousands), aliases, serializers, computed
fields, extras, excluded fields, root and generic models, long strings and number lists, and
models inside plain dicts and lists; with ``OPT_SORT_KEYS`` and ``OPT_INDENT_2`` too.
``ModelDump`` is held to ``model_dump(mode="json", exclude=..., exclude_none=...,
context=...)``. Then errors (the model's class and the path), ``default`` (never called for a
model), ``float_decimals`` (plain floats only) and the garbage collector.
"""

from __future__ import annotations

import asyncio
import dataclasses
import enum
import gc
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from functools import cache
from typing import Any, Generic, TypeVar

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    RootModel,
    SerializationInfo,
    computed_field,
    field_serializer,
    model_serializer,
)
from pydantic.alias_generators import to_camel
from strategies import SMALLEST
from test_pieces import tiny_limits

import encoder
from encoder import EncodeError, ModelDump
from encoder._settings import Limits
from encoder._walk import AnextRequest, Walker

T = TypeVar("T")

# -- the models ----------------------------------------------------------------------------------


class Color(enum.Enum):
    RED = "red"
    GREEN = "green"


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Leaf(BaseModel):
    name: str
    value: float | None = None
    note: str | None = None
    color: Color = Color.RED


class Branch(BaseModel):
    label: str
    leaves: list[Leaf]
    best: Leaf | None = None
    weights: list[float] = []


class Trunk(BaseModel):
    """A sub-model that holds a list of sub-models (walked on its own when that is long)."""

    top: Branch
    branches: list[Branch]
    spare: Branch | None = None
    depth: int = 0


class Aliased(BaseModel):
    model_config = ConfigDict(serialize_by_alias=True)

    title: str = Field(serialization_alias="Title")
    leaves: list[Leaf] = Field(serialization_alias="Leaves")
    count_: int = Field(0, serialization_alias="count")


class AliasedLast(BaseModel):
    """Aliased, with the aliased plain fields after the list (the order pydantic keeps)."""

    model_config = ConfigDict(serialize_by_alias=True)

    leaves: list[Leaf] = Field(serialization_alias="Leaves")
    title: str = Field(serialization_alias="Title")


class Serialized(BaseModel):
    secret: str
    leaves: list[Leaf]
    others: list[Leaf]

    @field_serializer("secret")
    def _hide(self, value: str) -> str:
        return "*" * len(value)

    @field_serializer("leaves")
    def _names(self, value: list[Leaf]) -> list[str]:
        return [leaf.name for leaf in value]


class WithContext(BaseModel):
    value: float

    @field_serializer("value")
    def _rounded(self, value: float, info: SerializationInfo) -> float:
        context = info.context or {}
        return round(value, int(context.get("digits", 12)))


class ContextHolder(BaseModel):
    first: WithContext
    items: list[WithContext]


class Custom(BaseModel):
    leaves: list[Leaf]
    owner: str = "me"

    @model_serializer
    def _custom(self) -> dict[str, Any]:
        return {
            "owner": self.owner.upper(),
            "n": len(self.leaves),
            "names": [x.name for x in self.leaves],
        }


class CustomText(BaseModel):
    """A model serializer that writes a str, not a dict."""

    leaves: list[Leaf]

    @model_serializer
    def _custom(self) -> str:
        return ",".join(leaf.name for leaf in self.leaves)


class Computed(BaseModel):
    leaves: list[Leaf]
    tail: str = "end"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def total(self) -> float:
        return sum(leaf.value or 0.0 for leaf in self.leaves)


class Extra(BaseModel):
    model_config = ConfigDict(extra="allow")

    leaves: list[Leaf]
    kind: str = "x"

    @computed_field  # type: ignore[prop-decorator]
    @property
    def size(self) -> int:
        return len(self.leaves)


class Excluded(BaseModel):
    hidden: list[Leaf] = Field(exclude=True)
    shown: list[Leaf]
    maybe: list[Leaf] | None = Field(None, exclude_if=lambda v: v is None or len(v) > 20)
    note: str | None = Field(None, exclude_if=lambda v: v is None)
    last: int = 1


class Forest(RootModel[list[Leaf]]):
    pass


class Index(RootModel[dict[str, Leaf]]):
    pass


class HoldsRoots(BaseModel):
    forest: Forest
    index: Index
    leaves: list[Leaf]


class Forests(BaseModel):
    forests: list[Forest]


class Texts(BaseModel):
    items: list[CustomText]


class Camel(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel, serialize_by_alias=True, validate_by_name=True
    )

    first_name: str
    leaf_list: list[Leaf]
    last_name: str


class Page(BaseModel, Generic[T]):
    items: list[T]
    total: int
    next: str | None = None


class Holder(BaseModel):
    by_name: dict[str, Leaf]
    groups: dict[str, list[Leaf]]
    trunk: Trunk
    level: Level
    color: Color
    created: datetime
    day: date
    span: timedelta


class Blob(BaseModel):
    text: str
    ints: list[int]
    floats: list[float]
    leaves: list[Leaf]


class Node(BaseModel):
    name: str
    value: float | None = None
    children: list[Node] = []
    tags: list[str] = []


# -- values ---------------------------------------------------------------------------------------

WHEN = datetime(2024, 5, 6, 7, 8, 9, 123456, tzinfo=timezone.utc)


def leaves(n: int, prefix: str = "l") -> list[Leaf]:
    return [
        Leaf(
            name=f'{prefix}{i}\u00e9"\\',
            value=None if i % 5 == 4 else i / 3 - 7.25,
            note=None if i % 2 else "n" * (i % 7),
            color=Color.GREEN if i % 3 else Color.RED,
        )
        for i in range(n)
    ]


def branch(n: int, label: str = "b") -> Branch:
    return Branch(
        label=label,
        leaves=leaves(n, label),
        best=Leaf(name="best", value=0.1) if n % 2 else None,
        weights=[i * 0.1 for i in range(n)],
    )


def trunk(n: int) -> Trunk:
    return Trunk(
        top=branch(n, "top"),
        branches=[branch(k, f"k{k}") for k in (0, 1, 3, n, 17)],
        spare=None,
        depth=n,
    )


def _dumped(value: Any) -> Any:
    """What orjson should see: every model (at any depth of plain containers) dumped."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json")
    if isinstance(value, ModelDump):  # only the plain form here (no exclude, no context)
        assert value.exclude is None
        return value.model.model_dump(mode="json")
    if isinstance(value, dict):
        return {k: _dumped(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_dumped(v) for v in value]
    return value


@dataclass(frozen=True)
class Case:
    """A value to encode and what orjson should be given in its place (built once)."""

    make: Callable[[], tuple[Any, Any]]


def _model(make: Callable[[], Any]) -> Callable[[], tuple[Any, Any]]:
    def build() -> tuple[Any, Any]:
        value = make()
        return value, _dumped(value)

    return build


def _view(make: Callable[[], Any], **kwargs: Any) -> Callable[[], tuple[Any, Any]]:
    def build() -> tuple[Any, Any]:
        model = make()
        return ModelDump(model, **kwargs), model.model_dump(mode="json", **kwargs)

    return build


CASES: dict[str, Case] = {
    "leaf": Case(_model(lambda: leaves(1)[0])),
    "leaf-all-none": Case(_model(lambda: Leaf(name="x"))),
    "branch-short": Case(_model(lambda: branch(3))),
    "branch-16": Case(_model(lambda: branch(16))),
    "branch-17": Case(_model(lambda: branch(17))),
    "branch-40": Case(_model(lambda: branch(40))),
    "branch-3000": Case(_model(lambda: branch(3000))),
    "trunk-short": Case(_model(lambda: trunk(2))),
    "trunk-long": Case(_model(lambda: trunk(25))),
    # Short: right by encode (pydantic dumps it whole); wrong where tiny limits walk the list.
    "aliased-short": Case(_model(lambda: Aliased(title="t", leaves=leaves(2), count_=2))),
    "aliased-long": Case(_model(lambda: Aliased(title="t", leaves=leaves(30), count_=30))),
    "aliased-last-long": Case(_model(lambda: AliasedLast(leaves=leaves(30), title="t"))),
    "field-serializer": Case(
        _model(lambda: Serialized(secret="hunter2", leaves=leaves(30), others=leaves(20, "o")))
    ),
    "model-serializer": Case(_model(lambda: Custom(leaves=leaves(30), owner="ann"))),
    "model-serializer-str": Case(_model(lambda: CustomText(leaves=leaves(30)))),
    "model-serializer-str-list": Case(
        _model(lambda: Texts(items=[CustomText(leaves=leaves(1, f"t{i}")) for i in range(20)]))
    ),
    "alias-generator-long": Case(
        _model(lambda: Camel(first_name="a", leaf_list=leaves(20), last_name="z"))
    ),
    "computed": Case(_model(lambda: Computed(leaves=leaves(30), tail="t"))),
    "computed-short": Case(_model(lambda: Computed(leaves=leaves(3)))),
    "extra": Case(
        _model(
            lambda: Extra.model_validate(
                {
                    "leaves": leaves(20),
                    "kind": "k",
                    "zeta": {"a": [1, 2.5, None]},  # extras, after the fields
                    "alpha": leaves(3, "x"),
                }
            )
        )
    ),
    "excluded-long": Case(
        _model(
            lambda: Excluded(hidden=leaves(30, "h"), shown=leaves(25), maybe=leaves(21), note=None)
        )
    ),
    "excluded-kept": Case(
        _model(
            lambda: Excluded(hidden=leaves(3, "h"), shown=leaves(40), maybe=leaves(18), note="x")
        )
    ),
    "root-list": Case(_model(lambda: Forest(leaves(30)))),
    "root-list-in-dict": Case(_model(lambda: {"forest": Forest(leaves(3))})),
    "root-list-field-long": Case(
        _model(lambda: Forests(forests=[Forest(leaves(2, f"f{i}")) for i in range(20)]))
    ),
    "root-list-field-short": Case(_model(lambda: Forests(forests=[Forest(leaves(2))] * 3))),
    "root-dict": Case(_model(lambda: Index({f"k{i}": x for i, x in enumerate(leaves(30))}))),
    "root-fields": Case(
        _model(
            lambda: HoldsRoots(
                forest=Forest(leaves(20)), index=Index({"a": Leaf(name="a")}), leaves=leaves(20)
            )
        )
    ),
    "page-of-leaves": Case(_model(lambda: Page[Leaf](items=leaves(50), total=50, next="n"))),
    "page-of-pages": Case(
        _model(
            lambda: Page[Page[Leaf]](
                items=[Page[Leaf](items=leaves(k), total=k) for k in (0, 2, 20)], total=3
            )
        )
    ),
    "page-of-ints": Case(_model(lambda: Page[int](items=list(range(100_000)), total=100_000))),
    "holder": Case(
        _model(
            lambda: Holder(
                by_name={f"n{i}": x for i, x in enumerate(leaves(40))},
                groups={"a": leaves(20), "b": [], "c": leaves(2)},
                trunk=trunk(20),
                level=Level.HIGH,
                color=Color.GREEN,
                created=WHEN,
                day=date(2020, 2, 29),
                span=timedelta(days=1, seconds=5),
            )
        )
    ),
    "blob": Case(
        _model(
            lambda: Blob(
                text=("x" * 1_000_000) + '\u00e9\n"\U0001f600',
                ints=[i * 7919 - 10**6 for i in range(100_000)],
                floats=[i / 7 - 3.5 for i in range(100_000)],
                leaves=leaves(20),
            )
        )
    ),
    "models-in-plain": Case(
        _model(
            lambda: {
                "a": [branch(20), 1.5, {"deep": [trunk(3), Leaf(name="z")]}],
                "b": (Leaf(name="t"), None),
                "c": "plain",
                "d": [Page[Leaf](items=leaves(30), total=30)] * 3,
            }
        )
    ),
    "list-of-models": Case(_model(lambda: leaves(3000))),
    "modeldump-exclude-none": Case(_view(lambda: trunk(25), exclude_none=True)),
    "modeldump-exclude-none-short": Case(_view(lambda: branch(5), exclude_none=True)),
    "modeldump-exclude-set": Case(_view(lambda: trunk(25), exclude={"top", "depth"})),
    "modeldump-exclude-all": Case(
        _view(
            lambda: trunk(25),
            exclude={"branches": {"__all__": {"weights", "best"}}, "top": {"leaves": True}},
        )
    ),
    "modeldump-exclude-index": Case(
        _view(lambda: branch(30), exclude={"leaves": {0: True, 3: {"note"}}})
    ),
    "modeldump-context": Case(
        _view(
            lambda: ContextHolder(
                first=WithContext(value=1 / 3),
                items=[WithContext(value=i / 7) for i in range(40)],
            ),
            context={"digits": 2},
        )
    ),
    "modeldump-node": Case(
        _view(
            lambda: Node(
                name="r",
                children=[Node(name=f"c{i}", value=None, tags=["t"] * i) for i in range(20)],
            ),
            exclude_none=True,
            exclude={"children": {"__all__": {"tags"}}},
        )
    ),
}


@cache
def built(case_id: str) -> tuple[Any, Any]:
    return CASES[case_id].make()


@pytest.fixture(scope="module", autouse=True)
def _let_the_cases_go() -> Iterator[None]:
    """The built cases (a few megabytes) are kept for this module's tests only."""
    yield
    built.cache_clear()


OPTIONS = {
    "plain": 0,
    "sort": orjson.OPT_SORT_KEYS,
    "indent": orjson.OPT_INDENT_2,
    "sort-indent-newline": orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2 | orjson.OPT_APPEND_NEWLINE,
}


def _params() -> Iterator[Any]:
    for case_id in CASES:
        for option_id, option in OPTIONS.items():
            yield pytest.param(case_id, option, id=f"{case_id}-{option_id}")


# -- the drivers ----------------------------------------------------------------------------------

#: Small, not the smallest: a few elements a group.
SMALL = Limits(
    group_bytes=64,
    str_bytes=16,
    number_bytes=48,
    max_group=3,
    plan_elements=4,
    sort_run=2,
    model_list=2,
)


def _scaled(limits: Limits, size: int) -> Limits:
    """Tiny limits for a small document; for a large one, large enough that it is cut into
    at most a few thousand pieces of each kind (a megabyte in bytes proves no more)."""
    if size <= 8_000:
        return limits
    least = size // 4_000
    return dataclasses.replace(
        limits,
        group_bytes=max(limits.group_bytes, least),
        str_bytes=max(limits.str_bytes, least),
        number_bytes=max(limits.number_bytes, least),
    )


def walked(value: Any, *, limits: Limits, native: bool = True, **kwargs: Any) -> bytes:
    pieces = []
    for piece in Walker(value, limits=limits, native=native, **kwargs):
        assert not isinstance(piece, AnextRequest)
        pieces.append(piece)
    return b"".join(pieces)


async def _acollect(value: Any, **kwargs: Any) -> list[bytes]:
    return [chunk async for chunk in encoder.aiterencode(value, **kwargs)]


def achunks(value: Any, **kwargs: Any) -> list[bytes]:
    return asyncio.run(_acollect(value, **kwargs))


def _check_chunks(chunks: list[bytes], chunk_size: int) -> None:
    for chunk in chunks:
        assert type(chunk) is bytes
        assert 1 <= len(chunk) <= chunk_size, (len(chunk), chunk_size)


def assert_encodes(value: Any, expected: bytes, **kwargs: Any) -> None:
    """``encode``, ``iterencode``, ``aiterencode`` and the walk under tiny limits (both size
    checks) all write ``expected``."""
    size = len(expected)
    assert encoder.encode(value, **kwargs) == expected, "encode"
    for chunk_size in (max(1, size // 3000), 7, 4096, encoder.DEFAULT_CHUNK_SIZE):
        chunks = list(encoder.iterencode(value, chunk_size=chunk_size, **kwargs))
        _check_chunks(chunks, chunk_size)
        assert b"".join(chunks) == expected, ("iterencode", chunk_size)
    for chunk_size in (max(5, size // 3000), encoder.DEFAULT_CHUNK_SIZE):
        chunks = achunks(value, chunk_size=chunk_size, **kwargs)
        _check_chunks(chunks, chunk_size)
        assert b"".join(chunks) == expected, ("aiterencode", chunk_size)
    for limits in (SMALLEST, SMALL):
        for native in (True, False):
            got = walked(value, limits=_scaled(limits, size), native=native, **kwargs)
            assert got == expected, ("walk", limits, native)


# -- the same bytes -------------------------------------------------------------------------------


@pytest.mark.parametrize(("case_id", "option"), list(_params()))
def test_models_write_their_dump(case_id: str, option: int) -> None:
    value, reference = built(case_id)
    expected = orjson.dumps(reference, option=option)
    assert_encodes(value, expected, option=option)


@pytest.mark.parametrize(("n", "walked_alone"), [(3, 0), (16, 0), (17, 17), (40, 40)])
def test_long_lists_of_sub_models_are_walked_a_model_at_a_time(n: int, walked_alone: int) -> None:
    """``edit`` sees each model walked on its own: the parent, and the elements of a list of
    more than 16 sub-models (a shorter one is the parent's dump); a key it sets is written
    last in that model's object."""
    model = branch(n)
    seen: list[str] = []

    def edit(obj: Any, fields: dict[str, Any]) -> None:
        seen.append(type(obj).__name__)
        fields["seen"] = len(seen)

    reference = model.model_dump(mode="json")
    reference["seen"] = 1
    for i, leaf in enumerate(reference["leaves"] if walked_alone else []):
        leaf["seen"] = i + 2
    expected = orjson.dumps(reference)
    assert encoder.encode(ModelDump(model, edit=edit)) == expected
    assert seen == ["Branch"] + ["Leaf"] * walked_alone
    seen.clear()
    limits = dataclasses.replace(SMALLEST, model_list=16)
    assert walked(ModelDump(model, edit=edit), limits=limits) == expected
    assert seen == ["Branch"] + ["Leaf"] * walked_alone


def test_a_model_is_not_a_dict_with_the_same_fields() -> None:
    """The expected bytes are pydantic's: enum values, ISO datetimes, timedelta as ISO 8601
    durations, aliases, computed fields (no test here passes by writing ``__dict__``)."""
    value, reference = built("holder")
    data = encoder.encode(value)
    assert data == orjson.dumps(reference)
    loaded = orjson.loads(data)
    assert loaded["level"] == 2
    assert loaded["color"] == "green"
    assert loaded["created"] == "2024-05-06T07:08:09.123456Z"
    assert loaded["span"] == "P1DT5S"
    assert set(loaded["by_name"]["n0"]) == {"name", "value", "note", "color"}


def test_exclude_none_leaves_out_nones_at_every_level() -> None:
    model = trunk(25)
    with_nones = orjson.loads(encoder.encode(model))
    without = orjson.loads(encoder.encode(ModelDump(model, exclude_none=True)))
    assert "spare" in with_nones
    assert "spare" not in without
    assert with_nones["branches"][4]["leaves"][1]["note"] is None
    assert "note" not in without["branches"][4]["leaves"][1]


def test_a_long_string_and_long_lists() -> None:
    value, reference = built("blob")
    data = encoder.encode(value)
    assert len(data) > 2_000_000
    assert data == orjson.dumps(reference)


# -- random recursive models ------------------------------------------------------------------------

names = st.text(st.characters(codec="utf-8"), max_size=12)  # no lone surrogates
values = st.one_of(
    st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-(2**53), 2**53)
)


def _nodes() -> st.SearchStrategy[Node]:
    tags = st.lists(names, max_size=4)
    leaf = st.builds(Node, name=names, value=values, tags=tags)
    return st.recursive(
        leaf,
        lambda children: st.builds(
            Node,
            name=names,
            value=values,
            children=st.one_of(
                st.lists(children, max_size=4), st.lists(children, min_size=16, max_size=24)
            ),
            tags=tags,
        ),
        max_leaves=80,
    )


views = st.sampled_from(
    [
        {},
        {"exclude_none": True},
        {"exclude": {"tags"}},
        {"exclude": {"children": {"__all__": {"value"}}}, "exclude_none": True},
    ]
)


@settings(max_examples=150, deadline=None)
@given(
    node=_nodes(),
    option=st.sampled_from(list(OPTIONS.values())),
    limits=tiny_limits,
    chunk_size=st.integers(1, 300),
    view=views,
    in_list=st.booleans(),
)
def test_random_trees(
    node: Node, option: int, limits: Limits, chunk_size: int, view: dict[str, Any], in_list: bool
) -> None:
    value: Any = ModelDump(node, **view) if view else node
    reference: Any = node.model_dump(mode="json", **view)
    if in_list:
        value, reference = [value, {"k": value}], [reference, {"k": reference}]
    expected = orjson.dumps(reference, option=option)
    assert encoder.encode(value, option=option) == expected
    chunks = list(encoder.iterencode(value, option=option, chunk_size=chunk_size))
    _check_chunks(chunks, chunk_size)
    assert b"".join(chunks) == expected
    assert b"".join(achunks(value, option=option, chunk_size=chunk_size)) == expected
    assert walked(value, option=option, limits=limits) == expected
    assert walked(value, option=option, limits=limits, native=False) == expected


# -- errors ------------------------------------------------------------------------------------------


class Fragile(BaseModel):
    v: int

    @field_serializer("v")
    def _check(self, v: int) -> int:
        if v == 3:
            raise ValueError("three is not allowed")
        return v


class Crate(BaseModel):
    label: str = "crate"
    items: list[Fragile]


def _errors(value: Any) -> dict[str, EncodeError]:
    """The error each driver raises."""
    runs: dict[str, Callable[[], object]] = {
        "encode": lambda: encoder.encode(value),
        "iterencode": lambda: list(encoder.iterencode(value, chunk_size=3)),
        "aiterencode": lambda: achunks(value, chunk_size=3),
        "walk": lambda: walked(value, limits=SMALLEST),
        "walk-small": lambda: walked(value, limits=SMALL, native=False),
    }
    errors = {}
    for name, run in runs.items():
        with pytest.raises(EncodeError) as info:
            run()
        errors[name] = info.value
    return errors


@pytest.mark.parametrize(
    ("make", "path"),
    [
        (lambda: Crate(items=[Fragile(v=i) for i in range(20)]), "$.items[3]"),
        (lambda: {"a": [0, Crate(items=[Fragile(v=i) for i in range(20)])]}, "$.a[1].items[3]"),
        (lambda: [ModelDump(Crate(items=[Fragile(v=i) for i in range(30)]))], "$[0].items[3]"),
        (lambda: Fragile(v=3), "$"),
        (lambda: {"x": {"y": Fragile(v=3)}}, "$.x.y"),
    ],
    ids=["list", "in-plain", "modeldump", "alone", "in-dicts"],
)
def test_a_failing_dump_names_the_model_and_the_path(make: Callable[[], Any], path: str) -> None:
    value = make()
    with pytest.raises(Exception, match="three is not allowed"):
        orjson.dumps(_dumped(value))  # pydantic itself refuses it
    for name, error in _errors(value).items():
        assert isinstance(error, TypeError), name
        assert error.path == path, (name, error.path)
        assert "Fragile" in error.message, (name, error.message)
        assert "three is not allowed" in error.message, (name, error.message)
        assert str(error).endswith(f" at {path}"), name


def test_a_failing_dump_in_a_short_list() -> None:
    """A short list of small models goes to the parent's own dump: the error names that
    model (at its path) or the element."""
    value = Crate(items=[Fragile(v=i) for i in range(5)])
    for name, error in _errors(value).items():
        assert (error.path, error.message.split(".")[0]) in {
            ("$", "Crate"),
            ("$.items[3]", "Fragile"),
        }, name
        assert "three is not allowed" in error.message, name


def test_chunks_before_the_failing_model_come_first() -> None:
    value = Crate(items=[Fragile(v=i) for i in range(20)])
    chunks: list[bytes] = []
    with pytest.raises(EncodeError):
        chunks.extend(encoder.iterencode(value, chunk_size=1))
    assert b"".join(chunks).startswith(b'{"label":"crate","items":[{"v":0},{"v":1},{"v":2}')


# -- default and float_decimals -------------------------------------------------------------------


class Odd:
    def __init__(self, n: int) -> None:
        self.n = n


def test_default_is_not_called_for_a_model() -> None:
    calls: list[Any] = []

    def spy(obj: Any) -> Any:
        calls.append(obj)
        if isinstance(obj, Odd):
            return {"odd": obj.n}
        return "DEFAULT"

    for model in (leaves(1)[0], branch(3), branch(30), trunk(20)):
        expected = orjson.dumps(model.model_dump(mode="json"))
        assert encoder.encode(model, default=spy) == expected
        assert b"".join(encoder.iterencode(model, default=spy, chunk_size=64)) == expected
        assert b"".join(achunks(model, default=spy, chunk_size=64)) == expected
        assert walked(model, default=spy, limits=SMALLEST) == expected
    assert calls == []
    # Next to an object only ``default`` knows: it is called for that one alone.
    value = {"odd": Odd(1), "model": branch(20), "list": [Odd(2), leaves(1)[0]]}
    reference = {
        "odd": {"odd": 1},
        "model": branch(20).model_dump(mode="json"),
        "list": [{"odd": 2}, leaves(1)[0].model_dump(mode="json")],
    }
    expected = orjson.dumps(reference)
    assert encoder.encode(value, default=spy) == expected
    assert walked(value, default=spy, limits=SMALLEST) == expected
    assert calls
    assert all(type(c) is Odd for c in calls), calls


class Measured(BaseModel):
    x: float
    xs: list[float]
    inner: dict[str, float]


class MeasuredMany(BaseModel):
    x: float
    items: list[Measured]


def _measured(n: int) -> Measured:
    return Measured(x=n / 3, xs=[i / 7 for i in range(n)], inner={"y": 2 / 3})


@pytest.mark.parametrize("option", [0, orjson.OPT_SORT_KEYS | orjson.OPT_INDENT_2])
@pytest.mark.parametrize(
    "make",
    [
        lambda: _measured(5),
        lambda: _measured(500),
        lambda: MeasuredMany(x=1 / 3, items=[_measured(i) for i in range(20)]),
        lambda: ModelDump(MeasuredMany(x=1 / 3, items=[_measured(3)] * 3), exclude_none=True),
    ],
    ids=["short", "long-floats", "parted", "modeldump"],
)
def test_float_decimals_rounds_plain_floats_only(make: Callable[[], Any], option: int) -> None:
    """``float_decimals`` rounds the floats of plain values, before and after a model, and
    none inside one: a generic model is written as pydantic dumped it."""
    model = make()
    dumped = (
        model.model.model_dump(mode="json", exclude_none=True)
        if isinstance(model, ModelDump)
        else model.model_dump(mode="json")
    )
    value = {"before": 1 / 3, "m": model, "after": [2 / 3, model, {"z": 5 / 7}], "tail": 4 / 9}
    reference = {
        "before": 0.33,
        "m": dumped,
        "after": [0.67, dumped, {"z": 0.71}],
        "tail": 0.44,
    }
    expected = orjson.dumps(reference, option=option)
    assert expected != orjson.dumps(_dumped_rounded(reference), option=option)  # floats inside
    kwargs: dict[str, Any] = {"option": option, "float_decimals": 2}
    assert_encodes(value, expected, **kwargs)
    # The model alone, with float_decimals: its floats as they are.
    alone = orjson.dumps(dumped, option=option)
    assert encoder.encode(model, **kwargs) == alone
    assert walked(model, limits=SMALLEST, **kwargs) == alone


def _dumped_rounded(value: Any) -> Any:
    if type(value) is float:
        return round(value, 2)
    if isinstance(value, dict):
        return {k: _dumped_rounded(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_dumped_rounded(v) for v in value]
    return value


# -- the garbage collector -------------------------------------------------------------------------


def _young_collections(run: Callable[[], bytes]) -> tuple[int, bytes]:
    counts = [0]

    def count(phase: str, info: dict[str, Any]) -> None:
        if phase == "start" and info["generation"] == 0:
            counts[0] += 1

    was_enabled = gc.isenabled()
    gc.enable()  # the collector on, as in a program that logs, whatever the test runner did
    gc.collect()
    gc.callbacks.append(count)
    try:
        data = run()
    finally:
        gc.callbacks.remove(count)
        if not was_enabled:
            gc.disable()
    return counts[0], data


def test_a_long_list_of_sub_models_sets_off_no_more_collections_than_orjson() -> None:
    """10,000 sub-models walked a few at a time: each step's dump is let go before the next,
    so the young generation fills no faster than with pydantic's one dump of it all."""
    model = Page[Leaf](items=leaves(10_000), total=10_000)
    theirs, expected = _young_collections(lambda: orjson.dumps(model.model_dump(mode="json")))
    ours, data = _young_collections(lambda: encoder.encode(model))
    streamed, chunks = _young_collections(
        lambda: b"".join(encoder.iterencode(model, chunk_size=4096))
    )
    assert data == expected
    assert chunks == expected
    assert theirs > 0  # the measure sees collections at all
    assert ours <= theirs + 2, (ours, theirs)
    assert streamed <= theirs + 2, (streamed, theirs)


def test_a_serializer_of_every_field_keeps_the_model_whole() -> None:
    """``@field_serializer("*")`` applies to the walked fields too: such a model is dumped
    by pydantic in one call, its lists of sub-models and numbers included."""
    from pydantic import field_serializer

    class Tagged(BaseModel):
        ids: list[int]
        leaves: list[Leaf]

        @field_serializer("*")
        def tag(self, value: Any) -> Any:
            return {"tagged": value}

    model = Tagged(ids=list(range(200)), leaves=leaves(40))
    want = orjson.dumps(model.model_dump(mode="json"))
    assert encoder.encode(model) == want
    assert b"".join(Walker(model, limits=SMALLEST)) == want  # type: ignore[misc]
