"""``python -m monitors.traces cat|stat|verify|get|ls DIR`` on small streams and runs, run as a
user would: a stream a TraceWriter wrote, a FileMonitor run of train and eval episodes (given
as the run's directory or its stream's), and a stream prime-rl wrote (index rows without
``length`` or ``step``)."""

from __future__ import annotations

import os
import re
import shutil
from pathlib import Path
from typing import Any

import anyio
import orjson
import prime_rl_rules as rules
import pytest
from streams import cli

from monitors.file import FileMonitor
from monitors.testing.episodes import EpisodeMaker
from monitors.traces import TraceWriter, read_records
from monitors.traces._layout import RUN_STREAM, chunk_path, index_path, list_chunks, sealed_path

ROOT = Path(__file__).resolve().parents[1]
TITLES = [
    "line",
    "step",
    "kind",
    "env",
    "ok",
    "reward",
    "advantage",
    "in",
    "out",
    "turns",
    "errors",
    "duration",
    "id",
]
LEFT = {"kind", "env", "ok", "id"}  # the columns of text, aligned left; numbers go right


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
                await writer.append(v, step=i, kind="train")

    anyio.run(write)
    assert len(list_chunks(directory)) >= 4
    return directory, values


def _index_lines(directory: Path) -> list[bytes]:
    return index_path(directory).read_bytes().splitlines(keepends=True)


def _rewrite_row(directory: Path, k: int, **changes: Any) -> dict[str, Any]:
    """Change fields of index row ``k`` (from 1); return the row as it was."""
    lines = _index_lines(directory)
    row = orjson.loads(lines[k - 1])
    lines[k - 1] = orjson.dumps({**row, **changes}, option=orjson.OPT_APPEND_NEWLINE)
    index_path(directory).write_bytes(b"".join(lines))
    return dict(row)


# -- a FileMonitor run: train and eval episodes in one stream -------------------------------

#: What the run below logs: (step, kind, episode sizes); then a bare record (no rewards) and
#: the first episode again as shipped (an annotation, not a second copy).
LOGGED = [(1, "train", [20_000, 26_000, 23_000]), (2, "eval", [29_000, 17_000])]
BARE = {
    "id": "bare-record",
    "ok": False,
    "traces": [],
    "num_input_tokens": 7,
    "num_output_tokens": 0,
}


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]]]:
    """A FileMonitor run's directory, and what each of its records' rows must show (from
    prime-rl's index_row, the oracle, and the step and kind it was logged with)."""
    root = tmp_path_factory.mktemp("run")
    maker = EpisodeMaker(seed=3)
    expected: list[dict[str, Any]] = []
    batches: list[tuple[int, str, list[dict[str, Any]]]] = []
    index = 0
    for step, kind, sizes in LOGGED:
        records = []
        for size in sizes:
            records.append(maker.episode(size, index=index).to_record())
            index += 1
        batches.append((step, kind, records))

    async def write() -> None:
        async with FileMonitor(root, chunk_bytes=50_000) as monitor:
            for step, kind, records in batches:
                await monitor.log_episodes(records, step=step, kind=kind, subset="all")  # type: ignore[arg-type]
            await monitor.log_episodes([BARE], step=3, kind="train", subset="all")
            first = batches[0][2][0]
            await monitor.log_episodes([first], step=3, kind="train", subset="effective")

    anyio.run(write)
    line = 0
    for step, kind, records in batches:
        for record in records:
            line += 1
            expected.append({**rules.index_row(line, record, 0, 0), "step": step, "kind": kind})
    expected.append({**rules.index_row(line + 1, BARE, 0, 0), "step": 3, "kind": "train"})
    assert len(list_chunks(root / RUN_STREAM)) >= 3
    assert sealed_path(root / RUN_STREAM, 0).exists()
    return root, expected


def _cells(row: dict[str, Any]) -> list[str]:
    """A row's cells as ls must show them, worked out here from the spec."""

    def text(v: Any) -> str:
        return "-" if v is None else str(v)

    def fixed(v: Any, digits: int, unit: str = "") -> str:
        return "-" if v is None else f"{v:.{digits}f}{unit}"

    return [
        text(row["line"]),
        text(row["step"]),
        text(row["kind"]),
        text(row["env"]),
        {True: "yes", False: "no", None: "-"}[row["ok"]],
        fixed(row["reward"], 3),
        fixed(row["advantage"], 3),
        text(row["input_tokens"]),
        text(row["output_tokens"]),
        text(row["turns"]),
        text(row["num_errors"]),
        fixed(row["duration"], 1, "s"),
        text(row["id"]),
    ]


def _table(out: bytes) -> list[list[str]]:
    """The cells of an ls table, checking on the way that every column is aligned: a text
    column's cells start where its title starts, a number column's end where it ends."""
    lines = out.decode().splitlines()
    header = [(m.start(), m.end(), m.group()) for m in re.finditer(r"\S+", lines[0])]
    assert [title for _, _, title in header] == TITLES
    table = []
    for line in lines[1:]:
        cells = [(m.start(), m.end(), m.group()) for m in re.finditer(r"\S+", line)]
        assert len(cells) == len(TITLES), line
        for (start, end, _), (t_start, t_end, title) in zip(cells, header, strict=True):
            if title in LEFT:
                assert start == t_start, (title, line)
            else:
                assert end == t_end, (title, line)
        table.append([cell for _, _, cell in cells])
    return table


def test_ls_shows_a_run_s_rows_as_an_aligned_table(
    run: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, expected = run
    result = cli("ls", root)
    assert result.returncode == 0, result.stderr
    assert result.stderr == b""
    table = _table(result.stdout)
    assert table == [_cells(row) for row in expected]
    # Spot checks against the spec rather than against _cells.
    assert [cells[2] for cells in table] == ["train"] * 3 + ["eval"] * 2 + ["train"]
    assert [cells[1] for cells in table] == ["1", "1", "1", "2", "2", "3"]
    assert table[-1][4:9] == ["no", "-", "-", "7", "0"]  # the bare record: no reward
    assert all(re.fullmatch(r"-?\d+\.\d{3}", cells[5]) for cells in table[:-1])
    assert all(re.fullmatch(r"\d+\.\ds", cells[11]) for cells in table[:-1])


def test_ls_filters_by_kind_and_limits(run: tuple[Path, list[dict[str, Any]]]) -> None:
    root, expected = run
    evals = cli("ls", root, "--kind", "eval")
    assert evals.returncode == 0, evals.stderr
    assert _table(evals.stdout) == [_cells(row) for row in expected if row["kind"] == "eval"]
    trains = cli("ls", root, "--kind", "train", "--limit", "2")
    assert trains.returncode == 0, trains.stderr
    assert _table(trains.stdout) == [_cells(row) for row in expected[:2]]


@pytest.mark.parametrize("order", ["-reward", "reward", "-duration", "in"])
def test_ls_sorts_rows_without_the_field_last(
    run: tuple[Path, list[dict[str, Any]]], order: str
) -> None:
    root, expected = run
    field = {"in": "input_tokens"}.get(order.lstrip("-"), order.lstrip("-"))
    descending = order.startswith("-")
    valued = [row for row in expected if row[field] is not None]
    ordered = sorted(valued, key=lambda r: r[field], reverse=descending)
    ordered += [row for row in expected if row[field] is None]
    assert ordered != expected  # the order shown says the sort was done
    result = cli("ls", root, "--sort", order)
    assert result.returncode == 0, result.stderr
    assert _table(result.stdout) == [_cells(row) for row in ordered]
    limited = cli("ls", root, "--sort", order, "--limit", "2")
    assert _table(limited.stdout) == [_cells(row) for row in ordered[:2]]


def test_ls_json_prints_the_rows_as_stored(run: tuple[Path, list[dict[str, Any]]]) -> None:
    root, _ = run
    lines = _index_lines(root / RUN_STREAM)
    result = cli("ls", root, "--json")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"".join(lines)
    evals = cli("ls", root, "--json", "--kind", "eval", "--sort", "-reward")
    rows = [orjson.loads(line) for line in lines]
    wanted = sorted((r for r in rows if r["kind"] == "eval"), key=lambda r: -r["reward"])
    assert [orjson.loads(line) for line in evals.stdout.splitlines()] == wanted


def test_ls_names_a_missing_index_and_a_damaged_row(tmp_path: Path) -> None:
    result = cli("ls", tmp_path / "nope")
    assert result.returncode == 1
    directory = tmp_path / "stream"

    async def write() -> None:
        async with TraceWriter(directory, compress=False) as writer:
            for n in range(5):
                await writer.append({"id": f"r{n}"}, step=n)

    anyio.run(write)
    lines = _index_lines(directory)
    lines[2] = b"#" * (len(lines[2]) - 1) + b"\n"
    index_path(directory).write_bytes(b"".join(lines))
    result = cli("ls", directory)
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode().startswith(
        f"python -m monitors.traces ls: {index_path(directory)} is damaged at row 3 (bad index row"
    )
    index_path(directory).unlink()
    result = cli("ls", directory)
    assert result.returncode == 1
    assert result.stdout == b""
    assert result.stderr.decode().splitlines() == [
        f"python -m monitors.traces ls: {directory} has no index ({index_path(directory)} is "
        f"missing): ls lists its rows; python -m monitors.traces cat {directory} reads the "
        f"records without it, and python -m monitors.traces verify {directory} checks them"
    ]


@pytest.mark.parametrize(
    "args",
    [
        ["cat"],
        ["cat", "--fold"],
        ["stat"],
        ["verify"],
        ["ls"],
        ["ls", "--json", "--sort", "-reward"],
        ["get", "ID"],
    ],
)
def test_a_run_and_its_stream_give_the_same_output(
    run: tuple[Path, list[dict[str, Any]]], args: list[str]
) -> None:
    root, expected = run
    args = [expected[3]["id"] if a == "ID" else a for a in args]
    command, options = args[0], args[1:]
    by_run = cli(command, root, *options)
    by_stream = cli(command, root / RUN_STREAM, *options)
    assert by_run.returncode == 0, by_run.stdout + by_run.stderr
    assert by_run.stdout
    assert (by_run.stdout, by_run.stderr) == (by_stream.stdout, by_stream.stderr)


def test_get_prints_a_run_s_record_as_stored(run: tuple[Path, list[dict[str, Any]]]) -> None:
    root, expected = run
    records = list(read_records(root))
    for n in (0, 4, 5):
        result = cli("get", root, expected[n]["id"])
        assert result.returncode == 0, result.stderr
        assert result.stdout == orjson.dumps(records[n]) + b"\n"


def test_cat_fold_folds_the_run_s_annotations(run: tuple[Path, list[dict[str, Any]]]) -> None:
    root, _ = run
    plain = cli("cat", root)
    folded = cli("cat", root, "--fold")
    assert plain.returncode == folded.returncode == 0, plain.stderr + folded.stderr
    as_stored = [orjson.loads(line) for line in plain.stdout.splitlines()]
    assert as_stored == list(read_records(root))
    with_annotations = [orjson.loads(line) for line in folded.stdout.splitlines()]
    assert with_annotations == list(read_records(root, fold=True))
    # The first episode was shipped at step 3: only the folded copy says so.
    assert with_annotations[0]["traces"][0]["info"]["shipped"] == {"step": 3, "kind": "train"}
    assert "shipped" not in as_stored[0]["traces"][0]["info"]
    assert with_annotations[1:] == as_stored[1:]


def test_verify_checks_a_run_s_rows_against_its_records(
    run: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    root, _ = run
    result = cli("verify", root)
    assert result.returncode == 0, result.stdout
    assert result.stdout == b"6 records verified, 0 problems\n"
    copy = tmp_path / "run"
    shutil.copytree(root, copy)
    stream = copy / RUN_STREAM
    old = _rewrite_row(stream, 2, id="forged")
    result = cli("verify", copy)
    assert result.returncode == 1
    assert result.stdout.decode().splitlines() == [
        f"problem: index row 2 says id 'forged', but record 2 has id {old['id']!r}",
        "6 records verified, 1 problems",
    ]
    _rewrite_row(stream, 2, id=old["id"], length=old["length"] + 1)
    result = cli("verify", copy)
    assert result.stdout.decode().splitlines() == [
        f"problem: index row 2 points at chunk {old['chunk']} byte {old['offset']}, "
        f"{old['length'] + 1} bytes, but record 2 is at chunk {old['chunk']} byte "
        f"{old['offset']}, {old['length']} bytes",
        "6 records verified, 1 problems",
    ]
    # get checks that a row points at a whole line before printing anything.
    result = cli("get", copy, old["id"])
    assert result.returncode == 1
    assert result.stdout == b""
    assert b"points at no whole line" in result.stderr


def test_verify_counts_the_rows_of_a_damaged_frame_or_chunk(
    run: tuple[Path, list[dict[str, Any]]], tmp_path: Path
) -> None:
    """The records a damaged frame or sealed chunk holds are skipped with their rows: the
    rows after them are checked against the records after them, and the counts agree."""
    root, _ = run
    rows = [orjson.loads(line) for line in _index_lines(root / RUN_STREAM)]
    chunk = rows[2]["chunk"]
    held = sum(1 for row in rows if row["chunk"] == chunk)
    frame = tmp_path / "frame"
    shutil.copytree(root, frame)
    path = sealed_path(frame / RUN_STREAM, chunk)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # inside the frame: its checksum fails
    path.write_bytes(bytes(data))
    size = sum(row["length"] for row in rows if row["chunk"] == chunk)
    result = cli("verify", frame)
    assert result.returncode == 1
    assert result.stdout.decode().splitlines() == [
        f"problem: {path.name}: a damaged zstd frame, bytes 0 to {size} unreadable "
        f"({held} records)",
        "6 records verified, 1 problems",
    ]
    table = tmp_path / "table"
    shutil.copytree(root, table)
    path = sealed_path(table / RUN_STREAM, chunk)
    path.write_bytes(path.read_bytes()[:-4] + b"\0\0\0\0")  # no seek table: the chunk is lost
    result = cli("verify", table)
    assert result.returncode == 1
    out = result.stdout.decode().splitlines()
    assert len(out) == 2, out
    assert out[0].startswith("problem: not a whole sealed chunk")
    assert out[1] == "6 records verified, 1 problems"


def test_verify_names_rows_out_of_order(stream: tuple[Path, list[Any]]) -> None:
    directory, values = stream
    lines = _index_lines(directory)
    lines[4], lines[5] = lines[5], lines[4]
    index_path(directory).write_bytes(b"".join(lines))
    result = cli("verify", directory)
    assert result.returncode == 1
    out = result.stdout.decode().splitlines()
    assert out[0] == "problem: index row 5 says line 6: rows are missing or out of order"
    assert out[1] == "problem: index row 6 says line 5: rows are missing or out of order"
    assert out[-1] == f"{len(values)} records verified, 2 problems"


# -- a stream prime-rl wrote: rows without length or step ------------------------------------


@pytest.fixture
def prime_run(tmp_path: Path) -> tuple[Path, list[dict[str, Any]]]:
    maker = EpisodeMaker(seed=5)
    records = [maker.episode(16_000 + 2_000 * i, index=i).to_record() for i in range(7)]
    root = tmp_path / "prime"
    stream = rules.write_prime_rl_stream(root, records, chunk_bytes=40_000, seal_upto=2)
    assert stream == root / RUN_STREAM
    assert sealed_path(stream, 0).exists()
    assert chunk_path(stream, list_chunks(stream)[-1]).exists()  # the last one plain
    assert "length" not in orjson.loads(_index_lines(stream)[0])
    # Round-trip through JSON, as the records are read back.
    return root, [orjson.loads(orjson.dumps(r)) for r in records]


def test_a_stream_prime_rl_wrote_reads_through_its_rows(
    prime_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, records = prime_run
    cat = cli("cat", root)
    assert cat.returncode == 0, cat.stderr
    assert cat.stdout == b"".join(orjson.dumps(r) + b"\n" for r in records)
    for n in (0, 3, 6):  # sealed chunks and the plain last one
        got = cli("get", root, records[n]["id"])
        assert got.returncode == 0, got.stderr
        assert got.stdout == orjson.dumps(records[n]) + b"\n"
    verified = cli("verify", root)
    assert verified.stdout == b"7 records verified, 0 problems\n", verified.stderr
    listed = cli("ls", root)
    assert listed.returncode == 0, listed.stderr
    table = _table(listed.stdout)
    assert [cells[0] for cells in table] == [str(n) for n in range(1, 8)]
    assert [cells[1] for cells in table] == ["-"] * 7  # prime-rl's rows have no step
    assert [cells[-1] for cells in table] == [r["id"] for r in records]
    rows = [rules.index_row(n + 1, r, 0, 0) for n, r in enumerate(records)]
    assert [cells[5] for cells in table] == [f"{row['reward']:.3f}" for row in rows]
    assert cli("ls", root, "--json").stdout == b"".join(_index_lines(root / RUN_STREAM))


def test_verify_checks_the_offsets_of_prime_rl_s_rows(
    prime_run: tuple[Path, list[dict[str, Any]]],
) -> None:
    root, records = prime_run
    stream = root / RUN_STREAM
    old = _rewrite_row(stream, 4, offset=orjson.loads(_index_lines(stream)[3])["offset"] + 5)
    result = cli("verify", root)
    assert result.returncode == 1
    assert result.stdout.decode().splitlines() == [
        f"problem: index row 4 points at chunk {old['chunk']} byte {old['offset'] + 5}, but "
        f"record 4 is at chunk {old['chunk']} byte {old['offset']}, "
        f"{len(orjson.dumps(records[3])) + 1} bytes",
        "7 records verified, 1 problems",
    ]
    got = cli("get", root, records[3]["id"])  # mid-line: not a record
    assert got.returncode == 1
    assert got.stdout == b""
    assert b"points at no whole line" in got.stderr


# -- a stream a TraceWriter wrote -------------------------------------------------------------


def test_cat_prints_each_record_as_stored(stream: tuple[Path, list[Any]]) -> None:
    directory, values = stream
    result = cli("cat", directory)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(b"\n") == [orjson.dumps(v) for v in values] + [b""]
    assert result.stderr == b""
    folded = cli("cat", directory, "--fold")  # no annotations: the same records
    assert folded.stdout == result.stdout


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
    assert fields["directory"] == str(directory)
    assert fields["index"] == str(index_path(directory))
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

    index = index_path(directory)
    rows = _index_lines(directory)
    os.truncate(index, index.stat().st_size - len(rows[-1]))  # rows have no fixed width
    result = cli("verify", directory)
    assert result.returncode == 1
    assert f"{len(values)} records but {len(values) - 1} index rows".encode() in result.stdout
    assert len(list(read_records(directory))) == len(values)

    with open(index, "ab") as f:
        f.write(rows[-1][:9])  # a torn last row
    result = cli("verify", directory)
    assert result.returncode == 1
    assert result.stdout.decode().splitlines()[-3:] == [
        f"problem: {len(values)} records but {len(values) - 1} index rows",
        f"problem: a torn last row of 9 bytes in {index.name} (not a row)",
        f"{len(values)} records verified, 2 problems",
    ]


def test_cli_refuses_a_missing_directory(tmp_path: Path) -> None:
    result = cli("stat", tmp_path / "nope")
    assert result.returncode == 1
    assert result.stderr.decode().splitlines() == [
        f"python -m monitors.traces stat: {tmp_path / 'nope'} does not exist: give a run's "
        "directory or a trace stream's (RUN/monitors/file/traces/stream)"
    ]
