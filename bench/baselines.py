"""Today's way, for ``python -m bench.loadtest --baseline``: what an orchestrator does
without nodewise, behind the same ``Monitor`` interface so the load test measures both alike.

- ``OrjsonFileBaseline``: ``orjson.dumps`` then ``write``, in ``asyncio.to_thread``, one
  episode at a time. orjson holds the GIL for the whole encode, so the thread does not help:
  the loop stalls for as long as one episode takes to encode (~130 ms at 60 MB).
- ``SdkLikeUploader``: shaped like the prime-traces SDK nodewise improves on: a bounded
  queue whose ``put`` blocks the caller (up to 5 s, then the episode is dropped), one
  uploader task that encodes each episode with ``orjson.dumps`` in a thread (the GIL
  again), batches up to 30 MiB, gzips at level 9 and posts one request at a time, with the
  same multipart body and headers as ``PrimeMonitor`` so the server accepts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import secrets
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import IO, Any

import aiohttp
import orjson

from monitors.base import DeliveryStats, Ledger, Monitor
from monitors.loadtest import LoadtestConfig, RunSpec
from monitors.loadtest._run import KEY
from monitors.prime import TRACES_PATH
from monitors.records import Kind, Subset, check_kind

__all__ = ["OrjsonFileBaseline", "SdkLikeUploader", "baseline_runs"]

log = logging.getLogger("bench.baselines")


def build_record(episode: Any) -> Any:
    """The record as today's way builds it: ``to_record()`` where there is one, on the loop."""
    to_record = getattr(episode, "to_record", None)
    return to_record() if callable(to_record) else episode


_STOP = object()
_CRLF = b"\r\n"


class OrjsonFileBaseline(Monitor):
    """Episodes to ``root/<kind>/<subset>.jsonl``, each encoded by ``orjson.dumps`` and
    written in ``asyncio.to_thread``; metrics are ignored (the load test logs none)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self._ledger = Ledger()
        self._files: dict[tuple[str, str], IO[bytes]] = {}

    def path(self, kind: Kind, subset: Subset) -> Path:
        return self.root / kind / f"{subset}.jsonl"

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        pass

    def _file(self, kind: Kind, subset: Subset) -> IO[bytes]:
        f = self._files.get((kind, subset))
        if f is None:
            path = self.path(kind, subset)
            path.parent.mkdir(parents=True, exist_ok=True)
            f = self._files[(kind, subset)] = open(path, "ab")  # noqa: SIM115 - closed in finalize
        return f

    @staticmethod
    def _write(f: IO[bytes], record: Any) -> None:
        f.write(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))

    async def log_episodes(
        self,
        episodes: Iterable[Any],
        *,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        check_kind(kind, subset)
        batch = list(episodes)
        self._ledger.submitted += len(batch)
        f = self._file(kind, subset)
        for episode in batch:
            try:
                await asyncio.to_thread(self._write, f, build_record(episode))
            except (TypeError, OSError) as exc:
                self._ledger.lost["write_error"] += 1
                log.warning("baseline: episode not written: %r", exc)
            else:
                self._ledger.delivered += 1

    async def finalize(self) -> None:
        files, self._files = self._files, {}
        for f in files.values():
            await asyncio.to_thread(f.close)

    def stats(self) -> DeliveryStats:
        return self._ledger.snapshot()


class SdkLikeUploader(Monitor):
    """An uploader shaped like the prime-traces SDK: ``log_episodes`` awaits a put on a
    bounded queue (``queue_records``; after ``put_timeout`` s, None for never, the episode is
    dropped, counted ``queue_full``), one task encodes (``orjson.dumps`` in a thread),
    batches (closed before ``batch_bytes``, or after ``linger`` s without a new episode), gzips at ``gzip_level``
    with the SHA-256 key in a thread, and posts one batch at a time, retrying 429/5xx and
    transport errors up to 5 attempts. ``finalize`` waits ``drain_timeout`` s for the queue
    to empty; what is left is lost (``drain_timeout``)."""

    def __init__(
        self,
        *,
        url: str,
        api_key: str,
        queue_records: int = 8,
        put_timeout: float | None = 5.0,
        gzip_level: int = 9,
        batch_bytes: int = 30 * 2**20,
        linger: float = 0.05,
        drain_timeout: float = 60.0,
        retry_base: float = 1.0,
    ) -> None:
        self.url = url.rstrip("/") + TRACES_PATH
        self._api_key = api_key
        self.queue_records = queue_records
        self.put_timeout = put_timeout
        self.gzip_level = gzip_level
        self.batch_bytes = batch_bytes
        self.linger = linger
        self.drain_timeout = drain_timeout
        self.retry_base = retry_base
        self._ledger = Ledger()
        self._queue: asyncio.Queue[Any] | None = None
        self._session: aiohttp.ClientSession | None = None
        self._task: asyncio.Task[None] | None = None
        self._finalized = False

    async def start(self) -> None:
        self._queue = asyncio.Queue(maxsize=self.queue_records)
        self._session = aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=300)
        )
        self._task = asyncio.create_task(self._run(), name="SdkLikeUploader")

    async def log_metrics(self, metrics: Mapping[str, Any], *, step: int) -> None:
        pass

    async def log_episodes(
        self,
        episodes: Iterable[Any],
        *,
        step: int,
        kind: Kind = "train",
        subset: Subset = "effective",
    ) -> None:
        check_kind(kind, subset)
        assert self._queue is not None
        for episode in episodes:
            self._ledger.submitted += 1
            try:
                await asyncio.wait_for(self._queue.put((episode, kind, subset)), self.put_timeout)
            except asyncio.TimeoutError:
                self._ledger.lost["queue_full"] += 1

    async def finalize(self) -> None:
        if self._finalized or self._task is None:
            return
        self._finalized = True
        assert self._queue is not None
        assert self._session is not None
        task = self._task
        try:
            await asyncio.wait_for(self._queue.put(_STOP), self.drain_timeout)
            await asyncio.wait_for(asyncio.shield(task), self.drain_timeout)
        except asyncio.TimeoutError:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        finally:
            ledger = self._ledger
            rest = ledger.submitted - ledger.delivered - sum(ledger.lost.values())
            if rest > 0:
                ledger.lost["drain_timeout"] += rest
            await self._session.close()

    def stats(self) -> DeliveryStats:
        return self._ledger.snapshot()

    # -- the uploader task ----------------------------------------------------------------

    async def _run(self) -> None:
        queue = self._queue
        assert queue is not None
        lines: list[bytes] = []
        size = 0
        context: tuple[str, str] = ("train", "all")
        while True:
            try:
                item = (
                    await queue.get()
                    if not lines
                    else await asyncio.wait_for(queue.get(), self.linger)
                )
            except asyncio.TimeoutError:
                await self._upload(lines, context)
                lines, size = [], 0
                continue
            if item is _STOP:
                break
            episode, kind, subset = item
            try:
                line = await asyncio.to_thread(
                    orjson.dumps, build_record(episode), option=orjson.OPT_APPEND_NEWLINE
                )
            except TypeError:
                self._ledger.lost["encode_error"] += 1
                continue
            if lines and (size + len(line) > self.batch_bytes or (kind, subset) != context):
                await self._upload(lines, context)
                lines, size = [], 0
            context = (kind, subset)
            lines.append(line)
            size += len(line)
        if lines:
            await self._upload(lines, context)

    def _pack(self, lines: list[bytes], context: tuple[str, str]) -> tuple[str, bytes, str]:
        """(content type, body, idempotency key) of one batch; runs in a worker thread."""
        raw = b"".join(lines)
        key = "sha256:" + hashlib.sha256(raw).hexdigest()
        gz = zlib.compressobj(self.gzip_level, zlib.DEFLATED, 31)
        data = gz.compress(raw) + gz.flush()
        del raw
        metadata = orjson.dumps(
            {"schema_version": 1, "context": {"kind": context[0], "subset": context[1]}}
        )
        boundary = ("sdk-" + secrets.token_hex(16)).encode()
        body = b"".join(
            (
                b"--" + boundary + _CRLF,
                b'Content-Disposition: form-data; name="metadata"' + _CRLF,
                b"Content-Type: application/json" + _CRLF + _CRLF,
                metadata + _CRLF,
                b"--" + boundary + _CRLF,
                b'Content-Disposition: form-data; name="traces"; filename="traces.jsonl"' + _CRLF,
                b"Content-Type: application/x-ndjson" + _CRLF,
                b"Content-Encoding: gzip" + _CRLF + _CRLF,
                data,
                _CRLF + b"--" + boundary + b"--" + _CRLF,
            )
        )
        return f"multipart/form-data; boundary={boundary.decode()}", body, key

    async def _upload(self, lines: list[bytes], context: tuple[str, str]) -> None:
        session = self._session
        assert session is not None
        records = len(lines)
        content_type, body, key = await asyncio.to_thread(self._pack, lines, context)
        headers = {
            "Authorization": f"Bearer {self._api_key}",
            "Content-Type": content_type,
            "Idempotency-Key": key,
            "X-Prime-Line-Format": "episode",
        }
        outcome = "failed"
        for attempt in range(5):
            try:
                async with session.post(self.url, data=body, headers=headers) as response:
                    await response.read()
                    if response.status in (200, 201):
                        outcome = "delivered"
                        break
                    if response.status not in (429, 502, 503, 504):
                        outcome = "rejected"
                        log.warning("SDK-like uploader: batch refused: HTTP %d", response.status)
                        break
            except aiohttp.ClientError as exc:
                log.warning("SDK-like uploader: attempt %d failed: %r", attempt + 1, exc)
            if attempt < 4:
                await asyncio.sleep(min(30.0, self.retry_base * 2**attempt))
        if outcome == "delivered":
            self._ledger.delivered += records
        else:
            self._ledger.lost[outcome] += records


def baseline_runs(monitors: Iterable[str]) -> list[RunSpec]:
    """Today's way of doing what each of ``monitors`` does (W&B has none), as load test
    runs measured beside them."""
    runs = []
    if "file" in monitors:
        runs.append(
            RunSpec(
                key="baseline-file",
                name="orjson + to_thread (file)",
                make=lambda root, _config, _url: OrjsonFileBaseline(root / "baseline-file"),
                files=True,
                ours=False,
                streams=_baseline_streams,
            )
        )
    if "prime" in monitors:
        runs.append(
            RunSpec(
                key="baseline-sdk",
                name="SDK-like uploader",
                make=_sdk_like,
                http=True,
                ours=False,
                in_flight=1,
            )
        )
    return runs


def _sdk_like(_root: Path, config: LoadtestConfig, url: str | None) -> Monitor:
    assert url is not None
    return SdkLikeUploader(url=url, api_key=KEY, drain_timeout=config.drain_timeout)


def _baseline_streams(monitor: Monitor) -> dict[str, str]:
    assert isinstance(monitor, OrjsonFileBaseline)
    return {s: str(monitor.path("train", s)) for s in ("all", "effective")}
