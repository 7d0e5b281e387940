"""The on-disk layout of a trace stream, prime-rl's: numbered chunk files in a directory,
and an index of one JSON row per record beside it.

```
traces/stream/00000.jsonl.zst   a sealed chunk: zstd's seekable format, same bytes as the plain one
traces/stream/00001.jsonl       a plain chunk: one record per line, at most chunk_bytes (a larger
                                record gets its own)
traces/stream.index.jsonl       one row per record, in order: where it is (line from 1, chunk,
                                offset, length) and what it is (prime-rl's index_row fields)
```

Nothing else lives in the directory, so prime-rl's reader (which globs ``*.jsonl*`` and reads
a chunk number off each name) reads it. A seal writes ``NNNNN.jsonl.zst.tmp`` until it is
renamed into place; for a moment both the plain and the sealed chunk may be present
(docs/design.md D9). A reader skips the ``.tmp`` file: it is never a chunk.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from ..errors import TraceFormatError

__all__ = [
    "INDEX_SUFFIX",
    "RUN_ANNOTATIONS",
    "RUN_STREAM",
    "IndexRow",
    "Listing",
    "annotations_of",
    "chunk_path",
    "decode_row",
    "encode_row",
    "index_path",
    "is_stream_file",
    "list_chunks",
    "mending_path",
    "scan",
    "sealed_path",
    "sealing_path",
    "stream_of",
]

#: The index of stream ``DIR`` is ``DIR`` + this, beside it.
INDEX_SUFFIX = ".index.jsonl"
#: A run directory's stream of episodes, and its annotation streams, below the run's.
RUN_STREAM = Path("monitors", "file", "traces", "stream")
RUN_ANNOTATIONS = Path("monitors", "file", "traces", "annotations")
_NAME = re.compile(r"(\d{5,})\.jsonl(\.zst(\.tmp)?)?\Z")
_ROW_OPTION = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY | orjson.OPT_NON_STR_KEYS


def index_path(directory: Path) -> Path:
    """The index of the stream in ``directory``: ``<directory>.index.jsonl`` beside it."""
    return directory.parent / (directory.name + INDEX_SUFFIX)


def stream_of(path: str | os.PathLike[str]) -> Path:
    """The stream a path names: a run directory's (``RUN/monitors/file/traces/stream``)
    when it is a run directory (it holds one), else the path itself, a stream's directory."""
    path = Path(path)
    inside = path / RUN_STREAM
    return inside if inside.is_dir() else path


def annotations_of(stream: Path) -> Path:
    """Where the annotation streams of a stream live: ``annotations/`` beside it."""
    return stream.parent / "annotations"


def mending_path(directory: Path) -> Path:
    """Where an index rewrite is written before it replaces the index (see _recovery)."""
    index = index_path(directory)
    return index.with_name(index.name + ".mending")


@dataclass(frozen=True)
class IndexRow:
    """One index row: where a record lives, and the rest of what its row says.

    Offsets are those of the plain chunk, whether the chunk is sealed or not.

    :param line: The record's number in the stream, from 1 (None in a row that has none,
        as prime-rl's annotation rows).
    :param chunk: The chunk file's number.
    :param offset: The record's first byte in the (uncompressed) chunk.
    :param length: The record's bytes, its newline included; None in a row prime-rl wrote
        (the record is then the line at ``offset``).
    :param step: The training step it was logged at, if given.
    :param kind: Its kind (``"train"``, ``"eval"``), if known.
    :param id: The record's own ``"id"``, if it has one.
    :param fields: The whole row, as written.
    """

    line: int | None
    chunk: int
    offset: int
    length: int | None = None
    step: int | None = None
    kind: str | None = None
    id: Any = None
    fields: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @property
    def end(self) -> int | None:
        """The offset just past the record's newline (None when the row has no length)."""
        return None if self.length is None else self.offset + self.length


def encode_row(fields: Mapping[str, Any]) -> bytes:
    """One index row as the line written (orjson, ``default=str`` as prime-rl's)."""
    return orjson.dumps(fields, default=str, option=_ROW_OPTION)


def _int(value: Any) -> int:
    if type(value) is not int or value < 0:
        raise TypeError(f"{value!r} is not a position")
    return value


def decode_row(data: bytes) -> IndexRow:
    """Parse one row (raises ValueError on anything that is not a row: a row needs an int
    ``chunk`` and ``offset``; ``line`` and ``length``, when present, are ints too)."""
    try:
        value: Any = orjson.loads(data)
        line, length, step = value.get("line"), value.get("length"), value.get("step")
        return IndexRow(
            line=None if line is None else _int(line),
            chunk=_int(value["chunk"]),
            offset=_int(value["offset"]),
            length=None if length is None else _int(length),
            step=step if type(step) is int else None,
            kind=value.get("kind"),
            id=value.get("id"),
            fields=value,
        )
    except (orjson.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
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

    :raises TraceFormatError: A file that is neither a chunk nor a sealing leftover: the
        directory is not (only) a trace stream.
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
            raise TraceFormatError(
                f"{directory} holds {name!r}, which is not a chunk: not a trace stream's "
                "directory (nothing else may live there, or prime-rl's readers fail)",
                chunk=name,
            )
        number = int(found.group(1))
        (sealing if found.group(3) else sealed if found.group(2) else plain).append(number)
    return Listing(sorted(plain), sorted(sealed), sorted(sealing))


def is_stream_file(name: str) -> bool:
    """Whether a file named ``name`` is a chunk of a stream (plain, sealed or being sealed)."""
    return _NAME.match(name) is not None


def list_chunks(directory: Path) -> list[int]:
    """Chunk numbers present in ``directory``, plain or sealed, in order (gaps are left to
    the reader).

    :raises TraceFormatError: The directory holds a file that belongs to no stream.
    """
    return scan(directory).chunks
