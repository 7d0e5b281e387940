"""Async drivers: encode on the event loop, giving it back whenever the time budget is spent.

Works under asyncio and trio (through anyio). With a budget ``b`` another task on stock asyncio
waits about ``2.5 * b`` plus the longest single step (see DESIGN section 3).
"""

from __future__ import annotations

import threading
import types
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from time import perf_counter
from typing import Any

import sniffio
from anyio.lowlevel import checkpoint

from ._chunks import Chunker
from ._walk import AnextRequest, Walker
from .errors import EncodeError
from .sync import DEFAULT_CHUNK_SIZE

__all__ = ["DEFAULT_BUDGET", "adump", "aiterencode"]

#: Seconds of encoding between two checkpoints, chosen by measurement (``make bench``, budget
#: sweep): on a 60 MB episode 0.15 ms kept loop lag p99 at 0.80 ms and max at 0.97 ms (0.1 ms:
#: 0.70 and 0.82), and the production mix encoded at 0.911x orjson's speed against 0.897x at
#: 0.1 ms (3 runs each). 0.25 ms reached p99 1.2-1.8 ms in earlier sweeps.
DEFAULT_BUDGET = 0.00015


class _Turn(threading.local):
    """When this thread's event loop last got control back from an encoder.

    Shared by every ``aiterencode`` in the thread, so that many small documents encoded back
    to back still give the loop its turn every ``budget`` seconds.
    """

    given = 0.0


_turn = _Turn()


@types.coroutine
def _asyncio_checkpoint() -> Generator[None, None, None]:
    """One turn of the event loop, as ``asyncio.sleep(0)`` gives it (a bare yield to the task),
    without the two coroutine frames that cost ~1% of encoding time at a 0.1 ms budget."""
    yield


async def aiterencode(
    obj: Any,
    *,
    option: int = 0,
    default: Callable[[Any], Any] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    budget: float = DEFAULT_BUDGET,
    iterables: bool = False,
    float_decimals: int | None = None,
) -> AsyncGenerator[bytes, None]:
    """The JSON of ``obj`` as chunks (as ``iterencode`` cuts them), yielding to the event
    loop every ``budget`` seconds.

    Output equals ``orjson.dumps(obj, option=option, default=default)``. With ``iterables``,
    async iterables are encoded as arrays too. A dict or list that changes size while it is
    being encoded raises ``EncodeError`` instead of writing a mix of old and new.
    """
    if not budget > 0:
        raise ValueError(f"budget must be a positive number of seconds, not {budget!r}")
    chunker = Chunker(chunk_size)
    walk = Walker(
        obj,
        option=option,
        default=default,
        iterables=iterables,
        float_decimals=float_decimals,
        allow_async=True,
    ).walk()
    add = chunker.add
    clock = perf_counter
    turn = _turn
    deadline = turn.given + budget
    # On asyncio a bare yield is anyio's checkpoint without its per-call overhead (and
    # without importing anyio's backend on the loop at the first call).
    give_turn = _asyncio_checkpoint if sniffio.current_async_library() == "asyncio" else checkpoint
    reply: Any = None
    try:
        while True:
            try:
                piece = walk.send(reply)
            except StopIteration:
                break
            reply = None
            if type(piece) is AnextRequest:
                try:
                    reply = await piece.aiter.__anext__()
                except StopAsyncIteration:
                    reply = AnextRequest.END
                continue
            full = add(piece)  # type: ignore[arg-type]
            if full is not None:
                for chunk in full:
                    yield chunk
            if clock() >= deadline:
                await give_turn()
                turn.given = now = clock()
                deadline = now + budget
    except EncodeError:
        last = chunker.flush()  # the prefix before the bad node first, then the error
        if last is not None:
            yield last
        raise
    finally:
        walk.close()
    last = chunker.flush()
    if last is not None:
        yield last


async def adump(
    obj: Any,
    write: Callable[[bytes], Awaitable[object]],
    *,
    option: int = 0,
    default: Callable[[Any], Any] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    budget: float = DEFAULT_BUDGET,
    iterables: bool = False,
    float_decimals: int | None = None,
) -> int:
    """Await ``write(chunk)`` for each chunk of the JSON of ``obj``; return the bytes written."""
    written = 0
    chunks = aiterencode(
        obj,
        option=option,
        default=default,
        chunk_size=chunk_size,
        budget=budget,
        iterables=iterables,
        float_decimals=float_decimals,
    )
    try:
        async for chunk in chunks:
            await write(chunk)
            written += len(chunk)
    finally:
        await chunks.aclose()
    return written
