"""Recipe: upload a JSON (or JSONL) body with aiohttp from an async generator.

``main()`` starts a small aiohttp server on 127.0.0.1 that hashes what it receives, uploads a
document and a batch of records to it, and checks both bodies against ``orjson.dumps``
(``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncIterator, Iterable
from typing import Any

import orjson
from aiohttp import ClientSession, web

import encoder

# --8<-- [start:document]


async def upload_document(session: ClientSession, url: str, doc: Any) -> Any:
    # An async iterable as ``data``: aiohttp sends it with chunked transfer encoding,
    # a chunk at a time, and the loop gets its turn every 0.1 ms of encoding.
    body = encoder.aiterencode(doc, chunk_size=256 * 1024)
    headers = {"Content-Type": "application/json"}
    async with session.post(url, data=body, headers=headers) as response:
        response.raise_for_status()
        return await response.json()


# --8<-- [end:document]
# --8<-- [start:jsonl]


async def jsonl(records: Iterable[Any]) -> AsyncIterator[bytes]:
    """One record per line, streamed."""
    for record in records:
        async for chunk in encoder.aiterencode(record, option=encoder.OPT_APPEND_NEWLINE):
            yield chunk


async def upload_records(session: ClientSession, url: str, records: Iterable[Any]) -> Any:
    headers = {"Content-Type": "application/x-ndjson"}
    async with session.post(url, data=jsonl(records), headers=headers) as response:
        response.raise_for_status()
        return await response.json()


# --8<-- [end:jsonl]


async def receive(request: web.Request) -> web.Response:
    """The server side of the demo: hash the body as it arrives."""
    digest = hashlib.sha256()
    size = 0
    async for data in request.content.iter_chunked(1 << 20):
        digest.update(data)
        size += len(data)
    return web.json_response(
        {
            "bytes": size,
            "sha256": digest.hexdigest(),
            "chunked": request.headers.get("Transfer-Encoding") == "chunked",
        }
    )


def _expect(body: bytes) -> dict[str, Any]:
    return {"bytes": len(body), "sha256": hashlib.sha256(body).hexdigest(), "chunked": True}


async def demo(doc: Any, records: list[Any]) -> tuple[Any, Any]:
    app = web.Application()
    app.router.add_post("/upload", receive)
    runner = web.AppRunner(app)
    await runner.setup()
    try:
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{runner.addresses[0][1]}/upload"
        async with ClientSession() as session:
            one = await upload_document(session, url, doc)
            many = await upload_records(session, url, records)
    finally:
        await runner.cleanup()
    return one, many


def main() -> tuple[Any, Any]:
    doc = {"id": "episode-1", "text": "token " * 2_000_000, "logprobs": [-0.5] * 500_000}
    records = [{"i": i, "text": "\u00e9" * i * 1000} for i in range(50)]
    one, many = asyncio.run(demo(doc, records))
    assert one == _expect(orjson.dumps(doc)), one
    lines = b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in records)
    assert many == _expect(lines), many
    print(f"uploaded {one['bytes']} + {many['bytes']} bytes, byte-identical to orjson.dumps")
    return one, many


if __name__ == "__main__":
    main()
