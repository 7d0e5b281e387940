"""Blocking drivers: the whole value as bytes, as an iterator of chunks, or into a file."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, Protocol

import orjson

from ._chunks import Chunker
from ._models import models_first
from ._walk import AnextRequest, Walker
from .errors import EncodeError

__all__ = ["dump", "encode", "iterencode"]

DEFAULT_CHUNK_SIZE = 64 * 1024
"""Most bytes in one chunk, unless ``chunk_size`` says otherwise (docs/design.md D5)."""


class SupportsWrite(Protocol):
    """What ``dump`` writes to: anything with ``write(bytes)``, such as a binary file."""

    def write(self, data: bytes, /) -> object: ...


def encode(
    obj: Any,
    *,
    option: int | None = 0,
    default: Callable[[Any], Any] | None = None,
    iterables: bool = False,
    float_decimals: int | None = None,
) -> bytes:
    """The JSON of ``obj`` as one ``bytes``, equal to ``orjson.dumps(obj, ...)``.

    Where orjson can encode the value this *is* ``orjson.dumps``; where it cannot (nesting
    deeper than 254, a cycle, a bad leaf) the walk takes over, so the value encodes or the
    ``EncodeError`` names the path. On that slow path a ``default`` hook is called again for
    the objects it already saw.

    :param obj: The value to encode.
    :param option: orjson's ``OPT_*`` flags, combined with ``|``.
    :param default: Called with each object orjson cannot write; returns one it can.
    :param iterables: Also encode iterators (generators, ``map``, ...) as arrays.
    :param float_decimals: Round every float of plain data to this many decimals (any int),
        as ``round`` does, numpy floats included; a verifiers episode or trace takes it as its
        ``to_record(float_decimals=...)``, and a pydantic model is written as dumped. None
        writes floats as they are.
    :returns: The whole document.
    :raises EncodeError: A node cannot be encoded (its path is in the error), or ``option``
        is not one orjson accepts.
    :raises ValueError: ``float_decimals`` is out of range.
    """
    # orjson's message and cause only: keeping its exception here would tie it to this
    # frame in a reference cycle when the walk raises too.
    refused: tuple[str, BaseException | None] | None = None
    if float_decimals is None and not iterables:
        try:
            return orjson.dumps(obj, option=option, default=models_first(default))
        except orjson.JSONEncodeError as exc:
            refused = (str(exc), exc.__cause__)
    walker = Walker(
        obj, option=option, default=default, iterables=iterables, float_decimals=float_decimals
    )
    data = b"".join(walker)  # type: ignore[arg-type]
    if refused is not None and not walker.wrote_models and refused[0] != "Recursion limit reached":
        # orjson refused it for a reason the walk does not go beyond, yet the walk wrote it:
        # a ``default`` that changes what it is given saw it again. orjson's answer stands.
        raise EncodeError(refused[0]) from refused[1]
    return data


def iterencode(
    obj: Any,
    *,
    option: int | None = 0,
    default: Callable[[Any], Any] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    iterables: bool = False,
    float_decimals: int | None = None,
) -> Iterator[bytes]:
    """The JSON of ``obj`` as non-empty chunks of at most ``chunk_size`` bytes, all but the
    last at least half full.

    Each ``next()`` does bounded work (about one chunk's worth), so a caller may interleave
    other work between chunks. Options and errors are as for ``encode``; on ``EncodeError``
    the chunks before the bad node are yielded first, then the error is raised.

    :param obj: The value to encode.
    :param option: orjson's ``OPT_*`` flags, combined with ``|``.
    :param default: Called with each object orjson cannot write; returns one it can.
    :param chunk_size: Most bytes in one chunk.
    :param iterables: Also encode iterators (generators, ``map``, ...) as arrays.
    :param float_decimals: Round every float of plain data to this many decimals (any int),
        as ``round`` does; a verifiers episode or trace takes it as its
        ``to_record(float_decimals=...)``, and a pydantic model is written as dumped. None
        writes floats as they are.
    :returns: An iterator of ``bytes`` chunks.
    :raises EncodeError: A node cannot be encoded, or ``option`` is not one orjson accepts.
    :raises ValueError: ``chunk_size`` is not a positive int, or ``float_decimals`` is out
        of range.
    """
    chunker = Chunker(chunk_size)
    walker = Walker(
        obj, option=option, default=default, iterables=iterables, float_decimals=float_decimals
    )
    return _iterencode(walker, chunker)


def _iterencode(walker: Walker, chunker: Chunker) -> Iterator[bytes]:
    add = chunker.add
    try:
        for piece in walker:
            assert not isinstance(piece, AnextRequest)  # only with allow_async
            full = add(piece)
            if full is not None:
                yield from full
    except EncodeError:
        # Everything before the bad node is handed out first: a sink keeps the longest
        # prefix there is, then the error comes.
        last = chunker.flush()
        if last is not None:
            yield last
        raise
    last = chunker.flush()
    if last is not None:
        yield last


def dump(
    obj: Any,
    fp: SupportsWrite,
    *,
    option: int | None = 0,
    default: Callable[[Any], Any] | None = None,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    iterables: bool = False,
    float_decimals: int | None = None,
) -> int:
    """Write the JSON of ``obj`` to ``fp`` (anything with ``write(bytes)``) chunk by chunk.

    On ``EncodeError`` what was already written stays written: write to a temporary file and
    rename it if a partial document must never be seen.

    :param obj: The value to encode.
    :param fp: Where the chunks go, by ``fp.write(chunk)``.
    :param option: orjson's ``OPT_*`` flags, combined with ``|``.
    :param default: Called with each object orjson cannot write; returns one it can.
    :param chunk_size: Most bytes in one ``write`` call.
    :param iterables: Also encode iterators (generators, ``map``, ...) as arrays.
    :param float_decimals: Round every float of plain data to this many decimals (any int),
        as ``round`` does; a verifiers episode or trace takes it as its
        ``to_record(float_decimals=...)``, and a pydantic model is written as dumped. None
        writes floats as they are.
    :returns: The number of bytes written.
    :raises EncodeError: A node cannot be encoded, or ``option`` is not one orjson accepts.
    :raises ValueError: ``chunk_size`` or ``float_decimals`` is out of range.
    """
    written = 0
    write = fp.write
    for chunk in iterencode(
        obj,
        option=option,
        default=default,
        chunk_size=chunk_size,
        iterables=iterables,
        float_decimals=float_decimals,
    ):
        write(chunk)
        written += len(chunk)
    return written
