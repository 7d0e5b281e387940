"""Recipe: write JSONL (one JSON document per line), blocking, async, or as a trace stream.

``main(directory)`` writes the same records the three ways, one of them not encodable, and
checks what each left on disk (``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import anyio
import orjson

import encoder
from monitors.traces import TraceWriter, read_records

# --8<-- [start:sync]


def write_jsonl(records: Iterable[Any], path: str | os.PathLike[str]) -> int:
    """Write one line per record; skip (and report) a record that cannot be encoded."""
    skipped = 0
    with open(path, "wb") as f:
        for record in records:
            start = f.tell()
            try:
                encoder.dump(record, f, option=encoder.OPT_APPEND_NEWLINE, chunk_size=1 << 20)
            except encoder.EncodeError as exc:
                # dump wrote the chunks before the bad node: cut them off.
                f.truncate(start)
                f.seek(start)
                skipped += 1
                print(f"skipped a record: {exc}", file=sys.stderr)
    return skipped


# --8<-- [end:sync]
# --8<-- [start:async]


async def awrite_jsonl(records: Iterable[Any], path: str | os.PathLike[str]) -> int:
    """The same on an event loop: encoding on the loop, file writes in a worker thread."""
    skipped = 0
    async with await anyio.open_file(path, "wb") as f:
        for record in records:
            start = await f.tell()
            try:
                await encoder.adump(
                    record, f.write, option=encoder.OPT_APPEND_NEWLINE, chunk_size=1 << 20
                )
            except encoder.EncodeError as exc:
                await f.truncate(start)
                await f.seek(start)
                skipped += 1
                print(f"skipped a record: {exc}", file=sys.stderr)
    return skipped


# --8<-- [end:async]
# --8<-- [start:trace]


async def write_trace(records: Iterable[Any], directory: str | os.PathLike[str]) -> int:
    """A trace stream: chunk files that roll at ``chunk_bytes`` and are sealed with zstd, an
    index, crash recovery."""
    skipped = 0
    async with TraceWriter(directory, chunk_bytes=1 << 30) as stream:
        for step, record in enumerate(records):
            try:
                await stream.append(record, step=step)
            except encoder.EncodeError:
                skipped += 1  # the partial line is already removed
    return skipped


# --8<-- [end:trace]


def sample_records() -> list[Any]:
    """Records of a few MB each, and one that fails half-way (a set, after a long string)."""
    records: list[Any] = [
        {"step": i, "text": "\u00e9t\u00e9 " * (250_000 * i), "logprobs": [-0.5] * 100_000}
        for i in range(1, 4)
    ]
    records.insert(2, {"step": -1, "text": "x" * 3_000_000, "tags": {"not", "json"}})
    return records


def main(directory: str | os.PathLike[str]) -> None:
    root = Path(directory)
    records = sample_records()
    good = [r for r in records if r["step"] >= 0]
    expected = b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in good)

    assert write_jsonl(records, root / "sync.jsonl") == 1
    assert (root / "sync.jsonl").read_bytes() == expected

    assert anyio.run(awrite_jsonl, records, root / "async.jsonl") == 1
    assert (root / "async.jsonl").read_bytes() == expected

    assert anyio.run(write_trace, records, root / "trace") == 1
    assert list(read_records(root / "trace")) == good
    assert (root / "trace.index.jsonl").is_file()  # the stream's index, beside it
    print(f"wrote {len(good)} records three ways, skipped 1")


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        main(tmp)
