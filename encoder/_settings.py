"""What one encoding was asked for, decoded once: the options, and the limits of a step.

``Settings`` turns the public keywords (orjson's ``option`` bits, ``default``,
``float_decimals``, ...) into the facts the walk reads at every node, and refuses what orjson
refuses. ``Limits`` are the sizes that bound one step (docs/design.md D3); tests shrink them
to make the walk cut every value into pieces.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import date, datetime, time
from typing import Any, Final

import orjson

from .errors import EncodeError
from .options import (
    OPT_APPEND_NEWLINE,
    OPT_INDENT_2,
    OPT_NON_STR_KEYS,
    OPT_PASSTHROUGH_DATACLASS,
    OPT_PASSTHROUGH_DATETIME,
    OPT_PASSTHROUGH_SUBCLASS,
    OPT_SERIALIZE_NUMPY,
    OPT_SORT_KEYS,
)

__all__ = ["DEFAULT_LIMITS", "Limits", "Settings"]

#: The types orjson writes itself whatever the options (datetimes join them unless passed
#: through to ``default``).
_JSON_TYPES: Final[frozenset[type]] = frozenset(
    {str, int, float, bool, type(None), list, dict, tuple}
)
_DATETIMES: Final[frozenset[type]] = frozenset({datetime, date, time})


@dataclass(frozen=True, slots=True)
class Limits:
    """How much one step of the walk may take on (docs/design.md D3).

    :param group_bytes: Estimated JSON bytes below which values go to one orjson call.
    :param str_bytes: Output bytes aimed at by one slice of a long string (or key).
    :param number_bytes: Output bytes aimed at by one slice of a long list of numbers.
    :param max_group: Most elements of a container looked at in one step.
    :param plan_elements: Containers this short are planned element by element (at most 32,
        what the C planner holds).
    :param sort_run: Items of a large dict sorted in one step (``OPT_SORT_KEYS``).
    :param chain_levels: Levels of nested one-element containers entered (or closed) in
        one step.
    :param model_list: A list of at most this many pydantic models, none of them large, is
        dumped by pydantic with the model that holds it; a longer one is walked a model at
        a time.
    :param model_floats: verifiers' per-token floats, at most this many to a node, are
        rounded by verifiers' serializer with the rest of the node (a model is large if it
        holds more, or a long list of models).
    """

    group_bytes: int = 128 * 1024
    str_bytes: int = 192 * 1024
    number_bytes: int = 128 * 1024
    max_group: int = 4096
    plan_elements: int = 32
    sort_run: int = 1024
    chain_levels: int = 256
    model_list: int = 16
    model_floats: int = 64

    def __post_init__(self) -> None:
        if not 1 <= self.plan_elements <= 32:
            raise ValueError("plan_elements must be from 1 to 32")
        for name in (
            "group_bytes",
            "str_bytes",
            "number_bytes",
            "max_group",
            "sort_run",
            "chain_levels",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive")
        if self.model_list < 0 or self.model_floats < 0:
            raise ValueError("model_list and model_floats must not be negative")


DEFAULT_LIMITS: Final = Limits()


@dataclass(frozen=True, slots=True)
class Settings:
    """One encoding's options, decoded: what the walk checks at each node."""

    option: int
    default: Callable[[Any], Any] | None
    iterables: bool
    decimals: int | None
    allow_async: bool
    limits: Limits
    #: orjson's option for the pieces (the newline is the walk's own, at the end).
    inner: int
    #: orjson's option for a non-str dict key written alone.
    key_option: int
    indent: bool
    sort: bool
    non_str_keys: bool
    newline: bool
    subclasses: bool
    dataclasses: bool
    numpy: bool
    #: Types orjson writes by itself, and those of them that are small leaves (datetimes).
    plain: frozenset[type]
    leaves: tuple[type, ...]

    @classmethod
    def decode(
        cls,
        *,
        option: int | None = 0,
        default: Callable[[Any], Any] | None = None,
        iterables: bool = False,
        float_decimals: int | None = None,
        allow_async: bool = False,
        limits: Limits = DEFAULT_LIMITS,
    ) -> Settings:
        """The settings for these keywords; refuses an ``option`` exactly where orjson does.

        :raises EncodeError: ``option`` is not one orjson accepts.
        :raises ValueError: ``float_decimals`` is neither None nor an int.
        """
        if option is None:
            option = 0  # as orjson reads it
        if type(option) is not int:
            raise EncodeError("Invalid opts")
        try:
            orjson.dumps(None, option=option)
        except TypeError:
            raise EncodeError("Invalid opts") from None
        if float_decimals is not None and type(float_decimals) is not int:
            raise ValueError(f"float_decimals must be an int or None, not {float_decimals!r}")
        plain = _JSON_TYPES if option & OPT_PASSTHROUGH_DATETIME else _JSON_TYPES | _DATETIMES
        return cls(
            option=option,
            default=default,
            iterables=iterables,
            decimals=float_decimals,
            allow_async=allow_async,
            limits=limits,
            inner=option & ~OPT_APPEND_NEWLINE,
            key_option=option & ~(OPT_INDENT_2 | OPT_APPEND_NEWLINE | OPT_SORT_KEYS),
            indent=bool(option & OPT_INDENT_2),
            sort=bool(option & OPT_SORT_KEYS),
            non_str_keys=bool(option & OPT_NON_STR_KEYS),
            newline=bool(option & OPT_APPEND_NEWLINE),
            subclasses=not option & OPT_PASSTHROUGH_SUBCLASS,
            dataclasses=not option & OPT_PASSTHROUGH_DATACLASS,
            numpy=bool(option & OPT_SERIALIZE_NUMPY),
            plain=plain,
            leaves=tuple(plain - _JSON_TYPES),
        )

    @property
    def check_types(self) -> bool:
        """Whether the pure-Python size check must look at types: for numpy arrays (large,
        yet invisible to it) and where orjson's bytes change (rounding, re-indenting); else a
        group with a foreign type is caught when orjson asks for ``default``."""
        return self.numpy or self.indent or self.decimals is not None
