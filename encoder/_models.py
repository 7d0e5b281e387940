"""pydantic models as the walk takes them: the bytes of ``model_dump(mode="json")``, a part at
a time (docs/design.md D16).

A model is written from one ``model_dump`` call of its own that leaves out the fields where
its size lies: lists of sub-models, sub-models that hold such lists, long lists of ints or
bools (token ids, masks: the model's own lists, not pydantic's copies) and verifiers'
per-token floats (rounded in C). Those are walked one sub-model, or one slice, a step;
everything else is pydantic's own output (strings are not copied), so field serializers,
aliases, extras, computed fields and ``exclude_none`` keep their meaning. The keys come in pydantic's order: the instance's fields as its ``__dict__``
holds them, then extras and computed fields.

Nothing here imports pydantic or verifiers: a model is known by its class's attributes, and
verifiers' constants are read from its modules only once one of its objects is met.
"""

from __future__ import annotations

import sys
import types
import typing
from collections.abc import Callable, Iterator
from importlib import metadata
from typing import Any, Final

try:
    from ._cround import round_slice
except ImportError:  # built without a C compiler

    def round_slice(
        values: list[object], start: int, stop: int, ndigits: int | None, /
    ) -> list[float]:
        out = []
        for value in values[start:stop]:
            if not isinstance(value, (float, int)):
                raise TypeError(f"round_slice: {type(value).__name__} is not a float")
            out.append(float(value if ndigits is None else round(value, ndigits)))
        return out


__all__ = [
    "ModelDump",
    "ModelList",
    "RoundedFloats",
    "is_model",
    "models_first",
    "record_dump",
    "round_slice",
]

#: ``exclude`` for a part that is left out altogether.
_OUT: Final = object()
#: verifiers' serializer of the per-token floats, and the versions whose records we walk.
_ROUNDING: Final = ("verifiers.v1.graph", "MessageNode.serialize_record_floats")
_VERIFIERS_SERIES: Final = "0.4."


def is_model(obj: object) -> bool:
    """Whether ``obj`` is a pydantic (v2) model instance."""
    return hasattr(type(obj), "__pydantic_serializer__") and hasattr(obj, "model_dump")


def models_first(
    default: Callable[[Any], Any] | None,
) -> Callable[[Any], Any] | None:
    """``default`` for a plain ``orjson.dumps`` that refuses pydantic models rather than hand
    them to ``default``: the walk writes a model as its ``model_dump``, whatever ``default``."""
    if default is None:
        return None

    def refusing_models(obj: Any) -> Any:
        if is_model(obj):
            raise TypeError("a pydantic model is written by the walk")
        return default(obj)

    return refusing_models


class Form:
    """What one ``model_dump`` was asked for, shared by every part of it."""

    __slots__ = ("context", "decimals", "edit", "exclude_none")

    def __init__(
        self,
        *,
        exclude_none: bool,
        context: Any,
        edit: Callable[[Any, dict[str, Any]], None] | None,
    ) -> None:
        self.exclude_none = exclude_none
        self.context = context
        self.edit = edit
        self.decimals: Any = _OUT  # verifiers' per-token rounding, read when first needed

    def rounding(self) -> int | None:
        """The decimals verifiers' serializer would round per-token floats to here."""
        if self.decimals is _OUT:
            default = sys.modules["verifiers.v1.graph"].RECORD_FLOAT_DECIMALS
            context = self.context
            self.decimals = (
                context.get("float_decimals", default) if isinstance(context, dict) else default
            )
        return self.decimals  # type: ignore[no-any-return]


class ModelDump:
    """A pydantic model to write as ``model.model_dump(mode="json", exclude=exclude,
    exclude_none=exclude_none, context=context)`` would, then ``orjson.dumps``: byte for
    byte, a sub-model or a slice of a long list at a time.

    :param model: A pydantic v2 model instance.
    :param exclude: pydantic's ``exclude`` (a set of field names, or a dict of them).
    :param exclude_none: Leave out fields that are None, at every level.
    :param context: pydantic's serialization ``context``, given to field serializers.
    :param edit: Called as ``edit(model, fields)`` with the fields pydantic wrote for each
        model walked (the parts walked on their own are not among them); it may set keys,
        as one would on the dumped dict (a new key goes last).
    """

    __slots__ = ("exclude", "form", "model", "whole")

    def __init__(
        self,
        model: Any,
        *,
        exclude: Any = None,
        exclude_none: bool = False,
        context: Any = None,
        edit: Callable[[Any, dict[str, Any]], None] | None = None,
    ) -> None:
        self.model = model
        self.exclude = exclude
        self.form = Form(exclude_none=exclude_none, context=context, edit=edit)
        self.whole: Callable[[], Any] | None = None

    @classmethod
    def part(cls, model: Any, exclude: Any, form: Form) -> ModelDump:
        view = cls.__new__(cls)
        view.model, view.exclude, view.form, view.whole = model, exclude, form, None
        return view

    def __repr__(self) -> str:
        return f"ModelDump({type(self.model).__name__})"

    def items(self, small: tuple[int, int] = (16, 64)) -> tuple[Any, bool | None]:
        """The model's keys and values in pydantic's order, and whether any part is walked
        on its own: with one, a list of items, ``ModelDump``, ``ModelList`` and
        ``RoundedFloats`` where those parts go; without, pydantic's dumped dict itself. A
        dump that is not a dict (a root model's, a model serializer's) comes back as it is,
        with None. ``small``: the walk's
        ``Limits.model_list`` and ``model_floats``."""
        form = self.form
        if self.whole is not None:
            record = self.whole()
            return record, (False if type(record) is dict else None)
        model = self.model
        plan = _plan(type(model))
        exclude = self.exclude
        parts: dict[str, Any] = {}
        attrs = model.__dict__
        if plan is not None:
            for name, field in plan.items():
                value = attrs.get(name)
                if value is None:
                    continue
                spec = _spec(exclude, name)
                if spec is _OUT:
                    continue
                part = field.part(value, spec, form, small)
                if part is not None:
                    parts[name] = part
        dumped = self.dump(_without(exclude, parts) if parts else exclude)
        if type(dumped) is not dict:  # a root model, a model serializer's own value
            return dumped, None
        written: Any = dumped
        if form.edit is not None:
            written = set(dumped)  # a key the edit adds goes last, as on the dumped dict
            form.edit(model, dumped)
        if not parts:
            return dumped, False
        assert plan is not None
        out: list[tuple[str, Any]] = []
        pop = dumped.pop
        keys = _keys(type(model))
        for name in attrs:
            key = keys.get(name, name)
            part = parts.get(name)
            if part is not None:
                if not plan[name].excluded_if(attrs[name]):
                    out.append((key, part))
            elif key in written and key in dumped:
                out.append((key, pop(key)))
        out.extend(dumped.items())
        return out, True

    def dump(self, exclude: Any) -> dict[str, Any]:
        form = self.form
        return self.model.model_dump(  # type: ignore[no-any-return]
            mode="json", exclude=exclude, exclude_none=form.exclude_none, context=form.context
        )


class ModelList:
    """A list of sub-models, each walked as a ``ModelDump`` of its own."""

    __slots__ = ("exclude", "form", "models")

    def __init__(self, models: list[Any], exclude: Any, form: Form) -> None:
        self.models = models
        self.exclude = exclude
        self.form = form

    def views(self) -> Iterator[ModelDump]:
        exclude, form, part = self.exclude, self.form, ModelDump.part
        for model in self.models:
            yield part(model, exclude, form)


class RoundedFloats:
    """A list of floats read as ``round(v, decimals)`` of each (as floats, not rounded, where
    ``decimals`` is None), in C: what verifiers' serializer, then pydantic, make of its
    per-token floats. A slice is a new list; nothing else is."""

    __slots__ = ("decimals", "values")

    def __init__(self, values: list[Any], decimals: int | None) -> None:
        self.values = values
        self.decimals = decimals

    def __len__(self) -> int:
        return len(self.values)

    def __getitem__(self, index: int | slice) -> Any:
        if isinstance(index, slice):
            start, stop, _ = index.indices(len(self.values))
            return round_slice(self.values, start, stop, self.decimals)
        return round_slice(self.values, index, index + 1, self.decimals)[0]


class _Field:
    """How one field of a model class may be walked on its own."""

    __slots__ = ("exclude_if", "lists", "models", "numbers", "rounds")

    def __init__(
        self,
        exclude_if: Any,
        lists: frozenset[type] = frozenset(),
        models: frozenset[type] = frozenset(),
        *,
        rounds: bool = False,
        numbers: bool = False,
    ) -> None:
        self.exclude_if = exclude_if
        self.lists = lists  # classes a list of sub-models may hold
        self.models = models  # classes of a sub-model worth walking on its own
        self.rounds = rounds  # verifiers' rounded per-token floats
        self.numbers = numbers  # a list of ints or bools, written as it is

    def excluded_if(self, value: Any) -> bool:
        return self.exclude_if is not None and bool(self.exclude_if(value))

    def part(self, value: Any, spec: Any, form: Form, small: tuple[int, int]) -> Any:
        """What this field's value is walked as, or None: left to pydantic's dump."""
        t = type(value)
        if self.rounds:
            if t is list and spec is None and value:
                return RoundedFloats(value, form.rounding())
            return None
        if self.numbers:
            # Token ids, masks: the list itself, not pydantic's copy of it.
            return value if t is list and spec is None and len(value) > small[1] else None
        if t is list and self.lists and value:
            kinds = set(map(type, value))
            # A short list of small models is dumped with the rest.
            if kinds <= self.lists and (
                len(value) > small[0] or any(_large(v, small) for v in value)
            ):
                each = _each(spec)
                if each is not _OUT:
                    return ModelList(value, each, form)
            return None
        if t in self.models and _large(value, small):
            return ModelDump.part(value, spec, form)
        return None


_PLANS: dict[type, dict[str, _Field] | None] = {}
_KEYS: dict[type, dict[str, str]] = {}


def _keys(cls: type) -> dict[str, str]:
    """The key pydantic writes for each field whose key is not its name (an alias, where
    the class serializes by alias)."""
    keys = _KEYS.get(cls)
    if keys is None:
        keys = {}
        if getattr(cls, "model_config", {}).get("serialize_by_alias", False):
            for name, info in getattr(cls, "__pydantic_fields__", {}).items():
                if info.serialization_alias and info.serialization_alias != name:
                    keys[name] = info.serialization_alias
        _KEYS[cls] = keys
    return keys


_DEEP: dict[type, bool] = {}


def _plan(cls: type) -> dict[str, _Field] | None:
    """The fields of a model class that may be walked on its own, or None where the class
    is written by one ``model_dump`` (a model serializer, a root model, nothing to walk)."""
    try:
        return _PLANS[cls]
    except KeyError:
        pass
    _PLANS[cls] = None  # while it is being made (a class that holds itself)
    plan = _make_plan(cls)
    _PLANS[cls] = plan
    return plan


def _make_plan(cls: type) -> dict[str, _Field] | None:
    decorators = getattr(cls, "__pydantic_decorators__", None)
    fields = getattr(cls, "__pydantic_fields__", None)
    if decorators is None or fields is None or getattr(cls, "__pydantic_root_model__", False):
        return None
    if decorators.model_serializers:
        return None
    serialized: dict[str, bool] = {}  # field -> True if it is verifiers' rounding
    for decorator in decorators.field_serializers.values():
        func = decorator.func
        rounding = (getattr(func, "__module__", None), getattr(func, "__qualname__", None))
        if "*" in decorator.info.fields:
            return None  # a serializer of every field: the class is dumped whole
        for name in decorator.info.fields:
            serialized[name] = rounding == _ROUNDING and decorator.info.when_used == "json"
    plan: dict[str, _Field] = {}
    for name, info in fields.items():
        if info.exclude is True:
            continue
        if name in serialized:
            if serialized[name]:
                plan[name] = _Field(info.exclude_if, rounds=True)
            continue
        if any(_custom(m) for m in info.metadata):
            continue
        if _number_list(info.annotation):
            plan[name] = _Field(info.exclude_if, numbers=True)
            continue
        lists, models = _classes(info.annotation)
        models = frozenset(m for m in models if _deep(m))
        if lists or models:
            plan[name] = _Field(info.exclude_if, lists, models)
    return plan or None


def _custom(metadata: Any) -> bool:
    """A serializer given in ``Annotated`` (``PlainSerializer``, ``WrapSerializer``)."""
    return type(metadata).__name__ in {"PlainSerializer", "WrapSerializer", "SerializeAsAny"}


def _classes(annotation: Any) -> tuple[frozenset[type], frozenset[type]]:
    """The model classes a field holds as the elements of a list, and as itself."""
    lists: set[type] = set()
    models: set[type] = set()
    for arm in _arms(annotation):
        origin = typing.get_origin(arm)
        if origin is list:
            args = typing.get_args(arm)
            if len(args) == 1:
                lists.update(a for a in _arms(args[0]) if _is_model_class(a))
        elif _is_model_class(arm):
            models.add(arm)
    return frozenset(lists), frozenset(models)


def _number_list(annotation: Any) -> bool:
    """A ``list[int]`` or ``list[bool]`` (or either or None): pydantic writes its elements
    as they are, as orjson does."""
    arms = [arm for arm in _arms(annotation) if arm is not type(None)]
    return (
        len(arms) == 1
        and typing.get_origin(arms[0]) is list
        and typing.get_args(arms[0]) in ((int,), (bool,))
    )


def _arms(annotation: Any) -> list[Any]:
    """The alternatives of a union (``X | None``), ``Annotated`` stripped."""
    origin = typing.get_origin(annotation)
    if origin is typing.Annotated:
        return _arms(typing.get_args(annotation)[0])
    if origin is typing.Union or origin is types.UnionType:
        return [arm for a in typing.get_args(annotation) for arm in _arms(a)]
    return [annotation]


def _is_model_class(obj: Any) -> bool:
    return isinstance(obj, type) and hasattr(obj, "__pydantic_serializer__")


def _deep(cls: type) -> bool:
    """Whether a model class may hold enough to be walked on its own: a list of sub-models,
    a sub-model that does, or verifiers' per-token floats."""
    if cls in _DEEP:
        return _DEEP[cls]
    _DEEP[cls] = False  # while it is being found (a class that holds itself)
    plan = _plan(cls)
    deep = plan is not None and any(
        f.rounds or f.lists or f.models or f.numbers for f in plan.values()
    )
    _DEEP[cls] = deep
    return deep


def _large(model: Any, small: tuple[int, int]) -> bool:
    """Whether a model holds a part worth a step of its own: a long list of models, or of
    per-token floats, at any depth (short lists are looked into; a long one is not)."""
    plan = _plan(type(model))
    if plan is None:
        return False
    attrs = model.__dict__
    for name, field in plan.items():
        value = attrs.get(name)
        if value is None:
            continue
        t = type(value)
        if field.rounds or field.numbers:
            if t is list and len(value) > small[1]:
                return True
        elif t is list:
            if len(value) > small[0] or any(_large(v, small) for v in value):
                return True
        elif t in field.models and _large(value, small):
            return True
    return False


def _spec(exclude: Any, name: str) -> Any:
    """``exclude`` for one field: ``_OUT``, or what applies inside it."""
    if exclude is None:
        return None
    if isinstance(exclude, (set, frozenset)):
        return _OUT if name in exclude else None
    if isinstance(exclude, dict):
        inner = exclude.get(name)
        if inner is True or inner is Ellipsis:
            return _OUT
        return inner
    return None


def _each(spec: Any) -> Any:
    """``exclude`` for each element of a list field (only ``"__all__"`` is walked)."""
    if spec is None:
        return None
    if isinstance(spec, dict) and set(spec) == {"__all__"}:
        inner = spec["__all__"]
        return _OUT if inner is True or inner is Ellipsis else inner
    return _OUT


def _without(exclude: Any, parts: dict[str, Any]) -> Any:
    """``exclude`` that also leaves out the parts walked on their own."""
    if exclude is None:
        return set(parts)
    if isinstance(exclude, (set, frozenset)):
        return set(exclude) | set(parts)
    merged = dict(exclude)
    merged.update(dict.fromkeys(parts, True))
    return merged


_KNOWN: dict[str, bool] = {}


def record_dump(
    obj: Any,
    float_decimals: int | None,
    *,
    edit: Callable[[Any, dict[str, Any]], None] | None = None,
) -> ModelDump | None:
    """``obj.to_record(float_decimals=...)`` as a ``ModelDump`` where ``obj`` is a verifiers
    ``Episode`` or ``Trace``; else None. Of a verifiers series other than the one the bytes
    were proven against (0.4), the record is built by ``to_record`` in one step."""
    trace = sys.modules.get("verifiers.v1.trace")
    if trace is None:
        return None
    episode = sys.modules.get("verifiers.v1.episode")
    if episode is not None and isinstance(obj, episode.Episode):
        exclude: Any = {"traces": {"__all__": trace.EXCLUDE_FIELDS}}
        exclude_none = True
    elif isinstance(obj, trace.Trace):
        exclude, exclude_none = trace.EXCLUDE_FIELDS, False
    else:
        return None
    context = {"float_decimals": float_decimals}
    view = ModelDump(obj, exclude=exclude, exclude_none=exclude_none, context=context, edit=edit)
    if not _known_verifiers():
        record = obj.to_record

        def whole() -> Any:
            fields = record(float_decimals=float_decimals)
            if edit is not None:
                edit(obj, fields)
            return fields

        view.whole = whole
    return view


def _known_verifiers() -> bool:
    known = _KNOWN.get("verifiers")
    if known is None:
        try:
            known = metadata.version("verifiers").startswith(_VERIFIERS_SERIES)
        except metadata.PackageNotFoundError:
            known = False
        _KNOWN["verifiers"] = known
    return known
