"""The monitor's own worker thread: hashing and gzip of batches, job after job, in order.

One thread of the monitor's own, not the loop's shared pool: the pieces of a batch must be
compressed in the order they were handed over (they feed one compressor), and the monitor
owns the thread's lifetime (``aclose`` in ``finalize``).

It runs at the process's priority. Lowering it (a higher nice value for this one thread, as
Linux allows) was measured and refused: on a quiet machine it changed nothing, and on a
saturated one (two CPU-bound processes on the 2 cores) it starved the thread while it held
the GIL between two C calls, so the event loop waited on it: loop lag max 40-580 ms against
9-23 ms at the same priority, and 3-13 MB/s against ~90 MB/s.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

import anyio

__all__ = ["Worker", "result"]

T = TypeVar("T")


class Worker:
    """A single thread running submitted jobs in order (``submit``), closed by ``aclose``."""

    def __init__(self, *, name: str) -> None:
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def submit(self, fn: Callable[..., T], /, *args: Any) -> Future[T]:
        """Queue ``fn(*args)``; await the returned future with ``result``."""
        return self._executor.submit(fn, *args)

    async def aclose(self) -> None:
        """Drop queued jobs, let the running one end, and wait for the thread to exit (from
        another thread, so the loop never waits)."""
        await anyio.to_thread.run_sync(self._shutdown)

    def _shutdown(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)


async def result(future: Future[T]) -> T:
    """Await a job's result on the loop (cancelling the wait cancels a job not yet started)."""
    return await asyncio.wrap_future(future)
