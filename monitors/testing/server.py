"""``TracesServer``: a real Prime Traces API server on 127.0.0.1, in a process of its own.

Tests, benchmarks and the demo point a Prime uploader at ``server.url``: the server checks
every request the way the service does, counts what it stores, and injects faults on demand.
Its own process keeps its work off the event loop under test (docs/design.md D15).

    with TracesServer(faults={"script": [503]}) as server:
        ...  # upload to server.url
        assert server.stats()["lines_stored"] == 10

Standalone: ``python -m monitors.testing.server --port 8765`` (``--help`` for the options).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import queue
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

import anyio
import orjson
from aiohttp import web

from ._app import ServerConfig, make_app
from ._batch import BatchLimits
from ._faults import Faults, FaultsError

__all__ = ["Faults", "FaultsError", "ServerConfig", "TracesServer", "main", "serve"]

HOST = "127.0.0.1"  # the only address this server ever binds
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the directory holding ``monitors``
_CONTROL_TIMEOUT = 30.0


class TracesServer:
    """A Prime Traces API server process; use as ``with`` or ``async with``, or call
    ``start()`` and ``stop()``. Stopped and started again, it keeps its port, so a client
    sees "connection refused" in between, as in a real outage.

    :param api_key: the one key accepted.
    :param team_id: if given, the team requests must name in ``X-Prime-Team-ID``.
    :param faults: the faults to start with (a ``Faults`` or a mapping of its fields);
        ``set_faults()`` changes them while running.
    :param max_line_bytes: the longest line accepted (the service's limit by default).
    :param max_batch_bytes: the most uncompressed bytes in a batch of several lines.
    :param max_batch_lines: the most lines in a batch.
    :param max_request_bytes: the largest request body, as the deployed service's transport
        caps it (answered 413 by that transport, so without a service code).
    :param max_id_chars: the longest episode id (``episode_id_too_long``; inferred).
    :param max_traces: the most traces in one episode (``too_many_traces_in_episode``;
        inferred).
    :param keep_lines: keep every stored line for ``lines()``.
    :param history: how many request summaries ``requests()`` can return.
    :param port: the port to listen on; 0 picks a free one.
    :param startup_timeout: seconds ``start()`` waits for the process to answer.
    """

    def __init__(
        self,
        *,
        api_key: str = "test-key",
        team_id: str | None = None,
        faults: Faults | Mapping[str, Any] | None = None,
        max_line_bytes: int = 64 << 20,
        max_batch_bytes: int = 30 << 20,
        max_batch_lines: int = 1_000_000,
        max_request_bytes: int = 32 << 20,
        max_id_chars: int = 256,
        max_traces: int = 10_000,
        keep_lines: bool = False,
        history: int = 200,
        port: int = 0,
        startup_timeout: float = 30.0,
    ) -> None:
        for name, value in (
            ("max_line_bytes", max_line_bytes),
            ("max_batch_bytes", max_batch_bytes),
            ("max_batch_lines", max_batch_lines),
            ("max_request_bytes", max_request_bytes),
            ("max_id_chars", max_id_chars),
            ("max_traces", max_traces),
            ("history", history),
        ):
            if value < 1:
                raise ValueError(f"{name} must be at least 1, not {value!r}")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be 0 to 65535, not {port!r}")
        self.api_key = api_key
        self.team_id = team_id
        self.faults = Faults.of(faults)  # validated here, before any process is started
        self.limits = BatchLimits(
            max_batch_bytes, max_batch_lines, max_line_bytes, max_id_chars, max_traces
        )
        self.max_request_bytes = max_request_bytes
        self.keep_lines = keep_lines
        self.history = history
        self.startup_timeout = startup_timeout
        self._port = port
        self._proc: subprocess.Popen[bytes] | None = None
        self._url: str | None = None
        self._opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))

    # --- the process ----------------------------------------------------------------------

    @property
    def url(self) -> str:
        """``http://127.0.0.1:PORT``, the base URL to give an uploader."""
        if self._url is None:
            raise RuntimeError("the TracesServer is not running; call start() first")
        return self._url

    @property
    def port(self) -> int:
        return self._port

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def pid(self) -> int:
        """The server process's id (a benchmark lowers its priority with it, say)."""
        if self._proc is None:
            raise RuntimeError("the TracesServer is not running; call start() first")
        return self._proc.pid

    def command(self) -> list[str]:
        """The command line that runs this server (without the parent watch)."""
        args = [
            sys.executable,
            "-m",
            "monitors.testing.server",
            "--port",
            str(self._port),
            "--api-key",
            self.api_key,
            "--faults",
            orjson.dumps(self.faults.to_dict()).decode(),
            "--max-line-bytes",
            str(self.limits.max_line_bytes),
            "--max-batch-bytes",
            str(self.limits.max_batch_bytes),
            "--max-batch-lines",
            str(self.limits.max_batch_lines),
            "--max-request-bytes",
            str(self.max_request_bytes),
            "--max-id-chars",
            str(self.limits.max_id_chars),
            "--max-traces",
            str(self.limits.max_traces),
            "--history",
            str(self.history),
        ]
        if self.team_id is not None:
            args += ["--team-id", self.team_id]
        if self.keep_lines:
            args.append("--keep-lines")
        return args

    def start(self) -> TracesServer:
        """Start the process and wait until it answers (``startup_timeout`` at most)."""
        if self._proc is not None:
            raise RuntimeError("the TracesServer is already running")
        env = dict(os.environ)
        path = env.get("PYTHONPATH")
        env["PYTHONPATH"] = str(_PACKAGE_ROOT) + (os.pathsep + path if path else "")
        proc = subprocess.Popen(
            [*self.command(), "--exit-on-stdin-eof"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        self._proc = proc
        try:
            first_line = _read_line(proc, self.startup_timeout)
            if not first_line.startswith(b"http://"):
                raise RuntimeError(
                    "the TracesServer process did not start (exit code "
                    f"{proc.poll()}, said {first_line!r}; its stderr is above)"
                )
            self._url = first_line.decode().strip()
            self._port = int(self._url.rsplit(":", 1)[1])
            self.stats()  # it answers
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout: float = 5.0) -> None:
        """Stop the process: SIGTERM, then SIGKILL.

        :param timeout: seconds to wait for the process to exit before SIGKILL.
        """
        proc, self._proc, self._url = self._proc, None, None
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        finally:
            for pipe in (proc.stdin, proc.stdout):
                if pipe is not None:
                    pipe.close()

    def __enter__(self) -> TracesServer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> TracesServer:
        return await anyio.to_thread.run_sync(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await anyio.to_thread.run_sync(self.stop)

    # --- talking to it (sync; the a* variants run these in a worker thread) -------------

    def stats(self) -> dict[str, Any]:
        """Counts since start or the last ``reset()``: ``requests`` (by status code, as
        strings), ``requests_total``, ``dropped`` / ``refused`` / ``aborted`` (never
        answered: drop fault, down fault, client went away), ``uploads``, ``replays``,
        ``lines_received`` (replays included), ``lines_stored``, ``unique_ids``,
        ``duplicate_ids``, ``records_without_id``, ``metrics_received``, ``body_bytes``,
        ``compressed_bytes``, ``uncompressed_bytes``, ``in_flight``, ``max_in_flight``."""
        result: dict[str, Any] = self._call("GET", "/_stats")
        return result

    def reset(self, *, faults: bool = False) -> None:
        """Forget everything received (counts, uploads, ids, lines, metrics, requests).

        :param faults: also go back to the faults the server was started with.
        """
        self._call("POST", "/_reset", {"faults": faults})

    def set_faults(self, **changes: Any) -> dict[str, Any]:
        """Change the named fault settings, keep the others; returns them all.

        :param changes: ``Faults`` fields and their new values (``seed`` re-seeds the RNG,
            ``script`` replaces the pending script).
        """
        Faults.of(self.faults).merged(changes)  # fail here, with the same message, if bad
        result: dict[str, Any] = self._call("POST", "/_faults", changes)
        return result

    def get_faults(self) -> dict[str, Any]:
        """The faults in force (``script`` holds only the entries not used yet)."""
        result: dict[str, Any] = self._call("GET", "/_faults")
        return result

    def requests(self, last: int | None = None) -> list[dict[str, Any]]:
        """Summaries of the latest API requests, oldest first: method, path, status (None if
        never answered), outcome, fault, headers (lower-cased, credential redacted), parts
        (name, headers, bytes), idempotency_key, computed_key, sizes, lines, metadata,
        upload_id, replay, error, seconds.

        :param last: how many (default: all the server kept).
        """
        query = "" if last is None else f"?last={int(last)}"
        result: list[dict[str, Any]] = self._call("GET", "/_requests" + query)
        return result

    def metrics(self) -> list[dict[str, Any]]:
        """Every accepted metrics post, in order: ``{"run_id", "step", "metrics"}``."""
        result: list[dict[str, Any]] = self._call("GET", "/_metrics")
        return result

    def lines(self) -> list[bytes]:
        """Every stored line, in commit order (needs ``keep_lines=True``)."""
        body = self._call("GET", "/_lines", raw=True)
        assert isinstance(body, bytes)
        return body.splitlines()

    async def astats(self) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(self.stats)

    async def areset(self, *, faults: bool = False) -> None:
        await anyio.to_thread.run_sync(lambda: self.reset(faults=faults))

    async def aset_faults(self, **changes: Any) -> dict[str, Any]:
        return await anyio.to_thread.run_sync(lambda: self.set_faults(**changes))

    async def arequests(self, last: int | None = None) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(self.requests, last)

    async def ametrics(self) -> list[dict[str, Any]]:
        return await anyio.to_thread.run_sync(self.metrics)

    async def alines(self) -> list[bytes]:
        return await anyio.to_thread.run_sync(self.lines)

    def _call(self, method: str, path: str, body: Any = None, *, raw: bool = False) -> Any:
        data = None if body is None else orjson.dumps(body)
        request = urllib.request.Request(self.url + path, data=data, method=method)
        if data is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with self._opener.open(request, timeout=_CONTROL_TIMEOUT) as response:
                payload: bytes = response.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")
            exc.close()
            raise RuntimeError(f"{method} {path} answered {exc.code}: {detail}") from None
        return payload if raw else orjson.loads(payload)


def _read_line(proc: subprocess.Popen[bytes], timeout: float) -> bytes:
    """The first line the process prints, or b"" if it exits or ``timeout`` passes first."""
    lines: queue.Queue[bytes] = queue.Queue()
    stdout = proc.stdout
    assert stdout is not None
    reader = threading.Thread(target=lambda: lines.put(stdout.readline()), daemon=True)
    reader.start()
    try:
        return lines.get(timeout=timeout)
    except queue.Empty:
        proc.kill()
        proc.wait()
        reader.join()
        return b""


# --- the server process ------------------------------------------------------------------


async def serve(config: ServerConfig, port: int, *, exit_on_stdin_eof: bool = False) -> None:
    """Run the server on 127.0.0.1:``port`` until SIGTERM/SIGINT (or stdin's end, if asked).

    The first line on stdout is the URL, once the socket is listening.
    """
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    if exit_on_stdin_eof:
        # The parent holds our stdin open; when it goes away (even killed), so do we.
        def on_stdin() -> None:
            try:
                data = os.read(0, 4096)
            except OSError:
                data = b""
            if not data:
                loop.remove_reader(0)
                stop.set()

        loop.add_reader(0, on_stdin)

    runner = web.AppRunner(make_app(config), access_log=None, shutdown_timeout=1.0)
    await runner.setup()
    try:
        site = web.TCPSite(runner, HOST, port)
        await site.start()
        bound = runner.addresses[0][1]
        sys.stdout.write(f"http://{HOST}:{bound}\n")
        sys.stdout.flush()
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m monitors.testing.server",
        description="A Prime Traces API test server on 127.0.0.1 (prints its URL first).",
    )
    parser.add_argument("--port", type=int, default=8765, help="0 picks a free port")
    parser.add_argument("--api-key", default="test-key")
    parser.add_argument("--team-id", default=None)
    parser.add_argument("--faults", default="{}", help='JSON, e.g. {"latency": 0.1}')
    parser.add_argument("--max-line-bytes", type=int, default=64 << 20)
    parser.add_argument("--max-batch-bytes", type=int, default=30 << 20)
    parser.add_argument("--max-batch-lines", type=int, default=1_000_000)
    parser.add_argument("--max-request-bytes", type=int, default=32 << 20)
    parser.add_argument("--max-id-chars", type=int, default=256)
    parser.add_argument("--max-traces", type=int, default=10_000)
    parser.add_argument("--keep-lines", action="store_true")
    parser.add_argument("--history", type=int, default=200)
    parser.add_argument("--exit-on-stdin-eof", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    try:
        faults = Faults.of(orjson.loads(args.faults))
    except (orjson.JSONDecodeError, FaultsError, TypeError) as exc:
        parser.error(f"--faults: {exc}")
    config = ServerConfig(
        api_key=args.api_key,
        team_id=args.team_id,
        faults=faults,
        limits=BatchLimits(
            args.max_batch_bytes,
            args.max_batch_lines,
            args.max_line_bytes,
            args.max_id_chars,
            args.max_traces,
        ),
        max_request_bytes=args.max_request_bytes,
        keep_lines=args.keep_lines,
        history=args.history,
    )
    try:
        asyncio.run(serve(config, args.port, exit_on_stdin_eof=args.exit_on_stdin_eof))
    except OSError as exc:  # the port is taken, say
        print(f"traces server: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
