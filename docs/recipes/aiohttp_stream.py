"""Recipe: stream a huge JSON response from an ``aiohttp.web`` handler.

``main()`` serves a ~20 MB document on 127.0.0.1, downloads it with an aiohttp client and
checks the body against ``orjson.dumps`` (``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

import asyncio
import hashlib
from contextlib import aclosing
from typing import Any

import orjson
from aiohttp import ClientSession, web

import encoder

# --8<-- [start:handler]
DOCUMENTS = web.AppKey("documents", dict)


async def get_document(request: web.Request) -> web.StreamResponse:
    doc = request.app[DOCUMENTS][request.match_info["name"]]
    response = web.StreamResponse(headers={"Content-Type": "application/json"})
    await response.prepare(request)  # status and headers go out; no length: chunked
    # aclosing: if the client goes away, write() raises and the encoder is closed at once.
    async with aclosing(encoder.aiterencode(doc, chunk_size=256 * 1024)) as chunks:
        async for chunk in chunks:
            await response.write(chunk)  # waits while the client reads slowly
    await response.write_eof()
    return response


def make_app(documents: dict[str, Any]) -> web.Application:
    app = web.Application()
    app[DOCUMENTS] = documents
    app.router.add_get("/documents/{name}", get_document)
    return app


# --8<-- [end:handler]


def sample_document(megabytes: float) -> dict[str, Any]:
    """An episode-shaped document of about ``megabytes``: long texts and lists of floats."""
    line = "The quick brown fox jumps over the lazy dog. \u00e9\u4e2d\U0001f600\n"
    turns = max(1, round(megabytes * 1_000_000 / 84_000))  # ~84 kB of JSON a turn
    return {
        "id": "episode-1",
        "turns": [
            {"role": "assistant", "content": line * 1_000 + str(i), "logprobs": [-0.125] * 4_000}
            for i in range(turns)
        ],
    }


async def serve_and_fetch(doc: dict[str, Any]) -> tuple[int, str]:
    """Serve ``doc`` on 127.0.0.1, download it once; return (bytes, sha256)."""
    runner = web.AppRunner(make_app({"big": doc}))
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        digest = hashlib.sha256()
        size = 0
        url = f"http://127.0.0.1:{port}/documents/big"
        async with ClientSession() as session, session.get(url) as response:
            response.raise_for_status()
            assert response.headers["Content-Type"] == "application/json"
            async for data in response.content.iter_chunked(1 << 20):
                digest.update(data)
                size += len(data)
    finally:
        await runner.cleanup()
    return size, digest.hexdigest()


def main(megabytes: float = 20) -> int:
    doc = sample_document(megabytes)
    expected = orjson.dumps(doc)
    size, sha = asyncio.run(serve_and_fetch(doc))
    assert (size, sha) == (len(expected), hashlib.sha256(expected).hexdigest())
    print(f"streamed {size / 1e6:.1f} MB, byte-identical to orjson.dumps")
    return size


if __name__ == "__main__":
    main()
