"""The monitor's own worker thread: hashing and gzip of batches, job after job, in order.

Not the loop's shared pool: a batch's pieces feed one compressor in the order handed over,
and the monitor owns the thread's lifetime (``aclose`` in ``finalize``). It runs at the
process's priority (docs/design.md D10).
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
