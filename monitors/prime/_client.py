"""HTTP to the Prime API over one aiohttp session: one POST with retries, never raising.

429/502/503/504, transport errors and (for traces) a 2xx without ``"status": "committed"``
are retried with the same bytes and key, after ``Retry-After`` or a jittered backoff
(docs/design.md D12). A 401/403 stops every later request; other answers outside 2xx reject.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Literal

import aiohttp
import anyio
import orjson

from ._body import Body
from ._config import PrimeConfig

__all__ = ["RETRY_STATUSES", "Client", "Result", "is_committed", "retry_after_seconds"]

log = logging.getLogger("monitors.prime")

RETRY_STATUSES = frozenset({429, 502, 503, 504})
_TRANSPORT_ERRORS = (aiohttp.ClientError, asyncio.TimeoutError, TimeoutError, OSError)
_DETAIL_CHARS = 300

Outcome = Literal["delivered", "rejected", "unauthorized", "failed"]


@dataclass(frozen=True)
class Result:
    """How one request ended: ``outcome``, the last status (None: no answer) and why."""

    outcome: Outcome
    status: int | None = None
    detail: str = ""
    attempts: int = 0


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


def is_committed(raw: bytes) -> bool:
    """Whether a 2xx answer's body is a JSON object with ``"status": "committed"``."""
    try:
        answer = orjson.loads(raw)
    except orjson.JSONDecodeError:
        return False
    return isinstance(answer, dict) and answer.get("status") == "committed"


class Client:
    """POSTs for one monitor. ``stopped`` turns true at the first 401/403."""

    def __init__(self, config: PrimeConfig, session: aiohttp.ClientSession) -> None:
        self.config = config
        self.session = session
        self.stopped = False
        self.stop_reason = ""
        self._random = random.Random()
        self._auth = {"Authorization": f"Bearer {config.api_key.reveal()}"}
        if config.team_id:
            self._auth["X-Prime-Team-ID"] = config.team_id

    def backoff(self, retry: int) -> float:
        """Seconds before retry number ``retry`` (0-based) when the server named no time."""
        base = self.config.retry_base * min(30.0, 2.0**retry)
        return base * self._random.uniform(0.5, 1.5)

    def _clean(self, text: str) -> str:
        """Server text made safe to log: short, and never holding the key."""
        text = text[:_DETAIL_CHARS].replace(self.config.api_key.reveal(), "***")
        return text.replace("\n", " ").strip()

    async def post(
        self,
        url: str,
        body: bytes | Body,
        headers: dict[str, str],
        *,
        what: str,
        committed: bool = False,
    ) -> Result:
        """POST ``body`` until it is answered for good or the attempts run out. A ``Body`` is
        streamed piece by piece (with its ``Content-Length``), afresh on every attempt. With
        ``committed``, a 2xx counts only with ``"status": "committed"`` (else it is retried)."""
        config = self.config
        headers = {**headers, **self._auth}
        if isinstance(body, Body):
            headers["Content-Length"] = str(body.size)
        last = Result("failed")
        for attempt in range(config.attempts):
            if self.stopped:
                return Result("unauthorized", None, self.stop_reason, attempt)
            delay: float | None = None
            try:
                data = body.stream() if isinstance(body, Body) else body
                async with self.session.post(url, data=data, headers=headers) as response:
                    status = response.status
                    raw = await response.read()
                    retry_after = response.headers.get("Retry-After")
            except _TRANSPORT_ERRORS as exc:
                last = Result(
                    "failed", None, self._clean(f"{type(exc).__name__}: {exc}"), attempt + 1
                )
            else:
                detail = self._clean(raw.decode("utf-8", "replace"))
                success = 200 <= status < 300
                if success and (not committed or is_committed(raw)):
                    return Result("delivered", status, detail, attempt + 1)
                if status in (401, 403):
                    self._stop(status, detail, what)
                    return Result("unauthorized", status, detail, attempt + 1)
                if not success and status not in RETRY_STATUSES:
                    return Result("rejected", status, detail, attempt + 1)
                if success:  # answered, but not committed: retried like a 503
                    detail = f'answered without "status": "committed": {detail or "no body"}'
                    log.warning("%s: HTTP %d %s", what, status, detail)
                last = Result("failed", status, detail, attempt + 1)
                delay = retry_after_seconds(retry_after, cap=config.retry_after_cap)
            if attempt + 1 >= config.attempts:
                break
            if delay is None:
                delay = self.backoff(attempt)
            log.info(
                "%s: attempt %d of %d failed (%s); retrying in %.2f s",
                what,
                attempt + 1,
                config.attempts,
                last.detail if last.status is None else f"HTTP {last.status}",
                delay,
            )
            await anyio.sleep(delay)
        return last

    def _stop(self, status: int, detail: str, what: str) -> None:
        if self.stopped:
            return
        self.stopped = True
        self.stop_reason = f"HTTP {status} ({detail})"
        log.error(
            "Prime API refused the credentials (HTTP %d: %s) for %s; uploads are stopped and "
            "every record from now on is counted lost as 'unauthorized'. Check PRIME_API_KEY "
            "and PRIME_TEAM_ID.",
            status,
            detail or "no detail",
            what,
        )
