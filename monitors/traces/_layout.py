"""The on-disk layout of a trace stream: numbered chunk files and a fixed-width index.

```
DIR/00000.jsonl   one record per line, at most chunk_bytes (a larger record gets its own)
DIR/00001.jsonl
DIR/index.jsonl   one row per record, ROW_BYTES wide, so row n is at byte n * ROW_BYTES
```
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

__all__ = [
    "INDEX_NAME",
    "ROW_BYTES",
    "IndexRow",
    "chunk_path",
    "decode_row",
    "encode_row",
    "list_chunks",
]

INDEX_NAME = "index.jsonl"
#: Width of an index row, padding and newline included.
ROW_BYTES = 160
_CHUNK = re.compile(r"(\d{5,})\.jsonl\Z")


@dataclass(frozen=True)
class IndexRow:
    """Where one record lives: chunk number, byte offset and length (newline included).

    :param chunk: The chunk file's number.
    :param offset: The record's first byte in the chunk.
    :param length: The record's bytes, its newline included.
    :param step: The training step it was logged at, if given (None in a row rebuilt after a
        crash, as are ``kind`` and ``subset``).
    :param kind: Its kind (``"train"``, ``"eval"``), if given.
    :param subset: Its subset (``"all"``, ``"effective"``), if given.
    """

    chunk: int
    offset: int
    length: int
    step: int | None = None
    kind: str | None = None
    subset: str | None = None

    @property
    def end(self) -> int:
        """The offset just past the record's newline."""
        return self.offset + self.length


def encode_row(row: IndexRow) -> bytes:
    """The row as a JSON object padded with spaces to ``ROW_BYTES`` (newline last)."""
    data = orjson.dumps(
        {
            "chunk": row.chunk,
            "offset": row.offset,
            "length": row.length,
            "step": row.step,
            "kind": row.kind,
            "subset": row.subset,
        }
    )
    if len(data) >= ROW_BYTES:
        raise ValueError(f"index row too wide ({len(data)} bytes): {data[:80]!r}")
    return data + b" " * (ROW_BYTES - 1 - len(data)) + b"\n"


def decode_row(data: bytes) -> IndexRow:
    """Parse one padded row (raises ValueError on anything else)."""
    try:
        value: Any = orjson.loads(data)
        return IndexRow(
            chunk=int(value["chunk"]),
            offset=int(value["offset"]),
            length=int(value["length"]),
            step=value.get("step"),
            kind=value.get("kind"),
            subset=value.get("subset"),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"bad index row {data[:80]!r}") from exc


def chunk_path(directory: Path, chunk: int) -> Path:
    return directory / f"{chunk:05d}.jsonl"


def list_chunks(directory: Path) -> list[int]:
    """Chunk numbers present in ``directory``, in order (gaps are left to the reader)."""
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = (_CHUNK.match(name) for name in names)
    return sorted(int(m.group(1)) for m in found if m)
