"""TracesServer: a real Prime Traces API server process, spoken to over real HTTP.

Requests are framed by hand here (boundary, part headers, gzip, sha256 key), so these tests
check the server against the wire format itself, not against our own uploader.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import io
import os
import socket
import time
import urllib.error
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import orjson
import pytest

from monitors.prime import METRICS_PATH, TRACES_PATH
from monitors.testing import Faults, FaultsError, TracesServer
from monitors.testing._batch import BatchLimits, Refused, check_traces
from monitors.testing._multipart import (
    MultipartError,
    MultipartParser,
    PartData,
    PartEnd,
    PartStart,
    parse_header_params,
)

TEAM = "team-7"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def running() -> Iterator[TracesServer]:
    with TracesServer(team_id=TEAM, keep_lines=True) as server:
        yield server


@pytest.fixture
def server(running: TracesServer) -> TracesServer:
    running.reset(faults=True)
    return running


# -- framing requests by hand ----------------------------------------------------------------


def ndjson(records: list[Any]) -> bytes:
    return b"".join(orjson.dumps(r) + b"\n" for r in records)


TRACES_PART_HEADERS = (
    ("Content-Disposition", 'form-data; name="traces"; filename="traces.jsonl"'),
    ("Content-Type", "application/x-ndjson"),
    ("Content-Encoding", "gzip"),
)
METADATA = orjson.dumps({"schema_version": 1, "context": {"run_id": "r1", "kind": "train"}})


@dataclass(frozen=True)
class Upload:
    """One traces request as the SDK frames it; change a field to break one thing."""

    lines: bytes  # the uncompressed NDJSON
    boundary: str = "nodewise-3f9a0c"
    metadata: bytes | None = METADATA
    traces_headers: tuple[tuple[str, str], ...] = TRACES_PART_HEADERS
    compressed: bytes | None = None  # default: gzip of ``lines``
    key: str | None = ""  # "": the right key; None: no header
    api_key: str | None = "test-key"
    team: str | None = TEAM
    line_format: str | None = "episode"

    def body(self) -> bytes:
        b = self.boundary.encode()
        out = []
        if self.metadata is not None:
            out += [
                b"--" + b + b"\r\n",
                b'Content-Disposition: form-data; name="metadata"\r\n',
                b"Content-Type: application/json\r\n\r\n",
                self.metadata,
                b"\r\n",
            ]
        data = self.compressed if self.compressed is not None else gzip.compress(self.lines, 1)
        out.append(b"--" + b + b"\r\n")
        out += [f"{k}: {v}\r\n".encode() for k, v in self.traces_headers]
        out += [b"\r\n", data, b"\r\n--" + b + b"--\r\n"]
        return b"".join(out)

    def headers(self) -> dict[str, str]:
        headers = {"Content-Type": f"multipart/form-data; boundary={self.boundary}"}
        if self.api_key is not None:
            headers["Authorization"] = f"Bearer {self.api_key}"
        if self.team is not None:
            headers["X-Prime-Team-ID"] = self.team
        if self.line_format is not None:
            headers["X-Prime-Line-Format"] = self.line_format
        if self.key is not None:
            headers["Idempotency-Key"] = self.key or (
                "sha256:" + hashlib.sha256(self.lines).hexdigest()
            )
        return headers

    def but(self, **changes: Any) -> Upload:
        return dataclasses.replace(self, **changes)


@dataclass
class Answer:
    status: int
    body: Any
    headers: dict[str, str]


async def post(server: TracesServer, upload: Upload, *, chunked: bool = False) -> Answer:
    """POST ``upload``; ``chunked`` sends it in 1000-byte pieces without a Content-Length."""
    body = upload.body()

    async def pieces() -> AsyncIterator[bytes]:
        for at in range(0, len(body), 1000):
            yield body[at : at + 1000]

    data = pieces() if chunked else io.BytesIO(body)
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + TRACES_PATH, data=data, headers=upload.headers()) as r,
    ):
        return Answer(r.status, orjson.loads(await r.read()), dict(r.headers))


async def post_metrics(server: TracesServer, body: bytes, api_key: str = "test-key") -> Answer:
    headers = {
        "Authorization": f"Bearer {api_key}",
        "X-Prime-Team-ID": TEAM,
        "Content-Type": "application/json",
    }
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + METRICS_PATH, data=body, headers=headers) as r,
    ):
        return Answer(r.status, orjson.loads(await r.read()), dict(r.headers))


#: Episodes as the service takes them (the "episode" line format): objects with a traces list.
RECORDS = [
    {"id": f"ep-{i}", "reward": i / 10, "text": "é漢🙂\n", "traces": [{"id": f"t-{i}"}]}
    for i in range(50)
]
GOOD = Upload(ndjson(RECORDS))


# -- the happy path and idempotency ------------------------------------------------------------


@pytest.mark.anyio
async def test_valid_upload_is_committed_and_counted(server: TracesServer) -> None:
    records = [*RECORDS, {"no_id": 1, "traces": []}, {"no_id": 2, "traces": [{"x": 1}]}]
    upload = Upload(ndjson(records))
    answer = await post(server, upload)
    assert answer.status == 200, answer.body
    assert answer.body["status"] == "committed"
    assert answer.body["lines"] == len(records)
    # the upload id is the content digest, 64 lowercase hex (prime-traces' UploadReceipt)
    assert answer.body["upload_id"] == hashlib.sha256(upload.lines).hexdigest()
    stats = await server.astats()
    assert stats["requests"] == {"200": 1}
    assert stats["uploads"] == 1
    assert stats["lines_received"] == stats["lines_stored"] == len(records)
    assert stats["unique_ids"] == 50
    assert stats["duplicate_ids"] == 0
    assert stats["records_without_id"] == 2
    assert stats["uncompressed_bytes"] == len(upload.lines)
    assert stats["compressed_bytes"] == len(gzip.compress(upload.lines, 1))
    assert stats["body_bytes"] == len(upload.body())
    assert await server.alines() == upload.lines.splitlines()


@pytest.mark.anyio
async def test_replay_answers_the_same_upload_id_and_stores_nothing(
    server: TracesServer,
) -> None:
    first = await post(server, GOOD)
    # Same bytes, same key, framed differently (another boundary): still the same upload.
    again = await post(server, GOOD.but(boundary="other-boundary-1"))
    assert first.status == again.status == 200
    assert again.body == first.body
    stats = server.stats()
    assert stats["uploads"] == 1
    assert stats["replays"] == 1
    assert stats["lines_received"] == 2 * len(RECORDS)
    assert stats["lines_stored"] == len(RECORDS)
    assert stats["duplicate_ids"] == 0
    assert len(server.lines()) == len(RECORDS)
    assert [r["replay"] for r in server.requests()] == [False, True]


@pytest.mark.anyio
async def test_several_gzip_members_and_a_last_line_without_newline(
    server: TracesServer,
) -> None:
    lines = ndjson(RECORDS[:10]) + b'{"id": "last", "traces": []}'
    half = len(lines) // 2
    compressed = gzip.compress(lines[:half]) + gzip.compress(lines[half:])
    answer = await post(server, Upload(lines, compressed=compressed))
    assert answer.status == 200, answer.body
    assert answer.body["lines"] == 11


@pytest.mark.anyio
async def test_chunked_body_without_content_length(server: TracesServer) -> None:
    answer = await post(server, GOOD, chunked=True)
    assert answer.status == 200, answer.body
    (seen,) = server.requests()
    assert seen["headers"]["transfer-encoding"] == "chunked"
    assert "content-length" not in seen["headers"]


# -- refusals ---------------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("api_key", "status"), [(None, 401), ("wrong-key", 401), ("test-key", 200)]
)
async def test_auth(server: TracesServer, api_key: str | None, status: int) -> None:
    answer = await post(server, GOOD.but(api_key=api_key))
    assert answer.status == status, answer.body
    if status == 401:
        assert answer.headers["WWW-Authenticate"] == "Bearer"
        assert server.stats()["lines_received"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize("team", [None, "team-8"])
async def test_wrong_team_is_forbidden(server: TracesServer, team: str | None) -> None:
    answer = await post(server, GOOD.but(team=team))
    assert answer.status == 403, answer.body
    assert answer.body["error"]["code"] == "forbidden"
    assert "X-Prime-Team-ID" in answer.body["error"]["message"]


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("change", "needle"),
    [
        ({"key": None}, "missing Idempotency-Key"),
        ({"key": "sha256:" + "0" * 64}, "is not the sha256"),
        ({"key": "md5:abc"}, "sha256:<64 hex digits>"),
        ({"line_format": "record"}, "X-Prime-Line-Format"),
        ({"compressed": b"this is not gzip"}, "not valid gzip"),
        ({"compressed": gzip.compress(GOOD.lines)[:-12]}, "truncated gzip"),
        ({"metadata": None}, "no 'metadata' part"),
        ({"metadata": b"{not json"}, "metadata part is not JSON"),
        ({"metadata": b'{"schema_version": 2, "context": {}}'}, "schema_version must be 1"),
        ({"metadata": b'{"schema_version": 1, "context": [1]}'}, "context must map strings"),
        ({"metadata": b'{"schema_version": 1, "context": {"step": 3}}'}, "to strings, not"),
        (
            {"traces_headers": (*TRACES_PART_HEADERS[:2], ("Content-Encoding", "br"))},
            "Content-Encoding must be gzip or none",
        ),
        (
            {"traces_headers": (("Content-Disposition", 'form-data; name="traces"'),)},
            "filename must be traces.jsonl",
        ),
    ],
)
async def test_protocol_errors_are_400(
    server: TracesServer, change: dict[str, Any], needle: str
) -> None:
    answer = await post(server, GOOD.but(**change))
    assert answer.status == 400, answer.body
    assert needle in answer.body["error"]["message"]
    assert server.stats()["lines_stored"] == 0


@pytest.mark.anyio
@pytest.mark.parametrize(
    "metadata",
    [b'{"schema_version": 1}', b'{"schema_version": 1, "context": {"run_type": "train"}}'],
    ids=["no context (the SDK's default)", "strings"],
)
async def test_metadata_the_sdk_sends_is_taken(server: TracesServer, metadata: bytes) -> None:
    answer = await post(server, GOOD.but(metadata=metadata))
    assert answer.status == 200, answer.body


@pytest.mark.anyio
async def test_a_line_that_is_not_json_is_named(server: TracesServer) -> None:
    lines = b'{"id": 1}\n{"id": 2}\n{"id": 3,\n{"id": 4}\n'
    answer = await post(server, Upload(lines, line_format="trace"))
    assert answer.status == 400
    assert answer.body["error"]["code"] == "invalid_trace", answer.body
    assert "line 3 is not JSON" in answer.body["error"]["message"]
    empty_line = await post(server, Upload(b'{"id": 1}\n\n{"id": 2}\n', line_format="trace"))
    assert empty_line.status == 400
    assert "line 2 is not JSON" in empty_line.body["error"]["message"]


@pytest.mark.anyio
async def test_a_body_that_is_not_multipart_is_400(server: TracesServer) -> None:
    headers = {**GOOD.headers(), "Content-Type": "application/json"}
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + TRACES_PATH, data=b"{}", headers=headers) as r,
    ):
        assert r.status == 400
    cut = GOOD.body()[:-30]  # no closing boundary
    async with (
        aiohttp.ClientSession() as session,
        session.post(server.url + TRACES_PATH, data=cut, headers=GOOD.headers()) as r,
    ):
        assert r.status == 400
        assert "closing boundary" in (await r.json())["error"]["message"]


@pytest.mark.anyio
async def test_limits_are_400_with_the_services_codes() -> None:
    """The service answers a limit with 400 and a code (as prime-traces' ``ErrorCode``
    lists them), not 413."""
    limits = {"max_batch_bytes": 2000, "max_batch_lines": 20, "max_line_bytes": 300}
    async with TracesServer(**limits) as server:
        small = Upload(ndjson([{"id": i} for i in range(20)]), team=None, line_format="trace")
        assert (await post(server, small)).status == 200
        too_many = Upload(ndjson([{"id": i} for i in range(21)]), team=None, line_format="trace")
        answer = await post(server, too_many)
        assert answer.status == 400
        assert answer.body["error"]["code"] == "too_many_traces_in_upload"
        long_line = Upload(ndjson([{"id": 1, "text": "x" * 300}]), team=None, line_format="trace")
        answer = await post(server, long_line)
        assert answer.status == 400
        assert answer.body["error"]["code"] == "trace_too_large"
        assert "line 1" in answer.body["error"]["message"]
        # 10 MB of zeros is a few KB of gzip: refused at the limit, not inflated whole.
        bomb = Upload(b"0" * 10_000_000, team=None)
        answer = await post(server, bomb)
        assert answer.status == 400
        assert answer.body["error"]["code"] == "upload_too_large"
        assert "over 2000 bytes" in answer.body["error"]["message"]
        assert server.stats()["requests"] == {"200": 1, "400": 3}


# -- faults -----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_script_answers_in_order_then_serves(server: TracesServer) -> None:
    server.set_faults(script=[503, 429], retry_after=2)
    first = await post(server, GOOD)
    second = await post(server, GOOD)
    third = await post(server, GOOD)
    assert [first.status, second.status, third.status] == [503, 429, 200]
    assert second.headers["Retry-After"] == "2"
    assert "Retry-After" not in first.headers
    assert server.get_faults()["script"] == []
    stats = server.stats()
    assert stats["requests"] == {"200": 1, "429": 1, "503": 1}
    assert stats["lines_stored"] == len(RECORDS)
    assert [r["fault"] for r in server.requests()] == [503, 429, None]


@pytest.mark.anyio
async def test_retry_after_defaults_to_one_second(server: TracesServer) -> None:
    server.set_faults(script=[429])
    answer = await post(server, GOOD)
    assert answer.status == 429
    assert answer.headers["Retry-After"] == "1"


@pytest.mark.anyio
async def test_latency_is_added(server: TracesServer) -> None:
    await server.aset_faults(latency=0.3)
    started = time.monotonic()
    answer = await post_metrics(server, b'{"run_id": "r", "step": 1, "metrics": {}}')
    assert answer.status == 200
    assert time.monotonic() - started >= 0.3


@pytest.mark.anyio
async def test_bandwidth_limits_the_body_read(server: TracesServer) -> None:
    big = Upload(
        ndjson([{"id": i, "blob": os.urandom(1000).hex(), "traces": []} for i in range(100)])
    )
    size = len(big.body())  # about 200 KB, incompressible
    server.set_faults(bandwidth=size / 0.4)
    started = time.monotonic()
    answer = await post(server, big)
    assert answer.status == 200
    assert time.monotonic() - started >= 0.35


@pytest.mark.anyio
async def test_drop_closes_the_connection_mid_body(server: TracesServer) -> None:
    big = Upload(
        ndjson([{"id": i, "blob": os.urandom(5000).hex(), "traces": []} for i in range(200)])
    )
    body = big.body()  # 2 MB, incompressible: the client is still sending when cut off
    server.set_faults(script=["drop"])
    with pytest.raises(aiohttp.ClientError):
        await post(server, big)
    stats = server.stats()
    assert stats["dropped"] == 1
    assert stats["requests"] == {}
    assert 0 < stats["body_bytes"] < len(body)
    # The next request is served.
    assert (await post(server, big)).status == 200


@pytest.mark.anyio
async def test_down_answers_nothing_until_up_again(server: TracesServer) -> None:
    server.set_faults(down=True)
    with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        await post(server, GOOD)
    with pytest.raises((aiohttp.ServerDisconnectedError, aiohttp.ClientOSError)):
        await post_metrics(server, b"{}")
    assert server.stats()["refused"] == 2
    server.set_faults(down=False)
    assert (await post(server, GOOD)).status == 200


@pytest.mark.anyio
async def test_rates_are_reproducible_with_a_seed(server: TracesServer) -> None:
    body = b'{"run_id": "r", "step": 1, "metrics": {}}'

    async def run() -> list[int]:
        server.set_faults(fail_rate_503=0.3, fail_rate_500=0.2, seed=11)
        return [(await post_metrics(server, body)).status for _ in range(20)]

    first, second = await run(), await run()
    assert first == second
    assert set(first) == {200, 500, 503}


def test_fault_settings_are_checked(running: TracesServer) -> None:
    with pytest.raises(FaultsError, match="unknown fault"):
        running.set_faults(latenc=1)
    with pytest.raises(FaultsError, match="add up to more than 1"):
        Faults(fail_rate_429=0.6, fail_rate_500=0.6)
    with pytest.raises(FaultsError, match="script entries"):
        TracesServer(faults={"script": [503, "boom"]})
    with pytest.raises(RuntimeError, match="answered 400"):
        running._call("POST", "/_faults", {"drop_rate": 2})


# -- metrics ----------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_metrics_endpoint(server: TracesServer) -> None:
    good = {"run_id": "run-1", "step": 7, "metrics": {"loss": 0.5, "reward/mean": 1.25}}
    answer = await post_metrics(server, orjson.dumps(good))
    assert (answer.status, answer.body) == (200, {"status": "ok"})
    assert (await server.ametrics()) == [good]
    for bad in (b"{nope", b"[]", b'{"run_id": "r", "step": "7", "metrics": {}}', b'{"step": 1}'):
        assert (await post_metrics(server, bad)).status == 400, bad
    assert (await post_metrics(server, orjson.dumps(good), api_key="nope")).status == 401
    stats = server.stats()
    assert stats["metrics_received"] == 1
    assert stats["requests"] == {"200": 1, "400": 4, "401": 1}


# -- what the client sent ---------------------------------------------------------------------


@pytest.mark.anyio
async def test_requests_show_headers_and_parts(server: TracesServer) -> None:
    await post(server, GOOD)
    (seen,) = await server.arequests()
    assert seen["status"] == 200
    assert seen["path"] == TRACES_PATH
    assert seen["headers"]["authorization"] == "Bearer <redacted>"
    assert "test-key" not in orjson.dumps(seen).decode()
    assert seen["headers"]["x-prime-line-format"] == "episode"
    assert seen["headers"]["x-prime-team-id"] == TEAM
    assert seen["computed_key"] == seen["idempotency_key"] == GOOD.headers()["Idempotency-Key"]
    metadata, traces = seen["parts"]
    assert metadata["name"] == "metadata"
    assert metadata["headers"]["content-type"] == "application/json"
    assert traces["name"] == "traces"
    assert traces["headers"] == {
        "content-disposition": 'form-data; name="traces"; filename="traces.jsonl"',
        "content-type": "application/x-ndjson",
        "content-encoding": "gzip",
    }
    assert traces["bytes"] == seen["compressed_bytes"] == len(gzip.compress(GOOD.lines, 1))
    assert seen["uncompressed_bytes"] == len(GOOD.lines)
    assert seen["lines"] == len(RECORDS)
    assert seen["metadata"] == orjson.loads(METADATA)
    # A mismatched key shows both values.
    await post(server, GOOD.but(key="sha256:" + "a" * 64))
    (last,) = server.requests(last=1)
    assert last["status"] == 400
    assert last["idempotency_key"] != last["computed_key"]


# -- the process ------------------------------------------------------------------------------


def test_sync_use_and_restart_on_the_same_port() -> None:
    server = TracesServer(faults={"script": [500]})
    with server:
        url = server.url
        request = urllib.request.Request(
            url + METRICS_PATH,
            data=b'{"run_id": "r", "step": 0, "metrics": {"a": 1}}',
            headers={"Authorization": "Bearer test-key"},
        )
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with pytest.raises(urllib.error.HTTPError) as failed:
            opener.open(request, timeout=10)
        assert failed.value.code == 500
        failed.value.close()
        with opener.open(request, timeout=10) as response:
            assert response.status == 200
        assert server.stats()["requests"] == {"200": 1, "500": 1}
    assert not server.running
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.url
    with pytest.raises(RuntimeError, match="not running"):
        _ = server.pid
    with socket.socket() as probe:  # nothing listens there now: connection refused
        assert probe.connect_ex(("127.0.0.1", server.port)) != 0
    with server:
        assert server.url == url
        assert server.stats()["requests_total"] == 0
        assert server.pid > 0
        assert server.pid != os.getpid()


def test_standalone_process_speaks_first_line_url() -> None:
    server = TracesServer()
    assert server.command()[1:3] == ["-m", "monitors.testing.server"]
    assert "--port" in server.command()


# -- the parsers, without a server -------------------------------------------------------------


def test_multipart_parser_gives_the_same_events_however_the_body_is_split() -> None:
    body = GOOD.body()

    def parse(pieces: list[bytes]) -> list[Any]:
        parser = MultipartParser(GOOD.boundary)
        events: list[Any] = []
        for piece in pieces:
            events += parser.feed(piece)
        parser.close()
        merged: list[Any] = []
        for event in events:  # join consecutive data pieces
            if isinstance(event, PartData) and merged and isinstance(merged[-1], bytes):
                merged[-1] += event.data
            else:
                merged.append(event.data if isinstance(event, PartData) else event)
        return merged

    whole = parse([body])
    assert [type(e).__name__ for e in whole] == [
        "PartStart", "bytes", "PartEnd", "PartStart", "bytes", "PartEnd",
    ]  # fmt: skip
    assert whole[1] == METADATA
    assert whole[4] == gzip.compress(GOOD.lines, 1)
    start = whole[3]
    assert isinstance(start, PartStart)
    assert start.header("content-encoding") == "gzip"
    assert parse([body[i : i + 1] for i in range(len(body))]) == whole
    for cut in range(0, len(body), 97):
        assert parse([body[:cut], body[cut:]]) == whole
    assert parse([b"preamble\r\n" + body + b"epilogue"]) == whole
    assert isinstance(whole[2], PartEnd)


def test_multipart_parser_refuses_broken_bodies() -> None:
    def parse(body: bytes) -> None:
        parser = MultipartParser(GOOD.boundary)
        parser.feed(body)
        parser.close()

    with pytest.raises(MultipartError, match="without the closing boundary"):
        parse(GOOD.body()[:-4])
    with pytest.raises(MultipartError, match="without the closing boundary"):
        parse(b"no boundary at all")
    with pytest.raises(MultipartError, match="unexpected bytes after a boundary"):
        parse(GOOD.body().replace(b"\r\n--nodewise-3f9a0c\r\n", b"\r\n--nodewise-3f9a0cX\r\n"))
    parser = MultipartParser("b")
    with pytest.raises(MultipartError, match="malformed part header"):
        parser.feed(b"--b\r\nno colon here\r\n\r\nx\r\n--b--")


def test_header_params() -> None:
    assert parse_header_params('form-data; name="tr;aces"; filename="a\\"b.jsonl"') == (
        "form-data",
        {"name": "tr;aces", "filename": 'a"b.jsonl'},
    )
    assert parse_header_params("Multipart/Form-Data; Boundary=abc") == (
        "multipart/form-data",
        {"boundary": "abc"},
    )


def test_check_traces_stops_at_the_first_limit() -> None:
    limits = BatchLimits(max_batch_bytes=100, max_batch_lines=3, max_line_bytes=10)
    ok = check_traces([gzip.compress(b"1\n2\n3\n")], limits, keep_lines=True)
    assert (ok.line_count, ok.lines) == (3, [b"1", b"2", b"3"])
    assert ok.key == "sha256:" + hashlib.sha256(b"1\n2\n3\n").hexdigest()
    for data, code, needle in (
        (b"1\n2\n3\n4\n", "too_many_traces_in_upload", "more than 3 lines"),
        (b"[" + b"1," * 20 + b"1]\n", "trace_too_large", "line 1"),
        (b"1\n" * 60, "upload_too_large", "over 100 bytes"),
        (b"1\n2\nnull,\n", "invalid_trace", "line 3 is not JSON"),
    ):
        with pytest.raises(Refused) as refused:
            check_traces([gzip.compress(data)], limits)
        assert (refused.value.status, refused.value.code) == (400, code)
        assert needle in refused.value.message


# -- what the service takes, and the record-level refusals --------------------------------------


@pytest.mark.anyio
async def test_the_sdks_defaults_are_taken(server: TracesServer) -> None:
    """No X-Prime-Line-Format header (the trace format), no context, and an uncompressed
    traces part: what prime-traces sends by default."""
    lines = ndjson([{"id": f"t-{i}", "nodes": []} for i in range(5)])
    plain = (*TRACES_PART_HEADERS[:2],)
    upload = Upload(lines, line_format=None, metadata=b'{"schema_version": 1}', compressed=lines)
    answer = await post(server, upload.but(traces_headers=plain))
    assert answer.status == 200, answer.body
    assert server.lines() == lines.splitlines()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("line_format", "records", "code"),
    [
        ("episode", [{"id": "e", "traces": []}, {"id": "x"}], "invalid_trace"),
        ("episode", [{"id": "e", "traces": []}, [1]], "invalid_trace"),
        ("trace", [{"id": "t"}, "text"], "invalid_trace"),
        ("episode", [{"id": "e" * 257, "traces": []}], "episode_id_too_long"),
        ("episode", [{"id": "e", "traces": [{}] * 10_001}], "too_many_traces_in_episode"),
        ("episode", [{"id": "e", "traces": []}, {"id": "e", "traces": []}], "duplicate_episode_id"),
        ("episode", [{"traces": [{"id": "t"}]}, {"traces": [{"id": "t"}]}], "duplicate_trace_id"),
        ("trace", [{"id": "t"}, {"id": "t"}], "duplicate_trace_id"),
    ],
    ids=[
        "no traces list",
        "not an object",
        "a trace not an object",
        "episode id too long",
        "too many traces",
        "episode twice",
        "trace twice in episodes",
        "trace twice",
    ],
)
async def test_records_the_service_refuses_are_refused_with_its_code(
    server: TracesServer, line_format: str, records: list[Any], code: str
) -> None:
    answer = await post(server, Upload(ndjson(records), line_format=line_format))
    assert answer.status == 400, answer.body
    assert answer.body["error"]["code"] == code
    assert f"line {len(records)}" in answer.body["error"]["message"]
    assert server.stats()["lines_stored"] == 0


@pytest.mark.anyio
async def test_the_same_bytes_under_the_other_line_format_conflict(server: TracesServer) -> None:
    lines = ndjson([{"id": "e", "traces": [{"id": "t"}]}])
    assert (await post(server, Upload(lines))).status == 200
    replay = await post(server, Upload(lines))
    assert replay.status == 200
    conflict = await post(server, Upload(lines, line_format="trace"))
    assert conflict.status == 409
    assert conflict.body["error"]["code"] == "line_format_conflict"


@pytest.mark.anyio
async def test_a_request_over_the_cap_is_refused_by_the_transport() -> None:
    async with TracesServer(max_request_bytes=10_000) as capped:
        records = [{"id": f"e{i}", "blob": os.urandom(400).hex(), "traces": []} for i in range(60)]
        answer = await post(capped, Upload(ndjson(records), team=None))
        assert answer.status == 413
        assert capped.stats()["lines_stored"] == 0
