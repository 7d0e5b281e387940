"""Async drivers: encode on the event loop, giving it back whenever the time budget is spent.

Works under asyncio and trio; the yield policy is docs/design.md D4. Nothing here imports an
event loop: the running one is found by sniffio at the first call, so importing the package
does all the set-up and the first call does none on the loop.
"""

from __future__ import annotations

import sys
import threading
import types
from collections.abc import AsyncGenerator, Awaitable, Callable, Generator
from time import perf_counter
from typing import Any

import sniffio

from ._chunks import Chunker
from ._walk import AnextRequest, Walker
from .errors import EncodeError
from .sync import DEFAULT_CHUNK_SIZE

__all__ = ["DEFAULT_BUDGET", "adump", "aiterencode"]

DEFAULT_BUDGET = 0.00015
"""Seconds of encoding between two turns given to the event loop (docs/design.md D4)."""


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
    without its two coroutine frames (docs/design.md D4)."""
    yield


def aiterencode(
    obj: Any,
    *,
    option: int | None = 0,
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

    :param obj: The value to encode.
    :param option: orjson's ``OPT_*`` flags, combined with ``|``.
    :param default: Called with each object orjson cannot write; returns one it can.
    :param chunk_size: Most bytes in one chunk.
    :param budget: Seconds of encoding between two turns given to the event loop.
    :param iterables: Also encode iterators and async iterables as arrays.
    :param float_decimals: Round every float of plain data to this many decimals (any int),
        as ``round`` does; a verifiers episode or trace takes it as its
        ``to_record(float_decimals=...)``, and a pydantic model is written as dumped. None
        writes floats as they are.
    :returns: An async iterator of ``bytes`` chunks.
    :raises EncodeError: A node cannot be encoded (after the chunks before it), or
        ``option`` is not one orjson accepts.
    :raises ValueError: ``budget``, ``chunk_size`` or ``float_decimals`` is out of range.
    """
    if not budget > 0:
        raise ValueError(f"budget must be a positive number of seconds, not {budget!r}")
    chunker = Chunker(chunk_size)
    walker = Walker(
        obj,
        option=option,
        default=default,
        iterables=iterables,
        float_decimals=float_decimals,
        allow_async=True,
    )
    return _aiterencode(walker, chunker, budget)


async def _aiterencode(
    walker: Walker, chunker: Chunker, budget: float
) -> AsyncGenerator[bytes, None]:
    walk = walker.walk()
    add = chunker.add
    clock = perf_counter
    turn = _turn
    deadline = turn.given + budget
    # On asyncio a bare yield is a checkpoint (as anyio's, without its per-call overhead);
    # under trio, trio's own (trio is loaded: it runs this).
    library = sniffio.current_async_library()
    give_turn = (
        _asyncio_checkpoint if library == "asyncio" else sys.modules[library].lowlevel.checkpoint
    )
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
    option: int | None = 0,
    default: Callable[[Any], Any] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    budget: float = DEFAULT_BUDGET,
    iterables: bool = False,
    float_decimals: int | None = None,
) -> int:
    """Await ``write(chunk)`` for each chunk of the JSON of ``obj``; return the bytes written.

    :param obj: The value to encode.
    :param write: An async callable that takes each chunk, in order.
    :param option: orjson's ``OPT_*`` flags, combined with ``|``.
    :param default: Called with each object orjson cannot write; returns one it can.
    :param chunk_size: Most bytes in one ``write`` call.
    :param budget: Seconds of encoding between two turns given to the event loop.
    :param iterables: Also encode iterators and async iterables as arrays.
    :param float_decimals: Round every float of plain data to this many decimals (any int),
        as ``round`` does; a verifiers episode or trace takes it as its
        ``to_record(float_decimals=...)``, and a pydantic model is written as dumped. None
        writes floats as they are.
    :returns: The number of bytes written.
    :raises EncodeError: A node cannot be encoded (what came before it is written), or
        ``option`` is not one orjson accepts.
    :raises ValueError: ``budget``, ``chunk_size`` or ``float_decimals`` is out of range.
    """
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
