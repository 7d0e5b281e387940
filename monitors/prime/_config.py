"""Settings of a ``PrimeMonitor``: arguments, else the environment, else what ``prime login``
wrote, checked once, with the precedence of the Prime SDKs (prime-traces' ``Config``)."""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import UploadError

__all__ = [
    "DEFAULT_BASE_URL",
    "DEFAULT_TRACES_URL",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_LINES",
    "MAX_LINE_BYTES",
    "MAX_REQUEST_BYTES",
    "METRICS_PATH",
    "TRACES_PATH",
    "PrimeConfig",
    "Secret",
]

DEFAULT_BASE_URL = "https://api.primeintellect.ai"
#: Where the SDK sends traces when nothing says otherwise: production serves the Traces API on
#: the public API domain, and only production does, so another base URL (dev, staging, a
#: local platform) is never taken for it (prime-traces' ``Config.traces_url``).
DEFAULT_TRACES_URL = "https://api.primeintellect.ai"
#: The deployed service sits behind a 32 MiB request cap (prime-traces' batching notes).
MAX_REQUEST_BYTES = 32 << 20
#: The endpoints, after ``traces_url`` and ``base_url``.
TRACES_PATH = "/api/v1/traces"
METRICS_PATH = "/api/v1/rft/metrics"
#: The service's limits: a batch holds at most this many lines; a longer line is refused.
MAX_BATCH_LINES = 1_000_000
MAX_LINE_BYTES = 64 << 20  # the line's bytes without its newline, as the SDK counts them
#: The most ``batch_bytes`` can be: a batch of lines up to this many bytes fits the request
#: cap even stored uncompressed (``gzip_level=0``), with its multipart framing.
MAX_BATCH_BYTES = MAX_REQUEST_BYTES - (1 << 20)


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


def login_file() -> Path:
    """What ``prime login`` writes: ``~/.prime/config.json``."""
    return Path.home() / ".prime" / "config.json"


def _login_settings() -> dict[str, Any]:
    """``~/.prime/config.json`` as a dict; {} when it is absent, unreadable or not an object
    (as the SDK reads it: a broken file never stops a run whose settings are given)."""
    try:
        settings = orjson.loads(login_file().read_bytes())
    except (OSError, orjson.JSONDecodeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def _text(settings: dict[str, Any], name: str) -> str | None:
    value = settings.get(name)
    return value if isinstance(value, str) and value.strip() else None


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
    retry_for: float
    linger: float
    connect_timeout: float
    read_timeout: float
    attempt_timeout: float

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
        retry_for: float,
        linger: float,
        connect_timeout: float,
        read_timeout: float,
        attempt_timeout: float,
    ) -> PrimeConfig:
        """Fill each unset value as the Prime SDKs do: the environment (``PRIME_API_KEY``,
        ``PRIME_TEAM_ID``, ``PRIME_TRACES_URL``, ``PRIME_API_BASE_URL`` or ``PRIME_BASE_URL``,
        ``RUN_ID``), then ``~/.prime/config.json`` (``api_key``, ``team_id``, ``traces_url``,
        ``base_url``), then the SDK's defaults; the traces URL never falls back to the base
        URL. Raise ``UploadError`` when no key is found anywhere."""
        env = os.environ
        login = _login_settings()
        key = (
            api_key if api_key is not None else env.get("PRIME_API_KEY") or _text(login, "api_key")
        )
        if not key or not key.strip():
            raise UploadError(
                "no Prime API key: pass api_key=, set the PRIME_API_KEY environment variable, "
                f"or run `prime login` (it writes {login_file()})"
            )
        base = _url(
            base_url
            or env.get("PRIME_API_BASE_URL")
            or env.get("PRIME_BASE_URL")
            or _text(login, "base_url")
            or DEFAULT_BASE_URL
        )
        traces = _url(
            traces_url
            or env.get("PRIME_TRACES_URL")
            or _text(login, "traces_url")
            or DEFAULT_TRACES_URL
        )
        if team_id is not None:
            team: str | None = team_id
        elif "PRIME_TEAM_ID" in env:
            team = env["PRIME_TEAM_ID"]
        else:
            team = _text(login, "team_id")
        run = run_id if run_id is not None else env.get("RUN_ID")
        for name, number in (
            ("max_in_flight", max_in_flight),
            ("queue_records", queue_records),
            ("batch_bytes", batch_bytes),
            ("batch_lines", batch_lines),
            ("line_bytes", line_bytes),
        ):
            _positive(name, number, integer=True)
        for name, seconds in (
            ("drain_timeout", drain_timeout),
            ("retry_base", retry_base),
            ("retry_after_cap", retry_after_cap),
            ("retry_for", retry_for),
            ("connect_timeout", connect_timeout),
            ("read_timeout", read_timeout),
            ("attempt_timeout", attempt_timeout),
        ):
            _positive(name, seconds)
        if isinstance(linger, bool) or not isinstance(linger, (int, float)) or linger < 0:
            raise ValueError(f"linger must be a number >= 0, not {linger!r}")
        if batch_bytes > MAX_BATCH_BYTES:
            raise ValueError(
                f"batch_bytes must be at most {MAX_BATCH_BYTES} (the service's request cap is "
                f"{MAX_REQUEST_BYTES} bytes), not {batch_bytes}"
            )
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
            retry_for=float(retry_for),
            linger=float(linger),
            connect_timeout=float(connect_timeout),
            read_timeout=float(read_timeout),
            attempt_timeout=float(attempt_timeout),
        )
