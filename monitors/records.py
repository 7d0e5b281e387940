"""What a record is: a Mapping, or an object with ``to_record()``, built only when encoded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import encoder

__all__ = [
    "KINDS",
    "SUBSETS",
    "Kind",
    "Subset",
    "SupportsToRecord",
    "build_record",
    "check_float_decimals",
    "check_kind",
    "line_option",
]

Kind = Literal["train", "eval"]
"""Which episodes: training or evaluation."""
Subset = Literal["all", "effective"]
"""Which stream of a kind: ``"all"`` episodes or the ``"effective"`` batch."""
KINDS: tuple[Kind, ...] = ("train", "eval")
SUBSETS: tuple[Subset, ...] = ("all", "effective")


@runtime_checkable
class SupportsToRecord(Protocol):
    """An episode that builds its JSON-ready form on demand (so idle episodes cost nothing)."""

    def to_record(self) -> Any: ...


def build_record(episode: Any) -> Any:
    """The value to encode for one episode: ``to_record()`` if it has one, else itself.

    :param episode: A Mapping, or an object with ``to_record()``.
    :raises TypeError: The episode is neither.
    """
    to_record = getattr(episode, "to_record", None)
    if to_record is not None and callable(to_record):
        return to_record()
    if isinstance(episode, Mapping):
        return episode
    raise TypeError(
        f"an episode must be a Mapping or have to_record(), not {type(episode).__name__}"
    )


def check_kind(kind: str, subset: str) -> None:
    """Refuse a kind or subset the trace layout has no place for.

    :param kind: One of ``KINDS``.
    :param subset: One of ``SUBSETS``.
    :raises ValueError: Either is something else.
    """
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, not {kind!r}")
    if subset not in SUBSETS:
        raise ValueError(f"subset must be one of {SUBSETS}, not {subset!r}")


def line_option(option: int) -> int:
    """``option`` for one JSON Lines record: with ``OPT_APPEND_NEWLINE``, and refused if it
    asks for ``OPT_INDENT_2`` (an indented record spans lines, and the stream would no longer
    be one record per line).

    :param option: The caller's orjson ``OPT_*`` flags.
    :raises ValueError: ``option`` includes ``OPT_INDENT_2``.
    """
    if option & encoder.OPT_INDENT_2:
        raise ValueError("option=OPT_INDENT_2 is refused: a JSON Lines record is one line")
    return option | encoder.OPT_APPEND_NEWLINE


def check_float_decimals(float_decimals: int | None) -> int | None:
    """``float_decimals`` as the encoder takes it, refused at once (at construction) rather
    than at the first episode.

    :raises ValueError: It is not None nor an int from 0 to 17.
    """
    if float_decimals is not None and (
        type(float_decimals) is not int or not 0 <= float_decimals <= 17
    ):
        raise ValueError(f"float_decimals must be an int from 0 to 17, not {float_decimals!r}")
    return float_decimals
