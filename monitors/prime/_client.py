"""HTTP to the Prime API over one aiohttp session: one POST with retries, never raising.

429/500/502/503/504, transport errors and (for traces) a 2xx without ``"status": "committed"``
are retried with the same bytes and key, after ``Retry-After`` or a jittered backoff capped
at 30 times ``retry_base``, for ``retry_for`` seconds (docs/design.md D12). A 401/403 stops
every later request, and so does a setup error (a redirect, which is never followed, or a
TLS failure), at once; other answers outside 2xx reject.

A request whose attempts never reached a server (no connection, or none that took its body)
ends ``unreachable``, not ``failed``. A transport failure is logged at WARNING with its cause
the first time a host fails, and again when that host answers (docs/design.md D12).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Literal
from urllib.parse import urlsplit

import aiohttp
import anyio
import orjson

from ._body import Body, Pieces
from ._config import PrimeConfig

__all__ = [
    "RETRY_STATUSES",
    "Attempts",
    "Client",
    "Outage",
    "Result",
    "error_of",
    "is_committed",
    "redact",
    "retry_after_seconds",
]

log = logging.getLogger("monitors.prime")

RETRY_STATUSES = frozenset({429, 500, 502, 503, 504})
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError)
_DETAIL_CHARS = 300

Outcome = Literal["delivered", "rejected", "unauthorized", "setup_error", "failed", "unreachable"]
Stop = Literal["unauthorized", "setup_error"]


@dataclass(frozen=True)
class Result:
    """How one request ended: ``outcome``, the last status (None: no answer) and why."""

    outcome: Outcome
    status: int | None = None
    detail: str = ""
    attempts: int = 0
    code: str | None = None  # the service's error code, when it named one

    @property
    def reason(self) -> str:
        """What a loss is counted as: the outcome, with the service's code for a rejection
        (``rejected:invalid_trace``)."""
        if self.outcome == "rejected" and self.code:
            return f"rejected:{self.code}"
        return self.outcome


class Attempts:
    """What one request's attempts have done so far: whether any reached a server, and
    whether the service may have stored the body (an attempt handed over every byte of it
    and no answer came), which decides how ``finalize`` counts a request it cuts short."""

    __slots__ = ("body", "reached", "unanswered")

    def __init__(self) -> None:
        self.reached = False  # an attempt connected, or was answered
        self.unanswered = False  # an earlier attempt sent the whole body and got no answer
        self.body: Pieces | None = None  # the body of the attempt under way

    def may_be_stored(self) -> bool:
        """Whether the service may hold the body: a whole body went out and was never
        answered (by an earlier attempt, or by the one under way)."""
        return self.unanswered or (self.body is not None and self.body.done)


@dataclass(frozen=True)
class Outage:
    """A host that has not answered since its last transport failure."""

    host: str
    since: float  # time.monotonic() of the first failure
    cause: str  # the last failure, in words
    ever_answered: bool  # whether the host answered earlier in this run


def retry_after_seconds(value: str | None, *, cap: float) -> float | None:
    """``Retry-After`` as seconds from now (0 to ``cap``), or None if absent or unreadable."""
    if value is None:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when.tzinfo is None:
            return None
        seconds = when.timestamp() - time.time()
    if seconds != seconds:  # NaN
        return None
    return min(cap, max(0.0, seconds))


class _Credential(str):
    """A header value that is a credential: sent as it is, shown as ``'***'`` by ``repr``
    (and so in a traceback's locals, a debugger's or an error reporter's view of a frame)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "'***'"


#: A credential as a server may echo one: ``Bearer <token>``, or an ``Authorization`` value.
_CREDENTIAL = re.compile(
    r"(?i)(\bbearer\s+)[^\s\"',;}]+|(\bauthorization[\"']?\s*[:=]\s*[\"']?)[^\"',;}\n]+"
)


def redact(text: str, key: str) -> str:
    """``text`` with ``key`` and every bearer token or ``Authorization`` value it holds
    replaced by ``***``, whatever the key."""
    if key:
        text = text.replace(key, "***")
    return _CREDENTIAL.sub(lambda m: (m.group(1) or m.group(2)) + "***", text)


def error_of(raw: bytes) -> tuple[str | None, str]:
    """``(code, message)`` of an error answer, read as prime-traces reads one: the service's
    ``{"error": {"code", "message"}}``, else a ``{"detail": ...}``, else the text."""
    text = raw.decode("utf-8", "replace")
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return None, text
    if isinstance(answer, dict):
        error = answer.get("error")
        if isinstance(error, dict):
            code = error.get("code")
            message = error.get("message")
            return (
                code if isinstance(code, str) and code else None,
                message if isinstance(message, str) and message else text,
            )
        if answer.get("detail"):
            return None, str(answer["detail"])
    return None, text


def is_committed(raw: bytes) -> bool:
    """Whether a 2xx answer's body is a JSON object with ``"status": "committed"``."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and answer.get("status") == "committed"


class Client:
    """POSTs for one monitor. ``stopped`` turns true at the first 401/403 (``stopped_as``
    ``"unauthorized"``) or setup error (``"setup_error"``)."""

    def __init__(self, config: PrimeConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.session = session
        self.stopped = False
        #: The records wait on the disk (outbox mode): a stop leaves them pending, not lost.
        self.durable = False
        self.stopped_as: Stop = "unauthorized"
        self.stop_reason = ""
        self._outages: dict[str, Outage] = {}  # by host
        self._answered: set[str] = set()  # hosts that answered in this run
        self._random = random.Random()
        self._auth: dict[str, str] = {
            "Authorization": _Credential(f"Bearer {config.api_key.reveal()}")
        }
        if config.team_id:
            self._auth["X-Prime-Team-ID"] = config.team_id

    def backoff(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (0-based) when the server named no time."""
        base = self.config.retry_base * min(30.0, 2.0**retry)
        return base * self._random.uniform(0.5, 1.5)

    def outage(self) -> Outage | None:
        """The oldest host not answering now, if any."""
        return min(self._outages.values(), key=lambda o: o.since, default=None)

    def _failed_in_transit(self, host: str, cause: str) -> None:
        outage = self._outages.get(host)
        if outage is not None:
            self._outages[host] = Outage(host, outage.since, cause, outage.ever_answered)
            return
        self._outages[host] = Outage(host, time.monotonic(), cause, host in self._answered)
        if self.durable:
            log.warning(
                "Prime API at %s did not answer (%s); retrying each request until it answers",
                host,
                cause,
            )
            return
        log.warning(
            "Prime API at %s did not answer (%s); retrying each request for up to %.0f s. "
            "Records whose requests never reach it are counted 'unreachable'.",
            host,
            cause,
            self.config.retry_for,
        )

    def _answered_by(self, host: str) -> None:
        self._answered.add(host)
        outage = self._outages.pop(host, None)
        if outage is not None:
            log.warning(
                "Prime API at %s answers again, after %.1f s without an answer",
                host,
                time.monotonic() - outage.since,
            )

    def _clean(self, text: str) -> str:
        """Server text made safe to log: never holding the key or any credential it echoes
        (redacted before the text is cut, so no prefix of one is left), and short."""
        text = redact(text, self.config.api_key.reveal())
        return text[:_DETAIL_CHARS].replace("\n", " ").strip()

    async def post(
        self,
        url: str,
        body: bytes | Body,
        headers: dict[str, str],
        *,
        what: str,
        committed: bool = False,
        attempts: Attempts | None = None,
    ) -> Result:
        """POST ``body`` until it is answered for good, or until the next retry would start
        more than ``retry_for`` seconds after the first attempt. The body is streamed piece
        by piece (with its ``Content-Length``), afresh on every attempt. With ``committed``,
        a 2xx counts only with ``"status": "committed"`` (else it is retried). ``attempts``
        follows what the attempts do, for a caller that may cut the request short."""
        config = self.config
        if isinstance(body, bytes):
            body = Body(
                content_type=headers.get("Content-Type", ""), pieces=(body,), size=len(body)
            )
        headers = {**headers, **self._auth, "Content-Length": str(body.size)}
        host = _host(url)
        tried = attempts if attempts is not None else Attempts()
        last = Result("failed")
        give_up = time.monotonic() + config.retry_for
        for attempt in itertools.count():
            if self.stopped:
                return Result(self.stopped_as, None, self.stop_reason, attempt)
            delay: float | None = None
            data = tried.body = body.stream()
            try:
                async with self.session.post(
                    url, data=data, headers=headers, allow_redirects=False
                ) as response:
                    status = response.status
                    raw = await response.read()
                    retry_after = response.headers.get("Retry-After")
                    location = response.headers.get("Location", "")
            except aiohttp.ClientSSLError as exc:
                detail = self._clean(f"{type(exc).__name__}: {exc}")
                self._stop_setup(f"TLS failed ({detail})", url, what)
                return Result("setup_error", None, detail, attempt + 1)
            except _TRANSPORT_ERRORS as exc:
                detail = self._clean(f"{type(exc).__name__}: {exc}" if str(exc) else repr(exc))
                tried.reached = tried.reached or data.started
                tried.unanswered = tried.unanswered or data.done
                outcome: Outcome = "failed" if tried.reached else "unreachable"
                last = Result(outcome, None, detail, attempt + 1)
                self._failed_in_transit(host, detail)
            else:
                tried.reached = True
                tried.body = None  # answered: this attempt stored nothing unknown
                self._answered_by(host)
                detail = self._clean(raw.decode("utf-8", "replace"))
                success = 200 <= status < 300
                if success and (not committed or is_committed(raw)):
                    return Result("delivered", status, detail, attempt + 1)
                if status in (401, 403):
                    self._stop(status, detail, what)
                    return Result("unauthorized", status, detail, attempt + 1)
                if 300 <= status < 400:
                    # Never followed: the key and team would go to wherever it points.
                    where = self._clean(location) or "no Location"
                    self._stop_setup(f"HTTP {status}, a redirect to {where}", url, what)
                    return Result("setup_error", status, detail, attempt + 1)
                if not success and status not in RETRY_STATUSES:
                    code, message = error_of(raw)
                    detail = self._clean(message)
                    return Result("rejected", status, detail, attempt + 1, code)
                if success:  # answered, but not committed: retried like a 503
                    detail = f'answered without "status": "committed": {detail or "no body"}'
                    log.warning("%s: HTTP %d %s", what, status, detail)
                last = Result("failed", status, detail, attempt + 1)
                delay = retry_after_seconds(retry_after, cap=config.retry_after_cap)
            if delay is None:
                delay = self.backoff(attempt)
            left = give_up - time.monotonic()
            if delay > left:
                break
            log.info(
                "%s: attempt %d failed (%s); retrying in %.2f s (for %.0f s more)",
                what,
                attempt + 1,
                last.detail if last.status is None else f"HTTP {last.status}",
                delay,
                left,
            )
            await anyio.sleep(delay)
        return last

    def _stop_setup(self, problem: str, url: str, what: str) -> None:
        if self.stopped:
            return
        self.stopped, self.stopped_as = True, "setup_error"
        self.stop_reason = problem
        log.error(
            "Prime API at %s: %s, for %s. This is a setting to fix, not a fault to wait out: "
            "uploads are stopped and %s. Check PRIME_TRACES_URL / PRIME_API_BASE_URL (the URL "
            "a redirect points to, https and its certificate).",
            url,
            problem,
            what,
            self._fate("setup_error"),
        )

    def _stop(self, status: int, detail: str, what: str) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.stop_reason = f"HTTP {status} ({detail})"
        log.error(
            "Prime API refused the credentials (HTTP %d: %s) for %s; uploads are stopped and "
            "%s. Check PRIME_API_KEY and PRIME_TEAM_ID.",
            status,
            detail or "no detail",
            what,
            self._fate("unauthorized"),
        )

    def _fate(self, stop: Stop) -> str:
        """What becomes of the records a stop leaves, in words."""
        if self.durable:
            return "the records stay on the disk, pending, for a later upload"
        return f"every record from now on is counted lost as '{stop}'"


def _host(url: str) -> str:
    """``host:port`` of ``url``, as a log names where requests go."""
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return f"{parts.hostname}:{port}"
