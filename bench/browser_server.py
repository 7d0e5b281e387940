"""The trace browser's server with measurement around it, for ``bench.browser``.

    python -m bench.browser_server --out PATH [--stalls] [--profile PATH] RUN [RUN ...]

Builds the app the way ``nodewise traces serve`` does (``monitors.traces._browser.make_app``)
and runs it with aiohttp's ``AppRunner`` on 127.0.0.1 (a free port), with a
``monitors.lag.LoopLagProbe`` on its loop from before the app is built, so that reading the
runs' indexes is sampled too. Once it listens it prints one JSON line (``url``, ``pid``,
``listening``: its ``perf_counter``, which is CLOCK_MONOTONIC on Linux and so comparable
across processes). On SIGTERM or SIGINT it stops and writes to ``--out``: every lag sample
(ms) with its time and the CPU ms the loop's thread and the whole process spent since the
wake-up before, each request the server answered (path, start, wall and loop-thread CPU ms,
as a middleware innermost around the handler saw it), its peak RSS (VmHWM), and with
``--stalls`` each stall of the loop over 8 ms as ``bench.stalls.StallSampler`` saw it (its
CPU clock, the sampler's lateness, the loop's stack). ``--profile PATH`` runs ``cProfile``
over the serving and dumps it there.

Measurement lives here, never in the shipped package. The probe keeps its samples in
``array('d')`` (8 bytes each, not a list of floats' ~32), so it adds ~32 bytes per ms of
run to the RSS measured.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import json
import os
import re
import signal
import sys
import time
from array import array
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from aiohttp import web

from monitors.lag import LoopLagProbe
from monitors.traces._browser import make_app, quiet_collector

from .stalls import StallSampler

_HWM = re.compile(rb"^VmHWM:\s+(\d+)\s+kB", re.MULTILINE)


def vm_hwm(pid: int | str = "self") -> int:
    """A process's peak resident memory in bytes (Linux; 0 elsewhere)."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            found = _HWM.search(f.read())
    except OSError:
        return 0
    return int(found.group(1)) * 1024 if found else 0


def build_app(runs: Sequence[Path]) -> web.Application:
    """The browser's app over ``runs``, as ``nodewise traces serve`` builds it."""
    return make_app(list(runs))


class Probe(LoopLagProbe):
    """``LoopLagProbe`` that also keeps, per sample, the ms of CPU the whole process (every
    thread) spent since the wake-up before: a late sample whose loop thread barely ran but
    whose process did was another thread of the server holding the loop off (the GIL); one
    where neither ran was the machine not running the process."""

    def __init__(self) -> None:
        super().__init__()
        # Arrays, not lists of floats: the probe's memory stays small beside the server's.
        self.samples, self.times, self.running = array("d"), array("d"), array("d")  # type: ignore[assignment]
        self.process = array("d")
        self._cpu = 0.0

    def _open(self) -> None:
        self._cpu = time.process_time()

    def _note(self, lag_ms: float, now: float, *, kept: bool) -> None:
        cpu = time.process_time()
        if kept:
            self.process.append((cpu - self._cpu) * 1e3)
        self._cpu = cpu


class Requests:
    """An aiohttp middleware that notes each request's path, start, wall and loop-thread CPU
    time around the handler (the app's own middlewares run outside it)."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    @web.middleware
    async def middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        t0, cpu0 = time.perf_counter(), time.thread_time()
        status = 500
        try:
            response = await handler(request)
            status = response.status
            return response
        finally:
            self.seen.append(
                {
                    "path": request.path_qs,
                    "status": status,
                    "start": t0,
                    "wall_ms": (time.perf_counter() - t0) * 1e3,
                    "cpu_ms": (time.thread_time() - cpu0) * 1e3,
                }
            )


async def serve(
    runs: Sequence[Path], *, out: Path, stalls: bool, profile: Path | None, host: str
) -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    probe = Probe()
    sampler = StallSampler() if stalls else None
    profiler = cProfile.Profile() if profile else None
    requests = Requests()
    started = time.perf_counter()
    async with probe, sampler or contextlib.nullcontext():
        if profiler is not None:
            profiler.enable()
        app = build_app(runs)
        app.middlewares.append(requests.middleware)
        runner = web.AppRunner(app, access_log=None)
        quiet_collector()  # as `nodewise traces serve` does around its start
        await runner.setup()
        quiet_collector()
        site = web.TCPSite(runner, host, 0)
        await site.start()
        port = runner.addresses[0][1]
        print(
            json.dumps(
                {
                    "url": f"http://{host}:{port}",
                    "pid": os.getpid(),
                    "started": started,
                    "listening": time.perf_counter(),
                }
            ),
            flush=True,
        )
        await stop.wait()
        stopped = time.perf_counter()
        if profiler is not None:
            profiler.disable()
        hwm = vm_hwm()
        await runner.cleanup()
    if profiler is not None and profile is not None:
        profiler.dump_stats(profile)
    report = {
        "started": started,
        "stopped": stopped,
        "vm_hwm": hwm,
        "lag": {
            "samples": list(probe.samples),
            "times": list(probe.times),
            "running": list(probe.running),
            "process": list(probe.process),
        },
        "requests": requests.seen,
        "stalls": None
        if sampler is None
        else [
            {
                "start": s.start,
                "wall_ms": s.wall_ms,
                "cpu_ms": s.cpu_ms,
                "sampler_late_ms": s.sampler_late_ms,
                "kind": s.kind,
                "stacks": s.stacks,
            }
            for s in sampler.stalls
        ],
    }
    out.write_text(json.dumps(report))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.browser_server", description=__doc__)
    p.add_argument("runs", nargs="+", type=Path, metavar="RUN")
    p.add_argument("--out", type=Path, required=True, help="where the measurements go (JSON)")
    p.add_argument("--stalls", action="store_true", help="sample the loop's stalls over 8 ms")
    p.add_argument("--profile", type=Path, help="cProfile the serving into this file")
    p.add_argument("--host", default="127.0.0.1")
    args = p.parse_args(argv)
    asyncio.run(
        serve(args.runs, out=args.out, stalls=args.stalls, profile=args.profile, host=args.host)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
