"""Fuzz target: upload requests to ``TracesServer``'s application, valid and broken.

Each input becomes one ``POST /api/v1/traces`` to the real aiohttp application (in this
process, on 127.0.0.1, so that its checks are instrumented), which forgets every earlier
input: headers, multipart framing, part headers, the metadata JSON, gzip members and NDJSON
lines are each either right or fuzzed (raw bytes in place of a part, a cut or corrupt gzip
stream, a wrong idempotency key, a body of arbitrary bytes). A valid request is one the prime-traces SDK would send: bare traces
without ``X-Prime-Line-Format`` (the SDK omits it for its default, ``trace``), or episodes,
each an object with a ``traces`` list of member traces, under ``X-Prime-Line-Format:
episode`` (prime-runs picks the format so); string ids, none twice in one upload (the
service's ``duplicate_*_id``). The server must answer every request with a 4xx naming the
fault, or 200 when the request is valid; a 500 (an exception in the server), no answer, or
a refusal of a valid request is a crash.

    python fuzz/traces_server.py [libFuzzer flags] [corpus dirs]   (or: make fuzz)
"""

from __future__ import annotations

import asyncio
import concurrent.futures.thread  # noqa: F401  (see below)
import hashlib
import sys
import zlib

import aiohttp
import atheris
from _repeatable import number_counters_repeatably
from aiohttp.test_utils import TestServer

# Only the server's own code is instrumented: aiohttp's streams and timers and the worker
# thread's loop (concurrent.futures) take branches that follow the timing of the socket and
# of the thread, which would steer two runs from one seed apart. Imported first, they stay
# as they are.
number_counters_repeatably()
with atheris.instrument_imports():
    import orjson

    from monitors.prime import TRACES_PATH
    from monitors.testing._app import STATE, ServerConfig, make_app
    from monitors.testing._batch import BatchLimits
    from monitors.testing._faults import Faults

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

    def trace(self, ids: set[str]) -> dict[str, str]:
        """A bare trace; an id already in ``ids`` (this upload's) makes the request invalid."""
        trace_id = f"t{self.fdp.ConsumeIntInRange(0, 15)}"
        if trace_id in ids:
            self.valid = False
        ids.add(trace_id)
        return {"id": trace_id, "text": self.fdp.ConsumeUnicodeNoSurrogates(24)}

    def build(self) -> tuple[dict[str, str], bytes]:
        fdp = self.fdp
        # The count, then the format: so the bytes of regression-bare-trace-sent-as-episode
        # still build the one bare trace they were found with, now sent as the SDK sends it.
        count = fdp.ConsumeIntInRange(0, 6)
        episodes = not fdp.ConsumeBool()
        lines = []
        trace_ids: set[str] = set()
        episode_ids: set[str] = set()
        for _ in range(count):
            record: dict[str, object]
            if episodes:
                episode_id = f"e{fdp.ConsumeIntInRange(0, 15)}"
                if episode_id in episode_ids:
                    self.valid = False
                episode_ids.add(episode_id)
                members = [self.trace(trace_ids) for _ in range(fdp.ConsumeIntInRange(0, 3))]
                record = {"id": episode_id, "traces": members}
            else:
                record = dict(self.trace(trace_ids))
            lines.append(orjson.dumps(record))
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
            "Content-Type": f"multipart/form-data; boundary={boundary}",
        }
        if not fdp.ConsumeIntInRange(0, 15):
            self.valid = False  # the other format's header: the lines do not match it
            episodes = not episodes
        if episodes:
            headers["X-Prime-Line-Format"] = "episode"
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
        # A seeded fault RNG (no fault is on, but each request draws from it).
        config = ServerConfig(api_key=API_KEY, faults=Faults(seed=0), limits=LIMITS, history=1)
        app = make_app(config)
        self.state = app[STATE]
        self.server = TestServer(app, host="127.0.0.1")
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
        # Each input on a fresh server: no upload an earlier input committed turns this one
        # into a replay or a line_format_conflict, so that a crash input replays alone.
        self.state.reset()
        try:
            status, answer = self.loop.run_until_complete(self.post(headers, body))
        except ValueError:
            return  # refused by the client before sending (a header it will not write)
        assert status != 500, f"server error: {answer[:300]!r}"
        assert status in (200, 400, 401, 403, 413), f"unexpected status {status}: {answer[:300]!r}"
        if request.valid:
            assert status == 200, f"a valid upload was refused ({status}): {answer[:300]!r}"
            assert orjson.loads(answer)["status"] == "committed"

    def close(self) -> None:
        self.loop.run_until_complete(self.session.close())
        self.loop.run_until_complete(self.server.close())
        self.loop.close()


def main() -> None:
    target = Target()
    try:
        atheris.Setup(sys.argv, target)
        atheris.Fuzz()
    finally:  # -atheris_runs ends with sys.exit: close, so nothing warns of an open session
        target.close()


if __name__ == "__main__":
    main()
