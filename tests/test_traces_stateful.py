"""A stateful test of ``TraceWriter`` against a list model.

Rules append records of random sizes (tiny values up to ~50 KB strings, non-ASCII and escapes
included) to a stream with a tiny ``chunk_bytes``, so it rolls often and records larger than
``chunk_bytes`` get a chunk of their own; try to append values that cannot be encoded (the
stream must not change); reopen the stream; simulate a crash (cut the last chunk inside its
last record and/or cut the index at any byte); and read everything back.

Every rule opens its own ``TraceWriter`` (so every rule is also a reopening) in a fresh event
loop, and checks the ``Recovery`` it reports against what the model expects.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from hypothesis import HealthCheck, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

import encoder
from monitors import TraceFormatError
from monitors.traces import (
    Recovery,
    TraceReader,
    TraceWriter,
    read_record,
    read_records,
    read_row,
)
from monitors.traces._layout import INDEX_NAME, ROW_BYTES, chunk_path, list_chunks

# -- records ------------------------------------------------------------------------------

_chars = st.characters(blacklist_categories=("Cs",))  # orjson refuses lone surrogates
_text = st.text(_chars, max_size=10)
_tricky = st.sampled_from(
    ['"', "\\", "\n", "\r\t", "\x00", "\x1f", "\x7f", "é", "漢字", "🙂", "\u2028", 'a"b\\c\n']
)
_piece = st.one_of(_text.filter(bool), _tricky)
_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False, allow_infinity=False),
    _text,
    _tricky,
)
_small = st.recursive(
    _scalars,
    lambda kids: st.one_of(st.lists(kids, max_size=4), st.dictionaries(_text, kids, max_size=4)),
    max_leaves=10,
)
_MAX_CHARS = 50_000


def _big_record(piece: str, reps: int, key: str, extra: Any) -> Any:
    reps = max(1, min(reps, _MAX_CHARS // len(piece)))
    return {key: piece * reps, "extra": extra}


# Sizes from a few bytes to ~50 KB (up to ~300 KB of JSON for escaped control characters).
_big = st.builds(_big_record, _piece, st.integers(1, _MAX_CHARS), _text, _small)
_medium = st.builds(_big_record, _piece, st.integers(1, 300), _text, _small)
records = st.one_of(_small, _medium, _big)


# -- helpers ------------------------------------------------------------------------------


def snapshot(directory: Path) -> dict[str, bytes]:
    """Every non-empty file of the stream (an empty chunk holds no bytes)."""
    out = {}
    for name in sorted(os.listdir(directory)):
        data = (directory / name).read_bytes()
        if data:
            out[name] = data
    return out


def index_rows(directory: Path) -> int:
    return (directory / INDEX_NAME).stat().st_size // ROW_BYTES


class TraceStreamMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="traces-stateful-"))
        self.dir = self.tmp / "stream"
        self.chunk_bytes = 1000
        self.model: list[bytes] = []  # orjson.dumps of each record, in order
        #: What the next opening must report after a simulated crash (None: nothing to mend).
        self.expected: Recovery | None = None
        #: After a crash: bytes of the torn last line the reader must skip, and whether the
        #: last index row still points at the torn record.
        self.torn_tail = 0
        self.dangling_row: int | None = None
        #: Chunks whose start is not a roll decided by a successful append (a failed append
        #: rolled first, or a crash cut the chunk's first record): the previous chunk may
        #: have had room for their first line.
        self.loose: set[int] = set()

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    @initialize(chunk_bytes=st.integers(200, 5000))
    def setup(self, chunk_bytes: int) -> None:
        self.chunk_bytes = chunk_bytes
        self._session(lambda writer: _nothing())

    # -- one writer per rule ---------------------------------------------------------------

    def _session(self, body: Any) -> Any:
        async def main() -> Any:
            writer = TraceWriter(self.dir, chunk_bytes=self.chunk_bytes, fsync=False)
            recovery = await writer.open()
            try:
                self._check_recovery(recovery, writer)
                return await body(writer)
            finally:
                await writer.close()

        return anyio.run(main)

    def _check_recovery(self, recovery: Recovery, writer: TraceWriter) -> None:
        note(f"opened: {recovery}")
        chunks = list_chunks(self.dir)
        if self.expected is None:
            assert not recovery.mended, recovery
            assert recovery.records == len(self.model)
            assert recovery.chunk == chunks[-1]
            assert recovery.chunk_size == chunk_path(self.dir, chunks[-1]).stat().st_size
        else:
            assert recovery == self.expected
            self.expected = None
            self.torn_tail = 0
            self.dangling_row = None
        assert writer.records == len(self.model)
        assert index_rows(self.dir) == len(self.model)
        assert (self.dir / INDEX_NAME).stat().st_size % ROW_BYTES == 0

    # -- rules -----------------------------------------------------------------------------

    @rule(values=st.lists(records, min_size=1, max_size=4), step=st.integers(0, 10**6))
    def append(self, values: list[Any], step: int) -> None:
        async def body(writer: TraceWriter) -> None:
            for value in values:
                line = orjson.dumps(value)
                before = len(self.model)
                row = await writer.append(value, step=step, kind="train", subset="all")
                self.model.append(line)
                note(f"appended {len(line) + 1} bytes as record {before}: {row}")
                assert writer.records == len(self.model)
                assert row.length == len(line) + 1
                assert (row.step, row.kind, row.subset) == (step, "train", "all")
                if row.length > self.chunk_bytes:
                    assert row.offset == 0, "a record larger than chunk_bytes starts a chunk"
                else:
                    assert row.end <= self.chunk_bytes
                data = chunk_path(self.dir, row.chunk).read_bytes()
                assert data[row.offset : row.end] == line + b"\n"
                assert read_row(self.dir, before) == row

        self._session(body)

    @rule(
        value=records,
        shape=st.sampled_from(["after", "after megabytes", "before", "deep"]),
        piece=_piece,
    )
    def append_unencodable(self, value: Any, shape: str, piece: str) -> None:
        bad: Any
        if shape == "after":
            bad = {"ok": value, "bad": object()}
        elif shape == "after megabytes":  # a MiB or more is written before the error comes
            bad = {"ok": value, "big": piece * (1_500_000 // len(piece)), "bad": object()}
        elif shape == "before":
            bad = [object(), value]
        else:
            bad = {"a": [value, {"b": {1, 2}}]}

        async def body(writer: TraceWriter) -> None:
            before = snapshot(self.dir)
            chunks = list_chunks(self.dir)
            with pytest.raises(encoder.EncodeError):
                await writer.append(bad)
            assert writer.records == len(self.model)
            assert snapshot(self.dir) == before, "a failed append changed the stream"
            added = set(list_chunks(self.dir)) - set(chunks)
            self.loose |= added
            # The writer goes on as if nothing happened.
            assert writer.records == len(self.model)

        self._session(body)

    @rule()
    def reopen(self) -> None:
        self._session(lambda writer: _nothing())

    @precondition(lambda self: self.expected is None)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """Leave what a process killed mid-append could leave: the last record cut anywhere
        before its newline, and/or index.jsonl cut at any byte (rows not yet written)."""
        n = len(self.model)
        chunks = list_chunks(self.dir)
        last = chunks[-1]
        last_size = chunk_path(self.dir, last).stat().st_size
        cut_data = False
        torn = 0
        if n:
            row = read_row(self.dir, -1)
            # A killed process can only tear the chunk being written: a chunk that rolled
            # was complete before the next one started (a machine going down can tear one
            # whose fsync had not finished: test_a_torn_rolled_chunk_is_cut_on_reopening).
            if row.chunk == last and data.draw(st.booleans(), label="cut last record"):
                cut_data = True
                at = data.draw(st.integers(row.offset, row.end - 1), label="cut at")
                os.truncate(chunk_path(self.dir, last), at)
                last_size = row.offset  # what recovery keeps: up to the last newline
                torn = at - row.offset
                if row.offset == 0 and last != chunks[0]:
                    self.loose.add(last)
        index_size = n * ROW_BYTES
        cut_index = index_size
        if data.draw(st.booleans(), label="cut index"):
            cut_index = data.draw(st.integers(0, index_size), label="index cut at")
            os.truncate(self.dir / INDEX_NAME, cut_index)
        kept = cut_index // ROW_BYTES
        survivors = n - 1 if cut_data else n
        dropped = 1 if cut_data and kept == n else 0
        note(f"crash: cut_data={cut_data} torn={torn} index cut at {cut_index} of {index_size}")
        self.expected = Recovery(
            chunk=last,
            chunk_size=last_size,
            records=survivors,
            torn_bytes=torn,
            torn_row_bytes=cut_index % ROW_BYTES,
            dropped_rows=dropped,
            rebuilt_rows=survivors - (kept - dropped),
        )
        self.torn_tail = torn
        self.dangling_row = n - 1 if dropped else None
        if cut_data:
            self.model.pop()

    @rule(data=st.data())
    def read_back(self, data: st.DataObject) -> None:
        reader = TraceReader(self.dir)
        got = [orjson.dumps(r) for r in reader]
        assert got == self.model
        assert reader.records == len(self.model)
        assert reader.skipped == 0
        assert reader.torn_tail_bytes == self.torn_tail
        assert [orjson.dumps(r) for r in read_records(self.dir)] == self.model
        n = len(self.model)
        if self.expected is None:
            assert index_rows(self.dir) == n
            usable = n
        else:  # not reopened since the crash: the index may be short, or one row too long
            usable = min(n, index_rows(self.dir))
        if self.dangling_row is not None:
            with pytest.raises(TraceFormatError):
                read_record(self.dir, self.dangling_row)
        if usable:
            for i in data.draw(st.lists(st.integers(0, usable - 1), max_size=4), label="i"):
                assert orjson.dumps(read_record(self.dir, i)) == self.model[i]
        if self.expected is None:
            if n:
                assert orjson.dumps(read_record(self.dir, -1)) == self.model[-1]
                assert orjson.dumps(read_record(self.dir, -n)) == self.model[0]
            for i in (n, -n - 1):
                with pytest.raises(IndexError):
                    read_record(self.dir, i)

    # -- invariants ------------------------------------------------------------------------

    @invariant()
    def chunks_are_well_formed(self) -> None:
        if not self.dir.exists():
            return
        chunks = list_chunks(self.dir)
        assert chunks == list(range(len(chunks))), f"chunk numbers have gaps: {chunks}"
        contents = [chunk_path(self.dir, c).read_bytes() for c in chunks]
        for c, data in zip(chunks, contents, strict=True):
            lines = data.count(b"\n") + (0 if data.endswith(b"\n") or not data else 1)
            if c != chunks[-1]:
                assert data.endswith(b"\n"), f"chunk {c} (not the last) does not end a line"
            assert len(data) <= self.chunk_bytes or lines == 1, (
                f"chunk {c} holds {len(data)} bytes > {self.chunk_bytes} in {lines} records"
            )
        # A chunk rolled only because its next line would not fit.
        for c in chunks[:-1]:
            nxt = contents[c + 1]
            if c + 1 in self.loose or not nxt:
                continue
            first = nxt.index(b"\n") + 1 if b"\n" in nxt else len(nxt)
            assert len(contents[c]) + first > self.chunk_bytes, (
                f"chunk {c} rolled at {len(contents[c])} bytes although the next line "
                f"({first} bytes) fit in {self.chunk_bytes}"
            )


async def _nothing() -> None:
    return None


TestTraceStream = TraceStreamMachine.TestCase
TestTraceStream.settings = settings(
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
        HealthCheck.filter_too_much,
    ],
)
