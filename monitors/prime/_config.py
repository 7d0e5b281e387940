"""Settings of a ``PrimeMonitor``: arguments, else the environment, checked once."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field

from ..errors import UploadError

__all__ = [
    "DEFAULT_BASE_URL",
    "MAX_BATCH_LINES",
    "MAX_LINE_BYTES",
    "METRICS_PATH",
    "TRACES_PATH",
    "PrimeConfig",
    "Secret",
]

DEFAULT_BASE_URL = "https://api.primeintellect.ai"
#: The endpoints, after ``traces_url`` and ``base_url``.
TRACES_PATH = "/api/v1/traces"
METRICS_PATH = "/api/v1/rft/metrics"
#: The service's limits: a batch holds at most this many lines; a longer line is refused.
MAX_BATCH_LINES = 1_000_000
MAX_LINE_BYTES = 64 << 20


class Secret:
    """A credential that never shows itself in a repr, a str or a log line."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "Secret('***')"

    __str__ = __repr__

    def __reduce__(self) -> str | tuple[object, ...]:  # never pickle a key by accident
        raise TypeError("a Secret cannot be pickled")


def _url(value: str) -> str:
    """A base URL without a trailing slash or ``/api/v1`` (both are added per endpoint)."""
    value = value.strip().rstrip("/")
    if value.endswith("/api/v1"):
        value = value[: -len("/api/v1")]
    return value


def _positive(name: str, value: float, *, integer: bool = False) -> None:
    bad = isinstance(value, bool) or not isinstance(value, int if integer else (int, float))
    if bad or not value > 0:
        kind = "a positive integer" if integer else "a positive number"
        raise ValueError(f"{name} must be {kind}, not {value!r}")


@dataclass(frozen=True)
class PrimeConfig:
    """Where and how a ``PrimeMonitor`` uploads. ``api_key`` stays hidden in every repr."""

    api_key: Secret = field(repr=False)
    traces_url: str
    base_url: str
    team_id: str | None
    run_id: str
    max_in_flight: int
    queue_records: int
    batch_bytes: int
    batch_lines: int
    line_bytes: int
    gzip_level: int
    drain_timeout: float
    retry_base: float
    retry_after_cap: float
    attempts: int
    linger: float
    connect_timeout: float
    read_timeout: float

    @classmethod
    def resolve(
        cls,
        *,
        api_key: str | None,
        traces_url: str | None,
        team_id: str | None,
        base_url: str | None,
        run_id: str | None,
        max_in_flight: int,
        queue_records: int,
        batch_bytes: int,
        batch_lines: int,
        line_bytes: int,
        gzip_level: int,
        drain_timeout: float,
        retry_base: float,
        retry_after_cap: float,
        attempts: int,
        linger: float,
        connect_timeout: float,
        read_timeout: float,
    ) -> PrimeConfig:
        """Fill unset values from ``PRIME_API_KEY``, ``PRIME_TRACES_URL``, ``PRIME_TEAM_ID``,
        ``PRIME_API_BASE_URL`` and ``RUN_ID``; raise ``UploadError`` without a key."""
        key = api_key if api_key is not None else os.environ.get("PRIME_API_KEY")
        if not key or not key.strip():
            raise UploadError(
                "no Prime API key: pass api_key= or set the PRIME_API_KEY environment variable"
            )
        base = _url(base_url or os.environ.get("PRIME_API_BASE_URL") or DEFAULT_BASE_URL)
        traces = _url(traces_url or os.environ.get("PRIME_TRACES_URL") or base)
        team = team_id if team_id is not None else os.environ.get("PRIME_TEAM_ID")
        run = run_id if run_id is not None else os.environ.get("RUN_ID")
        for name, number in (
            ("max_in_flight", max_in_flight),
            ("queue_records", queue_records),
            ("batch_bytes", batch_bytes),
            ("batch_lines", batch_lines),
            ("line_bytes", line_bytes),
            ("attempts", attempts),
        ):
            _positive(name, number, integer=True)
        for name, seconds in (
            ("drain_timeout", drain_timeout),
            ("retry_base", retry_base),
            ("retry_after_cap", retry_after_cap),
            ("connect_timeout", connect_timeout),
            ("read_timeout", read_timeout),
        ):
            _positive(name, seconds)
        if isinstance(linger, bool) or not isinstance(linger, (int, float)) or linger < 0:
            raise ValueError(f"linger must be a number >= 0, not {linger!r}")
        if isinstance(gzip_level, bool) or gzip_level not in range(0, 10):
            raise ValueError(f"gzip_level must be 0 to 9, not {gzip_level!r}")
        return cls(
            api_key=Secret(key.strip()),
            traces_url=traces,
            base_url=base,
            team_id=team or None,
            run_id=run or uuid.uuid4().hex,
            max_in_flight=max_in_flight,
            queue_records=queue_records,
            batch_bytes=batch_bytes,
            batch_lines=min(batch_lines, MAX_BATCH_LINES),
            line_bytes=line_bytes,
            gzip_level=gzip_level,
            drain_timeout=float(drain_timeout),
            retry_base=float(retry_base),
            retry_after_cap=float(retry_after_cap),
            attempts=attempts,
            linger=float(linger),
            connect_timeout=float(connect_timeout),
            read_timeout=float(read_timeout),
        )
