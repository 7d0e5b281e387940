"""What a record is: a verifiers episode, a pydantic model, an object with ``to_record()`` or a
Mapping; turned into what the encoder writes only when it is encoded."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from typing import Any, Final, Literal, TypeAlias

import encoder
from encoder._models import is_model

__all__ = [
    "DEFAULT_FLOAT_DECIMALS",
    "KINDS",
    "SLOW_TO_RECORD",
    "SUBSETS",
    "Edit",
    "Kind",
    "Records",
    "Subset",
    "check_float_decimals",
    "check_kind",
    "line_option",
    "record_id",
]

log = logging.getLogger(__name__)

#: Sees each model's dumped fields (or a record's dict) before they are written.
Edit: TypeAlias = Callable[[Any, dict[str, Any]], None]

Kind = Literal["train", "eval"]
"""Which episodes: training or evaluation."""
Subset = Literal["all", "effective"]
"""Which stream of a kind: ``"all"`` episodes or the ``"effective"`` batch."""
KINDS: tuple[Kind, ...] = ("train", "eval")
SUBSETS: tuple[Subset, ...] = ("all", "effective")


#: verifiers' own default for per-token floats (``RECORD_FLOAT_DECIMALS``), which prime-rl's
#: file monitor keeps: the monitors' default, so a prime-rl user gets prime-rl's bytes.
DEFAULT_FLOAT_DECIMALS: Final = 4
#: A ``to_record()`` call that holds the event loop longer than this is reported.
SLOW_TO_RECORD: Final = 0.020


class Records:
    """Turns what a caller logs into what one monitor's encoder writes, and keeps count of
    the ``to_record()`` calls that held the event loop (``slow``, warned once per type).

    What each kind of episode becomes (docs/monitors.md, "What to log"):

    - a verifiers ``Episode`` or ``Trace``: the bytes of ``to_record(float_decimals=...)``,
      walked a node and a slice at a time, never built as a dict;
    - any other object with ``to_record()``: what that returns (a dict, walked);
    - any other pydantic model: the bytes of ``model_dump(mode="json")``, walked;
    - a Mapping: itself, as given (``float_decimals`` does not touch it).

    :param float_decimals: verifiers' ``float_decimals``: the per-token floats of its
        episodes rounded to this many decimals, None for every digit.
    """

    __slots__ = ("_warned", "float_decimals", "slow")

    def __init__(self, float_decimals: int | None) -> None:
        self.float_decimals = float_decimals
        self.slow = 0
        self._warned: set[type] = set()

    def value(self, episode: Any, *, edit: Edit | None = None) -> Any:
        """The value to encode for one episode. ``edit`` sees each model's dumped fields (or
        the dict ``to_record()`` returned) before they are written.

        :raises TypeError: The episode is none of the kinds above.
        :raises Exception: What ``to_record()`` raised.
        """
        view = encoder.record_dump(episode, self.float_decimals, edit=edit)
        if view is not None:
            return view
        to_record = getattr(episode, "to_record", None)
        if to_record is not None and callable(to_record):
            start = time.perf_counter()
            record = to_record()
            self._timed(type(episode), time.perf_counter() - start)
            if edit is not None and isinstance(record, Mapping):
                record = dict(record)
                edit(episode, record)
            return record
        if is_model(episode):
            return encoder.ModelDump(episode, edit=edit)
        if isinstance(episode, Mapping):
            if edit is not None:
                episode = dict(episode)
                edit(None, episode)
            return episode
        raise TypeError(
            "an episode must be a Mapping, a pydantic model or have to_record(), "
            f"not {type(episode).__name__}"
        )

    def _timed(self, cls: type, seconds: float) -> None:
        if seconds <= SLOW_TO_RECORD:
            return
        self.slow += 1
        if cls not in self._warned:
            self._warned.add(cls)
            log.warning(
                "%s.to_record() held the event loop for %.0f ms: nodewise walks verifiers "
                "episodes and pydantic models a part at a time; hand it one of those, or a "
                'dict (docs/monitors.md, "What to log")',
                cls.__qualname__,
                seconds * 1000,
            )


def record_id(value: Any) -> Any:
    """The ``"id"`` a record will have, as far as it can be known before it is written."""
    if isinstance(value, Mapping):
        return value.get("id")
    if isinstance(value, encoder.ModelDump):
        return getattr(value.model, "id", None)
    return None


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

    :raises ValueError: It is neither None nor an int (any int, as ``round`` and verifiers
        take).
    """
    if float_decimals is not None and type(float_decimals) is not int:
        raise ValueError(f"float_decimals must be an int or None, not {float_decimals!r}")
    return float_decimals
