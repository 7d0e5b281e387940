"""``python -m monitors.traces stat|verify|cat DIR`` on a small stream, run as a user would."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio
import orjson
import pytest
from streams import cli

from monitors.traces import TraceWriter, read_records
from monitors.traces._layout import INDEX_NAME, ROW_BYTES, chunk_path, list_chunks

ROOT = Path(__file__).resolve().parents[1]


def _values() -> list[Any]:
    out: list[Any] = []
    for n in range(30):
        out.append(
            {
                "n": n,
                "text": ('é漢🙂 "q" \\ \n\t\x00 ' * (n * 37 % 200 + 1)),
                "floats": [n / 7, -0.0, 1e-300, 1.7976931348623157e308],
                "ints": [2**63 - 1, -(2**63), 2**64 - 1],
            }
        )
    out.insert(17, ["not", "an", "object", 1.5])
    out.insert(23, "a bare string\u2028")
    return out


@pytest.fixture
def stream(tmp_path: Path) -> tuple[Path, list[Any]]:
    values = _values()
    directory = tmp_path / "stream"

    async def write() -> None:
        async with TraceWriter(directory, chunk_bytes=6000, compress=False) as writer:
            for i, v in enumerate(values):
                await writer.append(v, step=i, kind="train", subset="all")

    anyio.run(write)
    assert len(list_chunks(directory)) >= 4
    return directory, values


def test_cat_prints_each_record_as_stored(stream: tuple[Path, list[Any]]) -> None:
    directory, values = stream
    result = cli("cat", directory)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(b"\n") == [orjson.dumps(v) for v in values] + [b""]
    assert result.stderr == b""


def test_cat_streams_a_line_longer_than_the_reader_holds(tmp_path: Path) -> None:
    directory = tmp_path / "big"
    big = {"big": "x" * (17 << 20), "end": "é"}  # longer than the reader's BIG_LINE (16 MiB)
    values: list[Any] = [{"a": 1}, big, {"b": 2}]

    async def write() -> None:
        async with TraceWriter(directory, compress=False) as writer:
            for v in values:
                await writer.append(v)

    anyio.run(write)
    result = cli("cat", directory)
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"".join(orjson.dumps(v) + b"\n" for v in values)
    assert cli("verify", directory).returncode == 0


def test_stat_counts_records_chunks_and_bytes(stream: tuple[Path, list[Any]]) -> None:
    directory, values = stream
    result = cli("stat", directory)
    assert result.returncode == 0, result.stderr
    fields = {}
    for line in result.stdout.decode().splitlines():
        key, _, value = line.rpartition("  ")
        fields[key.strip()] = value.strip()
    chunks = list_chunks(directory)
    assert fields["records"] == str(len(values))
    assert fields["index rows"] == str(len(values))
    assert fields["chunks"] == f"{len(chunks)} (0 sealed)"
    plain_bytes = sum(chunk_path(directory, c).stat().st_size for c in chunks)
    assert fields["plain bytes"] == str(plain_bytes)
    assert fields["bytes"] == f"{plain_bytes} uncompressed"
    assert fields["torn tails"] == "0"

    with open(chunk_path(directory, chunks[-1]), "ab") as f:
        f.write(b'{"torn": tr')
    fields2 = {
        k.strip(): v.strip()
        for k, _, v in (
            ln.rpartition("  ") for ln in cli("stat", directory).stdout.decode().splitlines()
        )
    }
    assert fields2["records"] == str(len(values))
    assert fields2["torn tails"] == "1"


def test_verify_passes_a_sound_stream(stream: tuple[Path, list[Any]]) -> None:
    directory, values = stream
    result = cli("verify", directory)
    assert result.returncode == 0, result.stdout + result.stderr
    assert b"problem:" not in result.stdout
    assert f"{len(values)} records verified, 0 problems".encode() in result.stdout


def test_verify_fails_on_a_corrupt_middle_record(stream: tuple[Path, list[Any]]) -> None:
    directory, _ = stream
    chunks = list_chunks(directory)
    path = chunk_path(directory, chunks[len(chunks) // 2])
    data = bytearray(path.read_bytes())
    first_end = data.index(b"\n")
    data[first_end // 2 : first_end // 2 + 4] = b"\xff!!\x00"  # same length: offsets still hold
    path.write_bytes(bytes(data))

    result = cli("verify", directory)
    assert result.returncode == 1, result.stdout
    assert b"problem" in result.stdout
    assert path.name.encode() in result.stdout


def test_verify_fails_on_a_torn_tail_and_a_short_index(stream: tuple[Path, list[Any]]) -> None:
    directory, values = stream
    last = chunk_path(directory, list_chunks(directory)[-1])
    with open(last, "ab") as f:
        f.write(b'{"torn"')
    result = cli("verify", directory)
    assert result.returncode == 1
    assert b"problem: a torn last line of 7 bytes" in result.stdout
    os.truncate(last, last.stat().st_size - 7)
    assert cli("verify", directory).returncode == 0

    index = directory / INDEX_NAME
    os.truncate(index, index.stat().st_size - ROW_BYTES)
    result = cli("verify", directory)
    assert result.returncode == 1
    assert f"{len(values)} records but {len(values) - 1} index rows".encode() in result.stdout
    assert len(list(read_records(directory))) == len(values)


def test_cli_refuses_a_missing_directory(tmp_path: Path) -> None:
    result = cli("stat", tmp_path / "nope")
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [
        f"python -m monitors.traces stat: {tmp_path / 'nope'} does not exist: give a trace "
        "stream's directory (RUN/traces/KIND/SUBSET)"
    ]
