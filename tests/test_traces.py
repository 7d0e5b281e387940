"""Trace streams: reading across chunks, torn and corrupt lines, big lines through ijson,
recovery after a crash, and appends that fail or are cancelled part-way."""

from __future__ import annotations

import dataclasses
import errno
import itertools
import logging
import os
import random
import threading
from pathlib import Path
from typing import Any

import anyio
import ijson
import orjson
import pytest
from streams import chunk_bytes, cut_index, index_lines, index_rows

import encoder
from monitors import TraceFormatError, TraceWriteError
from monitors.traces import (
    IndexRow,
    TraceReader,
    TraceWriter,
    _reader,
    _writer,
    aread_records,
    read_record,
    read_records,
    read_row,
)
from monitors.traces._index import count_rows
from monitors.traces._layout import (
    INDEX_SUFFIX,
    chunk_path,
    index_path,
    list_chunks,
    mending_path,
)
from monitors.traces._summary import episode_row


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def stream(tmp_path: Path) -> Path:
    """A stream's directory (made, empty); its index goes beside it, in ``tmp_path``."""
    directory = tmp_path / "stream"
    directory.mkdir()
    return directory


# -- helpers ------------------------------------------------------------------------------

_WORDS = ["alpha", "βeta", "漢字", "🙂", 'quo"te', "back\\slash", "new\nline", "tab\t", "\x00"]


def make_record(n: int, size: int) -> dict[str, Any]:
    """A deterministic record of about ``size`` characters of text, with escapes and
    non-ASCII, full-precision floats and big integers."""
    rng = random.Random(n)
    words = [rng.choice(_WORDS) for _ in range(max(1, size // 6))]
    return {
        "n": n,
        "text": " ".join(words)[:size],
        "floats": [rng.random() * 10 ** rng.randint(-20, 20) for _ in range(8)],
        "ints": [rng.randint(-(2**63), 2**64 - 1) for _ in range(4)],
        "nested": {"a": [None, True, False, {"b": -0.0, "c": ""}], "é": n * 1.5},
    }


def line_of(value: Any) -> bytes:
    return orjson.dumps(value) + b"\n"


async def write_stream(directory: Path, values: list[Any], **kwargs: Any) -> list[IndexRow]:
    """Write ``values`` to a stream, plain unless ``compress=True`` is passed."""
    async with TraceWriter(directory, **{"compress": False, **kwargs}) as writer:
        return [await writer.append(v, step=i, kind="eval") for i, v in enumerate(values)]


def snapshot(directory: Path, *, skip_empty: bool = False) -> dict[str, bytes]:
    """Every file of the stream, its index beside the directory included."""
    paths = [directory / name for name in sorted(os.listdir(directory))]
    out = {}
    for path in [*paths, index_path(directory)]:
        data = path.read_bytes()
        if data or not skip_empty:
            out[path.name] = data
    return out


def check_index(directory: Path, records: int) -> None:
    """The index holds ``records`` whole rows, numbered 1.. in order, in stream order, and
    nothing after its last newline."""
    data = index_path(directory).read_bytes()
    assert data == b"" or data.endswith(b"\n"), data[-100:]
    rows = index_rows(directory)
    assert [r.line for r in rows] == list(range(1, records + 1))
    assert count_rows(index_path(directory)) == records
    positions = [(r.chunk, r.offset) for r in rows]
    assert positions == sorted(positions)


def dumps_all(values: Any) -> list[bytes]:
    return [orjson.dumps(v) for v in values]


# -- reading across chunks ----------------------------------------------------------------


@pytest.mark.anyio
async def test_records_read_back_across_chunks(stream: Path) -> None:
    sizes = [10, 3000, 50, 9000, 1, 400, 20_000, 7, 2500, 2500, 2500, 100] * 3
    values = [make_record(n, size) for n, size in enumerate(sizes)]
    rows = await write_stream(stream, values, chunk_bytes=8192, compress=True)
    chunks = list_chunks(stream)
    assert len(chunks) >= 6, chunks
    # The directory holds the chunks only; the index is beside it.
    assert sorted(os.listdir(stream)) == [f"{c:05d}.jsonl.zst" for c in chunks]
    assert index_path(stream) == stream.parent / "stream.index.jsonl"
    # Some chunk holds several records, and the 20 KB records each start their own chunk.
    assert any(a.chunk == b.chunk for a, b in itertools.pairwise(rows))
    for i, (row, size) in enumerate(zip(rows, sizes, strict=True)):
        if size == 20_000:
            assert row.offset == 0
        # The row: the record's summary, where it is, and what append was told.
        assert (row.line, row.step, row.kind) == (i + 1, i, "eval")
        assert row.length == len(line_of(values[i]))
        assert dict(row.fields) == {
            **episode_row(values[i]),
            **{"line": i + 1, "offset": row.offset, "chunk": row.chunk},
            **{"length": row.length, "step": i, "kind": "eval"},
        }
    check_index(stream, len(values))
    assert [orjson.loads(line) for line in index_lines(stream)] == [r.fields for r in rows]

    expected = dumps_all(values)
    assert dumps_all(read_records(stream)) == expected
    assert dumps_all([r async for r in aread_records(stream)]) == expected
    # The chunks hold exactly the lines, in order.
    assert b"".join(chunk_bytes(stream, c) for c in chunks) == b"".join(e + b"\n" for e in expected)
    for i, row in enumerate(rows):
        assert read_row(stream, i) == row
        assert orjson.dumps(read_record(stream, i)) == expected[i]


@pytest.mark.anyio
async def test_read_record_negative_and_out_of_range(stream: Path) -> None:
    values = [make_record(n, 300 * n) for n in range(7)]
    await write_stream(stream, values, chunk_bytes=1000)
    n = len(values)
    for i in range(1, n + 1):
        assert read_record(stream, -i) == values[-i] == read_record(stream, n - i)
        assert read_row(stream, -i) == read_row(stream, n - i)
    for bad in (n, n + 1, -n - 1, -10 * n):
        with pytest.raises(IndexError):
            read_record(stream, bad)
        with pytest.raises(IndexError):
            read_row(stream, bad)


@pytest.mark.anyio
async def test_empty_stream_reads_as_nothing(stream: Path) -> None:
    async with TraceWriter(stream, compress=False) as writer:
        assert writer.records == 0
    assert list(read_records(stream)) == []
    with pytest.raises(IndexError):
        read_record(stream, 0)


# -- torn and corrupt lines ---------------------------------------------------------------


@pytest.mark.anyio
async def test_torn_last_line_is_counted_not_returned(stream: Path) -> None:
    values = [make_record(n, 500) for n in range(5)]
    await write_stream(stream, values, chunk_bytes=1200)
    last = chunk_path(stream, list_chunks(stream)[-1])
    torn = line_of(make_record(99, 800))[:-1]  # a whole JSON value, only the newline missing
    for tail in (torn[:1], torn[: len(torn) // 2], torn):
        with open(last, "ab") as f:
            f.write(tail)
        reader = TraceReader(stream)
        assert dumps_all(reader) == dumps_all(values)
        assert reader.torn_tail_bytes == len(tail)
        assert reader.records == len(values)
        assert reader.skipped == 0
        os.truncate(last, last.stat().st_size - len(tail))


async def _three_chunks(directory: Path) -> tuple[list[Any], list[IndexRow]]:
    """A stream of 12 records of ~800 bytes in chunks of 4."""
    values = [make_record(n, 400) for n in range(12)]
    assert all(780 < len(line_of(v)) < 870 for v in values)
    rows = await write_stream(directory, values, chunk_bytes=3500)
    assert [r.chunk for r in rows] == [0] * 4 + [1] * 4 + [2] * 4
    return values, rows


@pytest.mark.anyio
async def test_torn_line_inside_a_chunk_raises_with_chunk_and_offset(stream: Path) -> None:
    values, rows = await _three_chunks(stream)
    # Record 1 lost its second half and newline (a crash), and record 2 was written after it.
    path = chunk_path(stream, 0)
    data = path.read_bytes()
    r1 = rows[1]
    path.write_bytes(data[: r1.offset + r1.length // 2] + data[r1.end :])

    with pytest.raises(TraceFormatError) as info:
        list(read_records(stream))
    assert info.value.chunk == "00000.jsonl"
    assert info.value.offset == r1.offset
    assert "00000.jsonl" in str(info.value)
    assert str(r1.offset) in str(info.value)

    reader = TraceReader(stream, on_error="skip")
    got = dumps_all(reader)
    assert got == dumps_all(values[:1] + values[3:])  # records 1 and 2 share the bad line
    assert reader.skipped == 1
    assert reader.records == len(values) - 2
    assert [orjson.dumps(r) for r in read_records(stream, on_error="skip")] == got


@pytest.mark.anyio
async def test_non_last_chunk_without_final_newline_is_an_error(stream: Path) -> None:
    values, rows = await _three_chunks(stream)
    path = chunk_path(stream, 1)
    os.truncate(path, path.stat().st_size - 10)  # record 7 torn, yet chunk 2 follows
    with pytest.raises(TraceFormatError) as info:
        list(read_records(stream))
    assert (info.value.chunk, info.value.offset) == ("00001.jsonl", rows[7].offset)
    reader = TraceReader(stream, on_error="skip")
    assert dumps_all(reader) == dumps_all(values[:7] + values[8:])
    assert reader.skipped == 1
    assert reader.torn_tail_bytes == 0


@pytest.mark.anyio
@pytest.mark.parametrize("chunk", [0, 1, 2])
@pytest.mark.parametrize(
    "garbage", [b"\x00\xff\xfe not json", b"{", b'{"a": 1} {"b": 2}', b"", b"nan", b'"\xff"']
)
async def test_garbage_line_raises_or_is_skipped(stream: Path, chunk: int, garbage: bytes) -> None:
    values, rows = await _three_chunks(stream)
    path = chunk_path(stream, chunk)
    data = path.read_bytes()
    at = rows[4 * chunk + 2].offset  # between the chunk's second and third records
    path.write_bytes(data[:at] + garbage + b"\n" + data[at:])

    with pytest.raises(TraceFormatError) as info:
        list(read_records(stream))
    assert (info.value.chunk, info.value.offset) == (f"{chunk:05d}.jsonl", at)
    assert f"{chunk:05d}.jsonl" in str(info.value)

    reader = TraceReader(stream, on_error="skip")
    assert dumps_all(reader) == dumps_all(values)
    assert (reader.skipped, reader.records, reader.torn_tail_bytes) == (1, len(values), 0)


def test_on_error_must_be_raise_or_skip(stream: Path) -> None:
    with pytest.raises(ValueError, match="on_error"):
        TraceReader(stream, on_error="ignore")  # type: ignore[arg-type]


# -- lines longer than BIG_LINE go through ijson ------------------------------------------


def _big_values(*, ints: tuple[int, int] = (-(2**63) + 1, 2**63 - 1)) -> list[Any]:
    """Records of 1.2-3 MB: longer than a read block, so the reader cannot see their end."""
    rng = random.Random(7)
    out = []
    for n, size in enumerate([3_000_000, 1_200_000, 2_100_000]):
        out.append(
            {
                "n": n,
                "text": "".join(rng.choice(_WORDS) + " " for _ in range(size // 12)),
                "floats": [rng.random() * 10 ** rng.randint(-300, 300) for _ in range(20_000)],
                "ints": [rng.randint(*ints) for _ in range(5_000)],
                "deep": {"x": [[[{"é": [1.5, -0.0, 1e-7, 5e-324, 1.7976931348623157e308]}]]]},
                "empty": [{}, [], ""],
            }
        )
    return out


@pytest.fixture
def ijson_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the records parsed with ijson."""
    calls: list[int] = []
    real = ijson.items

    def items(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(_reader.ijson, "items", items)
    return calls


@pytest.mark.anyio
async def test_big_lines_parse_through_ijson_like_orjson(
    stream: Path, ijson_calls: list[int], monkeypatch: pytest.MonkeyPatch
) -> None:
    big = _big_values()
    small = [make_record(n, 100) for n in range(3)]
    values = [small[0], big[0], small[1], big[1], big[2], small[2]]
    await write_stream(stream, values, chunk_bytes=4 << 20)
    lines = b"".join(chunk_bytes(stream, c) for c in list_chunks(stream))
    expected = [orjson.dumps(orjson.loads(line)) for line in lines.splitlines()]
    assert expected == dumps_all(values)

    got = dumps_all(TraceReader(stream, big_line=1024))
    assert len(ijson_calls) >= 3, "the big records were not parsed with ijson"
    assert got == expected

    ijson_calls.clear()
    monkeypatch.setattr(_reader, "BIG_LINE", 1024)
    for i in range(len(values)):
        assert orjson.dumps(read_record(stream, i)) == expected[i]
    assert len(ijson_calls) == 3  # the three big records are now longer than BIG_LINE


@pytest.mark.anyio
@pytest.mark.parametrize("n", [2**63, 2**64 - 1, -(2**63)])
async def test_big_line_with_64_bit_integers(
    stream: Path, ijson_calls: list[int], monkeypatch: pytest.MonkeyPatch, n: int
) -> None:
    """orjson writes (and reads) any integer of the 64-bit ranges; a record holding one must
    read back whether or not it is longer than BIG_LINE."""
    value = {"id": n, "text": "x" * 3_000_000}
    await write_stream(stream, [value])
    assert orjson.loads(chunk_path(stream, 0).read_bytes()) == value
    assert list(TraceReader(stream)) == [value]  # short enough for orjson
    assert list(TraceReader(stream, big_line=1024)) == [value]
    assert ijson_calls
    monkeypatch.setattr(_reader, "BIG_LINE", 1024)
    assert read_record(stream, 0) == value


@pytest.mark.anyio
@pytest.mark.parametrize(
    "damage",
    ["garbage inside", "cut, next record glued on", "trailing garbage", "second value"],
)
async def test_big_corrupt_line_raises_like_a_small_one(
    stream: Path, ijson_calls: list[int], damage: str
) -> None:
    """Through ijson as through orjson: a line that is not exactly one JSON value is an error."""
    big = _big_values()[0]  # 3 MB: even half of it is longer than a read block
    values = [make_record(0, 100), big, make_record(2, 100), make_record(3, 100)]
    rows = await write_stream(stream, values)
    path = chunk_path(stream, 0)
    data = path.read_bytes()
    r = rows[1]
    line = data[r.offset : r.end - 1]
    if damage == "garbage inside":
        bad = line[: len(line) // 2] + b"\x00\xff garbage" + line[len(line) // 2 :]
    elif damage == "cut, next record glued on":
        bad = line[: len(line) // 2] + data[rows[2].offset : rows[2].end - 1]
    elif damage == "trailing garbage":
        bad = line + b" garbage"
    else:
        bad = line + b'{"n": 3}'
    with pytest.raises(orjson.JSONDecodeError):
        orjson.loads(bad)  # what the reader does with a line shorter than BIG_LINE
    rest = data[rows[2].end :] if damage == "cut, next record glued on" else data[r.end :]
    path.write_bytes(data[: r.offset] + bad + b"\n" + rest)

    with pytest.raises(TraceFormatError) as info:
        list(TraceReader(stream, big_line=1024))
    assert ijson_calls, "the damaged line was not parsed with ijson"
    assert (info.value.chunk, info.value.offset) == ("00000.jsonl", r.offset)

    reader = TraceReader(stream, big_line=1024, on_error="skip")
    got = dumps_all(reader)
    assert reader.skipped == 1
    if damage == "cut, next record glued on":
        assert got == dumps_all([values[0], values[3]])
    else:
        assert got == dumps_all([values[0], values[2], values[3]])


# -- recovery -----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_missing_index_rows_are_rebuilt(
    stream: Path, caplog: pytest.LogCaptureFixture
) -> None:
    values = [make_record(n, 200 + 150 * n) for n in range(10)]
    rows = await write_stream(stream, values, chunk_bytes=2500)
    assert len(list_chunks(stream)) >= 3
    index = index_path(stream)
    # A crash after the last four records reached their chunks, before their rows did;
    # the fourth-last row half written.
    half = len(index_lines(stream)[6]) // 2
    cut_index(stream, 6, half)

    with caplog.at_level(logging.WARNING, logger="monitors.traces"):
        async with TraceWriter(stream, chunk_bytes=2500, compress=False) as writer:
            recovery = writer.recovery
            assert recovery is not None
            assert recovery.rebuilt_rows == 4
            assert recovery.torn_row_bytes == half
            assert (recovery.dropped_rows, recovery.torn_bytes) == (0, 0)
            assert recovery.records == writer.records == 10
            assert recovery.mended
            assert recovery.chunk == list_chunks(stream)[-1]
            more = await writer.append({"after": "recovery"})
    assert "mended" in caplog.text

    check_index(stream, 11)
    assert recovery.index_size == sum(map(len, index_lines(stream)[:10]))
    assert index.stat().st_size == recovery.index_size + len(index_lines(stream)[10])
    for i, row in enumerate(rows):
        got = read_row(stream, i)
        assert (got.line, got.chunk, got.offset, got.length) == (
            *(i + 1, row.chunk, row.offset, row.length),
        )
        if i < 6:
            assert got == row  # the surviving rows keep their step and kind
            assert got.fields == row.fields
        else:  # rebuilt from the record: its summary, but no step
            assert got.step is None
            assert dict(got.fields) == {
                **episode_row(values[i]),
                **{"line": i + 1, "offset": row.offset, "chunk": row.chunk},
                **{"length": row.length, "step": None},
            }
    assert read_row(stream, 10) == more
    assert dumps_all(read_records(stream)) == dumps_all([*values, {"after": "recovery"}])
    assert [read_record(stream, i) for i in range(11)] == [*values, {"after": "recovery"}]


@pytest.mark.anyio
async def test_rows_pointing_past_the_data_are_dropped(stream: Path) -> None:
    values = [make_record(n, 400) for n in range(12)]
    rows = await write_stream(stream, values, chunk_bytes=3500)
    last = list_chunks(stream)[-1]
    assert [r.chunk for r in rows[-4:]] == [last] * 4
    # The last two records never reached the disk, but their rows did (and a third is torn).
    os.truncate(chunk_path(stream, last), rows[-2].offset + 17)

    async with TraceWriter(stream, chunk_bytes=3500, compress=False) as writer:
        recovery = writer.recovery
        assert recovery is not None
        assert recovery.dropped_rows == 2
        assert recovery.torn_bytes == 17
        assert (recovery.rebuilt_rows, recovery.torn_row_bytes) == (0, 0)
        assert recovery.records == writer.records == 10
        assert recovery.chunk_size == rows[-2].offset
        row = await writer.append(values[10])
    assert (row.chunk, row.offset) == (rows[-2].chunk, rows[-2].offset)
    check_index(stream, 11)
    assert [r.fields for r in index_rows(stream)] == [r.fields for r in [*rows[:10], row]]
    assert dumps_all(read_records(stream)) == dumps_all(values[:11])
    assert read_record(stream, -1) == values[10]


@pytest.mark.anyio
@pytest.mark.parametrize("index_lost", [0, 2, 5])
async def test_a_torn_rolled_chunk_is_cut_on_reopening(stream: Path, index_lost: int) -> None:
    """The machine went down before the fsync that follows a roll had finished: chunk 1
    lost the end of its last record (and the index its last ``index_lost`` rows), while
    chunk 2 reached the disk. Reopening cuts the torn line, drops its row, keeps every
    other record with its row, and appending goes on in the last chunk."""
    values, rows = await _three_chunks(stream)
    torn = rows[7]
    assert torn.chunk == 1
    os.truncate(chunk_path(stream, 1), torn.offset + 100)
    cut_index(stream, 12 - index_lost)
    survivors = values[:7] + values[8:]

    async with TraceWriter(stream, chunk_bytes=3500, compress=False) as writer:
        recovery = writer.recovery
        assert recovery is not None
        assert recovery.torn_bytes == 100
        row_lost = index_lost >= 5  # the torn record's row was lost with the index's tail
        assert recovery.dropped_rows == (0 if row_lost else 1)
        assert recovery.rebuilt_rows == index_lost - row_lost
        assert recovery.records == writer.records == 11
        assert (recovery.chunk, recovery.chunk_size) == (2, rows[-1].end)
        more = await writer.append({"after": "power loss"})
    assert more.chunk == 2
    assert chunk_path(stream, 1).stat().st_size == torn.offset
    assert dumps_all(read_records(stream)) == dumps_all([*survivors, {"after": "power loss"}])
    assert [read_record(stream, i) for i in range(12)] == [*survivors, {"after": "power loss"}]
    check_index(stream, 12)
    kept = rows[:7] + rows[8 : 12 - index_lost]
    for i, row in enumerate(kept):
        # Kept rows keep their step and kind; those after the torn one are renumbered.
        assert read_row(stream, i) == dataclasses.replace(row, line=i + 1)
        assert dict(read_row(stream, i).fields) == {**row.fields, "line": i + 1}
    for i in range(len(kept), 11):  # rebuilt from the data, after the torn record
        row = rows[i + 1]
        assert read_row(stream, i) == dataclasses.replace(row, line=i + 1, step=None)
    assert not mending_path(stream).exists()
    async with TraceWriter(stream, chunk_bytes=3500, compress=False) as writer:
        assert writer.recovery is not None
        assert not writer.recovery.mended


@pytest.mark.anyio
async def test_clean_reopen_mends_nothing(stream: Path) -> None:
    values = [make_record(n, 300) for n in range(6)]
    await write_stream(stream, values, chunk_bytes=1000)
    before = snapshot(stream)
    async with TraceWriter(stream, chunk_bytes=1000, compress=False) as writer:
        assert writer.recovery is not None
        assert not writer.recovery.mended
        assert writer.records == 6
    assert snapshot(stream) == before


# -- failed appends -----------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    "bad",
    [
        pytest.param({"ok": 1, "bad": object()}, id="small"),
        pytest.param({"big": "é" * 3_000_000, "bad": object()}, id="after-3MB-written"),
        pytest.param([1, 2, {"x": {1, 2}}], id="set"),
        pytest.param({"n": 2**64}, id="int-too-big"),
    ],
)
async def test_encode_error_leaves_the_stream_as_it_was(stream: Path, bad: Any) -> None:
    values = [make_record(n, 300) for n in range(3)]
    async with TraceWriter(stream, compress=False) as writer:
        for v in values:
            await writer.append(v)
        before = snapshot(stream)
        with pytest.raises(encoder.EncodeError):
            await writer.append(bad)
        assert snapshot(stream) == before
        assert writer.records == 3
        await writer.append({"after": True})
    assert dumps_all(read_records(stream)) == dumps_all([*values, {"after": True}])
    assert read_record(stream, 3) == {"after": True}


@pytest.mark.anyio
async def test_encode_error_after_a_roll_leaves_the_records_as_they_were(stream: Path) -> None:
    """The record would not fit the chunk, so the writer rolled before the error came."""
    values = [make_record(n, 300) for n in range(3)]
    async with TraceWriter(stream, chunk_bytes=1 << 20, compress=False) as writer:
        for v in values:
            await writer.append(v)
        before = snapshot(stream, skip_empty=True)
        with pytest.raises(encoder.EncodeError):
            await writer.append({"big": "x" * 2_000_000, "bad": object()})
        assert snapshot(stream, skip_empty=True) == before
        assert writer.records == 3
        await writer.append({"after": True})
    assert dumps_all(read_records(stream)) == dumps_all([*values, {"after": True}])
    assert read_record(stream, -1) == {"after": True}


@pytest.mark.anyio
async def test_append_after_close_is_an_error(stream: Path) -> None:
    writer = TraceWriter(stream, compress=False)
    await writer.append({"a": 1})
    await writer.close()
    await writer.close()  # idempotent
    with pytest.raises(TraceWriteError):
        await writer.append({"a": 2})
    assert list(read_records(stream)) == [{"a": 1}]


def test_chunk_bytes_must_be_positive(stream: Path) -> None:
    with pytest.raises(ValueError, match="chunk_bytes"):
        TraceWriter(stream, chunk_bytes=0, compress=False)


# -- cancelled appends --------------------------------------------------------------------


def _huge() -> dict[str, Any]:
    """~50 MB of JSON from a few shared strings (little memory)."""
    ascii_mb = "abcdefgh" * 131_072
    mixed = 'é漢🙂"\\\n' * 20_000
    return {"parts": [ascii_mb, mixed] * 40, "tail": list(range(1000))}


def cancel_after_batches(
    monkeypatch: pytest.MonkeyPatch, scope: anyio.CancelScope, written: int
) -> None:
    """Cancel ``scope`` once ``written`` batches of the appends to come are on the disk (as
    the next one reaches the worker thread; later ones pass): a point in the record whatever
    the machine's speed (a 50 MB append takes 50-75 ms here, so a cancel after some
    milliseconds could come after its end on a faster machine)."""
    real = _writer._write_joined
    batches = itertools.count()

    def write(fd: int, chunks: list[bytes]) -> None:
        if next(batches) == written:
            anyio.from_thread.run_sync(scope.cancel)
        real(fd, chunks)

    monkeypatch.setattr(_writer, "_write_joined", write)


@pytest.mark.anyio
@pytest.mark.parametrize("written", [None, 0, 1, 30], ids=["at-once", "0", "1", "30"])
async def test_cancelled_append_leaves_complete_records_only(
    stream: Path, monkeypatch: pytest.MonkeyPatch, written: int | None
) -> None:
    """Cancelled at its first checkpoint (None), or after ``written`` of the ~50 batches of a
    50 MB record are written."""
    values = [make_record(n, 300) for n in range(3)]
    huge = _huge()
    async with TraceWriter(stream, chunk_bytes=1 << 30, compress=False) as writer:
        for v in values:
            await writer.append(v)
        before = snapshot(stream)
        with anyio.CancelScope() as scope:
            if written is None:
                scope.cancel()
            else:
                cancel_after_batches(monkeypatch, scope, written)
            await writer.append(huge)
        assert scope.cancelled_caught, "the 50 MB append finished before it was cancelled"
        assert snapshot(stream) == before
        assert writer.records == 3
        assert dumps_all(read_records(stream)) == dumps_all(values)
        row = await writer.append({"after": "cancel"})
        assert (row.chunk, row.offset) == (0, sum(len(line_of(v)) for v in values))
    assert dumps_all(read_records(stream)) == dumps_all([*values, {"after": "cancel"}])
    assert read_record(stream, 3) == {"after": "cancel"}


@pytest.mark.anyio
async def test_cancelled_append_in_a_task(stream: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    values = [make_record(n, 300) for n in range(3)]
    async with TraceWriter(stream, compress=False) as writer:
        for v in values:
            await writer.append(v)
        before = snapshot(stream)
        finished = []

        async def big() -> None:
            await writer.append(_huge())
            finished.append(True)

        async with anyio.create_task_group() as group:
            # Cancelled once its first batch is written (not after a sleep: how far a 50 MB
            # append gets in a given time depends on the machine).
            cancel_after_batches(monkeypatch, group.cancel_scope, 1)
            group.start_soon(big)
        assert not finished
        assert snapshot(stream) == before
        await writer.append({"after": "cancel"})
    assert dumps_all(read_records(stream)) == dumps_all([*values, {"after": "cancel"}])


@pytest.mark.anyio
@pytest.mark.parametrize("why", ["full chunk", "record too long"])
async def test_append_cancelled_while_the_chunk_rolls(stream: Path, why: str) -> None:
    """A cancellation that arrives while the next chunk is being opened must leave a writer
    that can go on appending."""
    first = make_record(0, 700)
    async with TraceWriter(stream, chunk_bytes=2000, compress=False) as writer:
        await writer.append(first)  # 1201 bytes
        if why == "full chunk":
            await writer.append(make_record(1, 1500))  # 2174 bytes: a chunk of its own
        # and then a record of 1219 bytes: the chunk rolls first.
        kept = dumps_all(read_records(stream))
        real = writer._open_chunk
        with anyio.CancelScope() as scope:

            def open_chunk(path: Path) -> int:
                anyio.from_thread.run_sync(scope.cancel)
                return real(path)

            writer._open_chunk = open_chunk  # type: ignore[method-assign]
            await writer.append(make_record(2, 700))
        writer._open_chunk = real  # type: ignore[method-assign]
        assert scope.cancelled_caught
        assert dumps_all(read_records(stream)) == kept
        # The writer goes on, into a chunk file of its own.
        await writer.append(make_record(3, 700))
        await writer.append(make_record(4, 100))
    expected = [*kept, *dumps_all([make_record(3, 700), make_record(4, 100)])]
    assert dumps_all(read_records(stream)) == expected
    assert [orjson.dumps(read_record(stream, i)) for i in range(len(expected))] == expected


class _HeldFsync:
    """``os.fsync`` that waits, in whichever thread calls it, until released (a disk
    flushing gigabytes), recording the files it was asked to sync."""

    def __init__(self, *, error: OSError | None = None) -> None:
        self.release = threading.Event()
        self.started = threading.Event()
        self.synced: list[str] = []
        self.error = error

    def __call__(self, fd: int) -> None:
        name = os.path.basename(os.readlink(f"/proc/self/fd/{fd}"))
        self.started.set()
        if not self.release.wait(30):
            raise AssertionError("fsync never released")
        if self.error is not None and name.endswith(".jsonl") and not name.endswith(INDEX_SUFFIX):
            raise self.error
        self.synced.append(name)


@pytest.mark.anyio
async def test_a_roll_does_not_wait_for_the_old_chunks_fsync(
    stream: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Appends go on in the next chunk while the rolled one is fsynced; the next roll and
    close wait for that fsync (one in flight at most)."""
    held = _HeldFsync()
    monkeypatch.setattr(os, "fsync", held)
    values = [make_record(n, 700) for n in range(3)]  # ~1.2 KB each: one per chunk
    rows: list[IndexRow] = []
    async with TraceWriter(stream, chunk_bytes=2000, compress=False) as writer:
        with anyio.fail_after(10):  # would hang if the roll waited for the held fsync
            rows += [await writer.append(values[0]), await writer.append(values[1])]
        assert held.started.wait(10)
        assert held.synced == []
        assert [r.chunk for r in rows] == [0, 1]
        assert dumps_all(read_records(stream)) == dumps_all(values[:2])

        async def third() -> None:
            rows.append(await writer.append(values[2]))

        async with anyio.create_task_group() as group:
            group.start_soon(third)
            await anyio.sleep(0.2)
            assert len(rows) == 2, "the second roll did not wait for the first fsync"
            held.release.set()
    index = index_path(stream).name
    assert index == "stream.index.jsonl"
    assert held.synced == [
        *("00000.jsonl", index),  # in the background, after the first roll
        *("00001.jsonl", index),  # after the second
        *("00002.jsonl", index),  # on close
    ]
    assert [r.chunk for r in rows] == [0, 1, 2]
    assert dumps_all(read_records(stream)) == dumps_all(values)


@pytest.mark.anyio
async def test_a_failed_fsync_is_raised_on_close_and_the_records_stay(
    stream: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    held = _HeldFsync(error=OSError(errno.EIO, "Input/output error"))
    held.release.set()
    monkeypatch.setattr(os, "fsync", held)
    values = [make_record(n, 700) for n in range(3)]
    writer = TraceWriter(stream, chunk_bytes=2000, compress=False)
    with caplog.at_level(logging.ERROR, logger="monitors.traces"):
        async with writer:
            for v in values:
                await writer.append(v)
            with pytest.raises(TraceWriteError) as info:
                await writer.close()
    assert "fsync of chunk 0 failed" in caplog.text  # logged when it happened
    message = str(info.value)
    assert str(stream) in message
    for part in ("for chunk 0: ", "for chunk 1: ", "on close: ", "Input/output error"):
        assert part in message
    await writer.close()  # said once; closing again is quiet
    assert dumps_all(read_records(stream)) == dumps_all(values)
    with pytest.raises(TraceWriteError, match="closed"):
        await writer.append(values[0])


@pytest.mark.parametrize(
    "line",
    [
        b"18446744073709551616",  # past u64: orjson reads a float
        b'{"n": [-9223372036854775809, 1E5]}',  # past i64, and a Decimal-shaped float
        b"[1e400]",  # past the double range: orjson refuses it
    ],
)
def test_foreign_numbers_read_the_same_through_ijson(
    stream: Path, monkeypatch: pytest.MonkeyPatch, line: bytes
) -> None:
    """Numbers our writer never writes still read as orjson reads them, however long the line
    (found by fuzz/traces_reader.py: ijson kept big ints and read 1e400 as inf)."""
    chunk_path(stream, 0).write_bytes(line + b"\n")
    try:
        expected: list[Any] = [orjson.loads(line)]
    except orjson.JSONDecodeError:
        expected = []
    monkeypatch.setattr(_reader, "_BLOCK", 4)  # the line straddles read blocks
    for big_line in (2, 1 << 20):
        reader = TraceReader(stream, big_line=big_line)
        if expected:
            got = list(reader)
            assert got == expected
            assert [type(x) for x in got] == [type(x) for x in expected]
        else:
            with pytest.raises(TraceFormatError):
                list(reader)


@pytest.mark.parametrize(
    "line", [b'2"[0,2]', b'{"a": 1} "x', b'"cut', b"1 2", b"[1] 0", b" ", b'00"[,2]', b"\x0b11"]
)
def test_a_line_that_is_not_one_value_is_refused_through_ijson_too(
    stream: Path, monkeypatch: pytest.MonkeyPatch, line: bytes
) -> None:
    """yajl ignores an unterminated string at the end of its input; the reader does not
    (found by fuzz/traces_reader.py: ``2"[0,2]`` read as 2 from a long line)."""
    chunk_path(stream, 0).write_bytes(line + b"\n" + b'{"next": 1}\n')
    monkeypatch.setattr(_reader, "_BLOCK", 4)  # the line straddles read blocks: ijson
    with pytest.raises(TraceFormatError):
        list(TraceReader(stream, big_line=2))
    assert list(TraceReader(stream, on_error="skip", big_line=2)) == [{"next": 1}]


# -- sealing in the background --------------------------------------------------------------


@pytest.mark.anyio
async def test_seals_run_at_the_lowest_priority_and_one_chunk_waits_at_most(
    stream: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from monitors.traces._sealed import seal as real_seal

    release = threading.Event()
    nice: list[int] = []
    sealing: list[int] = []

    def held_seal(directory: Path, chunk: int, **kwargs: Any) -> int:
        nice.append(os.getpriority(os.PRIO_PROCESS, threading.get_native_id()))
        sealing.append(chunk)
        release.wait(timeout=30)
        return real_seal(directory, chunk, **kwargs)

    monkeypatch.setattr("monitors.traces._writer.seal", held_seal)
    values = [make_record(n, 900) for n in range(3)]
    async with TraceWriter(stream, chunk_bytes=1000) as writer:
        await writer.append(values[0])
        await writer.append(values[1])  # rolls: chunk 0 is being sealed, and held
        with anyio.fail_after(5):
            while not sealing:
                await anyio.sleep(0.01)
        # The next roll waits for that seal: the third append does not return meanwhile.
        async with anyio.create_task_group() as group:
            group.start_soon(writer.append, values[2])
            await anyio.sleep(0.3)
            assert writer.records == 2
            assert sealing == [0]
            release.set()
        assert writer.records == 3
    assert sealing == [0, 1, 2]  # the last one at close
    assert nice == [19, 19, 19] if os.uname().sysname == "Linux" else len(nice) == 3
    assert dumps_all(read_records(stream)) == dumps_all(values)
