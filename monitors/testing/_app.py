"""The aiohttp application behind ``TracesServer``: the Prime Traces API ingest endpoints, the
control endpoints tests use, and the state they share.

The API endpoints check a request the way the real service does (auth, team, headers,
multipart framing, gzip, one JSON value per line, limits, idempotency) and answer with the
real status codes, so an uploader tested here meets the same refusals. Batch checks run one
at a time on a worker thread of their own; every shared count is updated under one lock.
"""

from __future__ import annotations

import asyncio
import logging
import random
import re
import threading
import time
from collections import Counter, deque
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Final

import orjson
from aiohttp import web

from ..prime import METRICS_PATH, TRACES_PATH
from ._batch import BatchLimits, CheckedBatch, Refused, check_traces
from ._faults import Fate, Faults, FaultsError
from ._multipart import (
    MultipartError,
    MultipartParser,
    PartData,
    PartEnd,
    PartStart,
    parse_header_params,
)

__all__ = ["STATE", "ServerConfig", "ServerState", "make_app"]

log = logging.getLogger("monitors.testing")

_KEY_RE = re.compile(r"sha256:[0-9a-f]{64}")
_MAX_METADATA_BYTES = 1 << 20
_MAX_METRICS_BYTES = 16 << 20
_READ_SIZE = 64 << 10
#: Batch checks run on one thread: it outpaces the monitor under test, and more would only
#: compete with it for the cores (docs/design.md D15).
_CHECK_THREADS = 1


@dataclass(frozen=True)
class ServerConfig:
    """Everything the server process is started with (it travels as command-line flags)."""

    api_key: str = "test-key"
    team_id: str | None = None
    faults: Faults = field(default_factory=Faults)
    limits: BatchLimits = field(default_factory=BatchLimits)
    max_request_bytes: int = 32 << 20
    keep_lines: bool = False
    history: int = 200


class ServerState:
    """Counters, committed uploads and recent request summaries, behind one lock.

    Worker threads commit batches while the loop thread answers ``/_stats``, hence the lock.
    """

    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.lock = threading.Lock()
        self.faults = Faults.of(config.faults)
        self.rng = random.Random(self.faults.seed)
        self._seq = 0
        self.in_flight = 0
        self._clear()

    def _clear(self) -> None:
        self.statuses: Counter[int] = Counter()
        self.outcomes: Counter[str] = Counter()  # requests never answered, by why
        self.uploads = 0
        self.replays = 0
        self.lines_received = 0
        self.lines_stored = 0
        self.ids: set[bytes] = set()
        self.duplicate_ids = 0
        self.without_id = 0
        self.metrics: list[dict[str, Any]] = []
        self.body_bytes = 0
        self.compressed_bytes = 0
        self.uncompressed_bytes = 0
        self.max_in_flight = self.in_flight
        self.committed: dict[str, str] = {}  # Idempotency-Key -> upload_id
        self.formats: dict[str, str] = {}  # Idempotency-Key -> line format
        self.lines: list[bytes] = []
        self.history: deque[dict[str, Any]] = deque(maxlen=max(1, self.config.history))

    def reset(self, *, faults: bool = False) -> None:
        """Forget everything received; with ``faults``, also go back to the starting faults."""
        with self.lock:
            self._clear()
            if faults:
                self.faults = Faults.of(self.config.faults)
                self.rng = random.Random(self.faults.seed)

    def set_faults(self, changes: dict[str, Any]) -> Faults:
        with self.lock:
            self.faults = self.faults.merged(changes)
            if "seed" in changes:
                self.rng = random.Random(self.faults.seed)
            return Faults.of(self.faults)

    def begin(self) -> tuple[int, Fate, Faults]:
        """Admit an API request: its number, its fate, and the faults in force."""
        with self.lock:
            self._seq += 1
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
            faults = self.faults
            fate: Fate
            if faults.down:
                fate = "down"
            elif faults.script:
                entry = faults.script.pop(0)  # one-shot: the live copy forgets it
                fate = "drop" if entry == "drop" else (None if entry == 200 else int(entry))
            else:
                fate = faults.draw(self.rng)
            return self._seq, fate, faults

    def end(self, summary: dict[str, Any]) -> None:
        with self.lock:
            self.in_flight -= 1
            if summary["status"] is not None:
                self.statuses[summary["status"]] += 1
            else:
                self.outcomes[summary["outcome"]] += 1
            self.history.append(summary)

    def add_body_bytes(self, n: int) -> None:
        with self.lock:
            self.body_bytes += n

    def rejected_id(self, ids: list[bytes]) -> tuple[str, str] | None:
        """The first of ``ids`` (JSON-encoded) that ``reject_ids`` names, with its code."""
        with self.lock:
            reject = self.faults.reject_ids
        if not reject:
            return None
        for encoded in ids:
            record_id = orjson.loads(encoded)
            if isinstance(record_id, str) and record_id in reject:
                return record_id, reject[record_id]
        return None

    def commit(
        self, batch: CheckedBatch, compressed_bytes: int, line_format: str
    ) -> tuple[str, bool]:
        """Store a checked batch once per Idempotency-Key: ``(upload_id, replayed)``. The
        same bytes under the other line format are a conflict (409), as the service says:
        the format is the one header the digest does not cover."""
        with self.lock:
            self.lines_received += batch.line_count
            self.compressed_bytes += compressed_bytes
            self.uncompressed_bytes += batch.uncompressed_bytes
            known = self.committed.get(batch.key)
            if known is not None:
                if self.formats[batch.key] != line_format:
                    raise Refused(
                        409,
                        f"{batch.key} was stored as {self.formats[batch.key]!r} lines",
                        "line_format_conflict",
                    )
                self.replays += 1
                return known, True
            upload_id = batch.key.removeprefix("sha256:")  # the digest is the id (the SDK's models)
            self.committed[batch.key] = upload_id
            self.formats[batch.key] = line_format
            self.uploads += 1
            self.lines_stored += batch.line_count
            for record_id in batch.ids:
                if record_id in self.ids:
                    self.duplicate_ids += 1
                else:
                    self.ids.add(record_id)
            self.without_id += batch.without_id
            if batch.lines is not None:
                self.lines.extend(batch.lines)
            return upload_id, False

    def add_metrics(self, entry: dict[str, Any]) -> None:
        with self.lock:
            self.metrics.append(entry)

    def stats(self) -> dict[str, Any]:
        with self.lock:
            return {
                "requests": {str(code): n for code, n in sorted(self.statuses.items())},
                "requests_total": sum(self.statuses.values()) + sum(self.outcomes.values()),
                "dropped": self.outcomes["dropped"],
                "refused": self.outcomes["refused"],
                "aborted": self.outcomes["aborted"],
                "uploads": self.uploads,
                "replays": self.replays,
                "lines_received": self.lines_received,
                "lines_stored": self.lines_stored,
                "unique_ids": len(self.ids),
                "duplicate_ids": self.duplicate_ids,
                "records_without_id": self.without_id,
                "metrics_received": len(self.metrics),
                "body_bytes": self.body_bytes,
                "compressed_bytes": self.compressed_bytes,
                "uncompressed_bytes": self.uncompressed_bytes,
                "in_flight": self.in_flight,
                "max_in_flight": self.max_in_flight,
            }

    def recent(self, last: int | None) -> list[dict[str, Any]]:
        with self.lock:
            items = list(self.history)
        return items if last is None else items[max(0, len(items) - last) :]


STATE = web.AppKey("state", ServerState)


@dataclass
class _Call:
    """One API request in progress: the faults in force when it arrived, and its summary
    (what ``GET /_requests`` shows)."""

    request: web.Request
    faults: Faults
    summary: dict[str, Any]


class _Part:
    """One multipart part as received: headers (names lower-cased) and its bytes."""

    def __init__(self, name: str, start: PartStart, limit: int) -> None:
        self.name = name
        self.headers = {key.lower(): value for key, value in start.headers}
        self.chunks: list[bytes] = []
        self.size = 0
        self.limit = limit
        self.gzip = False  # a traces part sent with Content-Encoding: gzip

    def add(self, data: bytes) -> None:
        self.size += len(data)
        if self.size > self.limit:
            raise Refused(400, f"part {self.name!r} is over {self.limit} bytes", "upload_too_large")
        self.chunks.append(data)

    def summary(self) -> dict[str, Any]:
        return {"name": self.name, "headers": self.headers, "bytes": self.size}


#: The service's codes for the statuses faults inject (gateway 502/504 carry none).
_FAULT_CODES: Final = {429: "rate_limited", 503: "ingest_unavailable"}


def _json(value: Any, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(
        body=orjson.dumps(value), status=status, headers=headers, content_type="application/json"
    )


class _Api:
    """The request handlers, bound to one ``ServerState``."""

    def __init__(self, state: ServerState) -> None:
        self.state = state
        self.config = state.config
        self.limits = state.config.limits
        self.checker = ThreadPoolExecutor(_CHECK_THREADS, thread_name_prefix="TracesServer check")

    async def close(self, app: web.Application) -> None:
        """Let the running check end and drop queued ones (the app's cleanup)."""
        self.checker.shutdown(wait=False, cancel_futures=True)

    # --- the API endpoints -------------------------------------------------------------

    async def traces(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, self._traces)

    async def metrics(self, request: web.Request) -> web.StreamResponse:
        return await self._serve(request, self._metrics)

    async def _serve(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        """Fault injection, latency and bookkeeping around one API request."""
        started = time.monotonic()
        seq, fate, faults = self.state.begin()
        summary: dict[str, Any] = {
            "seq": seq,
            "time": time.time(),
            "method": request.method,
            "path": request.path,
            "status": None,
            "outcome": "aborted",  # until answered: the client went away, or a server bug
            "fault": None if fate is None else fate,
            "headers": _redacted_headers(request),
            "parts": [],
            "idempotency_key": request.headers.get("Idempotency-Key"),
            "computed_key": None,
            "body_bytes": 0,
            "compressed_bytes": 0,
            "uncompressed_bytes": None,
            "lines": None,
            "metadata": None,
            "upload_id": None,
            "replay": False,
            "error": None,
            "seconds": None,
        }
        call = _Call(request, faults, summary)
        try:
            if fate == "down":
                summary["outcome"] = "refused"
                return self._hang_up(request)
            if fate == "drop":
                await self._read_some(call)
                summary["outcome"] = "dropped"
                return self._hang_up(request)
            if fate is not None:
                async for _ in self._body(call):
                    pass  # read it all, as a server failing after the upload would
                retry = {"Retry-After": faults.retry_after_header()} if fate == 429 else None
                summary["error"] = f"injected fault: {fate}"
                refusal = Refused(fate, summary["error"], _FAULT_CODES.get(fate))
                response = _json(refusal.body(), fate, retry)
            else:
                try:
                    response = await handler(call)
                except Refused as exc:
                    summary["error"] = exc.message
                    challenge = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
                    response = _json(exc.body(), exc.status, challenge)
            if faults.latency:
                await asyncio.sleep(faults.latency)
            while self.state.faults.hold:  # the live setting: clearing it lets answers go
                await asyncio.sleep(0.005)
            summary["status"] = response.status
            summary["outcome"] = "answered"
            return response
        finally:
            summary["seconds"] = time.monotonic() - started
            self.state.end(summary)

    def _hang_up(self, request: web.Request) -> web.StreamResponse:
        """Close the connection without an answer (the client sees a disconnection)."""
        if request.transport is not None:
            request.transport.abort()
        # aiohttp finds the transport closed when it writes this, and lets it go quietly.
        return web.Response(status=204)

    def _check_auth(self, request: web.Request) -> None:
        auth = request.headers.get("Authorization")
        if auth is None:
            raise Refused(401, "missing Authorization header", "unauthenticated")
        scheme, _, token = auth.partition(" ")
        if scheme.lower() != "bearer" or token.strip() != self.config.api_key:
            raise Refused(401, "invalid API key", "unauthenticated")
        team = self.config.team_id
        got = request.headers.get("X-Prime-Team-ID")
        if team is not None and got != team:
            raise Refused(403, f"X-Prime-Team-ID {got!r} is not this key's team", "forbidden")

    async def _traces(self, call: _Call) -> web.Response:
        request, summary = call.request, call.summary
        self._check_auth(request)
        # The SDK omits the header for its default format, "trace".
        line_format = request.headers.get("X-Prime-Line-Format", "trace")
        if line_format not in ("episode", "trace"):
            raise Refused(
                400,
                f"X-Prime-Line-Format must be 'episode' or 'trace', not {line_format!r}",
                "line_format_mismatch",
            )
        length = request.content_length
        if length is not None and length > self.config.max_request_bytes:
            # The transport in front of the service refuses it: no service code.
            raise Refused(413, f"request of {length} bytes is over the request cap")
        key = request.headers.get("Idempotency-Key")
        if key is None:
            raise Refused(400, "missing Idempotency-Key header", "invalid_idempotency_key")
        if not _KEY_RE.fullmatch(key):
            raise Refused(
                400,
                f"Idempotency-Key must be 'sha256:<64 hex digits>', not {key!r}",
                "invalid_idempotency_key",
            )
        try:
            content_type, params = parse_header_params(request.headers.get("Content-Type", ""))
        except MultipartError as exc:
            raise Refused(400, f"bad Content-Type: {exc}", "malformed_encoding") from None
        boundary = params.get("boundary")
        if content_type != "multipart/form-data" or not boundary:
            raise Refused(
                400,
                "Content-Type must be multipart/form-data with a boundary",
                "malformed_encoding",
            )

        parts = await self._read_parts(call, boundary)
        for name in ("metadata", "traces"):
            if name not in parts:
                raise Refused(
                    400,
                    f"no {name!r} part",
                    "invalid_metadata" if name == "metadata" else "malformed_encoding",
                )
        summary["metadata"] = _check_metadata(b"".join(parts["metadata"].chunks))
        traces = parts["traces"]
        summary["compressed_bytes"] = traces.size

        def check_and_commit() -> tuple[CheckedBatch, str, bool]:
            batch = check_traces(
                traces.chunks,
                self.limits,
                keep_lines=self.config.keep_lines,
                line_format=line_format,
                compressed_part=traces.gzip,
            )
            summary["computed_key"] = batch.key
            summary["uncompressed_bytes"] = batch.uncompressed_bytes
            summary["lines"] = batch.line_count
            rejected = self.state.rejected_id(batch.ids)
            if rejected is not None:
                record_id, code = rejected
                raise Refused(400, f"record {record_id} rejected (injected)", code)
            if batch.key != key:
                raise Refused(
                    400,
                    f"Idempotency-Key {key} is not the sha256 of the uncompressed traces "
                    f"({batch.key})",
                    "digest_mismatch",
                )
            upload_id, replay = self.state.commit(batch, traces.size, line_format)
            return batch, upload_id, replay

        try:
            loop = asyncio.get_running_loop()
            batch, upload_id, replay = await loop.run_in_executor(self.checker, check_and_commit)
        finally:
            traces.chunks.clear()
        summary["upload_id"] = upload_id
        summary["replay"] = replay
        return _json({"upload_id": upload_id, "status": "committed", "lines": batch.line_count})

    async def _read_parts(self, call: _Call, boundary: str) -> dict[str, _Part]:
        """Stream the body through the multipart parser, checking each part's headers as it
        starts, and keep the two parts' bytes (the traces part still compressed)."""
        try:
            parser = MultipartParser(boundary)
        except MultipartError as exc:
            raise Refused(400, f"bad multipart boundary: {exc}", "malformed_encoding") from None
        limits = self.limits
        # A compressed part a little over the uncompressed limit can only be over it too.
        most = max(limits.max_batch_bytes, limits.max_line_bytes + 1)
        traces_limit = most + most // 64 + (64 << 10)
        parts: dict[str, _Part] = {}
        current: _Part | None = None
        try:
            async for chunk in self._body(call):
                for event in parser.feed(chunk):
                    if isinstance(event, PartData):
                        assert current is not None
                        current.add(event.data)
                    elif isinstance(event, PartStart):
                        current = _open_part(event, parts, traces_limit)
                    elif isinstance(event, PartEnd):
                        current = None
            parser.close()
        except MultipartError as exc:
            raise Refused(400, f"malformed multipart body: {exc}", "malformed_encoding") from None
        finally:
            call.summary["parts"] = [part.summary() for part in parts.values()]
        return parts

    async def _metrics(self, call: _Call) -> web.Response:
        self._check_auth(call.request)
        body = bytearray()
        async for chunk in self._body(call):
            body += chunk
            if len(body) > _MAX_METRICS_BYTES:
                raise Refused(413, f"metrics body is over {_MAX_METRICS_BYTES} bytes")
        try:
            value = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise Refused(400, f"body is not JSON: {exc}") from None
        if not isinstance(value, dict):
            raise Refused(400, "body must be a JSON object")
        run_id, step, metrics = value.get("run_id"), value.get("step"), value.get("metrics")
        if not isinstance(run_id, str):
            raise Refused(400, f"run_id must be a string, not {run_id!r}")
        if isinstance(step, bool) or not isinstance(step, int):
            raise Refused(400, f"step must be an integer, not {step!r}")
        if not isinstance(metrics, dict):
            raise Refused(400, f"metrics must be a JSON object, not {metrics!r}")
        self.state.add_metrics({"run_id": run_id, "step": step, "metrics": metrics})
        return _json({"status": "ok"})

    # --- reading the body at the configured bandwidth -----------------------------------

    async def _body(self, call: _Call) -> AsyncIterator[bytes]:
        rate = call.faults.bandwidth
        size = _READ_SIZE if not rate else max(1024, min(_READ_SIZE, int(rate / 20)))
        loop = asyncio.get_running_loop()
        started = loop.time()
        got = 0
        while True:
            chunk = await call.request.content.read(size)
            if not chunk:
                return
            got += len(chunk)
            call.summary["body_bytes"] = got
            self.state.add_body_bytes(len(chunk))
            if rate:
                delay = started + got / rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            yield chunk

    async def _read_some(self, call: _Call) -> None:
        """Read about half the body (at least one piece), as a connection cut mid-upload."""
        want = max(1, (call.request.content_length or 0) // 2)
        got = 0
        async for chunk in self._body(call):
            got += len(chunk)
            if got >= want:
                return

    # --- the control endpoints ----------------------------------------------------------

    async def get_stats(self, request: web.Request) -> web.Response:
        return _json(self.state.stats())

    async def post_reset(self, request: web.Request) -> web.Response:
        options = await _json_body(request)
        self.state.reset(faults=bool(options.get("faults", False)))
        return _json({"status": "ok"})

    async def get_faults(self, request: web.Request) -> web.Response:
        with self.state.lock:
            faults = self.state.faults.to_dict()
        return _json(faults)

    async def post_faults(self, request: web.Request) -> web.Response:
        changes = await _json_body(request)
        try:
            faults = self.state.set_faults(changes)
        except (FaultsError, TypeError) as exc:
            return _json({"detail": str(exc)}, 400)
        return _json(faults.to_dict())

    async def get_requests(self, request: web.Request) -> web.Response:
        last = request.query.get("last")
        try:
            count = None if last is None else int(last)
        except ValueError:
            return _json({"detail": f"last must be an integer, not {last!r}"}, 400)
        return _json(self.state.recent(count))

    async def get_metrics(self, request: web.Request) -> web.Response:
        with self.state.lock:
            metrics = list(self.state.metrics)
        return _json(metrics)

    async def get_lines(self, request: web.Request) -> web.Response:
        if not self.config.keep_lines:
            return _json({"detail": "the server was started without keep_lines"}, 409)
        with self.state.lock:
            lines = list(self.state.lines)
        body = b"".join(line + b"\n" for line in lines)
        return web.Response(body=body, content_type="application/x-ndjson")


Handler = Callable[[_Call], Awaitable[web.Response]]


def _open_part(start: PartStart, parts: dict[str, _Part], traces_limit: int) -> _Part:
    """Check a part's headers the moment they arrive and make its holder."""
    disposition = start.header("Content-Disposition")
    if disposition is None:
        raise Refused(400, "a part has no Content-Disposition header", "malformed_encoding")
    try:
        kind, params = parse_header_params(disposition)
        content_type = parse_header_params(start.header("Content-Type") or "")[0]
    except MultipartError as exc:
        raise Refused(400, f"bad part header: {exc}", "malformed_encoding") from None
    name = params.get("name")
    if kind != "form-data" or name is None:
        raise Refused(
            400,
            f"a part's Content-Disposition is not form-data with a name: {disposition!r}",
            "malformed_encoding",
        )
    if name in parts:
        raise Refused(
            400,
            f"more than one {name!r} part",
            "invalid_metadata" if name == "metadata" else "malformed_encoding",
        )
    if name == "metadata":
        if content_type != "application/json":
            raise Refused(
                400,
                f"metadata part must be application/json, not {content_type!r}",
                "invalid_metadata",
            )
        part = _Part(name, start, _MAX_METADATA_BYTES)
    elif name == "traces":
        if params.get("filename") != "traces.jsonl":
            raise Refused(
                400,
                f"traces part filename must be traces.jsonl: {disposition!r}",
                "malformed_encoding",
            )
        if content_type != "application/x-ndjson":
            raise Refused(
                400,
                f"traces part must be application/x-ndjson, not {content_type!r}",
                "malformed_encoding",
            )
        encoding = (start.header("Content-Encoding") or "").strip().lower()
        if encoding not in ("gzip", "", "identity"):  # the SDK's compress=False sends none
            raise Refused(
                400,
                f"traces part Content-Encoding must be gzip or none, not {encoding!r}",
                "malformed_encoding",
            )
        part = _Part(name, start, traces_limit)
        part.gzip = encoding == "gzip"
    else:
        raise Refused(
            400, f"unexpected part {name!r} (expected metadata and traces)", "malformed_encoding"
        )
    parts[name] = part
    return part


def _check_metadata(raw: bytes) -> dict[str, Any]:
    try:
        metadata = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise Refused(400, f"metadata part is not JSON: {exc}", "invalid_metadata") from None
    if not isinstance(metadata, dict):
        raise Refused(400, "metadata must be a JSON object", "invalid_metadata")
    version = metadata.get("schema_version")
    if isinstance(version, bool) or not isinstance(version, int) or version != 1:
        raise Refused(
            400, f"metadata schema_version must be 1, not {version!r}", "invalid_metadata"
        )
    context = metadata.get("context")
    # The SDK sends no context by default, else Dict[str, str] (prime-traces' models): the
    # service refuses any other shape as invalid_metadata, and with it the whole upload.
    if context is not None and (
        not isinstance(context, dict)
        or not all(isinstance(value, str) for value in context.values())
    ):
        raise Refused(
            400,
            f"context must map strings to strings, not {context!r}"[:300],
            "invalid_metadata",
        )
    return metadata


def _redacted_headers(request: web.Request) -> dict[str, str]:
    """Request headers, names lower-cased, with the credential replaced."""
    headers: dict[str, str] = {}
    for key, value in request.headers.items():
        name = key.lower()
        if name == "authorization":
            scheme, space, _ = value.partition(" ")
            value = f"{scheme} <redacted>" if space else "<redacted>"
        headers[name] = value
    return headers


async def _json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise web.HTTPBadRequest(text=f"body is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise web.HTTPBadRequest(text="body must be a JSON object")
    return value


def make_app(config: ServerConfig) -> web.Application:
    """The application; ``app[STATE]`` holds its ``ServerState``."""
    state = ServerState(config)
    api = _Api(state)
    app = web.Application()
    app[STATE] = state
    app.router.add_post(TRACES_PATH, api.traces)
    app.router.add_post(METRICS_PATH, api.metrics)
    app.router.add_get("/_stats", api.get_stats)
    app.router.add_post("/_reset", api.post_reset)
    app.router.add_get("/_faults", api.get_faults)
    app.router.add_post("/_faults", api.post_faults)
    app.router.add_get("/_requests", api.get_requests)
    app.router.add_get("/_metrics", api.get_metrics)
    app.router.add_get("/_lines", api.get_lines)
    app.on_cleanup.append(api.close)
    return app
