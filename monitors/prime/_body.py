"""The multipart/form-data body of one traces upload, framed by hand and kept in pieces.

Framed by hand because aiohttp's ``MultipartWriter`` refuses the traces part's
``Content-Encoding: gzip``. Never joined: the head, the gzip pieces and the tail are streamed
to the socket a slice at a time, afresh on every attempt (docs/design.md D11).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass

from anyio.lowlevel import checkpoint

__all__ = ["SEND_BYTES", "Body", "Pieces", "frame", "new_boundary"]

#: Most bytes of a body handed to the socket in one turn of the loop: a send is work on the
#: loop's thread (docs/design.md D11).
SEND_BYTES = 64 * 1024

_CRLF = b"\r\n"


def new_boundary() -> bytes:
    """A random multipart boundary (128 bits: the data containing it is never expected)."""
    return ("nodewise-" + secrets.token_hex(16)).encode("ascii")


def _head(boundary: bytes, metadata: bytes) -> bytes:
    return b"".join(
        (
            b"--" + boundary + _CRLF,
            b'Content-Disposition: form-data; name="metadata"' + _CRLF,
            b"Content-Type: application/json" + _CRLF,
            _CRLF,
            metadata + _CRLF,
            b"--" + boundary + _CRLF,
            b'Content-Disposition: form-data; name="traces"; filename="traces.jsonl"' + _CRLF,
            b"Content-Type: application/x-ndjson" + _CRLF,
            b"Content-Encoding: gzip" + _CRLF,
            _CRLF,
        )
    )


@dataclass(frozen=True)
class Body:
    """A framed body: ``content_type`` (with the boundary), its ``pieces`` and ``size``."""

    content_type: str
    pieces: tuple[bytes, ...]
    size: int

    def __bytes__(self) -> bytes:
        return b"".join(self.pieces)

    def stream(self) -> Pieces:
        """A fresh async iterator over the pieces (one per attempt)."""
        return Pieces(self.pieces)


class Pieces:
    """The pieces of a body as an async iterator, the shape aiohttp streams a body from:
    slices of at most ``SEND_BYTES`` (views, not copies), the loop given a turn before each.

    ``started``: aiohttp asked for the body, which it does once connected and the headers
    are written; ``done``: every byte was handed to the connection."""

    def __init__(self, pieces: tuple[bytes, ...]) -> None:
        self._pieces: Iterator[bytes] = iter(pieces)
        self._rest = memoryview(b"")
        self.started = False
        self.done = False

    def __aiter__(self) -> Pieces:
        return self

    async def __anext__(self) -> memoryview:
        self.started = True
        rest = self._rest
        if not rest:
            for piece in self._pieces:
                if piece:
                    rest = memoryview(piece)
                    break
            else:
                self.done = True
                raise StopAsyncIteration
        await checkpoint()
        self._rest = rest[SEND_BYTES:]
        return rest[:SEND_BYTES]


def _contains(boundary: bytes, traces: list[bytes]) -> bool:
    """Whether ``boundary`` occurs in the concatenation of ``traces`` (within a piece or
    across the seam of two)."""
    keep = len(boundary) - 1
    tail = b""
    for piece in traces:
        if boundary in piece or boundary in tail + piece[:keep]:
            return True
        tail = (tail + piece)[-keep:] if len(piece) < keep else piece[-keep:]
    return False


def frame(metadata: bytes, traces: list[bytes], *, boundary: bytes, checked: bool = False) -> Body:
    """The body of a ``metadata`` part (JSON) and a ``traces`` part holding the gzip pieces
    ``traces``. ``checked``: the caller already knows ``boundary`` is not in ``traces``;
    otherwise it is checked here, and redrawn in the astronomically unlikely case it is."""
    while not checked and _contains(boundary, traces):
        boundary = new_boundary()
    head = _head(boundary, metadata)
    tail = _CRLF + b"--" + boundary + b"--" + _CRLF
    pieces = (head, *traces, tail)
    return Body(
        content_type=f"multipart/form-data; boundary={boundary.decode()}",
        pieces=pieces,
        size=sum(map(len, pieces)),
    )
