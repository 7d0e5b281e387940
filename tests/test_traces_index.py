"""The index beside a trace stream (``<dir>.index.jsonl``, prime-rl's rows): rows found by
number and by id against a model, ids hidden in other fields, streams prime-rl wrote (rows
without ``length`` or ``step``, a seal left half done), and indexes a crash or a bad disk
left behind, deleted or with a row that is not JSON."""

from __future__ import annotations

import dataclasses
import os
import tempfile
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import pyzstd
from hypothesis import given, note
from hypothesis import strategies as st
from streams import cut_index, index_lines, index_rows

from monitors import TraceFormatError
from monitors.traces import (
    IndexRow,
    Recovery,
    TraceWriter,
    find_record,
    find_row,
    read_record,
    read_records,
    read_row,
)
from monitors.traces._layout import (
    RUN_STREAM,
    chunk_path,
    index_path,
    list_chunks,
    scan,
    sealed_path,
    sealing_path,
)
from monitors.traces._summary import episode_row


def write(directory: Path, values: list[Any], **kwargs: Any) -> list[IndexRow]:
    """Append ``values`` to a new stream and return their rows."""

    async def main() -> list[IndexRow]:
        async with TraceWriter(directory, fsync=False, **kwargs) as writer:
            return [await writer.append(v) for v in values]

    return anyio.run(main)


def reopen(
    directory: Path, extra: tuple[Any, ...] | list[Any] = (), **kwargs: Any
) -> tuple[Recovery, list[IndexRow]]:
    """Reopen the stream (mending it), append ``extra``; return the recovery and the rows."""

    async def main() -> tuple[Recovery, list[IndexRow]]:
        async with TraceWriter(directory, fsync=False, **kwargs) as writer:
            assert writer.recovery is not None
            return writer.recovery, [await writer.append(v) for v in extra]

    return anyio.run(main)


def first_with_id(values: list[Any], record_id: str) -> int | None:
    for n, value in enumerate(values):
        if isinstance(value, dict) and type(value.get("id")) is str and value["id"] == record_id:
            return n
    return None


def check_lookups(directory: Path, values: list[Any], rows: list[IndexRow], ids: set[str]) -> None:
    """Every row by number (from the start and from the end), every id in ``ids`` by id
    (its first record, or KeyError), as the model says."""
    total = len(values)
    for n in range(total):
        row = read_row(directory, n)
        assert row == rows[n], n
        assert row.line == n + 1
        assert read_row(directory, n - total) == rows[n]
        assert orjson.dumps(read_record(directory, n)) == orjson.dumps(values[n])
    for bad in (total, total + 1, -total - 1, -total - 7):
        with pytest.raises(IndexError):
            read_row(directory, bad)
        with pytest.raises(IndexError):
            read_record(directory, bad)
    for record_id in ids:
        first = first_with_id(values, record_id)
        if first is None:
            with pytest.raises(KeyError):
                find_row(directory, record_id)
            with pytest.raises(KeyError):
                find_record(directory, record_id)
        else:
            assert find_row(directory, record_id) == (first, rows[first]), record_id
            assert orjson.dumps(find_record(directory, record_id)) == orjson.dumps(values[first])


# -- rows by number and by id, against a model --------------------------------------------

_ids = st.one_of(
    st.text(st.characters(exclude_categories=["Cs"]), max_size=12),
    st.sampled_from(
        [
            "",
            "x",
            '"',
            "\\",
            "\\\\",
            '"id":"x",',
            'x","id":"y',
            "\n",
            "\u2028",
            "\x00",
            "🙂",
            "é漢",
            'a"b\\c\n',
            "x" * 5000,  # a row longer than last_row's read block
            '"\\' * 2000,
        ]
    ),
)


def _decoy(real: str, kind: int) -> dict[str, Any]:
    """A record that is not ``real``'s, but whose row holds ``"id":<real>,`` elsewhere (or
    the same as escaped text), before the record with that id."""
    needle = '"id":' + orjson.dumps(real).decode() + ","
    if kind == 0:
        return {"id": needle, "env": {"name": needle}, "traces": [{"id": needle}]}
    if kind == 1:
        return {"env": {"name": {"id": real, "k": 1}}, "group": {"id": {"id": real, "z": [1]}}}
    return {
        "id": real + "-not",
        "traces": [{"id": {"id": real, "q": 0}, "stop_condition": {"id": real, "s": 1}}],
    }


_ints = st.integers(-(2**63), 2**64 - 1)


@st.composite
def _values(draw: st.DrawFn) -> tuple[list[Any], set[str]]:
    pool = draw(st.lists(_ids, min_size=1, max_size=6, unique=True), label="ids")
    with_id = st.builds(
        lambda i, pad: {"id": i, "pad": pad}, st.sampled_from(pool), st.text(max_size=200)
    )
    other = st.one_of(
        st.builds(lambda pad: {"pad": pad}, st.text(max_size=50)),  # no id
        st.builds(lambda i: {"id": i}, st.one_of(_ints, st.none(), st.lists(_ids))),
        st.lists(_ints, max_size=3),
        st.text(max_size=20),
        _ints,
        st.none(),
        st.builds(_decoy, st.sampled_from(pool), st.integers(0, 2)),
    )
    values = draw(st.lists(st.one_of(with_id, with_id, other), max_size=25), label="values")
    unknown = draw(st.lists(_ids, max_size=3), label="unknown ids")
    return values, {*pool, *unknown}


@given(
    case=_values(),
    chunk_bytes=st.integers(40, 3000),
    compress=st.booleans(),
)
def test_rows_by_number_and_by_id_agree_with_a_model(
    case: tuple[list[Any], set[str]], chunk_bytes: int, compress: bool
) -> None:
    values, ids = case
    with tempfile.TemporaryDirectory(prefix="traces-index-") as tmp:
        directory = Path(tmp) / "stream"
        rows = write(directory, values, chunk_bytes=chunk_bytes, compress=compress)
        note(f"chunks: {scan(directory)}")
        assert [r.line for r in rows] == list(range(1, len(values) + 1))
        # The index is the rows, one line each, as append returned them.
        assert [orjson.loads(line) for line in index_lines(directory)] == [r.fields for r in rows]
        for n, (value, row) in enumerate(zip(values, rows, strict=True)):
            assert row.id == (value.get("id") if isinstance(value, dict) else None)
            assert read_row(directory, n).fields == row.fields
        check_lookups(directory, values, rows, ids)
        for bad in (12, None, 1.5):
            with pytest.raises(TypeError):
                find_row(directory, bad)  # type: ignore[arg-type]


# -- an id elsewhere in a row ----------------------------------------------------------------


def test_an_id_inside_another_field_never_fools_find_row(tmp_path: Path) -> None:
    """``find_row`` searches the index's bytes for ``"id":"x",``: rows where those bytes
    stand for something else (a nested object's ``id`` key, an env name or trace id that is
    that text) come first and must be passed over."""
    needle = '"id":"x",'
    values: list[Any] = [
        {"id": "a", "env": {"name": needle}, "group": {"id": needle}, "traces": [{"id": needle}]},
        {"id": "b", "env": {"name": {"id": "x", "k": 1}}},
        {"id": "c", "group": {"id": {"id": "x", "more": [1]}}, "traces": [{"id": {"id": "x"}}]},
        {"id": "d", "traces": [{"stop_condition": {"id": "x", "q": 2}}]},
        {"n": 4, "env": {"id": {"id": "x", "y": None}}},  # no id of its own
        {"id": 'y","id":"x', "x": needle},
        {"id": "xx"},
        {"id": "x\\"},
        {"id": "x", "n": 8},
        {"id": "x", "n": 9},
        {"id": needle, "n": 10},
    ]
    directory = tmp_path / "stream"
    rows = write(directory, values, chunk_bytes=300)
    index = index_path(directory).read_bytes()
    first_real = sum(map(len, index_lines(directory)[:8]))
    # The needle's bytes stand in the rows before the real one, outside their "id" field.
    assert 0 <= index.find(needle.encode()) < first_real
    assert index.count(needle.encode()) >= 5
    assert find_row(directory, "x") == (8, rows[8])
    assert find_record(directory, "x") == values[8]
    check_lookups(
        directory,
        values,
        rows,
        {"x", "xx", "x\\", needle, 'y","id":"x', "a", "b", "c", "d", "k", "y", "q", '"id":"x"'},
    )


# -- a stream prime-rl wrote -------------------------------------------------------------------


def _episode(n: int, size: int) -> dict[str, Any]:
    return {
        "id": f"ep-{n}" if n % 5 else f"ep-{n}/" + 'é"\\' * 3000,
        "env": {"name": "math"},
        "group": {"id": f"g{n // 3}"},
        "ok": True,
        "errors": [],
        "run": {"type": "train"},
        "num_input_tokens": 10 + n,
        "num_output_tokens": 3 * n,
        "traces": [
            {
                "id": f"t{n}",
                "info": {"advantage": n / 4, "dispatch": {"time": 1.0}, "arrival": {"time": 2.5}},
                "rewards": {"r": {"score": 1.0, "weight": 0.5}},
                "calls": [{"usage": {"cost": 0.01 * n}, "finish_reason": "stop"}],
                "nodes": [
                    {"parent": None, "message": {"role": "user", "content": "q" * size}},
                    {"parent": 0, "message": {"role": "assistant", "content": "a 漢字 \n"}},
                ],
                "stop_condition": "done",
            }
        ],
    }


def write_as_prime_rl(
    directory: Path, records: list[Any], chunk_bytes: int
) -> list[dict[str, Any]]:
    """Lay ``records`` out as prime-rl's file monitor does: orjson lines appended to numbered
    chunks (a new one when a line would take a chunk holding something past
    ``chunk_bytes``), each with an index row of prime-rl's fields (``line`` from 1,
    ``offset``, ``id``, ..., ``chunk`` last; no ``length``, no ``step``) beside the
    directory; every chunk but the last sealed as prime-rl seals it (a ``.tmp`` file
    renamed into place). Return the rows."""
    directory.mkdir(parents=True)
    option = orjson.OPT_APPEND_NEWLINE | orjson.OPT_SERIALIZE_NUMPY
    chunk = size = 0
    rows = []
    for n, record in enumerate(records):
        line = orjson.dumps(record, default=str, option=option)
        if size and size + len(line) > chunk_bytes:
            chunk, size = chunk + 1, 0
        with open(chunk_path(directory, chunk), "ab") as f:
            f.write(line)
        rows.append(
            {
                "cost": None,
                "line": n + 1,
                "offset": size,
                "id": record["id"],
                "kind": "train",
                "trace_ids": [t["id"] for t in record["traces"]],
                "env": record["env"]["name"],
                "group": record["group"]["id"],
                "ok": record["ok"],
                "num_errors": 0,
                "reward": 0.5,
                "chunk": chunk,
            }
        )
        size += len(line)
    with open(index_path(directory), "wb") as f:
        f.write(b"".join(orjson.dumps(row, default=str, option=option) for row in rows))
    for c in range(chunk):
        plain = chunk_path(directory, c)
        temp = sealing_path(directory, c)
        with (
            open(plain, "rb") as source,
            pyzstd.SeekableZstdFile(
                temp, "wb", level_or_option=3, max_frame_content_size=4 << 20
            ) as target,
        ):
            target.write(source.read())
        temp.replace(sealed_path(directory, c))
        plain.unlink()
    return rows


def prime_rl_row(fields: dict[str, Any]) -> IndexRow:
    return IndexRow(
        line=fields["line"],
        chunk=fields["chunk"],
        offset=fields["offset"],
        kind=fields["kind"],
        id=fields["id"],
        fields=fields,
    )


@pytest.mark.parametrize("missing", [0, 3], ids=["whole index", "index behind by 3"])
def test_a_stream_prime_rl_wrote_reads_by_number_and_id_and_goes_on(
    tmp_path: Path, missing: int
) -> None:
    records = [_episode(n, 50 + 400 * (n % 4)) for n in range(20)]
    directory = tmp_path / "stream"
    fields = write_as_prime_rl(directory, records, chunk_bytes=4000)
    listing = scan(directory)
    assert len(listing.sealed) >= 3
    assert listing.plain == [listing.chunks[-1]]
    rows = [prime_rl_row(f) for f in fields]
    assert {r.chunk for r in rows[:5]} <= set(listing.sealed)

    # Read as written: rows without length or step; the record is the line at the offset.
    read = index_rows(directory)
    assert [r.length for r in read] == [None] * len(records)
    assert [r.step for r in read] == [None] * len(records)
    assert [r.end for r in read] == [None] * len(records)
    check_lookups(directory, records, rows, {r["id"] for r in records} | {"ep-missing"})
    assert list(read_records(directory)) == records
    assert orjson.dumps(read_record(directory, 0)) == orjson.dumps(records[0])

    # A seal of the live chunk cut short, and (maybe) the last rows never written.
    last = listing.chunks[-1]
    plain = chunk_path(directory, last).read_bytes()
    sealing_path(directory, last).write_bytes(pyzstd.compress(plain)[: len(plain) // 3])
    if missing:
        cut_index(directory, len(records) - missing)
    assert list(read_records(directory)) == records  # the .zst.tmp is no chunk
    assert list_chunks(directory) == listing.chunks
    for n in range(len(records) - missing):
        assert read_record(directory, n) == records[n]

    more = [_episode(n, 100) for n in range(20, 24)]
    recovery, new = reopen(directory, more, chunk_bytes=1 << 20, compress=False)
    assert (recovery.seals_undone, recovery.seals_finished) == (1, 0)
    assert (recovery.rebuilt_rows, recovery.dropped_rows, recovery.torn_row_bytes) == (
        missing,
        0,
        0,
    )
    assert recovery.records == len(records)
    assert recovery.chunk == last
    assert recovery.chunk_size == len(plain)
    assert scan(directory).sealing == []
    # Appends go on in prime-rl's live chunk, the line numbers after prime-rl's.
    assert [r.line for r in new] == list(range(len(records) + 1, len(records) + 5))
    assert new[0].chunk == last
    assert new[0].offset == len(plain)
    every = [*records, *more]
    assert list(read_records(directory)) == every
    rebuilt = [
        dataclasses.replace(
            rows[n], kind="train", length=len(orjson.dumps(records[n])) + 1, step=None
        )
        for n in range(len(records) - missing, len(records))
    ]
    check_lookups(
        directory,
        every,
        [*rows[: len(records) - missing], *rebuilt, *new],
        {r["id"] for r in every} | {"ep-missing"},
    )
    for n in range(len(records) - missing, len(records)):
        assert read_row(directory, n).fields["env"] == "math"


def test_readers_take_a_run_directory_or_a_stream_directory(tmp_path: Path) -> None:
    run = tmp_path / "run"
    directory = run / RUN_STREAM
    records = [_episode(n, 100) for n in range(6)]
    rows = write(directory, records, chunk_bytes=1500)
    assert index_path(directory).is_file()
    for where in (run, directory):
        assert list(read_records(where)) == records
        assert read_row(where, 3) == rows[3]
        assert read_record(where, -1) == records[-1]
        assert find_record(where, records[5]["id"]) == records[5]
        assert find_row(where, records[4]["id"]) == (4, rows[4])


# -- an index a crash or a bad disk left ------------------------------------------------------


def _mended_rows(records: list[Any], rows: list[IndexRow]) -> list[dict[str, Any]]:
    """The rows recovery rebuilds for ``records`` at ``rows``'s places: the summary of each
    record read back, where it is, and no step."""
    return [
        {
            **episode_row(orjson.loads(orjson.dumps(record))),
            **{"line": row.line, "offset": row.offset, "chunk": row.chunk},
            **{"length": row.length, "step": None},
        }
        for record, row in zip(records, rows, strict=True)
    ]


@pytest.mark.parametrize("behind", [1, 4, 11])
@pytest.mark.parametrize("compress", [False, True], ids=["plain", "sealed"])
def test_an_index_behind_is_completed_on_reopening(
    tmp_path: Path, behind: int, compress: bool
) -> None:
    records = [_episode(n, 200 * (n % 5)) for n in range(14)]
    directory = tmp_path / "stream"

    async def main() -> list[IndexRow]:
        async with TraceWriter(directory, chunk_bytes=3000, fsync=False, compress=compress) as w:
            return [await w.append(r, step=100 + n, kind="eval") for n, r in enumerate(records)]

    rows = anyio.run(main)
    assert len(list_chunks(directory)) >= 3
    kept = len(records) - behind
    cut_index(directory, kept)
    with pytest.raises(IndexError):
        read_row(directory, kept)
    assert find_row(directory, records[kept - 1]["id"]) == (kept - 1, rows[kept - 1])
    with pytest.raises(KeyError):
        find_row(directory, records[kept]["id"])

    recovery, new = reopen(directory, [{"id": "after"}], chunk_bytes=3000, compress=compress)
    assert recovery.rebuilt_rows == behind
    assert (recovery.dropped_rows, recovery.torn_bytes, recovery.torn_row_bytes) == (0, 0, 0)
    assert recovery.records == len(records)
    assert recovery.index_size == sum(map(len, index_lines(directory)[: len(records)]))
    got = index_rows(directory)
    assert got[:kept] == rows[:kept]
    assert [r.fields for r in got[:kept]] == [r.fields for r in rows[:kept]]
    for row, old in zip(got[kept:-1], rows[kept:], strict=True):
        assert (row.line, row.chunk, row.offset, row.length) == (
            *(old.line, old.chunk, old.offset, old.length),
        )
        assert row.step is None  # the step was append's to know
        assert row.kind == "train"  # the record's own kind (append was told "eval")
    rebuilt = _mended_rows(records[kept:], rows[kept:])
    assert [dict(r.fields) for r in got[kept:-1]] == rebuilt
    assert {r["env"] for r in rebuilt} == {"math"}
    assert [r["reward"] for r in rebuilt] == [0.5] * behind
    assert [r["turns"] for r in rebuilt] == [1] * behind
    assert got[-1] == new[0]
    assert new[0].line == len(records) + 1
    every = [*records, {"id": "after"}]
    check_lookups(directory, every, got, {r["id"] for r in every})


@pytest.mark.parametrize("compress", [False, True], ids=["plain", "sealed"])
def test_an_index_deleted_is_rebuilt_on_reopening(tmp_path: Path, compress: bool) -> None:
    records: list[Any] = [_episode(n, 150 * (n % 6)) for n in range(15)]
    records[4] = ["not", "an", "episode"]
    records[9] = {"id": 9, "int": "id"}
    directory = tmp_path / "stream"
    rows = write(directory, records, chunk_bytes=2500, compress=compress)
    index_path(directory).unlink()
    # Without it, the records read in order; by number or id, nothing is found.
    assert list(read_records(directory)) == records
    with pytest.raises(IndexError):
        read_row(directory, 0)
    with pytest.raises(KeyError):
        find_row(directory, records[0]["id"])

    recovery, new = reopen(directory, [{"id": "after"}], chunk_bytes=2500, compress=compress)
    assert recovery.rebuilt_rows == recovery.records == len(records)
    assert recovery.mended
    got = index_rows(directory)
    assert [dict(r.fields) for r in got[:-1]] == _mended_rows(records, rows)
    assert [(r.line, r.chunk, r.offset, r.length) for r in got[:-1]] == [
        (r.line, r.chunk, r.offset, r.length) for r in rows
    ]
    assert got[-1] == new[0]
    assert new[0].line == len(records) + 1
    every = [*records, {"id": "after"}]
    ids = {r["id"] for r in every if isinstance(r, dict) and type(r["id"]) is str}
    check_lookups(directory, every, got, ids)
    # Reopened again, nothing is left to mend.
    again, _ = reopen(directory, chunk_bytes=2500, compress=compress)
    assert not again.mended


def _garbage_row(directory: Path, n: int, garbage: bytes) -> None:
    lines = index_lines(directory)
    lines[n] = garbage
    index_path(directory).write_bytes(b"".join(lines))


@pytest.mark.parametrize(
    "garbage",
    [b"not json at all\n", b"\x00" * 300 + b"\n", b'{"line": 6, "chunk": 1\n', b"[1, 2]\n"],
    ids=["text", "zeros", "cut", "not a row"],
)
@pytest.mark.parametrize("at", [0, 5, 11])
def test_an_index_with_a_garbage_row(tmp_path: Path, garbage: bytes, at: int) -> None:
    """A row that is not JSON (a bad disk): the rows around it are still found by number
    and id, and that row's number is an error; reopening after a crash tore an earlier
    chunk rebuilds the index from the data: every record has its row again, 1..n."""
    records = [{"id": f"r{n}", "n": n, "pad": "é" * 300} for n in range(12)]
    directory = tmp_path / "stream"
    rows = write(directory, records, chunk_bytes=2500, compress=False)
    assert len({r.chunk for r in rows}) >= 3
    _garbage_row(directory, at, garbage)
    for n in range(12):
        if n == at:
            with pytest.raises(TraceFormatError):
                read_row(directory, n)
            with pytest.raises(KeyError):
                find_row(directory, f"r{n}")
            continue
        assert read_row(directory, n) == rows[n], n
        assert read_row(directory, n - 12) == rows[n], n
        assert read_record(directory, n) == records[n]
        assert find_row(directory, f"r{n}") == (n, rows[n])
    assert list(read_records(directory)) == records

    # The machine went down: chunk 1 lost the end of its last record.
    torn = next(
        r for r in rows if r.chunk == 1 and r.end == os.path.getsize(chunk_path(directory, 1))
    )
    torn_n = rows.index(torn)
    assert rows[torn_n + 1].chunk == 2
    os.truncate(chunk_path(directory, 1), torn.offset + 50)
    recovery, new = reopen(directory, [{"id": "after"}], chunk_bytes=2500, compress=False)
    assert recovery.torn_bytes == 50
    # The index is rebuilt from the data: the torn record's row is dropped, the bad row
    # too, and its record (when it is not the torn one) gets its row back; every other row
    # is kept as it was, numbered 1..n again.
    assert recovery.dropped_rows == (2 if at != torn_n else 1)
    assert recovery.rebuilt_rows == (1 if at != torn_n else 0)
    got = index_rows(directory)
    assert [r.line for r in got] == list(range(1, len(got) + 1))
    survivors = [n for n in range(12) if n != torn_n]
    assert len(got) == len(survivors) + 1
    for i, n in enumerate(survivors):
        if n == at:  # rebuilt: where its record is, what it says, no step
            want = rows[n]
            place = (got[i].chunk, got[i].offset, got[i].length)
            assert place == (want.chunk, want.offset, want.length)
            assert (got[i].id, got[i].step) == (f"r{n}", None)
        else:
            assert got[i] == dataclasses.replace(rows[n], line=i + 1)
        assert read_record(directory, i) == records[n]
        assert find_row(directory, f"r{n}") == (i, got[i])
    assert got[-1] == new[0]
    assert read_record(directory, -1) == {"id": "after"}
    every = [r for n, r in enumerate(records) if n != torn_n] + [{"id": "after"}]
    assert list(read_records(directory)) == every
    again, _ = reopen(directory, chunk_bytes=2500, compress=False)
    assert not again.mended
