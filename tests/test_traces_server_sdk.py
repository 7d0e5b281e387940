"""The public prime-traces SDK (pinned in uv.lock) uploading to ``TracesServer``.

``TracesServer`` stands in for the service in every test, so the SDK's own client must read
its answers as it reads the service's: a commit as an ``UploadReceipt``, a refusal as the
typed exception its error code maps to (the SDK's parser reads the service's
``{"error": {"code", "message"}}``), a 429 or 503 as something to retry with the same bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import anyio
import orjson
import pytest
from prime_traces import (
    ForbiddenError,
    LineFormat,
    TracesClient,
    UnauthorizedError,
    ValidationRejectedError,
)

from monitors import DeliveryStats, PrimeMonitor
from monitors.testing import TracesServer

KEY = "sk-sdk-test-5e1f"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


TEAM = "team-sdk"
EPISODE = LineFormat.EPISODE


@pytest.fixture(scope="module")
def running() -> Iterator[TracesServer]:
    with TracesServer(api_key=KEY, team_id=TEAM, keep_lines=True, max_batch_bytes=4000) as s:
        yield s


@pytest.fixture
def server(running: TracesServer) -> TracesServer:
    running.reset(faults=True)
    return running


@contextmanager
def sdk(server: TracesServer, *, key: str = KEY, team: str = TEAM) -> Iterator[TracesClient]:
    """The SDK's own client, pointed at the server, closed after use."""
    client = TracesClient(api_key=key, base_url=server.url, team_id=team)
    try:
        yield client
    finally:
        client.close()


def episodes(n: int, size: int = 10) -> list[dict[str, object]]:
    return [{"id": f"ep-{i}", "traces": [{"id": f"t-{i}", "text": "x" * size}]} for i in range(n)]


@pytest.mark.parametrize(
    ("line_format", "compress"),
    [(LineFormat.EPISODE, True), (LineFormat.EPISODE, False), (LineFormat.TRACE, False)],
    ids=["episode gzip", "episode plain", "trace plain"],
)
def test_the_sdk_uploads_and_reads_the_receipt(
    server: TracesServer, line_format: LineFormat, compress: bool
) -> None:
    records: list[dict[str, object]] = episodes(5)
    if line_format is LineFormat.TRACE:
        records = [{"id": f"t-{i}", "nodes": []} for i in range(5)]
    with sdk(server) as client:
        receipts = client.upload_records(
            records, line_format=line_format, context={"a": "b"}, compress=compress
        )
    assert [r.status for r in receipts] == ["committed"]
    assert server.lines() == [orjson.dumps(r) for r in records]
    (request,) = [r for r in server.requests() if r["path"] == "/api/v1/traces"]
    assert receipts[0].upload_id == request["computed_key"].removeprefix("sha256:")


def test_the_sdk_retries_a_429_and_a_503_with_the_same_bytes(server: TracesServer) -> None:
    server.set_faults(script=[429, 503], retry_after=0)
    with sdk(server) as client:  # the SDK's defaults: trace lines, no context, gzip
        receipts = client.upload_records([{"id": f"t-{i}"} for i in range(3)])
    assert [r.status for r in receipts] == ["committed"]
    traces = [r for r in server.requests() if r["path"] == "/api/v1/traces"]
    assert [r["status"] for r in traces] == [429, 503, 200]
    assert len({r["idempotency_key"] for r in traces}) == 1


def jsonl(*records: object) -> list[bytes]:
    """Lines as the SDK's ``upload_lines`` takes them: each with its newline."""
    return [orjson.dumps(r) + b"\n" for r in records]


@pytest.mark.parametrize(
    ("client", "lines", "error", "code"),
    [
        ({}, [*jsonl({"id": "1"}), b'{"id": 2\n'], ValidationRejectedError, "invalid_trace"),
        ({}, jsonl(*episodes(3, 2000)), ValidationRejectedError, "upload_too_large"),
        ({"key": "sk-wrong"}, jsonl({"id": "1"}), UnauthorizedError, "unauthenticated"),
        ({"team": "team-other"}, jsonl({"id": "1"}), ForbiddenError, "forbidden"),
    ],
    ids=["not JSON", "over the batch limit", "wrong key", "wrong team"],
)
def test_the_sdk_raises_the_error_each_code_maps_to(
    server: TracesServer,
    client: dict[str, str],
    lines: list[bytes],
    error: type[Exception],
    code: str,
) -> None:
    with sdk(server, **client) as sdk_client, pytest.raises(error) as raised:
        sdk_client.upload_lines(lines, line_format=EPISODE, max_attempts=1)
    assert getattr(raised.value, "code", None) == code
    assert server.lines() == []


@pytest.mark.anyio
async def test_prime_monitor_sends_what_the_sdk_sends(server: TracesServer) -> None:
    """The same episodes uploaded by the SDK's own client and by PrimeMonitor: the same
    path, credentials, team, line format and Idempotency-Key (so the same uncompressed
    bytes), the same metadata, the same part headers. Only the framing's boundary, the
    gzip bytes and the client's own headers (User-Agent, ...) may differ."""
    records = episodes(6, 300)
    async with PrimeMonitor(
        api_key=KEY,
        team_id=TEAM,
        traces_url=server.url,
        base_url=server.url,
        run_id="r-1",
        stamp_run=False,
    ) as monitor:
        await monitor.log_episodes(records, step=2, kind="eval", subset="all")
    assert monitor.stats() == DeliveryStats(6, 6, {})
    ours = server.requests()[-1]

    def sdk_upload() -> None:
        with sdk(server) as client:
            client.upload_records(records, line_format=EPISODE, context=ours["metadata"]["context"])

    await anyio.to_thread.run_sync(sdk_upload)
    theirs = server.requests()[-1]
    assert theirs["replay"]  # the same bytes: answered as a replay of ours
    assert ours["path"] == theirs["path"] == "/api/v1/traces"
    for name in ("authorization", "x-prime-team-id", "idempotency-key", "x-prime-line-format"):
        assert ours["headers"][name] == theirs["headers"][name], name
    for request in (ours, theirs):
        assert request["headers"]["content-type"].startswith("multipart/form-data; boundary=")
    assert ours["computed_key"] == theirs["computed_key"] == ours["headers"]["idempotency-key"]
    assert ours["metadata"] == theirs["metadata"]
    parts = {p["name"]: p["headers"] for p in ours["parts"]}
    assert parts == {p["name"]: p["headers"] for p in theirs["parts"]}
