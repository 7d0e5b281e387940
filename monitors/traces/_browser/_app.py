"""The browser's HTTP side: an ``aiohttp.web`` application serving the page (fixed files read
at start) and the JSON API over the runs, behind the checks every request passes.

Every response forbids inline script (Content-Security-Policy) and sniffing. A request must
name the host the server was bound to (a page of another site that resolves its name to
127.0.0.1 is refused: DNS rebinding), and, when bound to any host but the loopback, carry the
token printed at start (docs/design.md D19).
"""

from __future__ import annotations

import ipaddress
import logging
import mimetypes
import re
import secrets
from collections.abc import Awaitable, Callable, Mapping, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, Final

import anyio
import orjson
from aiohttp import web

from ...errors import TraceFormatError
from ._episode import Episodes, NotFound
from ._runs import Run, open_runs
from ._table import Query, QueryError

__all__ = ["CSP", "make_app"]

log = logging.getLogger("monitors.traces.serve")

CSP: Final = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
COOKIE: Final = "nodewise_token"
#: Rows a page of the list holds at most.
MAX_LIMIT: Final = 1000
#: Seconds between two looks at each run's index and metrics.
REFRESH: Final = 1.0
_STATIC: Final = re.compile(r"[a-z0-9][a-z0-9_-]*\.(js|css|html|svg|png|ico)\Z")
_LOOPBACK_NAMES: Final = frozenset({"localhost", "127.0.0.1", "::1"})

_RUNS: Final = web.AppKey("runs", dict[str, Run])
_EPISODES: Final = web.AppKey("episodes", Episodes)

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def _web_files() -> dict[str, tuple[bytes, str]]:
    """The page's files (``web/``), read once: only these names are ever served."""
    files: dict[str, tuple[bytes, str]] = {}
    folder = resources.files(__package__) / "web"
    for entry in folder.iterdir():
        if entry.is_file() and _STATIC.match(entry.name):
            kind = mimetypes.guess_type(entry.name)[0] or "application/octet-stream"
            if entry.name.endswith(".js"):
                kind = "text/javascript"
            files[entry.name] = (entry.read_bytes(), kind)
    return files


def _json(value: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(value), status=status, content_type="application/json")


def _error(status: int, code: str, message: str) -> web.Response:
    return _json({"error": {"code": code, "message": message}}, status)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    """The name of a Host header, its port dropped (``[::1]:80`` -> ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


def make_app(
    paths: Sequence[Path], *, host: str = "127.0.0.1", token: str | None = None
) -> web.Application:
    """The browser's application over the runs at ``paths``.

    :param host: The host it is bound to: on the loopback, requests must name a loopback
        host; elsewhere ``token`` is required on every request.
    :param token: The secret a request must carry (``?token=``, the cookie the page gets, or
        ``Authorization: Bearer``); None: none (loopback only).
    :raises ValueError: No token for a host beyond the loopback.
    """
    loopback = _is_loopback(host)
    if not loopback and not token:
        raise ValueError(f"serving on {host} needs a token")
    files = _web_files()

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        response = await _checked(request, handler)
        response.headers["Content-Security-Policy"] = CSP
        response.headers["X-Content-Type-Options"] = "nosniff"
        response.headers["Referrer-Policy"] = "no-referrer"
        response.headers["Cache-Control"] = "no-store"
        return response

    async def _checked(request: web.Request, handler: Handler) -> web.StreamResponse:
        if loopback and _host_name(request.host) not in _LOOPBACK_NAMES:
            return _error(
                403, "bad_host", f"this server answers for 127.0.0.1, not {request.host!r}"
            )
        if token is not None:
            given = request.query.get("token")
            if given is not None and secrets.compare_digest(given, token):
                query = {k: v for k, v in request.query.items() if k != "token"}
                target = request.rel_url.with_query(query)
                response = web.Response(status=302, headers={"Location": str(target)})
                response.set_cookie(COOKIE, token, httponly=True, samesite="Strict")
                return response
            bearer = request.headers.get("Authorization", "")
            carried = request.cookies.get(COOKIE) or bearer.removeprefix("Bearer ").strip()
            if not carried or not secrets.compare_digest(carried, token):
                return _error(401, "no_token", "this server needs the token it printed at start")
        try:
            return await handler(request)
        except web.HTTPException as exc:
            if exc.status >= 400:
                code = "not_found" if exc.status == 404 else exc.reason.lower().replace(" ", "_")
                return _error(exc.status, code, exc.text or exc.reason)
            raise
        except Exception:
            log.exception("%s %s failed", request.method, request.path)
            return _error(500, "internal", "the server failed on this request; its log says why")

    app = web.Application(middlewares=[guard])
    app[_RUNS] = open_runs(paths)
    app[_EPISODES] = Episodes()

    async def page(request: web.Request) -> web.Response:
        body, kind = files["index.html"]
        return web.Response(body=body, content_type=kind, charset="utf-8")

    async def static(request: web.Request) -> web.Response:
        found = files.get(request.match_info["name"])
        if found is None:
            return _error(404, "not_found", "no such file")
        return web.Response(body=found[0], content_type=found[1], charset="utf-8")

    app.router.add_get("/", page)
    app.router.add_get("/static/{name}", static)
    app.router.add_get("/api/runs", _runs)
    app.router.add_get("/api/runs/{run}/status", _status)
    app.router.add_get("/api/runs/{run}/episodes", _episodes)
    app.router.add_get("/api/runs/{run}/metrics", _metrics)
    app.router.add_get(r"/api/runs/{run}/episodes/{line:\d+}", _outline)
    app.router.add_get(r"/api/runs/{run}/episodes/{line:\d+}/text", _text)
    app.router.add_get(
        r"/api/runs/{run}/episodes/{line:\d+}/traces/{trace:\d+}/nodes/{node:\d+}", _node
    )
    app.cleanup_ctx.append(_refreshing)
    return app


async def _refreshing(app: web.Application) -> Any:
    """Reads each run's index and metrics before the first request, then every ``REFRESH``
    seconds while the server runs (new episodes appear while a run writes)."""
    runs = app[_RUNS]
    for run in runs.values():
        await run.refresh()

    async def loop() -> None:
        while True:
            await anyio.sleep(REFRESH)
            for run in runs.values():
                try:
                    await run.refresh()
                except OSError as exc:
                    log.warning("%s: cannot read its index or metrics: %s", run.name, exc)

    async with anyio.create_task_group() as group:
        group.start_soon(loop)
        yield
        group.cancel_scope.cancel()


def _run(request: web.Request) -> Run:
    run = request.app[_RUNS].get(request.match_info["run"])
    if run is None:
        raise web.HTTPNotFound(text=f"no run named {request.match_info['run']!r}")
    return run


def _int(params: Mapping[str, str], name: str, default: int, high: int) -> int:
    text = params.get(name)
    if text is None:
        return default
    if not text.isdigit() or int(text) > high:
        raise QueryError(f"{name}: {text!r} is not an int from 0 to {high}")
    return int(text)


async def _runs(request: web.Request) -> web.Response:
    return _json({"runs": [run.describe() for run in request.app[_RUNS].values()]})


async def _status(request: web.Request) -> web.Response:
    run = _run(request)
    return _json({"episodes": len(run.table), "metrics": len(run.metric_rows)})


async def _episodes(request: web.Request) -> web.Response:
    run = _run(request)
    try:
        query = Query.parse(request.query)
        offset = _int(request.query, "offset", 0, 1 << 40)
        limit = _int(request.query, "limit", 100, MAX_LIMIT)
    except QueryError as exc:
        return _error(400, "bad_query", str(exc))
    table = run.table
    page = await table.page(query, offset=offset, limit=limit)
    return _json(
        {
            "total": page.total,
            "matched": page.matched,
            "offset": page.offset,
            "rows": page.rows,
            "histogram": {"edges": page.edges, "counts": page.counts},
            "facets": {
                "steps": sorted(table.steps),
                "kinds": sorted(table.kinds),
                "envs": sorted(table.envs),
            },
            "version": page.total,
        }
    )


async def _metrics(request: web.Request) -> web.Response:
    return _json(_run(request).metrics())


def _record_error(exc: Exception) -> web.Response:
    if isinstance(exc, NotFound):
        return _error(404, "not_found", str(exc))
    return _error(422, "bad_record", str(exc))


async def _outline(request: web.Request) -> web.Response:
    run = _run(request)
    try:
        outlined, seconds = await request.app[_EPISODES].outline(
            run, int(request.match_info["line"])
        )
    except (NotFound, TraceFormatError) as exc:
        return _record_error(exc)
    ms = b'{"ms":%d,' % round(seconds * 1000)
    return web.Response(body=ms + outlined.summary[1:], content_type="application/json")


async def _node(request: web.Request) -> web.Response:
    run = _run(request)
    info = request.match_info
    try:
        node = await request.app[_EPISODES].node(
            run, int(info["line"]), int(info["trace"]), int(info["node"])
        )
    except (NotFound, TraceFormatError) as exc:
        return _record_error(exc)
    return web.Response(body=node, content_type="application/json")


async def _text(request: web.Request) -> web.Response:
    run = _run(request)
    try:
        text = await request.app[_EPISODES].text(run, int(request.match_info["line"]))
    except (NotFound, TraceFormatError) as exc:
        return _record_error(exc)
    return _json(text)
