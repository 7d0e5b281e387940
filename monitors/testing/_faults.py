"""The faults a ``TracesServer`` can inject, and how one request's fate is drawn.

Shared by the client side (to check arguments before a process is started) and the server
(which owns the live copy, changed at runtime by ``POST /_faults``).
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["Fate", "Faults", "FaultsError"]

# What happens to one API request: answered normally (None), refused with a status code,
# its connection closed mid-body ("drop"), or closed before anything is read ("down").
Fate = int | Literal["drop", "down"] | None

_RATES = ("drop_rate", "fail_rate_429", "fail_rate_500", "fail_rate_503")


class FaultsError(ValueError):
    """A fault setting is unknown or out of range."""


@dataclass
class Faults:
    """Fault injection for the API endpoints (``/api/...``); control endpoints never fail.

    :param latency: seconds added before every API answer.
    :param bandwidth: bytes per second the request body is read at (0: no limit).
    :param fail_rate_429: chance a request is answered 429 after its body is read.
    :param fail_rate_500: the same for 500.
    :param fail_rate_503: the same for 503.
    :param drop_rate: chance the connection is closed after part of the body, unanswered.
    :param retry_after: a 429's ``Retry-After``: seconds (sent as an integer when whole), or
        a string sent as is (an HTTP date, say).
    :param seed: seeds the RNG behind the rates (one draw per API request).
    :param down: close every API request's connection at once, unanswered.
    :param script: what the next API requests get, in order, before any rate applies: a
        status code (``200``: answer normally) or ``"drop"``, each used once.
    :param reject_ids: record ``"id"`` -> an error code: every traces upload holding a record
        with such an id is answered 400 with that code, as the service rejects an upload
        for one bad record (nothing of it stored).
    :param hold: answers wait while this is set (after ``latency``); clearing it lets every
        held answer go: a service that is slow for exactly as long as a test needs.
    """

    latency: float = 0.0
    bandwidth: float = 0.0
    fail_rate_429: float = 0.0
    fail_rate_500: float = 0.0
    fail_rate_503: float = 0.0
    drop_rate: float = 0.0
    retry_after: float | str = 1
    seed: int | None = None
    down: bool = False
    script: list[int | str] = field(default_factory=list)
    reject_ids: dict[str, str] = field(default_factory=dict)
    hold: bool = False

    def __post_init__(self) -> None:
        self.validate()

    @classmethod
    def of(cls, value: Faults | Mapping[str, Any] | None) -> Faults:
        if value is None:
            return cls()
        if isinstance(value, Faults):
            return dataclasses.replace(
                value, script=list(value.script), reject_ids=dict(value.reject_ids)
            )
        return cls().merged(value)

    def merged(self, changes: Mapping[str, Any]) -> Faults:
        """A copy with ``changes`` applied; keys not named keep their value."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise FaultsError(f"unknown fault setting(s) {unknown}; known: {sorted(names)}")
        values = {**dataclasses.asdict(self), **changes}
        values["script"] = list(values["script"] or [])
        values["reject_ids"] = dict(values["reject_ids"] or {})
        return Faults(**values)

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        for name in ("latency", "bandwidth"):
            value = getattr(self, name)
            if not _is_number(value) or not (math.isfinite(value) and value >= 0):
                raise FaultsError(f"{name} must be a finite number >= 0, not {value!r}")
        for name in _RATES:
            value = getattr(self, name)
            if not _is_number(value) or not 0 <= value <= 1:
                raise FaultsError(f"{name} must be a number from 0 to 1, not {value!r}")
        if sum(getattr(self, name) for name in _RATES) > 1 + 1e-9:
            raise FaultsError(f"the rates {', '.join(_RATES)} add up to more than 1")
        if isinstance(self.retry_after, str):
            if not self.retry_after or "\n" in self.retry_after or "\r" in self.retry_after:
                raise FaultsError(f"retry_after is not a header value: {self.retry_after!r}")
        elif not _is_number(self.retry_after) or not self.retry_after >= 0:
            raise FaultsError(f"retry_after must be seconds >= 0, not {self.retry_after!r}")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int)
        ):
            raise FaultsError(f"seed must be an int or None, not {self.seed!r}")
        for name in ("down", "hold"):
            if not isinstance(getattr(self, name), bool):
                raise FaultsError(f"{name} must be a bool, not {getattr(self, name)!r}")
        if not isinstance(self.script, list):
            raise FaultsError(f"script must be a list, not {self.script!r}")
        for entry in self.script:
            if entry == "drop":
                continue
            if isinstance(entry, bool) or not isinstance(entry, int) or not 200 <= entry <= 599:
                raise FaultsError(f'script entries are status codes or "drop", not {entry!r}')
        if not isinstance(self.reject_ids, dict) or not all(
            isinstance(k, str) and isinstance(v, str) and v for k, v in self.reject_ids.items()
        ):
            raise FaultsError(f"reject_ids must map ids to codes, not {self.reject_ids!r}")

    def retry_after_header(self) -> str:
        value = self.retry_after
        if isinstance(value, str):
            return value
        return str(int(value)) if float(value).is_integer() else repr(float(value))

    def draw(self, rng: random.Random) -> Fate:
        """This request's fate from the rates (one RNG draw, whatever the rates are)."""
        roll = rng.random()
        choices: tuple[tuple[Fate, float], ...] = (
            ("drop", self.drop_rate),
            (429, self.fail_rate_429),
            (500, self.fail_rate_500),
            (503, self.fail_rate_503),
        )
        for fate, rate in choices:
            if roll < rate:
                return fate
            roll -= rate
        return None


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
