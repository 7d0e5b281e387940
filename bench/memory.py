"""Extra peak memory of encoding one document, measured in a fresh subprocess two ways.

    python -m bench.memory SPEC orjson|iter|aiter   ->  {"rss_mib": ..., "traced_mib": ...}

- ``rss_mib``: resident-set high-water mark (``VmHWM``, reset by writing 5 to
  ``/proc/self/clear_refs`` after the document is built and ``malloc_trim(0)``) minus ``VmRSS``
  at that moment: what the process really touched. It can still read a little low where the
  call reuses free pages the allocators kept (pymalloc arenas in use).
- ``traced_mib``: ``tracemalloc`` peak minus traced memory at the start, on another fresh copy.
  Exact for Python allocations, but counts allocated capacity whether touched or not (orjson
  reserves its output buffer ahead of what it writes: ~127 MiB for the 57 MiB of the 60 MB
  episode).

orjson's number includes its output ``bytes``; ours stream to a sink that drops each chunk.
Both include the UTF-8 copies orjson caches inside non-ASCII strs while encoding.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import gc
import json
import re
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import orjson

import encoder

from .documents import Part

__all__ = ["METHODS", "measure"]

MiB = 1 << 20
METHODS = ("orjson", "iter", "aiter")
_ROOT = Path(__file__).resolve().parents[1]


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as f:
        match = re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.MULTILINE)
    if match is None:
        raise OSError(f"no {field} in /proc/self/status")
    return int(match.group(1))


def _trim() -> None:
    """Hand free heap pages back to the OS (glibc), so that reusing memory the build freed
    costs page faults that RSS sees, as fresh memory would."""
    with contextlib.suppress(OSError, AttributeError):  # not glibc: measure without it
        ctypes.CDLL("libc.so.6").malloc_trim(0)


class _Rss:
    """Resets the RSS high-water mark, then reports how far above the start it went (MiB)."""

    def start(self) -> None:
        _trim()
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self.before = _status_kib("VmRSS")

    def extra_mib(self) -> float:
        return (_status_kib("VmHWM") - self.before) / 1024


class _Traced:
    def start(self) -> None:
        tracemalloc.start()
        self.before, _ = tracemalloc.get_traced_memory()
        tracemalloc.reset_peak()

    def extra_mib(self) -> float:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return (peak - self.before) / MiB


async def _drop(chunk: bytes) -> None:
    return None


def _run(method: str, value: Any, meter: _Rss | _Traced) -> float:
    gc.collect()
    if method == "aiter":

        async def stream() -> float:
            meter.start()  # inside the running loop: its creation is not counted
            async for chunk in encoder.aiterencode(value):
                await _drop(chunk)
            return meter.extra_mib()

        return asyncio.run(stream())
    meter.start()
    if method == "orjson":
        out = orjson.dumps(value)
        del out
    else:
        for _chunk in encoder.iterencode(value):
            pass
    return meter.extra_mib()


def _child(spec: str, method: str) -> dict[str, float | None]:
    part = Part(spec)
    # Warm up (imports, anyio's asyncio backend, first-call caches) on something small.
    tiny = {"a": ["é" * 10, 1.5]}
    orjson.dumps(tiny)
    b"".join(encoder.iterencode(tiny))

    async def warm() -> None:
        # A budget this small checkpoints after every piece: imports anyio's asyncio backend.
        async for _chunk in encoder.aiterencode(tiny, budget=1e-9):
            pass

    asyncio.run(warm())
    part.build()  # the first build makes the episode bodies
    result: dict[str, float | None] = {}
    try:
        result["rss_mib"] = _run(method, part.build(), _Rss())
    except OSError:
        result["rss_mib"] = None
    result["traced_mib"] = _run(method, part.build(), _Traced())
    return result


def measure(part: Part, method: str) -> dict[str, float | None]:
    """Run the measurement for one part and method in a fresh interpreter."""
    out = subprocess.run(
        [sys.executable, "-m", "bench.memory", part.spec, method],
        cwd=_ROOT,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, float | None] = json.loads(out.stdout)
    return result


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[1] not in METHODS:
        print(__doc__, file=sys.stderr)
        return 2
    print(json.dumps(_child(args[0], args[1])))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
