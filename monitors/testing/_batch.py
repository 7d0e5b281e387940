"""Checking one uploaded traces part: gunzip, hash, split into lines, parse every line.

Runs in a worker thread. It inflates incrementally (with python-isal, the faster: the server
shares the cores with the monitor it tests) and stops at the first limit crossed, so a gzip
bomb costs at most the batch limit and the batch is never held whole.
"""

from __future__ import annotations

import hashlib
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import orjson
from isal import isal_zlib

__all__ = ["BatchLimits", "CheckedBatch", "Refused", "check_traces"]

_PIECE = 1 << 20  # decompress at most this much at a time
# isal's stubs declare IsalError an instance of Exception; it is the class.
_ERRORS: tuple[type[Exception], ...] = (zlib.error, isal_zlib.IsalError)  # type: ignore[assignment]


@dataclass(frozen=True)
class BatchLimits:
    """What one upload may hold, counted on the uncompressed NDJSON (the first three), and
    the rules for each record. prime-traces names the record codes but not their rules; the
    last two are inferred: every member trace carries a copy of its episode's id, so the
    service caps the id's length (``episode_id_too_long``) and the traces in one episode
    (``too_many_traces_in_episode``)."""

    max_batch_bytes: int = 30 << 20
    max_batch_lines: int = 1_000_000
    max_line_bytes: int = 64 << 20
    max_id_chars: int = 256
    max_traces: int = 10_000


class Refused(Exception):
    """A request is refused; ``status`` is the HTTP status to answer (400, 401, ...).

    With a ``code`` (one of prime-traces' ``ErrorCode``) the answer is the Traces service's
    envelope, ``{"error": {"code", "message"}}``; without one, the platform API's
    ``{"detail": message}`` (the metrics endpoint).
    """

    def __init__(self, status: int, message: str, code: str | None = None) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code

    def body(self) -> dict[str, object]:
        if self.code is None:
            return {"detail": self.message}
        return {"error": {"code": self.code, "message": self.message}}


@dataclass
class CheckedBatch:
    """A traces part that passed every check.

    ``ids`` holds each record's ``"id"`` (as its JSON encoding, so ``1`` and ``"1"`` differ)
    for records that are objects with one; ``lines`` holds the raw lines only when asked for.
    """

    key: str  # "sha256:<hex>" of the uncompressed bytes
    uncompressed_bytes: int
    line_count: int
    ids: list[bytes] = field(default_factory=list)
    without_id: int = 0
    lines: list[bytes] | None = None


def check_record(
    value: Any,
    number: int,
    line_format: str,
    limits: BatchLimits,
    seen: tuple[set[str], set[str]],
) -> None:
    """Refuse line ``number`` as the service would: under the ``episode`` format an object
    with a ``traces`` list (a string id of at most ``max_id_chars``, at most ``max_traces``
    traces), under ``trace`` an object; no episode or trace id twice in one upload (``seen``:
    the ids so far)."""
    where = f"line {number}"
    if not isinstance(value, dict):
        raise Refused(400, f"{where} is not a JSON object", "invalid_trace")
    episodes, traces = seen
    members: Any = [value]
    if line_format == "episode":
        members = value.get("traces")
        if not isinstance(members, list):
            raise Refused(400, f"{where} is not an episode: no 'traces' list", "invalid_trace")
        episode_id = value.get("id")
        if isinstance(episode_id, str):
            if len(episode_id) > limits.max_id_chars:
                message = f"{where}: episode id over {limits.max_id_chars} characters"
                raise Refused(400, message, "episode_id_too_long")
            if episode_id in episodes:
                message = f"{where}: episode {episode_id!r} twice in one upload"
                raise Refused(400, message, "duplicate_episode_id")
            episodes.add(episode_id)
        if len(members) > limits.max_traces:
            message = f"{where}: {len(members)} traces, over {limits.max_traces}"
            raise Refused(400, message, "too_many_traces_in_episode")
    for member in members:
        trace_id = member.get("id") if isinstance(member, dict) else None
        if isinstance(trace_id, str):
            if trace_id in traces:
                message = f"{where}: trace {trace_id!r} twice in one upload"
                raise Refused(400, message, "duplicate_trace_id")
            traces.add(trace_id)


def check_traces(
    compressed: Iterable[bytes],
    limits: BatchLimits,
    *,
    keep_lines: bool = False,
    line_format: str | None = None,
    compressed_part: bool = True,
) -> CheckedBatch:
    """Gunzip ``compressed`` (one or more gzip members), check every line, hash the bytes.

    Raises ``Refused`` (400, with the service's code) for bad gzip, a line that is not JSON
    (naming the line, counted from 1), as soon as a limit is crossed, or, given a
    ``line_format`` (``episode`` or ``trace``), for a record the service refuses
    (``check_record``). ``compressed_part=False``: the part is the NDJSON itself.
    """
    digest = hashlib.sha256()
    out = CheckedBatch(key="", uncompressed_bytes=0, line_count=0)
    if keep_lines:
        out.lines = []
    pending = bytearray()  # the start of a line whose newline has not arrived yet
    total = 0
    seen: tuple[set[str], set[str]] = (set(), set())

    def take_line(line: bytes | bytearray) -> None:
        number = out.line_count + 1
        if len(line) > limits.max_line_bytes:
            raise Refused(
                400,
                f"line {number} is {len(line)} bytes, over {limits.max_line_bytes}",
                "trace_too_large",
            )
        if number > limits.max_batch_lines:
            raise Refused(
                400,
                f"batch has more than {limits.max_batch_lines} lines",
                "too_many_traces_in_upload",
            )
        out.uncompressed_bytes += len(line) + 1
        # One line may be up to max_line_bytes on its own (the client sends a line too big
        # for a shared batch alone); a batch of several may not pass max_batch_bytes.
        if number > 1 and out.uncompressed_bytes > limits.max_batch_bytes:
            raise Refused(
                400,
                f"batch is over {limits.max_batch_bytes} bytes uncompressed",
                "upload_too_large",
            )
        try:
            value = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise Refused(400, f"line {number} is not JSON: {exc}", "invalid_trace") from None
        if line_format is not None:
            check_record(value, number, line_format, limits, seen)
        out.line_count = number
        if isinstance(value, dict) and "id" in value:
            out.ids.append(orjson.dumps(value["id"]))
        else:
            out.without_id += 1
        if out.lines is not None:
            out.lines.append(bytes(line))

    def take(data: bytes) -> None:
        nonlocal total
        total += len(data)
        if total > max(limits.max_batch_bytes, limits.max_line_bytes + 1):
            raise Refused(
                400,
                f"batch is over {limits.max_batch_bytes} bytes uncompressed",
                "upload_too_large",
            )
        digest.update(data)
        start = 0
        while True:
            end = data.find(b"\n", start)
            if end < 0:
                break
            if pending:
                pending.extend(memoryview(data)[start:end])
                take_line(pending)
                pending.clear()
            else:
                take_line(data[start:end])
            start = end + 1
        if start < len(data):
            pending.extend(memoryview(data)[start:])
            if len(pending) > limits.max_line_bytes:
                raise Refused(
                    400,
                    f"line {out.line_count + 1} is over {limits.max_line_bytes} bytes",
                    "trace_too_large",
                )

    if compressed_part:
        _gunzip(compressed, take)
    else:
        for data in compressed:
            take(bytes(data))
    if pending:  # a last line without its newline still counts
        take_line(pending)
    out.key = "sha256:" + digest.hexdigest()
    out.uncompressed_bytes = total
    return out


def _gunzip(compressed: Iterable[bytes], sink: Callable[[bytes], None]) -> None:
    inflater = isal_zlib.decompressobj(wbits=31)
    fresh = True  # nothing fed to this inflater yet (a new member may or may not follow)
    seen_any = False
    try:
        for chunk in compressed:
            data = chunk
            while data:
                seen_any = True
                fresh = False
                while True:  # at most _PIECE bytes out at a time
                    out = inflater.decompress(data, _PIECE)
                    sink(out)
                    data = inflater.unconsumed_tail
                    if not data and (len(out) < _PIECE or inflater.eof):
                        break
                if inflater.eof:  # another gzip member may follow
                    data = inflater.unused_data
                    inflater = isal_zlib.decompressobj(wbits=31)
                    fresh = True
                else:
                    data = b""
    except _ERRORS as exc:
        raise Refused(400, f"traces part is not valid gzip: {exc}", "malformed_encoding") from None
    if not seen_any:
        raise Refused(400, "traces part is empty, not gzip", "malformed_encoding")
    if not fresh:
        raise Refused(400, "traces part is truncated gzip", "malformed_encoding")
