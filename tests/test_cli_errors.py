"""``nodewise`` given a user's mistake: every subcommand against every bad input, run as a
user runs it (the installed console script, in a subprocess). Each case says what is wrong
and what to do in one line on stderr, exits 1 (2 for a usage error or a load test that
cannot start), and never shows a traceback.

A stream without its index is not refused: ``cat`` and ``get`` read the chunks without it,
``stat`` and ``verify`` report it as one of their problems (on stdout, as they report every
problem) and exit 1. No command changes a file.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import anyio
import orjson
import pytest

from monitors.traces import TraceWriter
from monitors.traces._layout import INDEX_NAME, ROW_BYTES, list_chunks, sealed_path

ROOT = Path(__file__).resolve().parents[1]
#: The console script ``pip install`` made, as a user runs it.
NODEWISE = Path(sys.executable).with_name("nodewise")
#: Runs the console script with wandb made unimportable, as on an install without it.
WITHOUT_WANDB = (
    "import runpy, sys; sys.modules['wandb'] = None; sys.argv = sys.argv[1:]; "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
RECORDS = [{"id": f"r{n}", "n": n, "text": "é漢🙂 " * n} for n in range(12)]
#: A load test of a second or two: one small episode, in a step of its own.
SMALL = ["--episodes", "1", "--size", "100kB", "--step-size", "1", "--no-progress"]


@dataclass(frozen=True)
class Ran:
    code: int
    out: str
    err: list[str]  # stderr's lines


def run(*args: str | Path, python: list[str] | None = None) -> Ran:
    """``nodewise ARGS`` (or ``python`` ARGS), importing this checkout's code."""
    command = python or [str(NODEWISE)]
    result = subprocess.run(
        [*command, *map(str, args)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert "Traceback" not in result.stderr, result.stderr
    return Ran(result.returncode, result.stdout, result.stderr.splitlines())


@dataclass(frozen=True)
class Paths:
    stream: Path  # a sound stream: sealed chunks and a plain last one, and its index
    noindex: Path  # the same chunks without index.jsonl
    run: Path  # a FileMonitor run's directory: metrics.jsonl and traces/train/{all,effective}
    empty: Path
    other: Path  # a directory holding a notes file and nothing of a stream
    file: Path
    chunk: Path  # a chunk file of the stream, given for its directory
    missing: Path


def _snapshot(root: Path) -> str:
    """Every file under ``root`` and a hash of its bytes: to check that nothing changed."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        digest.update(str(path.relative_to(root)).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


@pytest.fixture(scope="module")
def paths(tmp_path_factory: pytest.TempPathFactory) -> Paths:
    root = tmp_path_factory.mktemp("inputs")
    stream = root / "stream"

    async def write() -> None:
        async with TraceWriter(stream, chunk_bytes=300, seal_on_close=False) as writer:
            for record in RECORDS:
                await writer.append(record)

    anyio.run(write)
    assert len(list_chunks(stream)) >= 3
    assert sealed_path(stream, 0).exists()
    noindex = root / "noindex"
    shutil.copytree(stream, noindex)
    (noindex / INDEX_NAME).unlink()
    run = root / "run"
    for subset in ("all", "effective"):
        shutil.copytree(stream, run / "traces" / "train" / subset)
    (run / "metrics.jsonl").write_text('{"step": 0}\n')
    (root / "empty").mkdir()
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("mine\n")
    (root / "file.txt").write_text("not a stream\n")
    return Paths(
        stream=stream,
        noindex=noindex,
        run=run,
        empty=root / "empty",
        other=root / "other",
        file=root / "file.txt",
        chunk=sealed_path(stream, 0),
        missing=root / "nope",
    )


# -- nodewise traces CMD PATH: paths that are no stream's directory --------------------------

#: Each bad path and what its one line says after the path (what is wrong, what to do).
NOT_A_STREAM: dict[str, Callable[[Paths], str]] = {
    "missing": lambda p: "does not exist: give a trace stream's directory (RUN/traces/KIND/SUBSET)",
    "file": lambda p: (
        "is a file, not a trace stream's directory (one holding 00000.jsonl or "
        "00000.jsonl.zst and index.jsonl)"
    ),
    "chunk": lambda p: f"is a file of a trace stream: give the stream's directory, {p.stream}",
    "empty": lambda p: (
        "is empty: not a trace stream (a stream's directory holds 00000.jsonl or "
        "00000.jsonl.zst and index.jsonl)"
    ),
    "other": lambda p: (
        "is not a trace stream: it holds no chunk (00000.jsonl, 00000.jsonl.zst), "
        "no index.jsonl and no stream below it; give a stream's directory"
    ),
    "run": lambda p: (
        "is not a trace stream but holds streams: give one of "
        f"{p.run}/traces/train/all, {p.run}/traces/train/effective"
    ),
}


@pytest.mark.parametrize("case", list(NOT_A_STREAM))
@pytest.mark.parametrize("command", ["cat", "stat", "verify", "get"])
def test_traces_refuses_a_path_that_is_no_stream(paths: Paths, command: str, case: str) -> None:
    path: Path = getattr(paths, case)
    before = _snapshot(paths.stream.parent)
    ran = run("traces", command, path, *(["r3"] if command == "get" else []))
    assert ran.code == 1, ran
    assert ran.out == ""
    assert ran.err == [f"nodewise traces {command}: {path} {NOT_A_STREAM[case](paths)}"]
    assert _snapshot(paths.stream.parent) == before


def test_traces_names_itself_as_the_user_typed_it(paths: Paths) -> None:
    ran = run("-m", "monitors.traces", "stat", paths.missing, python=[sys.executable])
    assert ran.code == 1
    assert ran.err == [
        f"python -m monitors.traces stat: {paths.missing} does not exist: "
        "give a trace stream's directory (RUN/traces/KIND/SUBSET)"
    ]


# -- nodewise traces CMD STREAM: a stream without its index, an unknown id -------------------


def test_cat_reads_a_stream_without_its_index(paths: Paths) -> None:
    ran = run("traces", "cat", paths.noindex)
    assert ran.code == 0, ran
    assert ran.out.encode() == b"".join(orjson.dumps(r) + b"\n" for r in RECORDS)
    assert ran.err == []


def test_stat_reports_a_missing_index_as_a_problem(paths: Paths) -> None:
    ran = run("traces", "stat", paths.noindex)
    assert ran.code == 1, ran
    lines = ran.out.splitlines()
    assert lines[0].startswith("problem: no index.jsonl: records read without it")
    assert "copy it along with the chunks, or reopen the stream with a TraceWriter" in lines[0]
    assert "records       12" in lines
    assert "index rows    none (no index.jsonl)" in lines
    assert ran.err == []


def test_verify_checks_the_records_of_a_stream_without_its_index(paths: Paths) -> None:
    ran = run("traces", "verify", paths.noindex)
    assert ran.code == 1, ran
    lines = ran.out.splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("problem: no index.jsonl: records read without it")
    assert lines[1] == "12 records verified, 1 problems"
    assert ran.err == []


def test_get_finds_a_record_without_the_index(paths: Paths) -> None:
    before = _snapshot(paths.noindex)
    ran = run("traces", "get", paths.noindex, "r7")
    assert ran.code == 0, ran
    assert ran.out.encode() == orjson.dumps(RECORDS[7]) + b"\n"
    assert ran.err == [
        f"nodewise traces get: note: {paths.noindex} has no index.jsonl: found by reading "
        f"the records in order (nodewise traces verify {paths.noindex} says more)"
    ]
    assert _snapshot(paths.noindex) == before  # nothing rebuilt behind the user's back


@pytest.mark.parametrize("where", ["stream", "noindex"])
def test_get_names_an_unknown_id(paths: Paths, where: str) -> None:
    directory: Path = getattr(paths, where)
    ran = run("traces", "get", directory, "r99")
    assert ran.code == 1, ran
    assert ran.out == ""
    how = (
        "among the 12 indexed in {d} ("
        if where == "stream"
        else "in {d} (read every record: it has no index.jsonl; "
    )
    assert ran.err == [
        f"nodewise traces get: no record with id 'r99' {how.format(d=directory)}ids match "
        f"exactly; nodewise traces cat {directory} | jq .id lists them)"
    ]


def test_verify_names_a_damaged_index_row(paths: Paths, tmp_path: Path) -> None:
    directory = tmp_path / "stream"
    shutil.copytree(paths.stream, directory)
    with open(directory / INDEX_NAME, "r+b") as f:
        f.seek(2 * ROW_BYTES)
        f.write(b"#" * (ROW_BYTES - 1) + b"\n")
    ran = run("traces", "verify", directory)
    assert ran.code == 1, ran
    assert ran.out.splitlines()[0].startswith("problem: index row 2 is not a row (bad index row")
    assert ran.out.splitlines()[-1] == "12 records verified, 1 problems"


# -- help, usage and --version ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["--help"], "usage: nodewise [-h] [--version] COMMAND ..."),
        (["traces", "--help"], "usage: nodewise traces [-h] COMMAND ..."),
        (["traces", "get", "--help"], "usage: nodewise traces get [-h] DIR ID"),
        (["traces", "stat", "--help"], "usage: nodewise traces stat [-h] DIR"),
        (["loadtest", "--help"], "usage: nodewise loadtest [-h]"),
        (["-m", "monitors.traces", "--help"], "usage: python -m monitors.traces [-h]"),
        (["-m", "monitors.loadtest", "--help"], "usage: python -m monitors.loadtest [-h]"),
    ],
)
def test_help_is_plain_text_under_the_name_typed(args: list[str], usage: str) -> None:
    python = [sys.executable] if args[0] == "-m" else None
    ran = run(*args, python=python)
    assert ran.code == 0, ran
    assert ran.out.startswith(usage)
    assert "``" not in ran.out
    assert ran.err == []


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ([], "nodewise: error: the following arguments are required: COMMAND"),
        (
            ["frobnicate"],
            "nodewise: error: unknown command 'frobnicate' (choose from loadtest, traces)",
        ),
        (
            ["--episodes", "3", "loadtest"],
            "nodewise: error: unknown option '--episodes': the command comes first (choose "
            "from loadtest, traces)",
        ),
        (["traces"], "nodewise traces: error: the following arguments are required: COMMAND"),
        (
            ["traces", "stat"],
            "nodewise traces stat: error: the following arguments are required: DIR",
        ),
        (
            ["traces", "get", "."],
            "nodewise traces get: error: the following arguments are required: ID",
        ),
        (["traces", "stat", ".", "x"], "nodewise traces: error: unrecognized arguments: x"),
    ],
)
def test_usage_errors_are_argparse_s(args: list[str], error: str) -> None:
    ran = run(*args)
    assert ran.code == 2, ran
    assert ran.out == ""
    assert ran.err[0].startswith("usage: nodewise")
    assert ran.err[-1] == error


def test_version_is_the_distribution_s() -> None:
    ran = run("--version")
    assert ran.code == 0, ran
    assert ran.out == f"nodewise {importlib.metadata.version('nodewise')}\n"
    assert ran.err == []


# -- nodewise loadtest: paths it would write at the end, monitors that are not installed -----


@pytest.mark.parametrize(
    ("option", "where", "says"),
    [
        ("--out", "file", "{path}: {path} is a file; give a directory (new or existing)"),
        ("--out", "file/sub", "{path}: {file} is a file; give a directory (new or existing)"),
        ("--json", "empty", "{path}: that is a directory; give a file's name"),
        ("--json", "nope/r.json", "{path}: no such directory {nope}; create it or write elsewhere"),
        ("--plot", "empty", "{path}: that is a directory; give a file's name"),
        (
            "--plot",
            "nope/lag.png",
            "{path}: no such directory {nope}; create it or write elsewhere",
        ),
    ],
)
def test_loadtest_refuses_a_path_before_it_runs(
    paths: Paths, option: str, where: str, says: str
) -> None:
    head, _, tail = where.partition("/")
    base = {"file": paths.file, "empty": paths.empty, "nope": paths.missing}[head]
    path = base / tail if tail else base
    ran = run("loadtest", option, path, "--monitors", "file", *SMALL)
    assert ran.code == 2, ran
    assert ran.out == ""
    message = says.format(path=path, file=paths.file, nope=paths.missing)
    assert ran.err == [f"nodewise loadtest: {option} {message}"]


def test_loadtest_skips_a_default_monitor_that_is_not_installed() -> None:
    ran = run(NODEWISE, "loadtest", *SMALL, python=[sys.executable, "-c", WITHOUT_WANDB])
    assert ran.code == 0, ran
    assert ran.err == [
        "nodewise loadtest: skipping WandbMonitor: the wandb package is not installed: "
        "pip install wandb (or pip install '.[wandb]' in the nodewise checkout)"
    ]
    assert "| FileMonitor |" in ran.out
    assert "| PrimeMonitor |" in ran.out
    assert "WandbMonitor" not in ran.out


@pytest.mark.parametrize("monitors", ["wandb", "file,wandb"])
def test_loadtest_refuses_a_named_monitor_that_is_not_installed(monitors: str) -> None:
    ran = run(
        NODEWISE,
        "loadtest",
        "--monitors",
        monitors,
        *SMALL,
        python=[sys.executable, "-c", WITHOUT_WANDB],
    )
    assert ran.code == 2, ran
    assert ran.out == ""
    assert ran.err == [
        "nodewise loadtest: --monitors wandb: the wandb package is not installed: "
        "pip install wandb (or pip install '.[wandb]' in the nodewise checkout)"
    ]
