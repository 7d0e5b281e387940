"""A small Chrome DevTools Protocol client on aiohttp's websocket client, to drive Debian's
headless Chromium in tests (no Playwright, no selenium).

::

    async with Chromium() as page:
        await page.navigate("http://127.0.0.1:8080/")
        await page.wait_for("document.documentElement.dataset.ready === '1'")
        await page.click("[data-test=sort][data-column=reward]")
        rows = await page.evaluate("document.querySelectorAll('tr').length")
        await page.screenshot(Path("list.png"))
        assert not page.errors()

``Chromium`` starts its own browser (a fresh profile in a temporary directory, headless,
1280x800), attaches to its one page and records what the page reports while the test drives
it: uncaught exceptions, console messages, log entries (network failures, CSP violations) and
every network request with its response headers and the bytes it took on the wire. The
browser is killed and its profile removed when the ``async with`` block ends.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

import aiohttp

__all__ = [
    "CDPError",
    "Chromium",
    "ConsoleMessage",
    "JSError",
    "Request",
    "find_chromium",
]

#: The flags every browser starts with: headless, no sandbox (tests may run as root), and
#: nothing that talks to the network on its own (updates, sync, field trials, QUIC probes).
FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-port=0",
)


class CDPError(RuntimeError):
    """A DevTools command failed (its ``error`` answer), or the browser went away."""


class JSError(RuntimeError):
    """An expression given to ``Chromium.evaluate`` threw (or its promise rejected)."""


@dataclass
class ConsoleMessage:
    """What the page reported: a console call, a log entry or an uncaught exception.

    :ivar source: ``"console"`` (``console.*``), ``"exception"`` (uncaught), or the log
        entry's source (``"network"``, ``"security"``, ``"violation"``, ``"javascript"``, ...).
    :ivar level: ``"error"``, ``"warning"``, ``"info"``, ... (an exception is ``"error"``).
    :ivar text: the message.
    :ivar url: the resource it is about, when the browser says.
    """

    source: str
    level: str
    text: str
    url: str = ""


@dataclass
class Request:
    """One network request the page made, and what came back.

    :ivar id: the DevTools request id.
    :ivar url: the URL asked for.
    :ivar status: the response's HTTP status (0 until it arrives).
    :ivar headers: the response's headers, names in lower case.
    :ivar encoded_bytes: bytes received on the wire, headers included (``loadingFinished``).
    :ivar finished: the body arrived whole; ``failed`` says why it did not, if it did not.
    """

    id: str
    url: str
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    encoded_bytes: int = 0
    finished: bool = False
    failed: str = ""


def find_chromium() -> str:
    """The path of Debian's Chromium (``chromium``, else ``chromium-browser``).

    :raises FileNotFoundError: neither is on PATH (``apt-get install chromium``).
    """
    for name in ("chromium", "chromium-browser"):
        path = shutil.which(name)
        if path is not None:
            return path
    raise FileNotFoundError("no chromium on PATH: install it with `apt-get install chromium`")


class Chromium:
    """A headless Chromium and a DevTools session on its page (an async context manager).

    :param executable: the browser to run (default: ``find_chromium()``).
    :param width: the viewport's width in CSS pixels.
    :param height: its height.
    :param timeout: default seconds to wait for a command, a load or a condition.
    """

    def __init__(
        self,
        *,
        executable: str | None = None,
        width: int = 1280,
        height: int = 800,
        timeout: float = 30.0,
    ) -> None:
        self.executable = executable or find_chromium()
        self.width = width
        self.height = height
        self.timeout = timeout
        #: Everything the page reported, in order (see ``errors`` for the ones that matter).
        self.messages: list[ConsoleMessage] = []
        #: Every request since the last ``clear_network``, by DevTools request id, in order.
        self.requests: dict[str, Request] = {}
        self._profile: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse[bool] | None = None
        self._reader: asyncio.Task[None] | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self._waiters: list[
            tuple[str, Callable[[dict[str, Any]], bool], asyncio.Future[dict[str, Any]]]
        ] = []

    # -- lifetime ----------------------------------------------------------------------------

    async def __aenter__(self) -> Chromium:
        try:
            await self._start()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    async def _start(self) -> None:
        """Launch the browser, find its DevTools port (the profile's ``DevToolsActivePort``
        file), attach to its page and turn on the domains whose events we record."""
        self._profile = Path(tempfile.mkdtemp(prefix="nodewise-chromium-"))
        log = self._profile / "stderr.log"
        with open(log, "wb") as stderr:
            self._process = subprocess.Popen(
                [
                    self.executable,
                    *FLAGS,
                    f"--user-data-dir={self._profile / 'profile'}",
                    f"--window-size={self.width},{self.height}",
                    "about:blank",
                ],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
                start_new_session=True,  # its own process group: closed with its helpers
            )
        port = await self._devtools_port(self._profile / "profile" / "DevToolsActivePort", log)
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets: list[dict[str, Any]] = await response.json()
        pages = [t for t in targets if t.get("type") == "page"]
        if not pages:
            raise CDPError(f"the browser has no page to attach to: {targets!r}")
        self._ws = await self._http.ws_connect(
            pages[0]["webSocketDebuggerUrl"], max_msg_size=0, heartbeat=None
        )
        self._reader = asyncio.create_task(self._read())
        for domain in ("Page", "Runtime", "Log", "Network"):
            await self.send(f"{domain}.enable")
        await self.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False},
        )

    async def _devtools_port(self, path: Path, log: Path) -> int:
        """The port the browser wrote to ``DevToolsActivePort`` (its first line)."""
        assert self._process is not None
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise CDPError(
                    f"{self.executable} exited ({self._process.returncode}): "
                    + log.read_text(errors="replace")[-2000:]
                )
            with contextlib.suppress(FileNotFoundError, ValueError):
                lines = path.read_text().splitlines()
                if len(lines) >= 2:  # written whole: the port, then the browser's ws path
                    return int(lines[0])
            await asyncio.sleep(0.05)
        raise CDPError(f"{self.executable} wrote no DevTools port in {self.timeout} s")

    async def close(self) -> None:
        """Close the session, kill the browser (and its helper processes) and remove its
        profile. Safe to call twice."""
        if self._reader is not None:
            self._reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._reader
            self._reader = None
        if self._ws is not None:
            await self._ws.close()
            self._ws = None
        if self._http is not None:
            await self._http.close()
            self._http = None
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self._process.pid, signal.SIGKILL)  # the group we started
            await asyncio.to_thread(self._process.wait)
            self._process = None
        if self._profile is not None:
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    # -- the protocol ------------------------------------------------------------------------

    async def send(
        self, method: str, params: Mapping[str, Any] | None = None, *, timeout: float | None = None
    ) -> dict[str, Any]:
        """Send one command and return its result.

        :raises CDPError: the browser answered with an error, or did not answer in time.
        """
        if self._ws is None:
            raise CDPError("the browser is not running")
        command_id = next(self._ids)
        answer: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self._pending[command_id] = answer
        try:
            await self._ws.send_str(
                json.dumps({"id": command_id, "method": method, "params": dict(params or {})})
            )
            message = await asyncio.wait_for(answer, timeout or self.timeout)
        except asyncio.TimeoutError:
            raise CDPError(f"{method}: no answer in {timeout or self.timeout} s") from None
        finally:
            self._pending.pop(command_id, None)
        if "error" in message:
            raise CDPError(f"{method}: {message['error'].get('message')} {message['error']}")
        result: dict[str, Any] = message.get("result", {})
        return result

    async def _read(self) -> None:
        """Route each message: answers to their command, events to the records and waiters."""
        assert self._ws is not None
        try:
            async for frame in self._ws:
                if frame.type != aiohttp.WSMsgType.TEXT:
                    continue
                message: dict[str, Any] = json.loads(frame.data)
                if "id" in message:
                    answer = self._pending.get(message["id"])
                    if answer is not None and not answer.done():
                        answer.set_result(message)
                    continue
                self._record(message["method"], message.get("params", {}))
                for waiter in list(self._waiters):
                    method, match, future = waiter
                    params = message.get("params", {})
                    if method == message["method"] and not future.done() and match(params):
                        future.set_result(params)
        finally:
            gone = CDPError("the DevTools connection closed")
            for future in [*self._pending.values(), *(w[2] for w in self._waiters)]:
                if not future.done():
                    future.set_exception(gone)

    def _record(self, method: str, params: dict[str, Any]) -> None:
        """Keep what the test may check later: messages and network traffic."""
        if method == "Runtime.consoleAPICalled":
            text = " ".join(_remote_text(arg) for arg in params.get("args", []))
            level = {"warning": "warning", "error": "error", "assert": "error"}.get(
                params.get("type", ""), "info"
            )
            self.messages.append(ConsoleMessage("console", level, text))
        elif method == "Runtime.exceptionThrown":
            details = params.get("exceptionDetails", {})
            exception = details.get("exception", {})
            text = exception.get("description") or details.get("text", "")
            self.messages.append(ConsoleMessage("exception", "error", text, details.get("url", "")))
        elif method == "Log.entryAdded":
            entry = params.get("entry", {})
            self.messages.append(
                ConsoleMessage(
                    entry.get("source", ""),
                    entry.get("level", ""),
                    entry.get("text", ""),
                    entry.get("url", ""),
                )
            )
        elif method == "Network.requestWillBeSent":
            request_id = params["requestId"]
            self.requests[request_id] = Request(request_id, params["request"]["url"])
        elif method == "Network.responseReceived":
            request = self.requests.get(params["requestId"])
            if request is not None:
                response = params["response"]
                request.status = int(response.get("status", 0))
                request.headers = {k.lower(): v for k, v in response.get("headers", {}).items()}
        elif method == "Network.loadingFinished":
            request = self.requests.get(params["requestId"])
            if request is not None:
                request.encoded_bytes = int(params.get("encodedDataLength", 0))
                request.finished = True
        elif method == "Network.loadingFailed":
            request = self.requests.get(params["requestId"])
            if request is not None:
                request.failed = params.get("errorText", "failed")

    async def wait_event(
        self,
        method: str,
        match: Callable[[dict[str, Any]], bool] = lambda params: True,
        *,
        timeout: float | None = None,
        after: Callable[[], Any] | None = None,
    ) -> dict[str, Any]:
        """The parameters of the next event ``method`` that ``match`` accepts.

        :param after: a coroutine function to run once the waiter is in place (the action
            that causes the event), so that an event it causes at once is not missed.
        :raises CDPError: none came in ``timeout`` seconds.
        """
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        waiter = (method, match, future)
        self._waiters.append(waiter)
        try:
            if after is not None:
                await after()
            return await asyncio.wait_for(future, timeout or self.timeout)
        except asyncio.TimeoutError:
            raise CDPError(f"no {method} event in {timeout or self.timeout} s") from None
        finally:
            self._waiters.remove(waiter)

    # -- what a test does --------------------------------------------------------------------

    async def navigate(self, url: str, *, timeout: float | None = None) -> None:
        """Go to ``url`` and wait for its load event (not for a same-document navigation, a
        change of the hash only, which has none).

        :raises CDPError: the navigation failed (its ``errorText``) or did not load in time.
        """
        loaded: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        waiter = ("Page.loadEventFired", lambda params: True, loaded)
        self._waiters.append(waiter)
        try:
            result = await self.send("Page.navigate", {"url": url}, timeout=timeout)
            if result.get("errorText"):
                raise CDPError(f"navigating to {url}: {result['errorText']}")
            if "loaderId" in result:  # a new document (a hash change has no loader)
                await asyncio.wait_for(loaded, timeout or self.timeout)
        except asyncio.TimeoutError:
            raise CDPError(f"{url} did not load in {timeout or self.timeout} s") from None
        finally:
            self._waiters.remove(waiter)

    async def reload(self, *, timeout: float | None = None) -> None:
        """Reload the page (as a user pressing F5) and wait for its load event."""
        await self.wait_event(
            "Page.loadEventFired",
            timeout=timeout,
            after=lambda: self.send("Page.reload", {"ignoreCache": True}),
        )

    async def evaluate(self, expression: str, *, timeout: float | None = None) -> Any:
        """The value of a JavaScript expression in the page (awaited if it is a promise,
        returned by value: JSON-able values only).

        :raises JSError: it threw, or its promise rejected.
        """
        result = await self.send(
            "Runtime.evaluate",
            {
                "expression": expression,
                "awaitPromise": True,
                "returnByValue": True,
                "userGesture": True,
            },
            timeout=timeout,
        )
        details = result.get("exceptionDetails")
        if details is not None:
            exception = details.get("exception", {})
            raise JSError(
                f"{expression[:200]!r} threw: "
                + (exception.get("description") or details.get("text", "?"))
            )
        return result.get("result", {}).get("value")

    async def wait_for(
        self, condition: str, *, timeout: float | None = None, interval: float = 0.05
    ) -> Any:
        """Poll a JavaScript expression until it is truthy; return its value.

        :raises TimeoutError: it stayed falsy for ``timeout`` seconds (the message names it
            and its last value).
        """
        deadline = time.monotonic() + (timeout or self.timeout)
        value: Any = None
        while True:
            try:
                value = await self.evaluate(condition)
            except JSError as exc:  # e.g. an element not there yet
                value = exc
            if value and not isinstance(value, JSError):
                return value
            if time.monotonic() >= deadline:
                raise TimeoutError(
                    f"{condition!r} not true after {timeout or self.timeout} s (last: {value!r})"
                )
            await asyncio.sleep(interval)

    async def click(self, selector: str, *, settle: float = 2.0) -> None:
        """Click the first element ``selector`` matches as a user would: scroll it into
        view, wait for it to be drawn there, then press and release the left button at its
        centre (real mouse events).

        :param settle: seconds to wait for the element to be drawn at its place and
            uncovered (content laid out lazily, ``content-visibility``, comes a frame late).
        :raises JSError: nothing matches, it has no size, or another element still covers
            its centre after ``settle`` seconds (the user would click that one).
        """
        where = f"""(async () => {{
            const el = document.querySelector({json.dumps(selector)});
            if (!el) throw new Error("nothing matches " + {json.dumps(selector)});
            el.scrollIntoView({{block: "center", inline: "center"}});
            for (let i = 0; i < 2; i++) await new Promise(r => requestAnimationFrame(r));
            const r = el.getBoundingClientRect();
            if (r.width === 0 || r.height === 0) throw new Error("it has no size");
            const x = r.left + r.width / 2, y = r.top + r.height / 2;
            const hit = document.elementFromPoint(x, y);
            if (!hit || !(hit === el || el.contains(hit)))
                throw new Error("covered by " + (hit ? hit.outerHTML.slice(0, 200) : "none"));
            return [x, y];
        }})()"""
        deadline = time.monotonic() + settle
        while True:
            try:
                box = await self.evaluate(where)
                break
            except JSError as exc:
                if "covered by" not in str(exc) or time.monotonic() >= deadline:
                    raise
            await asyncio.sleep(0.05)
        x, y = box
        await self.send("Input.dispatchMouseEvent", {"type": "mouseMoved", "x": x, "y": y})
        for kind in ("mousePressed", "mouseReleased"):
            await self.send(
                "Input.dispatchMouseEvent",
                {"type": kind, "x": x, "y": y, "button": "left", "buttons": 1, "clickCount": 1},
            )

    async def select(self, selector: str, value: str) -> None:
        """Choose ``value`` in a ``<select>`` and fire ``input`` and ``change`` as a user's
        choice does."""
        await self.evaluate(
            f"""(() => {{
                const el = document.querySelector({json.dumps(selector)});
                if (!el) throw new Error("nothing matches " + {json.dumps(selector)});
                const values = [...el.options].map(o => o.value);
                if (!values.includes({json.dumps(value)}))
                    throw new Error("no option " + {json.dumps(value)} + " in " + values);
                el.value = {json.dumps(value)};
                el.dispatchEvent(new Event("input", {{bubbles: true}}));
                el.dispatchEvent(new Event("change", {{bubbles: true}}));
            }})()"""
        )

    async def scroll(self, selector: str, top: float) -> float:
        """Scroll the element ``selector`` matches to ``top`` pixels (clamped by the
        browser), wait two frames for the page to draw, and return where it ended up."""
        result: float = await self.evaluate(
            f"""(async () => {{
                const el = document.querySelector({json.dumps(selector)});
                if (!el) throw new Error("nothing matches " + {json.dumps(selector)});
                el.scrollTop = {float(top)};
                el.dispatchEvent(new Event("scroll"));
                for (let i = 0; i < 2; i++) await new Promise(r => requestAnimationFrame(r));
                return el.scrollTop;
            }})()"""
        )
        return result

    async def screenshot(self, path: Path) -> None:
        """Save the viewport as a PNG at ``path``."""
        result = await self.send("Page.captureScreenshot", {"format": "png"})
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(result["data"]))

    # -- what the page reported --------------------------------------------------------------

    def errors(self, *, ignore: Callable[[ConsoleMessage], bool] | None = None) -> list[str]:
        """Uncaught exceptions, ``console.error`` calls and error-level log entries so far
        (but those ``ignore`` accepts), as text."""
        return [
            f"{m.source}: {m.text} {m.url}".strip()
            for m in self.messages
            if m.level == "error" and not (ignore is not None and ignore(m))
        ]

    def clear_messages(self) -> None:
        """Forget the messages recorded so far."""
        self.messages.clear()

    def clear_network(self) -> None:
        """Forget the requests recorded so far."""
        self.requests.clear()


def _remote_text(value: Mapping[str, Any]) -> str:
    """A console argument (a DevTools ``RemoteObject``) as text."""
    if "value" in value:
        return str(value["value"])
    return str(value.get("description") or value.get("type", ""))
