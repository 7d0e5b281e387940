"""PrimeMonitor against a real Prime Traces API server (``TracesServer``) on 127.0.0.1."""

from __future__ import annotations

import itertools
import logging
import math
import os
import ssl
import subprocess
import sys
import threading
import time
import traceback
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from email.utils import formatdate
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import orjson
import pytest
from aiohttp import web
from prime_runs.sinks import stamp_run as sdk_stamp_run
from prime_traces.core.config import Config as SdkConfig
from witness import own_ms, witnesses

import monitors
from monitors import DeliveryStats, LagStats, LoopLagProbe, PrimeMonitor, UploadError
from monitors.prime import TRACES_PATH, _batch, _gzip
from monitors.prime._body import SEND_BYTES, _contains, frame, new_boundary
from monitors.prime._client import is_committed, redact, retry_after_seconds
from monitors.prime._config import MAX_REQUEST_BYTES, PrimeConfig
from monitors.testing import EpisodeMaker, TracesServer

KEY = "sk-nodewise-test-6f1c2b9e4d7a"
TEAM = "team-42"
RUN = "run-abc"
BIG = "y" * (1 << 20)  # shared by the big episodes, so they cost ~nothing to build


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def running() -> Iterator[TracesServer]:
    with TracesServer(api_key=KEY, team_id=TEAM, keep_lines=True) as server:
        yield server


@pytest.fixture
def server(running: TracesServer) -> TracesServer:
    running.reset(faults=True)
    return running


PRIME_ENV = (
    "PRIME_API_KEY",
    "PRIME_TRACES_URL",
    "PRIME_TEAM_ID",
    "PRIME_API_BASE_URL",
    "PRIME_BASE_URL",
    "RUN_ID",
)


@pytest.fixture(autouse=True)
def no_prime_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No Prime setting from the environment, and a home of the test's own (where ``prime
    login`` would write ``.prime/config.json``); the home."""
    for name in PRIME_ENV:
        monkeypatch.delenv(name, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    return home


def stamped(episode: Any, kind: str = "train") -> bytes:
    """The line the monitor must upload for ``episode``: keyed to the run by the SDK's own
    ``stamp_run`` (prime-runs)."""
    return orjson.dumps(sdk_stamp_run(episode, RUN, kind))


def small(i: int, size: int = 3000) -> dict[str, Any]:
    """An episode as the service takes one: an object with a ``traces`` list."""
    return {"id": i, "text": f"episode {i} " + "x" * size, "reward": i / 7, "traces": []}


def big(i: int, megabytes: int) -> dict[str, Any]:
    return {"id": i, "parts": [BIG] * megabytes, "reward": 1.0, "traces": []}


def make(server: TracesServer, **kwargs: Any) -> PrimeMonitor:
    options: dict[str, Any] = {
        "api_key": KEY,
        "traces_url": server.url,
        "base_url": server.url,
        "team_id": TEAM,
        "run_id": RUN,
        "retry_base": 0.01,
        "retry_for": 1.0,
        **kwargs,
    }
    return PrimeMonitor(**options)


def balanced(stats: DeliveryStats) -> None:
    assert stats.pending == 0, stats
    assert stats.delivered + sum(stats.lost.values()) == stats.submitted, stats


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float = 10.0) -> None:
    with anyio.fail_after(timeout):
        while not await check():
            await anyio.sleep(0.02)


# -- delivery ---------------------------------------------------------------------------


@pytest.mark.anyio
async def test_300_episodes_delivered_once_without_stalling_the_loop(
    server: TracesServer,
) -> None:
    episodes: list[dict[str, Any]] = [
        big(i, 1 + i % 5) if i % 30 == 0 else small(i) for i in range(300)
    ]
    ends: list[float] = []
    spent_ms: list[float] = []

    async def timed(call: Awaitable[None]) -> None:
        began = time.perf_counter()
        await call
        ends.append(time.perf_counter())
        spent_ms.append((ends[-1] - began) * 1e3)

    with witnesses() as seen:
        async with LoopLagProbe() as probe, make(server, batch_bytes=4 << 20) as monitor:
            for start in range(0, 300, 10):
                await timed(monitor.log_episodes(episodes[start : start + 10], step=start // 10))
                metrics = {"loss": 1.0 / (1 + start), "nan": math.nan}
                await timed(monitor.log_metrics(metrics, step=start))
                await anyio.sleep(0.01)
    stats = monitor.stats()
    assert stats == DeliveryStats(300, 300, {}), stats
    served = await server.astats()
    assert served["unique_ids"] == 300
    assert served["duplicate_ids"] == 0
    assert served["lines_stored"] == 300
    assert served["uploads"] > 1  # batches closed at batch_bytes
    # Judged net of the machine's stalls (witness.py).
    slowest = max(own_ms(ends, spent_ms, seen.stalls))
    lag = LagStats.of(own_ms(probe.times, probe.samples, seen.stalls))
    print(f"slowest log call {max(spent_ms):.2f} ms; {probe.stats()}; net {slowest:.2f}, {lag}")
    assert slowest < 50, (slowest, max(spent_ms))
    assert lag.p99 < 50, (lag, probe.stats())
    assert lag.max < 250, (lag, probe.stats())
    # metrics: one post per call, the NaN dropped, never counted with the episodes
    assert monitor.metrics_stats() == DeliveryStats(30, 30, {})
    posted = await server.ametrics()
    assert len(posted) == 30
    assert posted[0] == {"run_id": RUN, "step": 0, "metrics": {"loss": 1.0}}


@pytest.mark.anyio
async def test_request_headers_and_body(server: TracesServer) -> None:
    episodes = [small(i, 100) for i in range(20)]
    async with make(server) as monitor:
        await monitor.log_episodes(episodes, step=3, kind="eval", subset="all")
    assert monitor.stats() == DeliveryStats(20, 20, {})
    (request,) = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    assert request["status"] == 200
    headers = request["headers"]
    assert headers["authorization"] == "Bearer <redacted>"
    assert headers["x-prime-team-id"] == TEAM
    assert headers["x-prime-line-format"] == "episode"
    assert headers["content-type"].startswith("multipart/form-data; boundary=")
    assert headers["idempotency-key"] == request["computed_key"]
    assert request["idempotency_key"].startswith("sha256:")
    metadata, traces = request["parts"]
    assert metadata["name"] == "metadata"
    assert metadata["headers"]["content-type"] == "application/json"
    assert traces["name"] == "traces"
    assert traces["headers"]["content-disposition"] == (
        'form-data; name="traces"; filename="traces.jsonl"'
    )
    assert traces["headers"]["content-type"] == "application/x-ndjson"
    assert traces["headers"]["content-encoding"] == "gzip"
    # streamed in pieces, with its length up front (not chunked)
    assert headers["content-length"] == str(request["body_bytes"])
    assert "transfer-encoding" not in headers
    assert request["compressed_bytes"] < request["uncompressed_bytes"]  # really gzipped
    assert request["lines"] == 20
    assert request["metadata"] == {
        "schema_version": 1,
        "context": {
            "source": "nodewise",
            "run_type": "eval",
            "run_id": RUN,
            "step": "3",
            "first_step": "3",
            "subset": "all",
        },
    }
    assert await server.alines() == [stamped(e, "eval") for e in episodes]


@pytest.mark.anyio
@pytest.mark.parametrize("size", [100, 3 << 20], ids=["many-lines", "one-line"])
async def test_a_batch_repeating_earlier_lines_gets_a_key_of_its_own(
    server: TracesServer, size: int
) -> None:
    # As an orchestrator logs: every episode under "all", then the same ones as "effective"
    # (and, to be sure, once more): batches of the same lines, whose sha256 is the same.
    episodes = [small(i, size) for i in range(6)]
    async with make(server, batch_bytes=4 << 20) as monitor:
        for calls, subset in enumerate(("all", "effective", "effective"), 1):
            await monitor.log_episodes(episodes, step=1, subset=subset)
            await wait_until(partial(_lines_at_least, server, 6 * calls))  # its own batches
    assert monitor.stats() == DeliveryStats(18, 18, {})
    served = await server.astats()
    assert served["replays"] == 0, served
    assert served["lines_stored"] == 18, served
    requests = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    keys = [r["idempotency_key"] for r in requests]
    assert len(set(keys)) == len(keys) == 3 * (1 if size == 100 else 6)
    assert all(r["idempotency_key"] == r["computed_key"] for r in requests)
    subsets = [r["metadata"]["context"]["subset"] for r in requests]
    assert subsets.count("all") * 2 == subsets.count("effective")
    # Every stored line is still exactly the record's JSON, spaces after it at most.
    lines = await server.alines()
    assert sorted(orjson.loads(line)["id"] for line in lines) == sorted(list(range(6)) * 3)
    assert {line.rstrip(b" ") for line in lines} == {stamped(e) for e in episodes}
    assert sorted(len(line) - len(line.rstrip(b" ")) for line in lines) == sorted(
        [0] * 16 + [1, 2] if size == 100 else [0] * 6 + [1] * 6 + [2] * 6
    )


@pytest.mark.anyio
async def test_a_repeat_of_a_full_batch_stays_within_the_limit() -> None:
    # Two lines that fill a batch to the byte: their repeat needs a space more, and a server
    # that holds batches to the limit would refuse it (413) unless the batch left room.
    limit = 20_000
    episodes = [{"id": i, "text": "x" * (limit // 2 - 31), "traces": []} for i in range(2)]
    assert sum(len(orjson.dumps(e)) + 1 for e in episodes) == limit
    with TracesServer(api_key=KEY, max_batch_bytes=limit) as server:
        async with make(server, batch_bytes=limit, stamp_run=False) as monitor:
            for calls, subset in enumerate(("all", "effective"), 1):
                await monitor.log_episodes(episodes, step=1, subset=subset)
                await wait_until(partial(_lines_at_least, server, 2 * calls))
        assert monitor.stats() == DeliveryStats(4, 4, {})
        served = await server.astats()
    assert (served["lines_stored"], served["replays"]) == (4, 0), served


def test_keys_are_never_reused_and_forget_the_oldest() -> None:
    import hashlib

    keys = _batch.Keys(remember=2)
    lines = hashlib.sha256(b'{"id":1}')

    def claim() -> tuple[str, bytes]:
        key, ending = keys.claim(lines)
        assert key == "sha256:" + hashlib.sha256(b'{"id":1}' + ending).hexdigest()
        return key, ending

    assert [claim()[1] for _ in range(3)] == [b"\n", b" \n", b"  \n"]
    # Only the last two are remembered: the first ending is free again.
    assert claim()[1] == b"\n"


@pytest.mark.anyio
async def test_settings_from_the_environment(
    server: TracesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PRIME_API_KEY", KEY)
    monkeypatch.setenv("PRIME_TRACES_URL", server.url + "/api/v1/")
    monkeypatch.setenv("PRIME_API_BASE_URL", server.url)
    monkeypatch.setenv("PRIME_TEAM_ID", TEAM)
    monkeypatch.setenv("RUN_ID", "run-from-env")
    async with PrimeMonitor(retry_base=0.01) as monitor:
        await monitor.log_episodes([small(1), small(2)], step=1)
        await monitor.log_metrics({"a": 1}, step=1)
    assert monitor.stats() == DeliveryStats(2, 2, {})
    assert (await server.ametrics())[0]["run_id"] == "run-from-env"


@pytest.mark.anyio
async def test_to_record_is_called_when_batched_and_bad_records_are_counted(
    server: TracesServer,
) -> None:
    class Lazy:
        built = 0

        def __init__(self, i: int) -> None:
            self.i = i

        def to_record(self) -> dict[str, Any]:
            Lazy.built += 1
            if self.i == 3:
                raise ValueError("no record for you")
            return small(self.i, 10)

    async with make(server) as monitor:
        await monitor.log_episodes([Lazy(i) for i in range(5)], step=0)
        assert Lazy.built == 0  # not built by the call
        await monitor.log_episodes([{"id": 9, "bad": {1, 2}}], step=1)  # a set: not JSON
    assert monitor.stats() == DeliveryStats(6, 4, {"bad_record": 1, "encode_error": 1})


# -- faults -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_429_honours_retry_after(server: TracesServer) -> None:
    await server.aset_faults(script=[429], retry_after=1)
    async with make(server, retry_base=5.0, retry_for=10.0) as monitor:  # backoff: 2.5 s+
        await monitor.log_episodes([small(i) for i in range(10)], step=0)
    assert monitor.stats() == DeliveryStats(10, 10, {})
    first, second = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    assert first["status"] == 429
    assert second["status"] == 200
    assert first["idempotency_key"] == second["idempotency_key"]
    assert 0.9 <= second["time"] - first["time"] < 2.4


@pytest.mark.anyio
async def test_503s_are_retried_for_retry_for_then_given_up(server: TracesServer) -> None:
    await server.aset_faults(script=[503] * 1000)
    started = time.monotonic()
    async with make(server, retry_for=0.5) as monitor:
        await monitor.log_episodes([small(i) for i in range(10)], step=0)
    assert monitor.stats() == DeliveryStats(10, 0, {"failed": 10})
    requests = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    assert len(requests) >= 3
    assert {r["status"] for r in requests} == {503}
    assert len({r["idempotency_key"] for r in requests}) == 1
    assert time.monotonic() - started < 10  # given up after about half a second


@pytest.mark.anyio
async def test_an_outage_shorter_than_retry_for_loses_nothing(server: TracesServer) -> None:
    """A server down for a few seconds (connections refused), then back: every batch sent
    during the outage is retried until it is delivered."""
    async with make(server, retry_base=0.1, retry_for=30.0, max_in_flight=4) as monitor:
        await monitor.log_episodes([small(i) for i in range(10)], step=0)
        await wait_until(lambda: _delivered(monitor, 10))
        await anyio.to_thread.run_sync(server.stop)  # the port stays: connections refused
        for step in range(1, 4):
            await monitor.log_episodes([small(step * 10 + i) for i in range(10)], step=step)
            await anyio.sleep(0.5)
        await anyio.sleep(1.5)
        await anyio.to_thread.run_sync(server.start)
    assert monitor.stats() == DeliveryStats(40, 40, {})
    # the restarted server process counts from zero: the 30 sent during the outage, once
    assert (await server.astats())["unique_ids"] == 30


async def _delivered(monitor: PrimeMonitor, n: int) -> bool:
    return monitor.stats().delivered >= n


async def _requests_at_least(server: TracesServer, n: int) -> bool:
    return int((await server.astats())["requests_total"]) >= n


async def _lines_at_least(server: TracesServer, n: int) -> bool:
    return int((await server.astats())["lines_received"]) >= n


@pytest.mark.anyio
async def test_random_503s_balance(server: TracesServer) -> None:
    await server.aset_faults(fail_rate_503=0.4, seed=7)
    async with make(server, batch_bytes=20_000) as monitor:
        for step in range(10):
            await monitor.log_episodes([small(step * 10 + i) for i in range(10)], step=step)
    stats = monitor.stats()
    balanced(stats)
    assert set(stats.lost) <= {"failed"}
    served = await server.astats()
    assert served["unique_ids"] == stats.delivered
    assert served["duplicate_ids"] == 0


@pytest.mark.anyio
async def test_dropped_connections_are_retried_with_the_same_bytes(server: TracesServer) -> None:
    await server.aset_faults(script=["drop", "drop"])
    async with make(server) as monitor:
        await monitor.log_episodes([small(i, 50_000) for i in range(20)], step=0)
    assert monitor.stats() == DeliveryStats(20, 20, {})
    served = await server.astats()
    assert served["dropped"] == 2
    assert served["unique_ids"] == 20
    assert served["duplicate_ids"] == 0
    keys = {r["idempotency_key"] for r in await server.arequests()}
    assert len(keys) == 1


@pytest.mark.anyio
async def test_server_down_at_start_then_up(server: TracesServer) -> None:
    await server.aset_faults(down=True)
    async with make(server, retry_base=0.2) as monitor:
        await monitor.log_episodes([small(i) for i in range(50)], step=0)
        await wait_until(lambda: _requests_at_least(server, 1))
        await anyio.sleep(0.3)
        await server.aset_faults(down=False)
    assert monitor.stats() == DeliveryStats(50, 50, {})
    served = await server.astats()
    assert served["refused"] >= 1
    assert served["unique_ids"] == 50


@pytest.mark.anyio
async def test_wrong_key_stops_uploads_with_one_error(
    server: TracesServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "sk-wrong-key-0000-9999"
    with caplog.at_level(logging.DEBUG):
        async with make(server, api_key=wrong) as monitor:
            await monitor.log_episodes([small(i) for i in range(20)], step=0)
            await wait_until(lambda: _requests_at_least(server, 1))
            await anyio.sleep(0.2)
            await monitor.log_episodes([small(i) for i in range(20, 50)], step=1)
            await monitor.log_metrics({"loss": 1.0}, step=1)
    assert monitor.stats() == DeliveryStats(50, 0, {"unauthorized": 50})
    balanced(monitor.metrics_stats())
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1, caplog.text
    assert "401" in errors[0].getMessage()
    assert wrong not in caplog.text
    assert wrong not in repr(monitor)
    served = await server.astats()
    assert served["requests"] == {"401": 1}


@pytest.mark.anyio
async def test_a_line_over_64_mib_is_refused_locally(server: TracesServer) -> None:
    huge = "z" * (36 << 20)
    async with make(server) as monitor:
        await monitor.log_episodes([small(1), {"id": 2, "a": huge, "b": huge}, small(3)], step=0)
    del huge
    assert monitor.stats() == DeliveryStats(3, 2, {"too_large": 1})
    assert (await server.astats())["unique_ids"] == 2


@pytest.mark.anyio
async def test_a_full_queue_drops_the_newest_and_warns_once(
    server: TracesServer, caplog: pytest.LogCaptureFixture
) -> None:
    await server.aset_faults(latency=0.3)
    with caplog.at_level(logging.WARNING, logger="monitors.prime"):
        async with make(server, queue_records=5, max_in_flight=1) as monitor:
            for step in range(4):
                await monitor.log_episodes([small(step * 50 + i) for i in range(50)], step=step)
    stats = monitor.stats()
    balanced(stats)
    assert set(stats.lost) == {"queue_full"}
    assert stats.lost["queue_full"] >= 150
    assert (await server.astats())["unique_ids"] == stats.delivered
    full = [r for r in caplog.records if "queue is full" in r.getMessage()]
    assert len(full) == 1, caplog.text


@pytest.mark.anyio
async def test_drain_timeout_counts_what_was_left(server: TracesServer) -> None:
    """What was sent and never answered may be stored (``unconfirmed``); what never left,
    waiting for an upload slot, is not (``drain_timeout``)."""
    await server.aset_faults(latency=5.0)
    async with make(server, drain_timeout=0.5, max_in_flight=1) as monitor:
        await monitor.log_episodes([small(i) for i in range(6)], step=0)
        await wait_until(lambda: uploading(server))  # sent, as a batch of its own
        await monitor.log_episodes([small(i) for i in range(6, 10)], step=1)
        began = time.monotonic()
    assert time.monotonic() - began < 2.5
    assert monitor.stats() == DeliveryStats(10, 0, {"unconfirmed": 6, "drain_timeout": 4})


@pytest.mark.anyio
async def test_cancelled_finalize_still_accounts_for_everything(server: TracesServer) -> None:
    await server.aset_faults(latency=5.0)
    monitor = make(server)

    async def run() -> None:
        async with monitor:
            await monitor.log_episodes([small(i) for i in range(10)], step=0)
            await monitor.log_metrics({"x": 1}, step=0)

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.sleep(0.5)
        group.cancel_scope.cancel()
    await monitor.finalize()  # again: nothing to do
    assert monitor.stats() == DeliveryStats(10, 0, {"unconfirmed": 10})  # all sent at once
    balanced(monitor.metrics_stats())
    with pytest.raises(RuntimeError, match="finalized"):
        await monitor.log_episodes([small(1)], step=1)


# -- configuration and secrecy --------------------------------------------------------


@pytest.mark.anyio
async def test_missing_key_is_an_upload_error_at_start(server: TracesServer) -> None:
    monitor = PrimeMonitor(traces_url=server.url)
    with pytest.raises(UploadError, match="PRIME_API_KEY"):
        await monitor.start()
    await monitor.log_episodes([small(1)], step=0)  # counted, not raised
    await monitor.finalize()
    assert monitor.stats() == DeliveryStats(1, 0, {"start_failed": 1})
    with pytest.raises(RuntimeError, match="not started"):
        await PrimeMonitor(traces_url=server.url).log_episodes([small(1)], step=0)


@pytest.mark.anyio
async def test_the_key_never_shows(server: TracesServer, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        monitor = make(server)
        assert KEY not in repr(monitor)
        async with monitor:
            assert KEY not in repr(monitor)
            assert KEY not in repr(monitor.config)
            await server.aset_faults(script=[503, "drop", 400])
            await monitor.log_episodes([small(i) for i in range(5)], step=0)
        assert KEY not in repr(monitor)
    assert monitor.stats() == DeliveryStats(5, 0, {"rejected": 5})
    assert "400" in caplog.text
    assert KEY not in caplog.text


def test_monitor_is_exported() -> None:
    assert monitors.PrimeMonitor is PrimeMonitor
    assert "PrimeMonitor" in monitors.__all__


def test_retry_after_parsing() -> None:
    assert retry_after_seconds(None, cap=60) is None
    assert retry_after_seconds("3", cap=60) == 3.0
    assert retry_after_seconds("120", cap=60) == 60.0
    assert retry_after_seconds("soon", cap=60) is None
    later = retry_after_seconds(formatdate(time.time() + 10, usegmt=True), cap=60)
    assert later is not None
    assert 8 <= later <= 10.5
    assert retry_after_seconds(formatdate(time.time() - 10, usegmt=True), cap=60) == 0.0


def test_bad_settings_are_refused() -> None:
    with pytest.raises(ValueError, match="metrics_queue"):
        PrimeMonitor(api_key=KEY, metrics_queue=0)


@pytest.mark.anyio
async def test_wrong_team_is_unauthorized_too(server: TracesServer) -> None:
    async with make(server, team_id="not-my-team") as monitor:
        await monitor.log_episodes([small(i) for i in range(5)], step=0)
    assert monitor.stats() == DeliveryStats(5, 0, {"unauthorized": 5})
    assert (await server.astats())["requests"] == {"403": 1}


# -- gzip: python-isal, and zlib's stored blocks at level 0 ---------------------------------


def test_compressor_levels_give_gzip_that_zlib_reads() -> None:
    data = b"".join(
        orjson.dumps(small(i, 500), option=orjson.OPT_APPEND_NEWLINE) for i in range(300)
    )
    sizes = {}
    for level in range(10):
        gz = _gzip.compressor(level)
        out = gz.compress(data[:70_000]) + gz.compress(data[70_000:]) + gz.flush()
        assert out[:2] == b"\x1f\x8b"  # a gzip member
        assert zlib.decompress(out, wbits=31) == data
        sizes[level] = len(out)
    assert sizes[0] > len(data)  # level 0 stores
    assert sizes[1] < len(data) / 2
    with pytest.raises(ValueError, match="gzip_level"):
        _gzip.compressor(10)


def test_isal_levels_follow_the_zlib_ratio() -> None:
    assert [_gzip.isal_level(level) for level in range(1, 10)] == [1, 2, 3, 3, 3, 3, 3, 3, 3]
    with pytest.raises(ValueError, match="gzip_level"):
        _gzip.isal_level(0)


# -- the multipart boundary -----------------------------------------------------------------


def test_boundary_search_sees_pieces_and_seams() -> None:
    b = b"nodewise-0123456789"
    assert _contains(b, [b"xx" + b + b"yy"])
    assert _contains(b, [b"xxnodewise-01", b"23456789yy"])  # across a seam
    assert _contains(b, [b"x" * 50 + b"nodewise", b"-", b"0123", b"456789"])  # across three
    assert not _contains(b, [b"nodewise-01234", b"5678", b"nodewise-0123456788"])
    body = frame(b"{}", [b"--" + b + b"--"], boundary=b)
    assert b.decode() not in body.content_type
    assert body.size == len(bytes(body))
    boundary = body.content_type.split("boundary=", 1)[1].encode()
    assert bytes(body).count(boundary) == 3  # metadata, traces, closing


@pytest.mark.anyio
async def test_a_body_streams_in_slices_giving_the_loop_a_turn_before_each() -> None:
    big = bytes(range(256)) * (SEND_BYTES // 128 + 3)  # two slices and a bit
    body = frame(b"{}", [big, b"", b"tail"], boundary=new_boundary())
    turns = 0
    slices: list[int] = []

    async def count_turns() -> None:
        nonlocal turns
        while True:
            await anyio.lowlevel.checkpoint()
            turns += 1

    async with anyio.create_task_group() as tg:
        tg.start_soon(count_turns)
        await anyio.lowlevel.checkpoint()  # let it start
        joined = bytearray()
        for _attempt in range(2):  # a retry streams the same bytes again
            joined.clear()
            async for piece in body.stream():
                assert 0 < len(piece) <= SEND_BYTES
                slices.append(turns)
                joined += piece
            assert bytes(joined) == bytes(body)
        tg.cancel_scope.cancel()
    expected = sum(-(-len(p) // SEND_BYTES) for p in body.pieces)  # empty pieces: none
    assert expected >= 5
    assert len(slices) == 2 * expected
    assert all(b > a for a, b in itertools.pairwise(slices))  # a turn before each


@pytest.mark.anyio
async def test_a_boundary_found_in_the_data_is_redrawn(
    server: TracesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    clash = b"nodewise-clash-4b1d"
    monkeypatch.setattr(_batch, "new_boundary", lambda: clash)
    episodes = [
        {"id": i, "text": f"before {clash.decode()} after " * 50, "traces": []} for i in range(5)
    ]
    async with make(server, gzip_level=0) as monitor:  # stored: the text shows in the body
        await monitor.log_episodes(episodes, step=0)
    assert monitor.stats() == DeliveryStats(5, 5, {})
    (request,) = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    assert clash.decode() not in request["headers"]["content-type"]
    assert await server.alines() == [stamped(e) for e in episodes]


# -- the answer to an upload: committed or not ------------------------------------------------


class FakeApi:
    """A Traces API on 127.0.0.1 that answers each traces upload from ``answers`` (status,
    body; the last one repeats) and keeps what it was sent."""

    def __init__(
        self, answers: list[tuple[int, bytes]], headers: dict[str, str] | None = None
    ) -> None:
        self.answers = answers
        self.headers = headers or {}  # on every answer
        self.requests: list[tuple[dict[str, str], bytes]] = []
        self.url = ""

    async def traces(self, request: web.Request) -> web.Response:
        body = await request.read()
        self.requests.append(({k.lower(): v for k, v in request.headers.items()}, body))
        status, text = self.answers[min(len(self.requests), len(self.answers)) - 1]
        return web.Response(
            status=status, body=text, content_type="application/json", headers=self.headers
        )


StartApi = Callable[..., Awaitable[FakeApi]]


@pytest.fixture
async def fake_api() -> AsyncIterator[StartApi]:
    runners: list[web.AppRunner] = []

    async def start(
        answers: list[tuple[int, bytes]],
        *,
        headers: dict[str, str] | None = None,
        tls: ssl.SSLContext | None = None,
    ) -> FakeApi:
        api = FakeApi(answers, headers)
        app = web.Application(client_max_size=1 << 30)
        app.router.add_post(TRACES_PATH, api.traces)
        runner = web.AppRunner(app)
        await runner.setup()
        runners.append(runner)
        await web.TCPSite(runner, "127.0.0.1", 0, ssl_context=tls).start()
        scheme = "https" if tls else "http"
        api.url = f"{scheme}://127.0.0.1:{runner.addresses[0][1]}"
        return api

    try:
        yield start
    finally:
        for runner in runners:
            await runner.cleanup()


COMMITTED = (200, b'{"upload_id": "u-1", "status": "committed"}')


def test_committed_answers() -> None:
    assert is_committed(COMMITTED[1])
    assert is_committed(b'{"status": "committed", "lines": 3}')
    assert not is_committed(b'{"status": "pending"}')
    assert not is_committed(b'{"upload_id": "u-1"}')
    assert not is_committed(b"[]")
    assert not is_committed(b"")
    assert not is_committed(b"<html>ok</html>")


@pytest.mark.anyio
async def test_a_2xx_that_is_not_committed_is_retried_with_the_same_bytes(
    fake_api: StartApi, caplog: pytest.LogCaptureFixture
) -> None:
    api = await fake_api(
        [(200, b'{"upload_id": "u-1", "status": "pending"}'), (202, b"ok"), COMMITTED]
    )
    with caplog.at_level(logging.WARNING, logger="monitors.prime"):
        async with PrimeMonitor(
            api_key=KEY, traces_url=api.url, base_url=api.url, run_id=RUN, retry_base=0.01
        ) as monitor:
            await monitor.log_episodes([small(i) for i in range(10)], step=0)
    assert monitor.stats() == DeliveryStats(10, 10, {})
    assert len(api.requests) == 3
    (first_headers, first_body), *rest = api.requests
    for headers, body in rest:  # a retry: the same key and bytes
        assert headers["idempotency-key"] == first_headers["idempotency-key"]
        assert body == first_body
    for headers, body in api.requests:  # streamed with its length, not chunked
        assert headers["content-length"] == str(len(body))
        assert "transfer-encoding" not in headers
    assert caplog.text.count('without "status": "committed"') == 2


@pytest.mark.anyio
async def test_a_2xx_never_committed_counts_as_failed(fake_api: StartApi) -> None:
    api = await fake_api([(201, b'{"upload_id": "u-1", "status": "queued"}')])
    async with PrimeMonitor(
        api_key=KEY,
        traces_url=api.url,
        base_url=api.url,
        run_id=RUN,
        retry_base=0.01,
        retry_for=0.3,
    ) as monitor:
        await monitor.log_episodes([small(i) for i in range(10)], step=0)
    assert monitor.stats() == DeliveryStats(10, 0, {"failed": 10})
    assert len(api.requests) >= 3  # every attempt in retry_for
    assert len({headers["idempotency-key"] for headers, _ in api.requests}) == 1


# -- the worker thread ------------------------------------------------------------------------


def _gzip_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("PrimeMonitor gzip")]


@pytest.mark.anyio
async def test_the_worker_thread_ends_with_finalize(server: TracesServer) -> None:
    before = len(_gzip_threads())
    async with make(server) as monitor:
        await monitor.log_episodes([big(0, 2), small(1)], step=0)
        await wait_until(lambda: _requests_at_least(server, 1))
        assert len(_gzip_threads()) == before + 1
    assert monitor.stats() == DeliveryStats(2, 2, {})
    assert len(_gzip_threads()) == before


@pytest.mark.anyio
async def test_the_worker_gives_up_its_core_after_each_piece(
    server: TracesServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A long line is many pieces queued at once: the worker yields its core after each, in
    its own thread, never on the loop's."""
    yields: list[str] = []
    monkeypatch.setattr(
        _batch, "_SCHED_YIELD", lambda: yields.append(threading.current_thread().name)
    )
    episodes = [big(0, 5), big(1, 3)]  # ~8 MB of JSON: at least 7 pieces of 1 MiB
    async with make(server) as monitor:
        await monitor.log_episodes(episodes, step=0)
    assert monitor.stats() == DeliveryStats(2, 2, {})
    total = sum(len(orjson.dumps(e)) for e in episodes)
    assert len(yields) >= total // _batch.PIECE_BYTES
    assert {name.split("_")[0] for name in yields} == {"PrimeMonitor gzip"}


@pytest.mark.anyio
async def test_a_rejection_echoing_a_credential_logs_no_part_of_it(
    fake_api: StartApi, caplog: pytest.LogCaptureFixture
) -> None:
    """A server's answer is cut to 300 characters for the log: the key (and any other
    bearer token or Authorization value) is redacted before the cut, so no prefix of it
    is left where the cut falls inside it."""
    other = "tok-OTHER-CREDENTIAL-77"
    for pad in range(270, 300, 3):  # the cut falls in each part of the key
        echo = b"x" * pad + f"Authorization: Bearer {KEY}; again {KEY}".encode()
        api = await fake_api([(400, echo + f" bearer {other}".encode())])
        with caplog.at_level(logging.WARNING, logger="monitors.prime"):
            async with PrimeMonitor(
                api_key=KEY, traces_url=api.url, base_url=api.url, run_id=RUN
            ) as monitor:
                await monitor.log_episodes([small(1)], step=0)
        assert monitor.stats().lost == {"rejected": 1}
    assert "x" * 270 in caplog.text  # the answers were logged
    for secret in (KEY, other):
        leaked = [secret[:n] for n in range(4, len(secret) + 1) if secret[:n] in caplog.text]
        assert not leaked, leaked


def test_redact_every_credential_whatever_the_key() -> None:
    text = 'a {"Authorization": "Token abc-123"} b Bearer xyz.789 c k-KEY d'
    assert redact(text, "k-KEY") == 'a {"Authorization": "***"} b Bearer *** c *** d'


# -- the run, the context and the limits, as the service takes them ---------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("kind", ["train", "eval"])
async def test_uploads_are_keyed_to_the_run_as_prime_runs_keys_them(
    server: TracesServer, kind: str
) -> None:
    """Real episodes (verifiers' schema) go up with ``run.id``/``run.type`` on the episode
    and on every member trace, byte for byte as prime-runs' ``stamp_run`` writes them; the
    episodes themselves are left as they were; the context holds only strings."""
    maker = EpisodeMaker(seed=3)
    records = [maker.episode(size, index=i).to_record() for i, size in enumerate([20_000] * 4)]
    records.append({"id": "no-run", "traces": [{"id": "t", "run": {"name": "kept"}}, 7]})
    before = [orjson.dumps(r) for r in records]
    async with make(server) as monitor:
        await monitor.log_episodes(records, step=5, kind=kind)  # type: ignore[arg-type]
    assert monitor.stats() == DeliveryStats(5, 5, {})
    lines = await server.alines()
    assert lines == [stamped(r, kind) for r in records]
    assert [orjson.dumps(r) for r in records] == before
    for line in lines:
        episode = orjson.loads(line)
        assert episode["run"]["id"] == RUN
        assert episode["run"]["type"] == kind
        members = [t for t in episode["traces"] if isinstance(t, dict)]
        assert members
        assert all(t["run"]["id"] == RUN for t in members)
        assert all(t["run"]["type"] == kind for t in members)
    assert orjson.loads(lines[-1])["traces"][0]["run"] == {"name": "kept", "id": RUN, "type": kind}
    (request,) = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    context = request["metadata"]["context"]
    assert all(isinstance(value, str) for value in context.values()), context
    assert context["source"] == "nodewise"
    assert context["run_type"] == kind


@pytest.mark.anyio
async def test_stamp_run_false_uploads_the_records_as_they_are(server: TracesServer) -> None:
    episodes = [small(i, 100) for i in range(3)]
    async with make(server, stamp_run=False) as monitor:
        await monitor.log_episodes(episodes, step=0)
    assert await server.alines() == [orjson.dumps(e) for e in episodes]


@pytest.mark.anyio
async def test_the_line_cap_leaves_out_the_newline(server: TracesServer) -> None:
    """The SDK counts a line's bytes without its newline: a line of exactly the cap goes."""
    at_cap = {"id": 1, "text": "x" * 1000, "traces": []}
    cap = len(orjson.dumps(at_cap))
    over = {"id": 2, "text": "x" * 1001, "traces": []}
    monitor = make(server, stamp_run=False)
    monitor._args["line_bytes"] = cap
    async with monitor:
        await monitor.log_episodes([at_cap, over], step=0)
    assert monitor.stats() == DeliveryStats(2, 1, {"too_large": 1})
    assert await server.alines() == [orjson.dumps(at_cap)]


@pytest.mark.anyio
async def test_a_line_whose_request_is_over_32_mib_is_refused_before_it_is_sent(
    server: TracesServer,
) -> None:
    """The deployed service sits behind a 32 MiB request cap. A line under the 64 MiB line
    cap whose request would still be over it (stored uncompressed here) is counted
    ``too_large`` and never sent; compressed below the cap, the same size goes."""
    noise = os.urandom(17 << 20).hex()  # 34 MiB that gzip cannot shrink much
    async with make(server, gzip_level=0) as monitor:
        await monitor.log_episodes(
            [small(1), {"id": 2, "noise": noise, "traces": []}, small(3)], step=0
        )
    assert monitor.stats() == DeliveryStats(3, 2, {"too_large": 1})
    sent = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    assert all(r["body_bytes"] <= MAX_REQUEST_BYTES for r in sent)
    assert sorted(orjson.loads(line)["id"] for line in await server.alines()) == [1, 3]
    async with make(server, gzip_level=1) as monitor:
        await monitor.log_episodes([{"id": 4, "text": "z" * (34 << 20), "traces": []}], step=0)
    assert monitor.stats() == DeliveryStats(1, 1, {})


@pytest.mark.anyio
async def test_batch_bytes_past_the_request_cap_is_refused(server: TracesServer) -> None:
    with pytest.raises(ValueError, match="batch_bytes"):
        await make(server, batch_bytes=MAX_REQUEST_BYTES).start()


# -- settings as the SDKs resolve them ---------------------------------------------------------


def resolved(**kwargs: Any) -> PrimeConfig:
    """The settings a monitor made with ``kwargs`` starts with."""
    monitor = PrimeMonitor(**kwargs)
    key = None if monitor._api_key is None else monitor._api_key.reveal()
    return PrimeConfig.resolve(api_key=key, **monitor._args)


def prime_login(home: Path, settings: Any) -> None:
    """What ``prime login`` leaves: ``~/.prime/config.json``."""
    (home / ".prime").mkdir(exist_ok=True)
    (home / ".prime" / "config.json").write_bytes(orjson.dumps(settings))


LOGIN = {
    "api_key": "sk-from-login",
    "team_id": "team-login",
    "traces_url": "http://traces.login:8083/api/v1/",
    "base_url": "http://platform.login",
}
ENV = {
    "PRIME_API_KEY": "sk-from-env",
    "PRIME_TEAM_ID": "team-env",
    "PRIME_TRACES_URL": "http://traces.env",
    "PRIME_API_BASE_URL": "http://platform.env/api/v1",
}


@pytest.mark.parametrize(
    ("login", "env"),
    [
        (LOGIN, {}),
        (LOGIN, ENV),
        ({"api_key": "sk-from-login", "base_url": "http://staging.example"}, {}),
        ({"api_key": "sk-from-login"}, {"PRIME_BASE_URL": "http://staging.example"}),
        ({}, {"PRIME_API_KEY": "sk-from-env", "PRIME_API_BASE_URL": "http://staging.example"}),
        (["not", "an", "object"], {"PRIME_API_KEY": "sk-from-env"}),
        ({"api_key": "sk-from-login", "team_id": "team-login"}, {"PRIME_TRACES_URL": "http://t"}),
    ],
    ids=[
        "login",
        "env over login",
        "base in login",
        "PRIME_BASE_URL",
        "base in env",
        "bad file",
        "mixed",
    ],
)
def test_settings_resolve_as_the_sdk_resolves_them(
    no_prime_env: Path, monkeypatch: pytest.MonkeyPatch, login: Any, env: dict[str, str]
) -> None:
    """Environment, then ``~/.prime/config.json``, then the SDK's default; the traces URL
    never the platform's base URL: what prime-traces' own ``Config`` says, read in the same
    home and environment."""
    prime_login(no_prime_env, login)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    ours, sdk = resolved(), SdkConfig()
    assert ours.api_key.reveal() == sdk.api_key
    assert ours.team_id == sdk.team_id
    assert ours.traces_url == sdk.traces_url
    assert ours.base_url == sdk.base_url


def test_arguments_win_over_the_environment_and_prime_login(
    no_prime_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prime_login(no_prime_env, LOGIN)
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    config = resolved(
        api_key="sk-arg", team_id="team-arg", traces_url="http://traces.arg/", base_url="http://b"
    )
    assert config.api_key.reveal() == "sk-arg"
    assert (config.team_id, config.traces_url, config.base_url) == (
        "team-arg",
        "http://traces.arg",
        "http://b",
    )


@pytest.mark.anyio
async def test_a_key_from_prime_login_uploads(server: TracesServer, no_prime_env: Path) -> None:
    prime_login(no_prime_env, {"api_key": KEY, "team_id": TEAM, "traces_url": server.url})
    async with PrimeMonitor(base_url=server.url, run_id=RUN, retry_base=0.01) as monitor:
        await monitor.log_episodes([small(1)], step=0)
    assert monitor.stats() == DeliveryStats(1, 1, {})


def test_no_key_anywhere_says_where_one_is_looked_for() -> None:
    with pytest.raises(UploadError, match=r"PRIME_API_KEY.*prime login.*\.prime/config\.json"):
        resolved()


# -- what is retried, and what is a setting to fix --------------------------------------------


@pytest.mark.anyio
async def test_a_500_is_retried_with_the_same_bytes(fake_api: StartApi) -> None:
    api = await fake_api([(500, b'{"error": {"code": "internal", "message": "oops"}}'), COMMITTED])
    async with PrimeMonitor(
        api_key=KEY, traces_url=api.url, base_url=api.url, run_id=RUN, retry_base=0.01
    ) as monitor:
        await monitor.log_episodes([small(i) for i in range(3)], step=0)
    assert monitor.stats() == DeliveryStats(3, 3, {})
    (first, _), (second, _) = api.requests
    assert first["idempotency-key"] == second["idempotency-key"]


@pytest.mark.anyio
async def test_a_redirect_is_a_setup_error_never_followed(
    fake_api: StartApi, caplog: pytest.LogCaptureFixture
) -> None:
    """A redirect would carry the key and team to wherever it points: it is not followed,
    and it stops the uploads at once with one clear error (no retries)."""
    elsewhere = await fake_api([COMMITTED])
    api = await fake_api([(307, b"")], headers={"Location": elsewhere.url + TRACES_PATH})
    with caplog.at_level(logging.INFO, logger="monitors.prime"):
        async with PrimeMonitor(
            api_key=KEY, team_id=TEAM, traces_url=api.url, base_url=api.url, run_id=RUN
        ) as monitor:
            await monitor.log_episodes([small(1)], step=0)
            await wait_until(lambda: _stopped(monitor))
            await monitor.log_episodes([small(2)], step=1)
    assert monitor.stats() == DeliveryStats(2, 0, {"setup_error": 2})
    assert len(api.requests) == 1  # not retried
    assert elsewhere.requests == []  # not followed
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "redirect to " + elsewhere.url in errors[0].getMessage()
    assert "retrying" not in caplog.text


async def _stopped(monitor: PrimeMonitor) -> bool:
    return monitor.stats().pending == 0


@pytest.mark.anyio
async def test_a_certificate_the_client_cannot_verify_is_a_setup_error(
    fake_api: StartApi, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A self-signed certificate (made with openssl) fails verification: reported at once
    as a setup error, without retrying five times."""
    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
        ],
        check=True,
        capture_output=True,
    )
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    api = await fake_api([COMMITTED], tls=tls)
    with caplog.at_level(logging.INFO, logger="monitors.prime"):
        async with PrimeMonitor(
            api_key=KEY, traces_url=api.url, base_url=api.url, run_id=RUN, retry_base=0.01
        ) as monitor:
            await monitor.log_episodes([small(1), small(2)], step=0)
    assert monitor.stats() == DeliveryStats(2, 0, {"setup_error": 2})
    assert api.requests == []
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert len(errors) == 1
    assert "TLS failed" in errors[0]
    assert "certificate" in errors[0].lower()
    assert "retrying" not in caplog.text


def named(i: int) -> dict[str, Any]:
    return {"id": f"ep-{i}", "text": "x" * 200, "traces": []}


@pytest.mark.anyio
async def test_rejections_count_under_the_services_code_logged_once(
    server: TracesServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A 400 names its code: the loss is counted under ``rejected:<code>``, and the code's
    message is logged once, however many batches it rejects."""
    await server.aset_faults(reject_ids={f"ep-{i}": "episode_id_too_long" for i in range(3)})
    with caplog.at_level(logging.DEBUG, logger="monitors.prime"):
        async with make(server) as monitor:
            for i in range(4):
                await monitor.log_episodes([named(i)], step=i)
                await wait_until(partial(_requests_at_least, server, i + 1))  # its own batch
    assert monitor.stats() == DeliveryStats(4, 1, {"rejected:episode_id_too_long": 3})
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, warnings
    assert "rejected:episode_id_too_long" in warnings[0]
    assert "record ep-0 rejected" in warnings[0]


# -- a rejected record costs only itself ------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("bad", [[17], [0, 39], [5, 6, 7]], ids=["one", "first and last", "three"])
async def test_a_record_the_service_rejects_is_found_by_halving(
    server: TracesServer, bad: list[int]
) -> None:
    """The service rejects a whole upload for one bad record. The batch's halves are sent
    in its place, and theirs, until the bad lines are alone: only they are lost, under the
    code, and every other record is stored once; about 2·log2(lines) more requests each."""
    await server.aset_faults(reject_ids={f"ep-{i}": "invalid_trace" for i in bad})
    episodes = [named(i) for i in range(40)]
    async with make(server) as monitor:
        await monitor.log_episodes(episodes, step=0)
    assert monitor.stats() == DeliveryStats(40, 40 - len(bad), {"rejected:invalid_trace": len(bad)})
    stored = sorted(orjson.loads(line)["id"] for line in await server.alines())
    assert stored == sorted(f"ep-{i}" for i in range(40) if i not in bad)
    requests = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    assert len(requests) <= 1 + 2 * len(bad) * math.ceil(math.log2(40))
    keys = [r["idempotency_key"] for r in requests]
    assert len(set(keys)) == len(keys)  # no rejection sent again unchanged


@pytest.mark.anyio
async def test_a_rejection_of_the_request_itself_is_not_split(fake_api: StartApi) -> None:
    api = await fake_api([(400, b'{"error": {"code": "invalid_metadata", "message": "no"}}')])
    async with PrimeMonitor(
        api_key=KEY, traces_url=api.url, base_url=api.url, run_id=RUN, retry_base=0.01
    ) as monitor:
        await monitor.log_episodes([named(i) for i in range(8)], step=0)
    assert monitor.stats() == DeliveryStats(8, 0, {"rejected:invalid_metadata": 8})
    assert len(api.requests) == 1


@pytest.mark.anyio
async def test_a_server_that_never_answers_costs_an_attempt_not_minutes(
    server: TracesServer,
) -> None:
    """Each attempt has a total timeout: a server that takes the body and never answers
    fails each attempt after ``attempt_timeout``, and the batch is counted ``failed``."""
    await server.aset_faults(latency=30.0)
    started = time.monotonic()
    async with make(server, attempt_timeout=0.3) as monitor:
        await monitor.log_episodes([small(1)], step=0)
    assert monitor.stats() == DeliveryStats(1, 0, {"failed": 1})
    assert time.monotonic() - started < 15  # attempts of 0.3 s for retry_for (1 s)


# -- a service that cannot be reached ------------------------------------------------------


def closed_port() -> str:
    """The URL of a port on 127.0.0.1 nothing listens on: connecting is refused."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}"


@pytest.mark.anyio
async def test_an_unreachable_service_is_said_at_once_and_counted_as_such(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Nothing listens: the first failure is a warning naming the host and the cause;
    finalize says at once what it waits for; what never reached the service is counted
    ``unreachable``, never ``unconfirmed`` (which says the service may hold it)."""
    url = closed_port()
    host = url.removeprefix("http://")
    with caplog.at_level(logging.INFO, logger="monitors.prime"):
        async with PrimeMonitor(
            api_key=KEY,
            traces_url=url,
            base_url=url,
            run_id=RUN,
            retry_base=0.05,
            retry_for=60.0,
            drain_timeout=1.0,
        ) as monitor:
            await monitor.log_episodes([small(i) for i in range(3)], step=0)
            await monitor.log_metrics({"loss": 1.0}, step=0)
            await wait_until(lambda: _said(caplog, "did not answer"))
    assert monitor.stats() == DeliveryStats(3, 0, {"unreachable": 3})
    assert monitor.metrics_stats() == DeliveryStats(1, 0, {"unreachable": 1})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    down = [w for w in warnings if "did not answer" in w]
    assert len(down) == 1, warnings  # one host, one warning, however many attempts
    assert host in down[0]
    assert "Connect" in down[0]  # the cause: aiohttp's ClientConnectorError
    waits = [w for w in warnings if "finalize waits" in w]
    assert len(waits) == 1, warnings
    assert host in waits[0]
    assert "3 episode(s) and 1 metrics post(s)" in waits[0]
    assert "has not answered once" in waits[0]
    assert not [w for w in warnings if "unconfirmed" in w or "never confirmed" in w], warnings


@pytest.mark.anyio
async def test_a_request_that_never_reaches_the_service_ends_unreachable_not_failed() -> None:
    url = closed_port()
    async with PrimeMonitor(
        api_key=KEY, traces_url=url, base_url=url, run_id=RUN, retry_base=0.01, retry_for=0.3
    ) as monitor:
        await monitor.log_episodes([small(1)], step=0)
        await monitor.log_metrics({"loss": 1.0}, step=0)
    assert monitor.stats() == DeliveryStats(1, 0, {"unreachable": 1})
    assert monitor.metrics_stats() == DeliveryStats(1, 0, {"unreachable": 1})


@pytest.mark.anyio
async def test_a_service_that_comes_back_is_said_to_and_loses_nothing(
    server: TracesServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A service whose connections close unanswered, then answers again: one warning when
    it stops answering, one when it answers again, and every record delivered."""
    await server.aset_faults(down=True)
    with caplog.at_level(logging.WARNING, logger="monitors.prime"):
        async with make(server, retry_base=0.05, retry_for=30.0) as monitor:
            await monitor.log_episodes([small(i) for i in range(5)], step=0)
            await wait_until(lambda: _said(caplog, "did not answer"))
            await server.aset_faults(down=False)
            await wait_until(lambda: _delivered(monitor, 5))
    assert monitor.stats() == DeliveryStats(5, 5, {})
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 2, warnings
    assert "did not answer" in warnings[0]
    assert "answers again" in warnings[1]
    assert server.url.removeprefix("http://") in warnings[1]


async def _delivered(monitor: PrimeMonitor, n: int) -> bool:
    return monitor.stats().delivered >= n


async def _said(caplog: pytest.LogCaptureFixture, text: str) -> bool:
    return text in caplog.text


# -- memory under a stalled service ------------------------------------------------------------


def line_bytes(episode: Any) -> int:
    """The bytes the monitor holds for ``episode``: its stamped line and newline."""
    return len(stamped(episode)) + 1


def bounded(lengths: list[int], bound: int) -> tuple[list[bool], int]:
    """What an exact bound keeps of lines of these lengths, in order, when nothing is
    answered meanwhile: whether each is kept, and the bytes then held."""
    held, kept = 0, []
    for length in lengths:
        kept.append(held + length <= bound)
        held += length if kept[-1] else 0
    return kept, held


async def settle(monitor: PrimeMonitor, *, held: int, lost: int) -> None:
    """Wait until every episode logged is encoded: the monitor holds ``held`` bytes and has
    dropped ``lost``; fail saying what it holds if that never comes."""
    with anyio.move_on_after(10):
        while (monitor._held, monitor.stats().lost_total) != (held, lost):
            await anyio.sleep(0.01)
    assert (monitor._held, monitor.stats().lost_total) == (held, lost), monitor.stats()


async def uploading(server: TracesServer) -> bool:
    """Whether the server has a request in flight."""
    return bool((await server.astats())["in_flight"])


MIB = 1 << 20


@pytest.mark.anyio
@pytest.mark.parametrize(
    "first", [[8], [0, 8]], ids=["big then small", "small then big, then small"]
)
async def test_a_queue_far_from_full_drops_nothing_whatever_the_order_of_sizes(
    server: TracesServer, first: list[int]
) -> None:
    """A slow service, one request in flight: what is held is counted to the byte, so
    records of any sizes in any order are all kept while they stay under the bound (a mean
    of the first lines once dropped nearly every small one after a big one)."""
    await server.aset_faults(hold=True)
    episodes = [big(i, mb) if mb else small(i, 20_000) for i, mb in enumerate(first)]
    episodes += [small(i, 20_000) for i in range(len(first), len(first) + 100)]
    lengths = [line_bytes(e) for e in episodes]
    bound = 64 * MIB
    assert sum(lengths) < bound / 2
    async with make(server, queue_bytes=bound, max_in_flight=1, retry_for=30.0) as monitor:
        await monitor.log_episodes(episodes[:1], step=0)
        await wait_until(lambda: uploading(server))  # the first line's request is in flight
        held = lengths[0]
        for i in range(1, len(first)):  # each encoded before the rest
            await monitor.log_episodes([episodes[i]], step=0)
            held += lengths[i]
            await settle(monitor, held=held, lost=0)
        for at in range(len(first), len(episodes), 10):
            await monitor.log_episodes(episodes[at : at + 10], step=1)
            held += sum(lengths[at : at + 10])
            await settle(monitor, held=held, lost=0)
        await server.aset_faults(hold=False)
    assert monitor.stats() == DeliveryStats(len(episodes), len(episodes), {})
    assert (await server.astats())["unique_ids"] == len(episodes)


@pytest.mark.anyio
async def test_a_full_queue_drops_exactly_the_records_past_the_bound(
    server: TracesServer, caplog: pytest.LogCaptureFixture
) -> None:
    """Small records, then big ones past the bound, then small ones again, into a service
    that answers nothing meanwhile: exactly the records whose lines would take what is held
    past ``queue_bytes`` are dropped and counted ``queue_full``; the later small ones that
    fit are kept, and everything kept is delivered once the service answers."""
    await server.aset_faults(hold=True)
    episodes = [small(i, 20_000) for i in range(50)]
    episodes += [big(50 + i, 8) for i in range(6)]
    episodes += [small(56 + i, 20_000) for i in range(50)]
    lengths = [line_bytes(e) for e in episodes]
    bound = 32 * MIB
    kept, held = bounded(lengths, bound)
    dropped = kept.count(False)
    assert dropped == 3  # the 4th, 5th and 6th big ones
    with caplog.at_level(logging.WARNING, logger="monitors.prime"):
        async with make(server, queue_bytes=bound, max_in_flight=1, retry_for=30.0) as monitor:
            for at in range(0, len(episodes), 4):
                await monitor.log_episodes(episodes[at : at + 4], step=at)
            await settle(monitor, held=held, lost=dropped)
            await server.aset_faults(hold=False)
    assert monitor.stats() == DeliveryStats(len(episodes), len(episodes) - 3, {"queue_full": 3})
    stored = sorted(orjson.loads(line)["id"] for line in await server.alines())
    assert stored == [e["id"] for e, keep in zip(episodes, kept, strict=True) if keep]
    full = [r.getMessage() for r in caplog.records if "queue is full" in r.getMessage()]
    assert len(full) == 1, full


@pytest.mark.anyio
async def test_a_stalled_service_holds_at_most_queue_bytes(
    server: TracesServer, caplog: pytest.LogCaptureFixture
) -> None:
    """A service that takes requests and answers none: what the monitor holds stays within
    ``queue_bytes`` (about 100 lines' worth here), the newest episodes past it are counted
    ``queue_full``, and one warning says so before it fills."""
    await server.aset_faults(hold=True)
    lengths = [line_bytes(small(i)) for i in range(10)] * 30
    bound = 100 * max(lengths)
    with caplog.at_level(logging.WARNING, logger="monitors.prime"):
        async with make(server, queue_bytes=bound, drain_timeout=0.5) as monitor:
            for step in range(30):
                await monitor.log_episodes([small(i) for i in range(10)], step=step)
                kept, held = bounded(lengths[: 10 * (step + 1)], bound)
                await settle(monitor, held=held, lost=kept.count(False))
    stats = monitor.stats()
    assert stats.submitted == 300
    assert stats.lost["queue_full"] == kept.count(False), stats
    balanced(stats)
    held = [r.getMessage() for r in caplog.records if "of episodes held" in r.getMessage()]
    assert len(held) == 1, held
    await server.aset_faults(hold=False)


@pytest.mark.anyio
async def test_an_old_queue_is_warned_of_once(
    server: TracesServer, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(monitors.prime._monitor, "PENDING_AGE", 0.2)
    await server.aset_faults(latency=30.0)
    with caplog.at_level(logging.WARNING, logger="monitors.prime"):
        async with make(server, drain_timeout=0.3, max_in_flight=1) as monitor:
            for step in range(6):
                await monitor.log_episodes([small(i) for i in range(3)], step=step)
                await anyio.sleep(0.1)
    held = [r.getMessage() for r in caplog.records if "of episodes held" in r.getMessage()]
    assert len(held) == 1, held
    assert "the oldest for" in held[0]


def test_queue_bytes_must_be_positive() -> None:
    with pytest.raises(ValueError, match="queue_bytes"):
        PrimeMonitor(queue_bytes=0)


@pytest.mark.anyio
async def test_the_line_format_follows_the_record(server: TracesServer) -> None:
    """As prime-runs chooses it: a record with member traces goes up as an ``episode``
    line, a bare trace as a ``trace`` line; a batch holds one format."""
    episode = {"id": "e-1", "traces": [{"id": "t-1"}]}
    trace = {"id": "t-2", "nodes": []}
    async with make(server) as monitor:
        await monitor.log_episodes([episode, trace, episode | {"id": "e-2"}], step=0)
    assert monitor.stats() == DeliveryStats(3, 3, {})
    requests = [r for r in await server.arequests() if r["path"] == TRACES_PATH]
    formats = sorted((r["headers"]["x-prime-line-format"], r["lines"]) for r in requests)
    assert formats == [("episode", 1), ("episode", 1), ("trace", 1)]
    stored = {orjson.loads(line)["id"]: orjson.loads(line) for line in await server.alines()}
    assert stored["t-2"]["run"] == {"id": RUN, "type": "train"}  # a trace is keyed too


@pytest.mark.anyio
async def test_one_invalid_episode_among_a_thousand_costs_only_itself(
    server: TracesServer,
) -> None:
    """1,000 verifiers-shaped episodes and one that is no episode (its traces not a list),
    logged a step at a time: the one is lost under the service's code, the 1,000 are
    delivered once each."""
    maker = EpisodeMaker(seed=8)
    episodes: list[Any] = maker.episodes(1000, size=20_000)
    episodes.insert(617, {"id": "not-an-episode", "traces": "none"})
    async with make(server, retry_for=30.0) as monitor:
        for step in range(0, len(episodes), 50):
            await monitor.log_episodes(episodes[step : step + 50], step=step // 50)
    assert monitor.stats() == DeliveryStats(1001, 1000, {"rejected:invalid_trace": 1})
    served = await server.astats()
    assert served["unique_ids"] == 1000
    assert served["duplicate_ids"] == 0


@pytest.mark.anyio
async def test_the_key_stays_out_of_a_failed_requests_frames(fake_api: StartApi) -> None:
    """What an error reporter shows of a request's frames (each local's repr) holds no key:
    the Authorization value is sent as it is and shown as '***'."""
    captured: list[str] = []
    api = await fake_api([COMMITTED])

    class Exploding:
        def post(self, *args: Any, **kwargs: Any) -> Any:
            tb = traceback.TracebackException.from_exception(
                RuntimeError("boom"), capture_locals=True
            )
            frame = sys._getframe(1)  # Client.post, with its headers
            captured.append(repr(frame.f_locals))
            captured.append("".join(tb.format()))
            raise aiohttp.ClientError("no network here")

    async with PrimeMonitor(
        api_key=KEY, traces_url=api.url, base_url=api.url, run_id=RUN, retry_for=0.1
    ) as monitor:
        assert monitor._client is not None
        monitor._client.session = Exploding()  # type: ignore[assignment]
        await monitor.log_episodes([small(1)], step=0)
    assert captured
    assert "Authorization" in captured[0]
    assert all(KEY not in text for text in captured)
