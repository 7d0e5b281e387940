"""The outbox: a run's trace stream uploaded from the disk, with a cursor of what the service
has answered for good (docs/design.md D18).

```
RUN/monitors/file/traces/stream/                   the stream (the queue)
RUN/monitors/file/traces/stream.index.jsonl        its index (read as it grows)
RUN/monitors/file/traces/stream.uploads/RUN_ID.json     the cursor of the upload to RUN_ID
RUN/monitors/file/traces/stream.uploads/RUN_ID.lock     held by the one uploader at work
```

Batches are a pure function of the stream: consecutive lines of one kind and one step, up to
the batch limits. So a batch sent again after a crash, or after the cursor was lost, has the
same lines, the same bytes and the same ``Idempotency-Key``, and the service keeps one copy.
Everything here blocks: call it in a worker thread.
"""

from __future__ import annotations

import bisect
import errno
import fcntl
import os
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import orjson

from ..errors import UploadError
from ..records import Kind
from ..traces._index import Growing
from ..traces._layout import RUN_STREAM, IndexRow, decode_row, index_path

__all__ = [
    "CURSOR_VERSION",
    "Cursor",
    "Tail",
    "cursor_path",
    "kind_of",
    "known_run_ids",
    "outbox_stream",
    "uploads_dir",
    "wanted",
]

CURSOR_VERSION = 1
_BLOCK = 1 << 20


def outbox_stream(path: Path) -> Path:
    """The stream an outbox path names: a stream's directory (one with an index beside it),
    else a run directory's stream, which a file monitor starting later may create."""
    if (path / RUN_STREAM).is_dir() or not index_path(path).exists():
        return path / RUN_STREAM
    return path


def uploads_dir(stream: Path) -> Path:
    """Where the cursors of a stream's uploads live: beside the stream, as its index."""
    return stream.with_name(stream.name + ".uploads")


def cursor_path(stream: Path, run_id: str) -> Path:
    """The cursor of the upload of ``stream`` to run ``run_id``."""
    return uploads_dir(stream) / (quote(run_id, safe="") + ".json")


def known_run_ids(stream: Path) -> list[str]:
    """The run ids the stream has cursors for (a restart with no run id takes the one)."""
    try:
        names = sorted(os.listdir(uploads_dir(stream)))
    except FileNotFoundError:
        return []
    return [unquote(name[: -len(".json")]) for name in names if name.endswith(".json")]


class Cursor:
    """What the service has answered for good of one stream's upload to one run: the line
    ranges settled (stored, or rejected for good with a code), and how many of each.

    :param path: The cursor's file.
    :param run_id: The run the lines go to.
    """

    def __init__(self, path: Path, run_id: str) -> None:
        self.path = path
        self.run_id = run_id
        self._starts: list[int] = []  # disjoint ranges, sorted, never adjacent
        self._ends: list[int] = []
        self.delivered = 0
        self.lost: Counter[str] = Counter()
        self._lock_fd = -1

    def read(self) -> str | None:
        """Read the cursor's file (none: nothing settled yet). Returns what was wrong with
        the file when it could not be read: then nothing is settled, so every line is sent
        again, each batch under the key it had, and the service answers for those it holds.
        """
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return None
        try:
            value: Any = orjson.loads(data)
            if value.get("version") != CURSOR_VERSION or value.get("run_id") != self.run_id:
                raise ValueError(f"not a version {CURSOR_VERSION} cursor of run {self.run_id!r}")
            ranges = value["settled"]
            delivered, lost = value["delivered"], value["lost"]
            if type(delivered) is not int or not isinstance(lost, dict):
                raise ValueError("bad counts")
            for first, last in ranges:
                if type(first) is not int or type(last) is not int or not 1 <= first <= last:
                    raise ValueError(f"bad range {[first, last]!r}")
                self._add(first, last)
            self.delivered = delivered
            self.lost = Counter({str(k): int(v) for k, v in lost.items()})
        except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
            self._starts, self._ends, self.delivered, self.lost = [], [], 0, Counter()
            return f"{self.path} is damaged ({exc})"
        return None

    # -- the ranges ----------------------------------------------------------------------

    def _add(self, first: int, last: int) -> None:
        starts, ends = self._starts, self._ends
        i = bisect.bisect_left(ends, first - 1)  # the first range that may touch
        j = bisect.bisect_right(starts, last + 1)  # past the last one that may touch
        if i < j:
            first, last = min(first, starts[i]), max(last, ends[j - 1])
        starts[i:j] = [first]
        ends[i:j] = [last]

    def settled_through(self, line: int) -> int | None:
        """The last line of the settled range holding ``line``; None when it is not settled."""
        i = bisect.bisect_right(self._starts, line) - 1
        if i >= 0 and self._ends[i] >= line:
            return self._ends[i]
        return None

    def ranges(self) -> list[tuple[int, int]]:
        return list(zip(self._starts, self._ends, strict=True))

    def settle(self, first: int, last: int, *, delivered: int, lost: Mapping[str, int]) -> None:
        """Lines ``first`` to ``last`` were answered for good: ``delivered`` stored, the
        rest lost by reason."""
        self._add(first, last)
        self.delivered += delivered
        self.lost.update({k: v for k, v in lost.items() if v})

    # -- the file ------------------------------------------------------------------------

    def encode(self) -> bytes:
        return orjson.dumps(
            {
                "version": CURSOR_VERSION,
                "run_id": self.run_id,
                "settled": self.ranges(),
                "delivered": self.delivered,
                "lost": dict(sorted(self.lost.items())),
            }
        )

    def save(self, data: bytes | None = None) -> None:
        """Write the cursor (``data``: a snapshot ``encode`` took) so that a crash at any
        moment leaves the old one or the new one: a temporary file, fsynced, renamed over
        it, and the directory fsynced.

        :raises OSError: The disk refused (the old cursor stays).
        """
        data = self.encode() if data is None else data
        temporary = self.path.with_name(self.path.name + ".tmp")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.path)
        directory = os.open(self.path.parent, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)

    def lock(self) -> None:
        """Hold the cursor's lock file for this process (released by ``unlock`` or exit).

        :raises UploadError: Another uploader holds it.
        """
        self.path.parent.mkdir(parents=True, exist_ok=True)
        lock = self.path.with_suffix(".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EACCES):
                raise UploadError(
                    f"another uploader is uploading this stream to run {self.run_id!r} "
                    f"(it holds {lock})"
                ) from exc
            raise
        self._lock_fd = fd

    def unlock(self) -> None:
        if self._lock_fd >= 0:
            os.close(self._lock_fd)  # closing the descriptor releases the lock
            self._lock_fd = -1


def kind_of(row: IndexRow) -> Kind:
    """A row's kind, as the stamp names it (a row without one is a training episode)."""
    return "eval" if row.kind == "eval" else "train"


def wanted(row: IndexRow, cursor: Cursor, kind: Kind | None) -> bool:
    """Whether an upload sends ``row``'s record: a line not settled in ``cursor``, of
    ``kind`` (None: any)."""
    if row.line is None or cursor.settled_through(row.line) is not None:
        return False
    return kind is None or kind_of(row) == kind


class Tail:
    """The rows of a stream's index, read as the index grows, at most ``_BLOCK`` bytes at a
    time: a row is taken once its newline is written. An index rewritten meanwhile (a
    writer's recovery) is read again from its start, rows already taken passed over.

    ``skipped`` lists the line ranges no readable row named (a damaged row): warned about,
    never silently passed over.
    """

    def __init__(self, stream: Path) -> None:
        self.index = index_path(stream)
        self.next_line = 1
        self.skipped: list[tuple[int, int]] = []
        self._growing = Growing(self.index, block=_BLOCK)

    def read(self) -> list[IndexRow]:
        """The rows appended since the last call (none when nothing new is complete)."""
        _, lines = self._growing.read()
        rows = []
        for raw in lines:
            try:
                row = decode_row(raw)
            except ValueError:
                continue  # a damaged row: its line shows as a gap at the next good one
            if row.line is None or row.line < self.next_line:
                continue  # taken already (an index read again from its start)
            if row.line > self.next_line:
                self.skipped.append((self.next_line, row.line - 1))
            self.next_line = row.line + 1
            rows.append(row)
        return rows

    def rows(self) -> Iterator[IndexRow]:
        """Every row from here to the index's end as it is now."""
        while rows := self.read():
            yield from rows
