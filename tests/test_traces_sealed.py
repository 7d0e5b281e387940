"""Sealed trace chunks (zstd's seekable format, docs/design.md D9): read as the plain ones,
random access that decompresses only the frames a record spans, ``zstd -dcf`` and pyzstd
read them, the CLI on sealed streams, damaged frames and seek tables, stray files,
``float_decimals``, and seals or rolls that fail on a full disk."""

from __future__ import annotations

import copy
import errno
import logging
import os
import random
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
import pyzstd
from streams import cli, copy_stream, cut_index, index_rows

from monitors import TraceFormatError, TraceWriteError
from monitors.traces import (
    IndexRow,
    TraceReader,
    TraceWriter,
    _reader,
    _sealed,
    aread_records,
    find_record,
    find_row,
    read_record,
    read_records,
    read_row,
)
from monitors.traces._index import count_rows
from monitors.traces._layout import (
    chunk_path,
    index_path,
    list_chunks,
    scan,
    sealed_path,
    sealing_path,
)
from monitors.traces._sealed import FRAME_BYTES

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def stream(tmp_path: Path) -> Path:
    """A stream's directory (not made yet); its index goes beside it, in ``tmp_path``."""
    return tmp_path / "stream"


# -- the seek table, read here from zstd's spec (not from monitors.traces._sealed) ---------

_SEEKABLE_MAGIC = 0x8F92EAB1
_SKIPPABLE_MAGIC = 0x184D2A5E
_FOOTER = 9  # frames (u32), descriptor (u8), magic (u32)


@dataclass(frozen=True)
class SeekTable:
    """A sealed file's frames: ``c[i]``/``d[i]`` is where frame ``i`` starts compressed /
    uncompressed (one more entry than frames); ``entries`` is the file offset of the first
    seek table entry, ``entry`` the size of one."""

    c: list[int]
    d: list[int]
    entries: int
    entry: int

    @property
    def frames(self) -> int:
        return len(self.d) - 1

    def frame_of(self, offset: int) -> int:
        """The frame holding uncompressed byte ``offset``."""
        return max(i for i in range(self.frames) if self.d[i] <= offset)


def seek_table(path: Path) -> SeekTable:
    data = path.read_bytes()
    frames, descriptor, magic = struct.unpack("<IBI", data[-_FOOTER:])
    assert magic == _SEEKABLE_MAGIC, f"{path.name} does not end with a seek table"
    entry = 12 if descriptor & 0x80 else 8
    start = len(data) - _FOOTER - frames * entry - 8
    skippable, size = struct.unpack_from("<II", data, start)
    assert (skippable, size) == (_SKIPPABLE_MAGIC, frames * entry + _FOOTER)
    c, d = [0], [0]
    for i in range(frames):
        c_size, d_size = struct.unpack_from("<II", data, start + 8 + i * entry)
        c.append(c[-1] + c_size)
        d.append(d[-1] + d_size)
    assert c[-1] == start, "the frames do not end where the seek table starts"
    return SeekTable(c, d, start + 8, entry)


def damage_frame(path: Path, frame: int) -> SeekTable:
    """Flip bytes in the middle of ``frame``'s compressed data (sizes unchanged)."""
    table = seek_table(path)
    data = bytearray(path.read_bytes())
    middle = (table.c[frame] + table.c[frame + 1]) // 2
    for i in range(middle, middle + 16):
        data[i] ^= 0x5A
    path.write_bytes(bytes(data))
    return table


# -- streams ------------------------------------------------------------------------------

_WORDS = ["alpha", "βeta", "漢字", "🙂", 'quo"te', "back\\slash", "new\nline", "tab\t", "\x00"]


def mixed_values() -> list[Any]:
    """Records of 5 B to ~150 KB with escapes, non-ASCII, full-precision floats, 64-bit
    integers and ids (some long, one of 10 KB with escapes: rows keep ids verbatim, of any
    length), and a few values without a string id."""
    rng = random.Random(2024)
    out: list[Any] = []
    for n in range(80):
        size = rng.choice([5, 300, 4000, 30_000, 120_000])
        record_id = f"rec-{n}" if n % 9 else "long/" + "é" * 70 + f"/{n}"
        if n == 40:
            record_id = "huge/" + 'é"\\\n漢' * 2000 + f"/{n}"
        out.append(
            {
                "id": record_id,
                "n": n,
                "text": " ".join(rng.choice(_WORDS) for _ in range(size // 6 + 1)),
                "floats": [rng.random() * 10 ** rng.randint(-30, 30) for _ in range(4)],
                "ints": [rng.randint(-(2**63), 2**64 - 1) for _ in range(3)],
                "nested": {"a": [None, True, {"b": -0.0, "c": ""}]},
            }
        )
    out.insert(30, ["not", "an", "object", 1.5])
    out.insert(50, "a bare string\u2028")
    out.insert(60, {"id": 12, "n": "an int id is not indexed"})
    assert any(len(orjson.dumps(v["id"])) > 10_000 for v in out if isinstance(v, dict))
    return out


def string_ids(values: list[Any]) -> list[tuple[int, str]]:
    return [
        (n, v["id"]) for n, v in enumerate(values) if isinstance(v, dict) and type(v["id"]) is str
    ]


def write(directory: Path, values: list[Any], **kwargs: Any) -> list[IndexRow]:
    async def main() -> list[IndexRow]:
        async with TraceWriter(directory, fsync=False, **kwargs) as writer:
            return [await writer.append(v, step=n, kind="train") for n, v in enumerate(values)]

    return anyio.run(main)


def dumps_all(values: Any) -> list[bytes]:
    return [orjson.dumps(v) for v in values]


def lines_of(values: list[Any]) -> bytes:
    return b"".join(orjson.dumps(v) + b"\n" for v in values)


@dataclass(frozen=True)
class Twins:
    """The same values written plain, sealed whole (``seal_on_close``), and sealed but for
    the live chunk."""

    values: list[Any]
    plain: Path
    sealed: Path
    mixed: Path


@pytest.fixture(scope="module")
def twins(tmp_path_factory: pytest.TempPathFactory) -> Twins:
    root = tmp_path_factory.mktemp("twins")
    values = mixed_values()
    out = Twins(values, root / "plain", root / "sealed", root / "mixed")
    rows = write(out.plain, values, chunk_bytes=150_000, compress=False)
    assert write(out.sealed, values, chunk_bytes=150_000) == rows
    assert write(out.mixed, values, chunk_bytes=150_000, seal_on_close=False) == rows
    chunks = list_chunks(out.plain)
    assert len(chunks) >= 8, chunks
    assert scan(out.plain).sealed == []
    assert scan(out.sealed).plain == []
    assert scan(out.sealed).sealed == chunks
    assert scan(out.mixed).plain == [chunks[-1]]
    assert scan(out.mixed).sealed == chunks[:-1]
    return out


def copy_of(directory: Path, tmp_path: Path) -> Path:
    """A copy of the stream in ``tmp_path``, its index beside it."""
    return copy_stream(directory, tmp_path / directory.name)


def open_fails_naming(directory: Path, name: str) -> None:
    """``TraceWriter.open()`` refuses the stream: a TraceWriteError naming the file, whose
    cause is the reader's TraceFormatError naming it."""
    with pytest.raises(TraceWriteError) as info:
        anyio.run(TraceWriter(directory, fsync=False).open)
    assert name in str(info.value)
    cause = info.value.__cause__
    assert isinstance(cause, TraceFormatError), repr(cause)
    assert cause.chunk == name


# -- a sealed stream reads as the plain one ------------------------------------------------


@pytest.mark.parametrize("which", ["sealed", "mixed"])
def test_a_sealed_stream_reads_as_the_plain_one(twins: Twins, which: str) -> None:
    directory: Path = getattr(twins, which)
    values = twins.values
    expected = dumps_all(values)
    chunks = list_chunks(twins.plain)
    assert list_chunks(directory) == chunks
    # Offsets are the plain chunk's: the index is the same, byte for byte.
    assert index_path(directory).read_bytes() == index_path(twins.plain).read_bytes()
    # Each stream's directory holds its chunks only; its index is beside it.
    assert sorted(os.listdir(directory.parent)) == [
        *("mixed", "mixed.index.jsonl", "plain", "plain.index.jsonl"),
        *("sealed", "sealed.index.jsonl"),
    ]
    for c in chunks:
        plain = chunk_path(twins.plain, c).read_bytes()
        if sealed_path(directory, c).exists():
            assert not chunk_path(directory, c).exists()
            assert pyzstd.decompress(sealed_path(directory, c).read_bytes()) == plain
        else:
            assert chunk_path(directory, c).read_bytes() == plain

    reader = TraceReader(directory)
    assert dumps_all(reader) == expected
    assert (reader.records, reader.skipped, reader.damaged, reader.torn_tail_bytes) == (
        len(values),
        0,
        0,
        0,
    )
    assert dumps_all(read_records(directory)) == expected
    assert dumps_all(TraceReader(directory, big_line=1000)) == expected  # ijson, from frames

    async def read_async() -> list[bytes]:
        return [orjson.dumps(r) async for r in aread_records(directory)]

    assert anyio.run(read_async) == expected
    for n in range(len(values)):
        assert orjson.dumps(read_record(directory, n)) == expected[n]
        assert read_row(directory, n) == read_row(twins.plain, n)
    assert orjson.dumps(read_record(directory, -1)) == expected[-1]
    ids = string_ids(values)
    for n, record_id in ids:
        assert find_row(directory, record_id) == find_row(twins.plain, record_id)
        assert find_row(directory, record_id)[0] == n
        assert orjson.dumps(find_record(directory, record_id)) == expected[n]
    with pytest.raises(KeyError):
        find_record(directory, "no such id")


# -- random access into a multi-frame chunk ------------------------------------------------


def framed_values() -> list[Any]:
    """~45 MiB of records: 1 to 6 MiB ones with a few of 50-400 KB between them, the text
    random hex (so zstd has work) after escapes and non-ASCII. The second record (~6 MiB
    from ~3.5 MiB on) spans three frames, the fourth (300 KB from ~11.9 MiB on) two."""
    rng = random.Random(5)
    out: list[Any] = []
    sizes = [int(3.5 * MiB), 6 * MiB - 4096, int(2.4 * MiB), 300_000]
    for _ in range(11):
        sizes += [rng.randint(MiB, 6 * MiB), *(rng.randint(50_000, 400_000) for _ in "ab")]
    for n, size in enumerate(sizes):
        text = 'é漢🙂 "q" \\ \n\t\x00 ' + rng.randbytes(size // 2).hex()
        out.append({"id": f"f{n}", "n": n, "text": text, "x": rng.random()})
    out.append({"id": "last", "n": len(out), "text": "the last one"})
    return out


def small_framed_values() -> list[Any]:
    """~17 MiB of 60-140 KB records: many of them in every frame."""
    rng = random.Random(11)
    return [
        {"id": f"s{n}", "n": n, "text": rng.randbytes(rng.randint(30_000, 70_000)).hex()}
        for n in range(170)
    ]


@dataclass(frozen=True)
class Framed:
    values: list[Any]
    rows: list[IndexRow]
    directory: Path
    table: SeekTable


def _framed(directory: Path, values: list[Any]) -> Framed:
    rows = write(directory, values, chunk_bytes=1 << 30)
    assert (scan(directory).sealed, scan(directory).plain) == ([0], [])
    table = seek_table(sealed_path(directory, 0))
    assert all(b - a == FRAME_BYTES for a, b in zip(table.d, table.d[1:-1], strict=False))
    return Framed(values, rows, directory, table)


@pytest.fixture(scope="module")
def framed(tmp_path_factory: pytest.TempPathFactory) -> Framed:
    """One sealed chunk of ~12 frames, records of 1 to 6 MiB."""
    framed = _framed(tmp_path_factory.mktemp("framed") / "stream", framed_values())
    assert framed.table.frames >= 10
    return framed


@pytest.fixture(scope="module")
def small_framed(tmp_path_factory: pytest.TempPathFactory) -> Framed:
    """One sealed chunk of 5 frames, records of ~100 KB."""
    framed = _framed(tmp_path_factory.mktemp("small-framed") / "stream", small_framed_values())
    assert framed.table.frames >= 5
    return framed


def spanned(table: SeekTable, first: int, last: int) -> list[int]:
    """The frames holding bytes ``first`` to ``last`` (included)."""
    return list(range(table.frame_of(first), table.frame_of(last) + 1))


def test_random_access_decompresses_only_the_frames_a_record_spans(
    framed: Framed, monkeypatch: pytest.MonkeyPatch
) -> None:
    big_line = MiB
    monkeypatch.setattr(_reader, "BIG_LINE", big_line)
    table, rows, values = framed.table, framed.rows, framed.values
    # The layout holds what this test is about.
    frames_of = [spanned(table, r.offset, r.end - 1) for r in rows]
    small = [len(f) for r, f in zip(rows, frames_of, strict=True) if r.length - 1 <= big_line]
    big = [len(f) for r, f in zip(rows, frames_of, strict=True) if r.length - 1 > big_line]
    assert max(small) == 2, "no small record crosses a frame boundary"
    assert max(big) == 3, "no big record spans three frames"
    assert 2 in big, "no big record spans two frames"
    assert frames_of[-1] == [table.frames - 1]

    loads: list[int] = []
    real = pyzstd.decompress

    def counting(data: bytes, *args: Any, **kwargs: Any) -> bytes:
        out = real(data, *args, **kwargs)
        loads.append(len(out))
        return out

    monkeypatch.setattr(pyzstd, "decompress", counting)
    order = list(range(len(values)))
    random.Random(1).shuffle(order)
    for n in order:
        row = rows[n]
        # A big record is streamed through ijson without its newline.
        last = row.end - 1 if row.length - 1 <= big_line else row.end - 2
        frames = spanned(table, row.offset, last)
        want = [table.d[f + 1] - table.d[f] for f in frames]
        loads.clear()
        assert orjson.dumps(read_record(framed.directory, n)) == orjson.dumps(values[n])
        assert loads == want, (n, row, frames)
        if len(frames) > 1:
            loads.clear()
            assert find_record(framed.directory, values[n]["id"]) == values[n]
            assert loads == want, (n, row, frames)
    loads.clear()
    assert read_record(framed.directory, -1) == values[-1]
    assert loads == [table.d[-1] - table.d[-2]]  # the last frame only


# -- zstd and pyzstd read sealed chunks ----------------------------------------------------


@pytest.mark.parametrize("which", ["sealed", "mixed"])
def test_zstd_tool_and_library_decompress_a_sealed_stream(twins: Twins, which: str) -> None:
    directory: Path = getattr(twins, which)
    expected = lines_of(twins.values)
    chunks = list_chunks(directory)
    assert b"".join(chunk_path(twins.plain, c).read_bytes() for c in chunks) == expected
    # The library, always: each .zst whole (pyzstd skips the seek table's skippable frame).
    got = b""
    for c in chunks:
        sealed = sealed_path(directory, c)
        got += (
            pyzstd.decompress(sealed.read_bytes())
            if sealed.exists()
            else chunk_path(directory, c).read_bytes()
        )
    assert got == expected
    assert [orjson.loads(line) for line in got.splitlines()] == twins.values

    # The tool, where installed: `zstd -dcf DIR/0*` (a plain last chunk passed through).
    if shutil.which("zstd") is None:
        return
    out = subprocess.run(
        ["sh", "-c", 'zstd -qdcf "$1"/0*', "sh", str(directory)],
        capture_output=True,
        check=False,
        timeout=60,
        env={**os.environ, "LC_ALL": "C"},
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout == expected
    if shutil.which("jq") is None:
        return
    jq = subprocess.run(
        ["jq", "-c", "."], input=out.stdout, capture_output=True, check=False, timeout=60
    )
    assert jq.returncode == 0, jq.stderr
    parsed = [orjson.loads(line) for line in jq.stdout.splitlines()]
    assert len(parsed) == len(twins.values)
    for got_value, value in zip(parsed, twins.values, strict=True):
        # jq may reformat numbers; the shape and the strings come through.
        assert type(got_value) is type(value)
        if isinstance(value, dict):
            assert (got_value["id"], got_value["n"]) == (value["id"], value["n"])
            assert got_value.get("text") == value.get("text")


# -- the CLI on sealed streams -------------------------------------------------------------


def stat_fields(out: bytes) -> dict[str, str]:
    fields = {}
    for line in out.decode().splitlines():
        key, _, value = line.partition("  ")
        fields[key.strip()] = value.strip()
    return fields


@pytest.mark.parametrize("which", ["sealed", "mixed"])
def test_cli_cat_and_verify_a_sealed_stream(twins: Twins, which: str) -> None:
    directory: Path = getattr(twins, which)
    result = cli("cat", directory)
    assert result.returncode == 0, result.stderr
    assert result.stdout == lines_of(twins.values)

    result = cli("verify", directory)
    assert result.returncode == 0, result.stdout + result.stderr
    assert b"problem:" not in result.stdout
    assert f"{len(twins.values)} records verified, 0 problems".encode() in result.stdout


def test_cli_get_prints_the_record_with_that_id(twins: Twins) -> None:
    directory = twins.sealed
    ids = string_ids(twins.values)
    long_id = next(i for i in ids if len(orjson.dumps(i[1])) > 10_000)
    for n, record_id in [ids[0], ids[len(ids) // 2], ids[-1], long_id]:
        result = cli("get", directory, record_id)
        assert result.returncode == 0, result.stderr
        assert result.stdout == orjson.dumps(twins.values[n]) + b"\n"
    result = cli("get", directory, "rec-unknown")
    assert result.returncode == 1
    assert result.stdout == b""
    assert b"rec-unknown" in result.stderr


def test_cli_stat_shows_plain_and_sealed_bytes_and_the_ratio(twins: Twins) -> None:
    chunks = list_chunks(twins.mixed)
    result = cli("stat", twins.mixed)
    assert result.returncode == 0, result.stdout + result.stderr
    fields = stat_fields(result.stdout)
    plain = chunk_path(twins.mixed, chunks[-1]).stat().st_size
    holding = sum(chunk_path(twins.plain, c).stat().st_size for c in chunks[:-1])
    # On the disk: the frames and the seek table.
    compressed = sum(sealed_path(twins.mixed, c).stat().st_size for c in chunks[:-1])
    frames = sum(seek_table(sealed_path(twins.mixed, c)).c[-1] for c in chunks[:-1])
    assert frames < compressed < holding
    assert fields["records"] == str(len(twins.values))
    assert fields["index rows"] == str(len(twins.values))
    assert fields["chunks"] == f"{len(chunks)} ({len(chunks) - 1} sealed)"
    assert fields["plain bytes"] == str(plain)
    assert fields["sealed bytes"] == (
        f"{compressed} (holding {holding} bytes: {holding / compressed:.2f}x)"
    )
    assert fields["bytes"] == f"{plain + holding} uncompressed"
    assert fields["torn tails"] == "0"
    assert fields["damaged"].startswith("0 ")


def test_cli_verify_names_a_damaged_frame_and_a_truncated_chunk(
    small_framed: Framed, twins: Twins, tmp_path: Path
) -> None:
    directory = copy_of(small_framed.directory, tmp_path)
    damage_frame(sealed_path(directory, 0), 1)
    result = cli("verify", directory)
    assert result.returncode == 1, result.stdout
    assert b"problem: 00000.jsonl.zst: a damaged zstd frame" in result.stdout
    result = cli("cat", directory)
    assert result.returncode == 1
    assert b"in 00000.jsonl.zst" in result.stderr
    result = cli("stat", directory)
    assert result.returncode == 1
    assert stat_fields(result.stdout)["damaged"].startswith("1 ")

    directory = copy_of(twins.sealed, tmp_path)
    path = sealed_path(directory, 2)
    os.truncate(path, path.stat().st_size - 5)
    result = cli("verify", directory)
    assert result.returncode == 1, result.stdout
    assert b"problem: " in result.stdout
    assert b"in 00002.jsonl.zst" in result.stdout


# -- damaged frames ------------------------------------------------------------------------


def overlapping(rows: list[IndexRow], table: SeekTable, frames: list[int]) -> list[int]:
    """Records whose bytes (newline included) overlap any of ``frames``."""
    return [
        n
        for n, r in enumerate(rows)
        if any(r.offset < table.d[f + 1] and table.d[f] < r.end for f in frames)
    ]


@pytest.mark.parametrize(
    ("stream", "frame", "big_line"),
    [
        ("small_framed", 0, _reader.BIG_LINE),
        ("small_framed", 2, 100_000),  # lines over 100 KB found and parsed from the frames
        ("small_framed", -1, _reader.BIG_LINE),
        ("framed", 1, MiB),  # records of 1 to 6 MiB, each over big_line
        ("framed", 2, _reader.BIG_LINE),
    ],
)
def test_a_damaged_frame_loses_exactly_the_records_it_holds(
    request: pytest.FixtureRequest, tmp_path: Path, stream: str, frame: int, big_line: int
) -> None:
    framed: Framed = request.getfixturevalue(stream)
    directory = copy_of(framed.directory, tmp_path)
    table = framed.table
    frame %= table.frames
    damage_frame(sealed_path(directory, 0), frame)
    lost = overlapping(framed.rows, table, [frame])
    assert len(lost) >= 2 if stream == "small_framed" else lost

    reader = TraceReader(directory, on_error="skip", big_line=big_line)
    kept = [v for n, v in enumerate(framed.values) if n not in lost]
    assert dumps_all(reader) == dumps_all(kept)
    assert (reader.records, reader.skipped, reader.damaged) == (len(kept), len(lost), 1)

    with pytest.raises(TraceFormatError) as info:
        list(TraceReader(directory, big_line=big_line))
    assert info.value.chunk == "00000.jsonl.zst"
    assert info.value.offset == framed.rows[lost[0]].offset
    assert "00000.jsonl.zst" in str(info.value)

    for n in {0, lost[0] - 1, *lost, lost[-1] + 1, len(framed.values) - 1}:
        if not 0 <= n < len(framed.values):
            continue
        if n in lost:
            with pytest.raises(TraceFormatError, match=r"00000\.jsonl\.zst"):
                read_record(directory, n)
        else:
            assert read_record(directory, n) == framed.values[n]


def test_two_damaged_frames_lose_exactly_the_records_they_hold(
    small_framed: Framed, tmp_path: Path
) -> None:
    """Past the first damaged frame, reading resumes at a record, not at a frame boundary;
    the records of the sound frame before the second damaged one must still be read."""
    directory = copy_of(small_framed.directory, tmp_path)
    path = sealed_path(directory, 0)
    damage_frame(path, 1)
    damage_frame(path, 3)
    lost = overlapping(small_framed.rows, small_framed.table, [1, 3])

    reader = TraceReader(directory, on_error="skip")
    got = [v["n"] for v in reader]
    assert got == [n for n in range(len(small_framed.values)) if n not in lost]
    assert (reader.skipped, reader.damaged) == (len(lost), 2)


def test_reopening_names_a_damaged_frame_it_must_read(small_framed: Framed, tmp_path: Path) -> None:
    """Index rows lost are rebuilt from the data on reopening; a damaged frame on the way
    makes ``open()`` fail as a damaged seek table does, naming the file (not with
    ``DamagedFrame``, the reader's own exception)."""
    directory = copy_of(small_framed.directory, tmp_path)
    damage_frame(sealed_path(directory, 0), 2)
    cut_index(directory, 10)  # rows lost up to frame 2 and past
    open_fails_naming(directory, "00000.jsonl.zst")


# -- damaged seek tables, truncated chunks, stray files ------------------------------------


def _cut(path: Path) -> None:
    os.truncate(path, path.stat().st_size - 1)


def _cut_half(path: Path) -> None:
    os.truncate(path, path.stat().st_size // 2)


def _entry_past_the_end(path: Path) -> None:
    table = seek_table(path)
    data = bytearray(path.read_bytes())
    c_size, d_size = struct.unpack_from("<II", data, table.entries)
    struct.pack_into("<II", data, table.entries, c_size + 1000, d_size)
    path.write_bytes(bytes(data))


def _footer_frames(path: Path) -> None:
    data = bytearray(path.read_bytes())
    frames, descriptor, magic = struct.unpack_from("<IBI", data, len(data) - _FOOTER)
    struct.pack_into("<IBI", data, len(data) - _FOOTER, frames + 1, descriptor, magic)
    path.write_bytes(bytes(data))


@pytest.mark.parametrize(
    "damage", [_cut, _cut_half, _entry_past_the_end, _footer_frames], ids=lambda f: f.__name__
)
def test_a_sealed_chunk_without_a_whole_seek_table_is_named(
    twins: Twins, tmp_path: Path, damage: Any
) -> None:
    directory = copy_of(twins.sealed, tmp_path)
    bad = 3
    name = sealed_path(directory, bad).name
    damage(sealed_path(directory, bad))
    in_bad = [n for n in range(len(twins.values)) if read_row(directory, n).chunk == bad]
    assert in_bad

    with pytest.raises(TraceFormatError) as info:
        list(read_records(directory))
    assert info.value.chunk == name
    assert name in str(info.value)
    for n in (in_bad[0], in_bad[-1]):
        with pytest.raises(TraceFormatError) as info:
            read_record(directory, n)
        assert info.value.chunk == name
    open_fails_naming(directory, name)

    reader = TraceReader(directory, on_error="skip")
    kept = [v for n, v in enumerate(twins.values) if n not in in_bad]
    assert dumps_all(reader) == dumps_all(kept)
    assert (reader.skipped, reader.damaged) == (len(in_bad), 1)


def test_a_stray_file_is_named(twins: Twins, tmp_path: Path) -> None:
    directory = copy_of(twins.mixed, tmp_path)
    (directory / "notes.txt").write_text("mine\n")
    with pytest.raises(TraceFormatError) as info:
        list(read_records(directory))
    assert info.value.chunk == "notes.txt"
    assert "notes.txt" in str(info.value)
    open_fails_naming(directory, "notes.txt")
    result = cli("verify", directory)
    assert result.returncode == 1
    assert b"notes.txt" in result.stderr


# -- a seal a crash cut short ---------------------------------------------------------------


@pytest.mark.parametrize(
    "left",
    [
        "half a .zst.tmp file",
        "an empty .zst.tmp file",
        "a whole .zst.tmp file",
        "renamed, the plain one not unlinked",
        "a sealed copy cut short",
        "a sealed copy of other bytes",
    ],
)
@pytest.mark.parametrize("live", [False, True], ids=["full chunk", "live chunk"])
def test_reopening_settles_a_seal_cut_short(
    twins: Twins, tmp_path: Path, left: str, live: bool
) -> None:
    directory = copy_of(twins.mixed, tmp_path)
    chunks = list_chunks(directory)
    last = chunks[-1]
    chunk = last if live else 2
    plain = chunk_path(twins.plain, chunk).read_bytes()
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    chunk_path(scratch, chunk).write_bytes(plain)
    _sealed.seal(scratch, chunk, fsync=False)
    whole = sealed_path(scratch, chunk).read_bytes()
    assert pyzstd.decompress(whole) == plain
    chunk_path(directory, chunk).write_bytes(plain)
    sealed_path(directory, chunk).unlink(missing_ok=True)
    if left.endswith(".zst.tmp file"):
        cut = {
            "half a .zst.tmp file": len(whole) // 2,
            "an empty .zst.tmp file": 0,
            "a whole .zst.tmp file": len(whole),
        }[left]
        sealing_path(directory, chunk).write_bytes(whole[:cut])
    elif left == "renamed, the plain one not unlinked":
        sealed_path(directory, chunk).write_bytes(whole)
    elif left == "a sealed copy cut short":
        sealed_path(directory, chunk).write_bytes(whole[:-10])
    else:  # whole, but of the chunk without its last record
        chunk_path(scratch, chunk).write_bytes(plain[: plain.rfind(b"\n", 0, -1) + 1])
        _sealed.seal(scratch, chunk, fsync=False)
        sealed_path(scratch, chunk).replace(sealed_path(directory, chunk))
    finished = left == "renamed, the plain one not unlinked"
    # Readers read the plain chunk meanwhile.
    assert dumps_all(read_records(directory)) == dumps_all(twins.values)

    extra = {"id": "after", "n": "after the crash"}
    appends_in = last + 1 if live and finished else last

    async def reopen() -> None:
        # Not sealing (compress=False): what recovery settled is seen as it left it.
        async with TraceWriter(directory, chunk_bytes=150_000, compress=False) as writer:
            recovery = writer.recovery
            assert recovery is not None
            assert (recovery.seals_undone, recovery.seals_finished) == (
                (0, 1) if finished else (1, 0)
            )
            assert recovery.mended
            assert recovery.records == len(twins.values)
            assert recovery.chunk == appends_in
            assert recovery.unsealed == ([] if live or finished else [chunk])
            listing = scan(directory)
            assert listing.sealing == [], "a .zst.tmp leftover after reopening"
            assert not set(listing.plain) & set(listing.sealed), listing
            assert (chunk in listing.sealed) == finished, listing
            await writer.append(extra)
        # Sealing: the chunk left plain is sealed in the background, the live one on close.
        async with TraceWriter(directory, chunk_bytes=150_000, fsync=False) as writer:
            recovery = writer.recovery
            assert recovery is not None
            assert not recovery.mended
            assert recovery.unsealed == ([] if live or finished else [chunk])

    anyio.run(reopen)
    listing = scan(directory)
    assert (listing.plain, listing.sealing) == ([], [])
    assert listing.sealed == list_chunks(directory)
    # Sealed again from the plain chunk (which the live one appends went on in).
    assert pyzstd.decompress(sealed_path(directory, chunk).read_bytes()).startswith(plain)
    values = [*twins.values, extra]
    assert dumps_all(read_records(directory)) == dumps_all(values)
    for n in range(len(values)):
        assert read_record(directory, n) == values[n]


# -- float_decimals ------------------------------------------------------------------------


def _rounded(value: Any, decimals: int) -> Any:
    if type(value) is float:
        return round(value, decimals)
    if isinstance(value, (list, tuple)):
        return [_rounded(v, decimals) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v, decimals) for k, v in value.items()}
    return value


@pytest.mark.anyio
async def test_float_decimals_rounds_on_disk_only(stream: Path) -> None:
    rng = random.Random(3)
    record = {
        "id": "floats",
        "x": 3.14159,
        "ints": [1, 2**63, True],
        "nested": [2.71828, {"y": -0.123456, "z": (1.23456, 7)}],
        "many": [rng.random() * 1000 for _ in range(20_000)],  # past the small-value path
        "text": "1.23456",
    }
    before = copy.deepcopy(record)
    async with TraceWriter(stream, float_decimals=2, fsync=False) as writer:
        await writer.append(record)
        await writer.append({"plain": 1.23456})
    assert record == before, "the caller's record was changed"
    assert record["x"] == 3.14159
    got = list(read_records(stream))
    assert got == [_rounded(record, 2), {"plain": 1.23}]
    assert got[0]["x"] == 3.14
    assert got[0]["nested"][1]["z"] == [1.23, 7]
    assert got[0]["ints"] == [1, 2**63, True]
    with pytest.raises(ValueError, match="float_decimals"):
        TraceWriter(stream, float_decimals=1.5)  # type: ignore[arg-type]


# -- a seal or a roll that fails ----------------------------------------------------------


class _Disk:
    """A disk that is full until ``free()``."""

    def __init__(self) -> None:
        self.full = True
        self.refused = 0

    def check(self) -> None:
        if self.full:
            self.refused += 1
            raise OSError(errno.ENOSPC, "No space left on device")

    def free(self) -> None:
        self.full = False


@pytest.mark.anyio
@pytest.mark.parametrize("where", ["write", "rename"])
async def test_a_seal_that_fails_leaves_the_plain_chunk_and_close_retries_it(
    stream: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    where: str,
) -> None:
    disk = _Disk()
    if where == "write":
        real_write = pyzstd.SeekableZstdFile.write

        def write(self: pyzstd.SeekableZstdFile, data: Any) -> int:
            disk.check()
            return real_write(self, data)

        monkeypatch.setattr(pyzstd.SeekableZstdFile, "write", write)
    else:
        real_replace = os.replace

        def replace(src: Any, dst: Any, *args: Any, **kwargs: Any) -> None:
            if str(src).endswith(".zst.tmp"):
                disk.check()
            real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "replace", replace)

    values = [{"id": f"v{n}", "n": n, "text": "é" * 700} for n in range(12)]
    writer = TraceWriter(stream, chunk_bytes=3000, fsync=False)
    with caplog.at_level(logging.ERROR, logger="monitors.traces"):
        async with writer:
            for v in values:
                await writer.append(v)
            await writer._settle()  # the last roll's seal, in the background
            live = writer._chunk
            full = list(range(live))
            assert len(full) >= 3
            assert disk.refused == len(full)
            assert writer.seal_failures == set(full)
            listing = scan(stream)
            assert listing.sealing == [], "a failed seal left its temporary file"
            assert listing.sealed == []
            assert listing.plain == [*full, live]
            assert dumps_all(read_records(stream)) == dumps_all(values)
            for n in range(len(values)):
                assert read_record(stream, n) == values[n]
            for c in full:
                assert f"cannot seal chunk {c}, left plain" in caplog.text
            disk.free()
    # close() tried them again, and sealed the live chunk too.
    assert writer.seal_failures == set()
    listing = scan(stream)
    assert (listing.plain, listing.sealing) == ([], [])
    assert listing.sealed == [*full, live]
    assert dumps_all(read_records(stream)) == dumps_all(values)


@pytest.mark.anyio
async def test_a_seal_that_fails_at_close_is_left_plain_and_reported(
    stream: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    disk = _Disk()
    real_write = pyzstd.SeekableZstdFile.write

    def write(self: pyzstd.SeekableZstdFile, data: Any) -> int:
        disk.check()
        return real_write(self, data)

    monkeypatch.setattr(pyzstd.SeekableZstdFile, "write", write)
    values = [{"n": n, "text": "x" * 500} for n in range(3)]
    writer = TraceWriter(stream, fsync=False)
    with caplog.at_level(logging.ERROR, logger="monitors.traces"):
        async with writer:
            for v in values:
                await writer.append(v)
    assert writer.seal_failures == {0}
    assert "cannot seal chunk 0, left plain" in caplog.text
    assert (scan(stream).plain, scan(stream).sealed, scan(stream).sealing) == ([0], [], [])
    assert dumps_all(read_records(stream)) == dumps_all(values)
    # Reopened with room on the disk, the stream goes on in the plain chunk and seals it.
    disk.free()
    async with TraceWriter(stream, fsync=False) as again:
        assert again.recovery is not None
        assert again.recovery.chunk == 0
        await again.append({"n": 3})
    assert (scan(stream).plain, scan(stream).sealed) == ([], [0])
    assert [v["n"] for v in read_records(stream)] == [0, 1, 2, 3]


@pytest.mark.anyio
@pytest.mark.parametrize(
    "when",
    ["the chunk is full", "the next record does not fit", "a MiB of the next record is written"],
)
async def test_a_roll_that_fails_fails_that_append_only(
    stream: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    chunk_bytes = 3000
    values: list[Any]
    if when == "the chunk is full":
        # A record larger than chunk_bytes fills chunk 0: the next append rolls first.
        values = [{"n": 0, "text": "x" * 5000}, *({"n": n, "text": "y" * 900} for n in (1, 2))]
        fails_at = 1
    elif when == "the next record does not fit":
        # Three ~1 KB records fill most of chunk 0; the fourth does not fit: it rolls.
        values = [{"n": n, "text": "y" * 900} for n in range(4)]
        fails_at = 3
    else:
        # 1.5 MB in a 3 MiB chunk; the next 2 MB record is written a MiB at a time until it
        # does not fit: what was written is cut off, then it rolls.
        chunk_bytes = 3 * MiB
        values = [{"n": n, "parts": ["é" * 1000] * size} for n, size in enumerate([750, 1000])]
        fails_at = 1
    values += [{"n": n, "text": "z" * 900} for n in range(len(values), len(values) + 4)]
    writer = TraceWriter(stream, chunk_bytes=chunk_bytes, fsync=False)
    written: list[Any] = []
    async with writer:
        for v in values[:fails_at]:
            await writer.append(v)
            written.append(v)
        real_open = writer._open_chunk
        refused: list[Path] = []

        def open_chunk(path: Path) -> int:
            if not refused:
                refused.append(path)
                raise OSError(errno.ENOSPC, "No space left on device")
            return real_open(path)

        monkeypatch.setattr(writer, "_open_chunk", open_chunk)
        with pytest.raises(TraceWriteError, match="No space left on device"):
            await writer.append(values[fails_at])
        assert refused == [chunk_path(stream, 1)]
        assert writer.records == len(written)
        assert dumps_all(read_records(stream)) == dumps_all(written)
        assert count_rows(index_path(stream)) == len(written)
        assert index_path(stream).read_bytes().endswith(b"\n")
        # The stream is not closed: the same record goes in now, and the rest after it.
        for v in values[fails_at:]:
            row = await writer.append(v)
            written.append(v)
            assert read_row(stream, len(written) - 1) == row
    assert written == values
    assert dumps_all(read_records(stream)) == dumps_all(values)
    assert [r.line for r in index_rows(stream)] == list(range(1, len(values) + 1))
    assert index_path(stream).read_bytes().endswith(b"\n")
    for n, v in enumerate(values):
        assert read_record(stream, n) == v
    assert read_row(stream, fails_at).chunk == 1
    assert scan(stream).sealed == list_chunks(stream)


def test_a_stream_caught_mid_seal_reads_whole(stream: Path) -> None:
    """prime-rl seals through ``NNNNN.jsonl.zst.tmp``, as nodewise does: a reader that finds
    one (a seal under way, or a crash's leftover) reads the plain chunk beside it, never the
    temporary file, and raises nothing."""
    values = [{"id": f"r{n}", "n": n, "pad": "x" * 2000} for n in range(40)]
    write(stream, values, chunk_bytes=20_000, compress=False)
    chunks = list_chunks(stream)
    assert len(chunks) >= 3
    temp = sealing_path(stream, chunks[0])
    assert temp.name == f"{chunks[0]:05d}.jsonl.zst.tmp"
    temp.write_bytes(pyzstd.compress(b'{"id": "half a seal"')[:50])  # cut short
    assert list(read_records(stream)) == values
    assert read_record(stream, 0) == values[0]
    assert find_record(stream, "r39") == values[39]
    assert list_chunks(stream) == chunks
    assert scan(stream).sealing == [chunks[0]]
    stat = cli("stat", stream)
    assert stat.returncode == 0, stat.stderr
