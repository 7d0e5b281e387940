"""``nodewise traces serve``: a local trace browser over run directories, live or finished.

The episode list comes from index rows alone; an episode is outlined once (the byte span of
each node) and served one node at a time, so the page never holds a whole 60 MB record and
the server never parses one (docs/design.md D19). The page is hand-written ES modules and CSS
shipped in ``web/``: no build step, nothing fetched from elsewhere.
"""

from __future__ import annotations

import gc
import secrets
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import anyio
from aiohttp import web

from ._app import CSP, make_app

__all__ = ["CSP", "make_app", "quiet_collector", "serve"]


def quiet_collector() -> None:
    """Move the objects alive now (the modules imported, the tables of index rows) out of
    the cyclic collector's way: a full collection walks every tracked object with the loop
    stopped, 10-35 ms for a server's ~40,000 on a 2-core machine (docs/design.md D19).
    They are still freed when no longer referenced; only cycles among them would stay."""
    gc.collect()
    gc.freeze()


async def serve(
    paths: Sequence[Path],
    *,
    host: str = "127.0.0.1",
    port: int = 7788,
    out: TextIO = sys.stdout,
) -> None:
    """Serve the runs at ``paths`` until SIGINT or SIGTERM; print the address to open (with
    a fresh token when ``host`` is not the loopback) as the first line of ``out``.

    :raises OSError: The address cannot be bound.
    """
    from ._app import _is_loopback

    token = None if _is_loopback(host) else secrets.token_urlsafe(24)
    app = make_app(paths, host=host, token=token)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    quiet_collector()
    await runner.setup()  # reads every run's index and metrics
    quiet_collector()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        server = site._server
        sockets = getattr(server, "sockets", None) or []
        bound = sockets[0].getsockname()[1] if sockets else port
        shown = f"[{host}]" if ":" in host else host
        address = f"http://{shown}:{bound}/"
        print(f"serving {address}" + (f"?token={token}" if token else ""), file=out, flush=True)
        with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for _ in signals:
                break
    finally:
        await runner.cleanup()
