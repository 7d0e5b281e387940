"""Fuzz target: upload requests to ``TracesServer``'s application, valid and broken.

Each input becomes one ``POST /api/v1/traces`` to the real aiohttp application (in this
process, on 127.0.0.1, so its parser is instrumented): headers, multipart framing, part
headers, the metadata JSON, gzip members and NDJSON lines are each either right or fuzzed
(raw bytes in place of a part, a cut or corrupt gzip stream, a wrong idempotency key, a body
of arbitrary bytes). The server must answer every request with a 4xx naming the fault, or
200 when the request is valid; a 500 (an exception in the server), no answer, or a refusal
of a valid request is a crash.

    python fuzz/traces_server.py [libFuzzer flags] [corpus dirs]   (or: make fuzz)
"""

from __future__ import annotations

import asyncio
import hashlib
import sys
import zlib

import atheris

with atheris.instrument_imports():
    import aiohttp
    import orjson
    from aiohttp.test_utils import TestServer

    from monitors.prime import TRACES_PATH
    from monitors.testing._app import ServerConfig, make_app
    from monitors.testing._batch import BatchLimits

API_KEY = "fuzz-key"
CRLF = b"\r\n"
# Small limits, so that the fuzzer reaches them.
LIMITS = BatchLimits(max_batch_bytes=4096, max_batch_lines=16, max_line_bytes=2048)


def gzipped(data: bytes, level: int) -> bytes:
    z = zlib.compressobj(level, zlib.DEFLATED, 31)
    return z.compress(data) + z.flush()


class Request:
    """One request built from the input; ``valid`` when nothing in it was broken."""

    def __init__(self, fdp: atheris.FuzzedDataProvider) -> None:
        self.fdp = fdp
        self.valid = True

    def choose(self, right: bytes, odds: int = 6) -> bytes:
        """``right``, or (about once in ``odds``) fuzzed bytes instead."""
        if self.fdp.ConsumeIntInRange(0, odds - 1):
            return right
        self.valid = False
        fuzzed: bytes = self.fdp.ConsumeBytes(self.fdp.ConsumeIntInRange(0, 64))
        return fuzzed

    def build(self) -> tuple[dict[str, str], bytes]:
        fdp = self.fdp
        lines = []
        for _ in range(fdp.ConsumeIntInRange(0, 6)):
            text = fdp.ConsumeUnicodeNoSurrogates(24)
            lines.append(orjson.dumps({"id": fdp.ConsumeIntInRange(0, 1000), "text": text}))
        ndjson = b"".join(self.choose(line) + b"\n" for line in lines)
        traces = gzipped(ndjson, fdp.ConsumeIntInRange(0, 9))
        if not fdp.ConsumeIntInRange(0, 7):
            self.valid = False
            cut = fdp.ConsumeIntInRange(0, len(traces))
            traces = traces[:cut] + fdp.ConsumeBytes(fdp.ConsumeIntInRange(0, 16))
        key = "sha256:" + hashlib.sha256(ndjson).hexdigest()
        suffix = fdp.ConsumeUnicodeNoSurrogates(8)
        boundary = "nodewise-fuzz-" + "".join(c for c in suffix if c.isascii() and c.isalnum())
        b = boundary.encode()
        metadata = self.choose(b'{"schema_version": 1, "context": {"run": "fuzz"}}')
        body = b"".join(
            [
                b"--" + b + CRLF,
                self.choose(b'Content-Disposition: form-data; name="metadata"') + CRLF,
                b"Content-Type: application/json" + CRLF + CRLF,
                metadata + CRLF,
                self.choose(b"--" + b) + CRLF,
                self.choose(
                    b'Content-Disposition: form-data; name="traces"; filename="traces.jsonl"'
                )
                + CRLF,
                b"Content-Type: application/x-ndjson" + CRLF,
                self.choose(b"Content-Encoding: gzip") + CRLF + CRLF,
                traces + CRLF,
                self.choose(b"--" + b + b"--") + CRLF,
            ]
        )
        if not fdp.ConsumeIntInRange(0, 15):
            self.valid = False
            body = fdp.ConsumeBytes(fdp.remaining_bytes())
        headers = {
            "Authorization": f"Bearer {API_KEY}",
            "Idempotency-Key": key,
            "X-Prime-Line-Format": "episode",
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        }
        if not fdp.ConsumeIntInRange(0, 7):
            self.valid = False
            name = list(headers)[fdp.ConsumeIntInRange(0, len(headers) - 1)]
            headers[name] = (
                fdp.ConsumeUnicodeNoSurrogates(40).encode("latin-1", "ignore").decode("latin-1")
            )
        if len(ndjson) > LIMITS.max_batch_bytes or len(lines) > LIMITS.max_batch_lines:
            self.valid = False
        return headers, body


class Target:
    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        config = ServerConfig(api_key=API_KEY, limits=LIMITS, history=1)
        self.server = TestServer(make_app(config), host="127.0.0.1")
        self.loop.run_until_complete(self.server.start_server())
        self.session = self.loop.run_until_complete(self._session())
        self.url = str(self.server.make_url(TRACES_PATH))

    async def _session(self) -> aiohttp.ClientSession:
        return aiohttp.ClientSession()

    async def post(self, headers: dict[str, str], body: bytes) -> tuple[int, bytes]:
        async with self.session.post(self.url, data=body, headers=headers) as response:
            return response.status, await response.read()

    def __call__(self, data: bytes) -> None:
        request = Request(atheris.FuzzedDataProvider(data))
        try:
            headers, body = request.build()
        except ValueError:  # a header value aiohttp will not send (a newline in it)
            return
        try:
            status, answer = self.loop.run_until_complete(self.post(headers, body))
        except ValueError:
            return  # refused by the client before sending (a header it will not write)
        assert status != 500, f"server error: {answer[:300]!r}"
        assert status in (200, 400, 401, 403, 413), f"unexpected status {status}: {answer[:300]!r}"
        if request.valid:
            assert status == 200, f"a valid upload was refused ({status}): {answer[:300]!r}"
            assert orjson.loads(answer)["status"] == "committed"


def main() -> None:
    target = Target()
    atheris.Setup(sys.argv, target)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
