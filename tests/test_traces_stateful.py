"""A stateful test of ``TraceWriter`` against a list model, plain and sealed.

Rules append records of random sizes (tiny values up to ~50 KB strings, non-ASCII and escapes
included) to a stream with a tiny ``chunk_bytes``, so it rolls often and records larger than
``chunk_bytes`` get a chunk of their own; try to append values that cannot be encoded (the
stream must not change); reopen the stream; simulate a crash (cut the last chunk inside its
last record and/or cut the index at any byte); seal chunks (closing with ``seal_on_close``,
or ``_sealed.seal`` on a chunk); simulate a kill in the middle of a seal (a ``.zst.tmp``
leftover of any length, a sealed file renamed into place next to its plain chunk, or a
sealed copy cut short next to it); and read everything back.

The model holds every record's bytes and every index row's bytes: a row the writer wrote
(the record's ``episode_row`` summary, where it is, the step and kind it was given), or one
recovery rebuilt from the data after a crash (the same, with no step and the summary's kind).

The stream is written with ``compress`` drawn once: sealed, each chunk that rolls is sealed
in the background; plain, only the rules above seal chunks. Every rule opens its own
``TraceWriter`` (so every rule is also a reopening) in a fresh event loop, and checks the
``Recovery`` it reports against what the model expects.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import pyzstd
from hypothesis import HealthCheck, event, note, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from streams import chunk_bytes

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
from monitors.traces._index import count_rows
from monitors.traces._layout import (
    chunk_path,
    decode_row,
    encode_row,
    index_path,
    list_chunks,
    scan,
    sealed_path,
    sealing_path,
)
from monitors.traces._sealed import seal
from monitors.traces._summary import episode_row

# -- records ------------------------------------------------------------------------------

_chars = st.characters(exclude_categories=["Cs"])  # orjson refuses lone surrogates
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


def contents(directory: Path) -> dict[str, bytes]:
    """What the stream holds as a reader sees it: the index, and every non-empty chunk's
    bytes, uncompressed (plain or sealed alike; an empty chunk holds nothing)."""
    out = {"index": index_path(directory).read_bytes()}
    for c in list_chunks(directory):
        data = chunk_bytes(directory, c)
        if data:
            out[f"chunk {c}"] = data
    return out


def index_rows(directory: Path) -> int:
    """Whole rows in the index (a torn last one is not a row)."""
    return count_rows(index_path(directory))


def row_bytes(
    value: Any, *, line: int, chunk: int, offset: int, length: int, step: Any, kind: Any
) -> bytes:
    """The index row of a record: its summary, where it is, and the step and kind the
    writer was given (a row rebuilt from the data has no step, and the summary's kind)."""
    fields = {**episode_row(value), "line": line, "offset": offset, "chunk": chunk}
    fields.update(length=length, step=step)
    if kind is not None:
        fields["kind"] = kind
    return encode_row(fields)


def rebuilt_row(row: bytes, record: bytes) -> bytes:
    """The row recovery rebuilds, from the data, for the record whose row was ``row``."""
    old = decode_row(row)
    assert old.length == len(record) + 1
    return row_bytes(
        orjson.loads(record),
        line=old.line,
        chunk=old.chunk,
        offset=old.offset,
        length=old.length,
        step=None,
        kind=None,
    )


def sealed_bytes(plain: bytes) -> bytes:
    """What ``seal`` writes for a chunk holding ``plain``."""
    with tempfile.TemporaryDirectory(prefix="traces-stateful-seal-") as tmp:
        chunk_path(Path(tmp), 0).write_bytes(plain)
        seal(Path(tmp), 0, fsync=False)
        return sealed_path(Path(tmp), 0).read_bytes()


@dataclass(frozen=True)
class Torn:
    """What a simulated kill mid-append left, as the next opening must report it."""

    torn_bytes: int
    torn_row_bytes: int
    dropped_rows: int
    rebuilt_rows: int
    #: The last chunk's size once its torn line is cut (None: the chunk was not cut).
    last_size: int | None


_LEFTOVERS = ["a .zst.tmp leftover", "renamed, the plain one not unlinked", "a sealed copy cut"]


class TraceStreamMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="traces-stateful-"))
        self.dir = self.tmp / "stream"
        self.chunk_bytes = 1000
        self.compress = False
        self.model: list[bytes] = []  # orjson.dumps of each record, in order
        #: The index's rows, as the stream holds them once (re)opened.
        self.rows: list[bytes] = []
        #: What a simulated kill mid-append left, until the next opening mends it.
        self.torn: Torn | None = None
        #: After a crash: bytes of the torn last line the reader must skip, and whether the
        #: last index row still points at the torn record.
        self.torn_tail = 0
        self.dangling_row: int | None = None
        #: Seals a simulated kill cut short, until the next opening settles them: how many
        #: it must undo and finish, and what each chunk must then be ("plain" or "sealed").
        self.seals_undone = 0
        self.seals_finished = 0
        self.outcome: dict[int, str] = {}
        #: Chunks whose start is not a roll decided by a successful append (a failed append
        #: rolled first, a crash cut the chunk's first record, or the chunk before it was
        #: sealed whole, so appends went on in a fresh one): the previous chunk may have had
        #: room for their first line.
        self.loose: set[int] = set()

    def teardown(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)

    @property
    def crashed(self) -> bool:
        """Whether a simulated kill left something for the next opening to mend."""
        return self.torn is not None or bool(self.outcome)

    @initialize(chunk_bytes=st.integers(200, 5000), compress=st.booleans())
    def setup(self, chunk_bytes: int, compress: bool) -> None:
        self.chunk_bytes = chunk_bytes
        self.compress = compress
        self._session(lambda writer: _nothing())

    # -- one writer per rule ---------------------------------------------------------------

    def _expected(self) -> Recovery:
        """What opening the stream now must report, from the files and the crash model."""
        listing = scan(self.dir)
        plain = {c for c in listing.plain if self.outcome.get(c) != "sealed"}
        sealed = {c for c in listing.sealed if self.outcome.get(c) != "plain"} - plain
        chunks = sorted(plain | sealed)
        if chunks and chunks[-1] in plain:
            last = chunks[-1]
            size = chunk_path(self.dir, last).stat().st_size
            if self.torn is not None and self.torn.last_size is not None:
                size = self.torn.last_size
        else:  # appends go on in a fresh chunk after a sealed one
            last, size = (chunks[-1] + 1 if chunks else 0), 0
        torn = self.torn or Torn(0, 0, 0, 0, None)
        return Recovery(
            chunk=last,
            chunk_size=size,
            records=len(self.model),
            torn_bytes=torn.torn_bytes,
            torn_row_bytes=torn.torn_row_bytes,
            dropped_rows=torn.dropped_rows,
            rebuilt_rows=torn.rebuilt_rows,
            seals_undone=self.seals_undone,
            seals_finished=self.seals_finished,
            unsealed=sorted(plain - {last}),
            index_size=sum(map(len, self.rows)),
        )

    def _session(self, body: Any, *, seal_on_close: bool = False) -> Any:
        expected = self._expected()
        if expected.chunk not in list_chunks(self.dir):
            self.loose.add(expected.chunk)

        async def main() -> Any:
            writer = TraceWriter(
                self.dir,
                chunk_bytes=self.chunk_bytes,
                fsync=False,
                compress=self.compress,
                seal_on_close=seal_on_close,
            )
            recovery = await writer.open()
            try:
                note(f"opened: {recovery}")
                if recovery.seals_undone or recovery.seals_finished:
                    event(
                        f"reopened after a kill mid-seal ({'sealed' if self.compress else 'plain'})"
                    )
                assert recovery == expected
                # Settled before open() returned: nothing a seal cut short is left, but what
                # the chunks left plain being sealed in the background may show meanwhile.
                now = scan(self.dir)
                assert set(now.sealing) <= set(recovery.unsealed), now
                assert set(now.plain) & set(now.sealed) <= set(recovery.unsealed), now
                assert writer.records == len(self.model)
                assert len(self.rows) == len(self.model)
                assert index_path(self.dir).read_bytes() == b"".join(self.rows)
                result = await body(writer)
            finally:
                await writer.close()
            assert writer.seal_failures == set()
            return result

        result = anyio.run(main)
        self.torn = None
        self.torn_tail = 0
        self.dangling_row = None
        self.seals_undone = self.seals_finished = 0
        self.outcome = {}
        return result

    # -- rules -----------------------------------------------------------------------------

    @rule(values=st.lists(records, min_size=1, max_size=4), step=st.integers(0, 10**6))
    def append(self, values: list[Any], step: int) -> None:
        async def body(writer: TraceWriter) -> None:
            for value in values:
                line = orjson.dumps(value)
                before = len(self.model)
                row = await writer.append(value, step=step, kind="train")
                self.model.append(line)
                note(f"appended {len(line) + 1} bytes as record {before}: {row}")
                assert writer.records == len(self.model)
                assert row.length == len(line) + 1
                assert (row.line, row.step, row.kind) == (before + 1, step, "train")
                expected = row_bytes(
                    value,
                    line=before + 1,
                    chunk=row.chunk,
                    offset=row.offset,
                    length=row.length,
                    step=step,
                    kind="train",
                )
                assert index_path(self.dir).read_bytes().endswith(expected)
                assert dict(row.fields) == orjson.loads(expected)
                self.rows.append(expected)
                if row.length > self.chunk_bytes:
                    assert row.offset == 0, "a record larger than chunk_bytes starts a chunk"
                else:
                    assert row.end <= self.chunk_bytes
                # Appends go to a plain chunk, sealed or not after it rolls.
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
            # Read as a reader reads it: a chunk sealed meanwhile holds the same bytes.
            before = contents(self.dir)
            chunks = list_chunks(self.dir)
            with pytest.raises(encoder.EncodeError):
                await writer.append(bad)
            assert writer.records == len(self.model)
            assert contents(self.dir) == before, "a failed append changed the stream"
            added = set(list_chunks(self.dir)) - set(chunks)
            self.loose |= added
            # The writer goes on as if nothing happened.
            assert writer.records == len(self.model)

        self._session(body)

    @rule(data=st.data())
    def reopen(self, data: st.DataObject) -> None:
        """Reopen the stream, often right after a kill in the middle of a seal."""
        if data.draw(st.booleans(), label="killed mid-seal first"):
            self._kill_mid_seal(data)
        self._session(lambda writer: _nothing())

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data())
    def crash(self, data: st.DataObject) -> None:
        """Leave what a process killed mid-append could leave: the last record cut anywhere
        before its newline, and/or the index cut at any byte (rows not yet written)."""
        n = len(self.model)
        listing = scan(self.dir)
        chunks = listing.chunks
        last = chunks[-1]
        cut_data = False
        torn = 0
        last_size: int | None = None
        if n:
            row = read_row(self.dir, -1)
            # A killed process can only tear the chunk being written: a chunk that rolled
            # was complete before the next one started (a machine going down can tear one
            # whose fsync had not finished: test_a_torn_rolled_chunk_is_cut_on_reopening),
            # and a sealed one was whole before it was renamed into place.
            if (
                row.chunk == last
                and last in listing.plain
                and data.draw(st.booleans(), label="cut last record")
            ):
                cut_data = True
                at = data.draw(st.integers(row.offset, row.end - 1), label="cut at")
                os.truncate(chunk_path(self.dir, last), at)
                last_size = row.offset  # what recovery keeps: up to the last newline
                torn = at - row.offset
                if row.offset == 0 and last != chunks[0]:
                    self.loose.add(last)
        index = b"".join(self.rows)
        assert index_path(self.dir).read_bytes() == index
        cut_index = len(index)
        if data.draw(st.booleans(), label="cut index"):
            cut_index = data.draw(st.integers(0, len(index)), label="index cut at")
            os.truncate(index_path(self.dir), cut_index)
        whole = index.rfind(b"\n", 0, cut_index) + 1  # the rows left whole end there
        kept = index[:whole].count(b"\n")
        survivors = n - 1 if cut_data else n
        dropped = 1 if cut_data and kept == n else 0
        note(f"crash: cut_data={cut_data} torn={torn} index cut at {cut_index} of {len(index)}")
        # Once reopened: the rows left whole and pointing at data, then rows rebuilt from
        # the records that survived.
        left = kept - dropped
        self.rows = self.rows[:left] + [
            rebuilt_row(self.rows[i], self.model[i]) for i in range(left, survivors)
        ]
        self.torn = Torn(
            torn_bytes=torn,
            torn_row_bytes=cut_index - whole,
            dropped_rows=dropped,
            rebuilt_rows=survivors - (kept - dropped),
            last_size=last_size,
        )
        self.torn_tail = torn
        self.dangling_row = n - 1 if dropped else None
        if cut_data:
            self.model.pop()

    @precondition(lambda self: not self.crashed)
    @rule(data=st.data())
    def seal_chunks(self, data: st.DataObject) -> None:
        """Seal the live chunk by closing with ``seal_on_close`` (sealed streams), or one
        plain chunk with data (the live one, or one a plain stream left) by ``seal``."""
        listing = scan(self.dir)
        full = [c for c in listing.plain if chunk_path(self.dir, c).stat().st_size]
        ways = (["close"] if self.compress else []) + (["seal()"] if full else [])
        if not ways:
            return
        way = data.draw(st.sampled_from(ways), label="seal by")
        event(f"seal by {way}")
        if way == "close":
            self._session(lambda writer: _nothing(), seal_on_close=True)
            after = scan(self.dir)
            note(f"sealed on close: {after}")
            assert after.sealing == []
            assert after.sealed == [c for c in after.chunks if chunk_bytes(self.dir, c)]
            return
        chunk = data.draw(st.sampled_from(full), label="seal chunk")
        plain = chunk_path(self.dir, chunk).read_bytes()
        size = seal(self.dir, chunk, fsync=False)
        note(f"sealed chunk {chunk}: {len(plain)} bytes in {size}")
        assert not chunk_path(self.dir, chunk).exists()
        assert not sealing_path(self.dir, chunk).exists()
        assert sealed_path(self.dir, chunk).stat().st_size == size
        assert pyzstd.decompress(sealed_path(self.dir, chunk).read_bytes()) == plain

    @precondition(lambda self: self.dir.exists())
    @rule(data=st.data())
    def crash_mid_seal(self, data: st.DataObject) -> None:
        self._kill_mid_seal(data)

    def _kill_mid_seal(self, data: st.DataObject) -> None:
        """Leave what a process killed while sealing a chunk could leave: the sealed file
        still being written (``.zst.tmp``, cut anywhere), or renamed into place with the
        plain chunk not yet unlinked; or a sealed copy cut short next to a whole plain chunk
        (not a kill's doing: recovery trusts the plain one and seals it again)."""
        listing = scan(self.dir)
        last = listing.chunks[-1]
        candidates = [
            c
            for c in listing.chunks
            # A kill mid-append tears the live chunk: it was not being sealed then.
            if c not in self.outcome and (c != last or self.torn is None)
            if chunk_bytes(self.dir, c)
        ]
        if not candidates:
            return
        chunk = data.draw(st.sampled_from(candidates), label="chunk mid-seal")
        left = data.draw(st.sampled_from(_LEFTOVERS), label="left")
        event(f"killed mid-seal: {left}")
        plain = chunk_bytes(self.dir, chunk)
        sealed = sealed_path(self.dir, chunk)
        whole = sealed.read_bytes() if sealed.exists() else sealed_bytes(plain)
        chunk_path(self.dir, chunk).write_bytes(plain)
        if left == "a .zst.tmp leftover":
            sealed.unlink(missing_ok=True)
            cut = data.draw(st.integers(0, len(whole)), label="sealing bytes")
            sealing_path(self.dir, chunk).write_bytes(whole[:cut])
            self.seals_undone += 1
            self.outcome[chunk] = "plain"
        elif left == "renamed, the plain one not unlinked":
            sealed.write_bytes(whole)
            self.seals_finished += 1
            self.outcome[chunk] = "sealed"
        else:
            cut = data.draw(st.integers(0, len(whole) - 1), label="sealed bytes")
            sealed.write_bytes(whole[:cut])
            self.seals_undone += 1
            self.outcome[chunk] = "plain"
        note(f"killed sealing chunk {chunk}: {left}; now {scan(self.dir)}")

    @rule()
    def read_back(self) -> None:
        reader = TraceReader(self.dir)
        got = [orjson.dumps(r) for r in reader]
        assert got == self.model
        assert reader.records == len(self.model)
        assert reader.skipped == 0
        assert reader.torn_tail_bytes == self.torn_tail
        assert [orjson.dumps(r) for r in read_records(self.dir)] == self.model
        n = len(self.model)
        if self.torn is None:
            assert index_rows(self.dir) == n
            usable = n
        else:  # not reopened since the crash: the index may be short, or one row too long
            usable = min(n, index_rows(self.dir))
        if self.dangling_row is not None:
            with pytest.raises(TraceFormatError):
                read_record(self.dir, self.dangling_row)
        # Every index row points at its record, in a plain or a sealed chunk.
        for i in range(usable):
            assert orjson.dumps(read_record(self.dir, i)) == self.model[i], i
            if self.torn is None:
                assert read_row(self.dir, i).fields == orjson.loads(self.rows[i]), i
        if self.torn is None:
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
        listing = scan(self.dir)
        chunks = listing.chunks
        assert chunks == list(range(len(chunks))), f"chunk numbers have gaps: {chunks}"
        contents = [chunk_bytes(self.dir, c) for c in chunks]
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
        # A sealed chunk holds its plain bytes, as zstd's own decoder reads it (but the
        # sealed copy a simulated crash cut short).
        for c in listing.sealed:
            if self.outcome.get(c) != "plain":
                assert pyzstd.decompress(sealed_path(self.dir, c).read_bytes()) == contents[c]
        if not self.outcome:
            assert listing.sealing == [], f"a seal left its temporary file: {listing}"
            assert not set(listing.plain) & set(listing.sealed), f"plain and sealed: {listing}"
            if self.compress:
                # Every chunk that rolled was sealed: only the live one is plain.
                assert set(listing.plain) <= {chunks[-1]}, listing


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
