"""The multipart/form-data body of one traces upload, framed by hand.

aiohttp's ``MultipartWriter`` refuses a part-level ``Content-Encoding``, which the traces part
needs (``gzip``), and framing is a few lines: boundary, part headers, bytes.
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence

__all__ = ["frame"]

_CRLF = b"\r\n"


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


def frame(metadata: bytes, traces: Sequence[bytes]) -> tuple[str, bytes]:
    """``(content_type, body)``: a ``metadata`` part (JSON) and a ``traces`` part holding the
    gzip bytes ``traces``. The random boundary is checked against the data (and redrawn in
    the astronomically unlikely case the compressed bytes contain it)."""
    while True:
        boundary = ("nodewise-" + secrets.token_hex(16)).encode("ascii")
        head = _head(boundary, metadata)
        tail = _CRLF + b"--" + boundary + b"--" + _CRLF
        body = b"".join((head, *traces, tail))
        if body.find(boundary, len(head), len(body) - len(tail)) < 0:
            return f"multipart/form-data; boundary={boundary.decode()}", body
