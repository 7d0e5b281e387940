"""The on-disk layout of a trace stream: numbered chunk files and a fixed-width index.

```
DIR/00000.jsonl.zst   a sealed chunk: zstd's seekable format, same bytes as the plain one
DIR/00001.jsonl       a plain chunk: one record per line, at most chunk_bytes (a larger
                      record gets its own)
DIR/index.jsonl       one row per record, ROW_BYTES wide, so row n is at byte n * ROW_BYTES
```

A seal writes ``NNNNN.jsonl.zst.tmp`` (prime-rl's name for it) until it is renamed into
place; for a moment both the plain and the sealed chunk may be present (docs/design.md D9).
A reader skips the ``.tmp`` file: it is never a chunk.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson

from ..errors import TraceFormatError

__all__ = [
    "INDEX_NAME",
    "ROW_BYTES",
    "IndexRow",
    "Listing",
    "chunk_path",
    "decode_row",
    "encode_row",
    "id_hash",
    "is_stream_file",
    "list_chunks",
    "scan",
    "sealed_path",
    "sealing_path",
]

INDEX_NAME = "index.jsonl"
#: Width of an index row, padding and newline included.
ROW_BYTES = 256
#: Longest id (UTF-8 bytes, as JSON) a row keeps verbatim; a longer one is kept as its hash.
ID_BYTES = 120
_NAME = re.compile(r"(\d{5,})\.jsonl(\.zst(\.tmp)?)?\Z")
#: Left by an index rewrite that a crash interrupted (see _recovery).
MENDING_NAME = INDEX_NAME + ".mending"


def id_hash(record_id: str) -> str:
    """The 64-bit hash a row keeps for an id too long to keep verbatim."""
    return hashlib.blake2b(record_id.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()


@dataclass(frozen=True)
class IndexRow:
    """Where one record lives: chunk number, uncompressed byte offset and length.

    Offsets are those of the plain chunk, whether the chunk is sealed or not.

    :param chunk: The chunk file's number.
    :param offset: The record's first byte in the (uncompressed) chunk.
    :param length: The record's bytes, its newline included.
    :param step: The training step it was logged at, if given (None in a row rebuilt after a
        crash, as are ``kind``, ``subset`` and ``id``).
    :param kind: Its kind (``"train"``, ``"eval"``), if given.
    :param subset: Its subset (``"all"``, ``"effective"``), if given.
    :param id: The record's own ``"id"``, when it is a string of at most ``ID_BYTES``.
    :param idh: ``id_hash`` of a longer string id (then ``id`` is None).
    """

    chunk: int
    offset: int
    length: int
    step: int | None = None
    kind: str | None = None
    subset: str | None = None
    id: str | None = None
    idh: str | None = None

    @property
    def end(self) -> int:
        """The offset just past the record's newline."""
        return self.offset + self.length


def row_for_id(record_id: Any) -> tuple[str | None, str | None]:
    """``(id, idh)`` for a row of a record whose ``"id"`` is ``record_id``."""
    if type(record_id) is not str:
        return None, None
    if len(orjson.dumps(record_id)) <= ID_BYTES:
        return record_id, None
    return None, id_hash(record_id)


def encode_row(row: IndexRow) -> bytes:
    """The row as a JSON object padded with spaces to ``ROW_BYTES`` (newline last)."""
    fields: dict[str, Any] = {
        "chunk": row.chunk,
        "offset": row.offset,
        "length": row.length,
        "step": row.step,
        "kind": row.kind,
        "subset": row.subset,
    }
    if row.idh is not None:
        fields["idh"] = row.idh
    fields["id"] = row.id  # last, so that a search for `"id":<id>}` finds it
    data = orjson.dumps(fields)
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
            id=value.get("id"),
            idh=value.get("idh"),
        )
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise ValueError(f"bad index row {data[:80]!r}") from exc


def chunk_path(directory: Path, chunk: int) -> Path:
    """The plain chunk ``chunk``."""
    return directory / f"{chunk:05d}.jsonl"


def sealed_path(directory: Path, chunk: int) -> Path:
    """The sealed chunk ``chunk``."""
    return directory / f"{chunk:05d}.jsonl.zst"


def sealing_path(directory: Path, chunk: int) -> Path:
    """Where chunk ``chunk`` is sealed before it is renamed into place."""
    return directory / f"{chunk:05d}.jsonl.zst.tmp"


@dataclass(frozen=True)
class Listing:
    """What a stream's directory holds, by kind of file (chunk numbers, in order)."""

    plain: list[int]
    sealed: list[int]
    sealing: list[int]  # leftovers of a seal a crash interrupted

    @property
    def chunks(self) -> list[int]:
        """Every chunk, plain or sealed (or both, mid-seal)."""
        return sorted(set(self.plain) | set(self.sealed))


def scan(directory: Path) -> Listing:
    """Sort the files of a stream's directory (an empty listing when it does not exist).

    :raises TraceFormatError: A file that is neither a chunk, a sealing leftover nor an
        index: the directory is not (only) a trace stream.
    """
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return Listing([], [], [])
    plain: list[int] = []
    sealed: list[int] = []
    sealing: list[int] = []
    for name in names:
        found = _NAME.match(name)
        if found is None:
            if name in (INDEX_NAME, MENDING_NAME):
                continue
            raise TraceFormatError(
                f"{directory} holds {name!r}, which is neither a chunk nor an index: "
                "not a trace stream's directory",
                chunk=name,
            )
        number = int(found.group(1))
        (sealing if found.group(3) else sealed if found.group(2) else plain).append(number)
    return Listing(sorted(plain), sorted(sealed), sorted(sealing))


def is_stream_file(name: str) -> bool:
    """Whether a file named ``name`` belongs to a stream: a chunk (plain, sealed or being
    sealed) or the index (or an index rewrite's leftover)."""
    return _NAME.match(name) is not None or name in (INDEX_NAME, MENDING_NAME)


def list_chunks(directory: Path) -> list[int]:
    """Chunk numbers present in ``directory``, plain or sealed, in order (gaps are left to
    the reader).

    :raises TraceFormatError: The directory holds a file that belongs to no stream.
    """
    return scan(directory).chunks
