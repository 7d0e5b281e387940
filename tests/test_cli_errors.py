"""``nodewise`` given a user's mistake: every subcommand against every bad input, run as a
user runs it (the installed console script, in a subprocess). Each case says what is wrong
and what to do in one line on stderr, exits 1 (2 for a usage error or a load test that
cannot start), and never shows a traceback.

Every ``traces`` command takes a run's directory or a stream's. A stream without its index
is not refused: ``cat`` and ``get`` read the chunks without it, ``stat`` and ``verify`` report
it as one of their problems (on stdout, as they report every problem) and exit 1, and ``ls``,
which reads only the index, says it is missing (on stderr) and exits 1. No command changes a
file.
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
from monitors.traces._layout import RUN_STREAM, index_path, list_chunks, sealed_path

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
    stream: Path  # a sound stream: sealed chunks and a plain last one, its index beside it
    noindex: Path  # the same chunks without their index
    run: Path  # a run's directory: monitors/file/metrics.jsonl, the stream in traces/stream
    runs: Path  # a directory of two runs' directories
    empty: Path
    other: Path  # a directory holding a notes file and nothing of a stream
    file: Path
    chunk: Path  # a chunk file of the stream, given for its directory
    index: Path  # the stream's index, given for the stream
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
    shutil.copytree(stream, noindex)  # the index, beside the stream, stays behind
    assert not index_path(noindex).exists()
    run = root / "run"
    runs = root / "runs"
    for where in (run, runs / "a", runs / "b"):
        shutil.copytree(stream, where / RUN_STREAM)
        shutil.copy(index_path(stream), index_path(where / RUN_STREAM))
        (where / RUN_STREAM.parent.parent / "metrics.jsonl").write_text('{"step": 0}\n')
    (root / "empty").mkdir()
    (root / "other").mkdir()
    (root / "other" / "notes.txt").write_text("mine\n")
    (root / "file.txt").write_text("not a stream\n")
    return Paths(
        stream=stream,
        noindex=noindex,
        run=run,
        runs=runs,
        empty=root / "empty",
        other=root / "other",
        file=root / "file.txt",
        chunk=sealed_path(stream, 0),
        index=index_path(stream),
        missing=root / "nope",
    )


# -- nodewise traces CMD PATH: paths that are no stream's directory --------------------------

#: What a stream's directory holds, as the errors say it.
HOLDS = "a stream's directory holds 00000.jsonl or 00000.jsonl.zst, its index beside it"
#: Each bad path and what its one line says after the path (what is wrong, what to do).
NOT_A_STREAM: dict[str, Callable[[Paths], str]] = {
    "missing": lambda p: (
        "does not exist: give a run's directory or a trace stream's "
        "(RUN/monitors/file/traces/stream)"
    ),
    "file": lambda p: f"is a file, not a run's directory or a trace stream's ({HOLDS})",
    "chunk": lambda p: f"is a file of a trace stream: give the stream's directory, {p.stream}",
    "index": lambda p: f"is a trace stream's index: give the stream's directory, {p.stream}",
    "empty": lambda p: f"is empty: not a run or a trace stream ({HOLDS})",
    "other": lambda p: (
        "is not a run or a trace stream: it holds no chunk (00000.jsonl, 00000.jsonl.zst), "
        "no monitors/file/traces/stream and no stream below it; give a run's directory or "
        "a trace stream's"
    ),
    "runs": lambda p: (
        f"is not a run or a trace stream but holds some: give one of {p.runs}/a, {p.runs}/b"
    ),
}
COMMANDS = ["cat", "stat", "verify", "get", "ls"]


@pytest.mark.parametrize("case", list(NOT_A_STREAM))
@pytest.mark.parametrize("command", COMMANDS)
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
        f"python -m monitors.traces stat: {paths.missing} does not exist: give a run's "
        "directory or a trace stream's (RUN/monitors/file/traces/stream)"
    ]


def test_traces_suggests_the_streams_inside_a_run_s_folders(paths: Paths, tmp_path: Path) -> None:
    """Given a folder inside a run, the streams below it: the episodes' and any other."""
    shutil.copytree(paths.run, tmp_path / "run")
    below = tmp_path / "run" / "monitors"
    annotations = tmp_path / "run" / RUN_STREAM.parent / "annotations" / "unknown"
    shutil.copytree(paths.stream, annotations)
    ran = run("traces", "ls", below)
    assert ran.code == 1, ran
    assert ran.err == [
        f"nodewise traces ls: {below} is not a run or a trace stream but holds some: give "
        f"one of {tmp_path / 'run' / RUN_STREAM}, {annotations}"
    ]


@pytest.mark.parametrize("command", COMMANDS)
def test_traces_reads_a_run_s_directory(paths: Paths, command: str) -> None:
    before = _snapshot(paths.stream.parent)
    ran = run("traces", command, paths.run, *(["r3"] if command == "get" else []))
    assert ran.code == 0, ran
    by_stream = run("traces", command, paths.stream, *(["r3"] if command == "get" else []))
    if command == "stat":  # the one line that names the directory
        ran_out = ran.out.replace(str(paths.run / RUN_STREAM), str(paths.stream))
        assert ran_out == by_stream.out
    else:
        assert ran.out == by_stream.out
    assert ran.out
    assert ran.err == []
    assert _snapshot(paths.stream.parent) == before


def test_traces_names_a_stray_file_in_a_stream(paths: Paths, tmp_path: Path) -> None:
    """An old layout's index.jsonl inside the stream: prime-rl's readers would fail on it."""
    directory = tmp_path / "stream"
    shutil.copytree(paths.stream, directory)
    (directory / "index.jsonl").write_bytes(b"")
    ran = run("traces", "cat", directory)
    assert ran.code == 1, ran
    assert ran.out == ""
    assert ran.err == [
        f"nodewise traces cat: {directory} holds 'index.jsonl', which is not a chunk: not a "
        "trace stream's directory (nothing else may live there, or prime-rl's readers fail) "
        "(in index.jsonl)"
    ]


# -- nodewise traces CMD STREAM: a stream without its index, an unknown id -------------------


def test_cat_reads_a_stream_without_its_index(paths: Paths) -> None:
    ran = run("traces", "cat", paths.noindex)
    assert ran.code == 0, ran
    assert ran.out.encode() == b"".join(orjson.dumps(r) + b"\n" for r in RECORDS)
    assert ran.err == []


def _no_index(paths: Paths) -> str:
    return (
        f"problem: no noindex.index.jsonl beside {paths.noindex}: records read without it "
        "(cat, get, read_records), but ls, read_record and find_record need it; copy it "
        "along with the chunks, or reopen the stream with a TraceWriter to rebuild it "
        "(without ids)"
    )


def test_stat_reports_a_missing_index_as_a_problem(paths: Paths) -> None:
    ran = run("traces", "stat", paths.noindex)
    assert ran.code == 1, ran
    lines = ran.out.splitlines()
    assert lines[0] == _no_index(paths)
    assert f"index         {index_path(paths.noindex)} (missing)" in lines
    assert "records       12" in lines
    assert "index rows    none (no noindex.index.jsonl)" in lines
    assert ran.err == []


def test_verify_checks_the_records_of_a_stream_without_its_index(paths: Paths) -> None:
    ran = run("traces", "verify", paths.noindex)
    assert ran.code == 1, ran
    assert ran.out.splitlines() == [_no_index(paths), "12 records verified, 1 problems"]
    assert ran.err == []


def test_ls_says_the_index_is_missing(paths: Paths) -> None:
    before = _snapshot(paths.noindex.parent)
    ran = run("traces", "ls", paths.noindex)
    assert ran.code == 1, ran
    assert ran.out == ""
    d = paths.noindex
    assert ran.err == [
        f"nodewise traces ls: {d} has no index ({index_path(d)} is missing): ls lists its "
        f"rows; nodewise traces cat {d} reads the records without it, and nodewise traces "
        f"verify {d} checks them"
    ]
    assert _snapshot(paths.noindex.parent) == before  # nothing rebuilt


def test_get_finds_a_record_without_the_index(paths: Paths) -> None:
    before = _snapshot(paths.noindex.parent)
    ran = run("traces", "get", paths.noindex, "r7")
    assert ran.code == 0, ran
    assert ran.out.encode() == orjson.dumps(RECORDS[7]) + b"\n"
    assert ran.err == [
        f"nodewise traces get: note: {paths.noindex} has no noindex.index.jsonl: found by "
        f"reading the records in order (nodewise traces verify {paths.noindex} says more)"
    ]
    assert _snapshot(paths.noindex.parent) == before  # nothing rebuilt behind the user's back


@pytest.mark.parametrize("where", ["stream", "noindex"])
def test_get_names_an_unknown_id(paths: Paths, where: str) -> None:
    directory: Path = getattr(paths, where)
    ran = run("traces", "get", directory, "r99")
    assert ran.code == 1, ran
    assert ran.out == ""
    how = (
        "among the 12 indexed in {d} (ids match exactly; nodewise traces ls {d} lists them)"
        if where == "stream"
        else "in {d} (read every record: it has no noindex.index.jsonl; ids match exactly; "
        "nodewise traces cat {d} | jq .id lists them)"
    )
    assert ran.err == [f"nodewise traces get: no record with id 'r99' {how.format(d=directory)}"]


def test_verify_names_a_damaged_index_row(paths: Paths, tmp_path: Path) -> None:
    directory = tmp_path / "stream"
    shutil.copytree(paths.stream, directory)
    rows = index_path(paths.stream).read_bytes().splitlines(keepends=True)
    rows[2] = b"#" * (len(rows[2]) - 1) + b"\n"
    index_path(directory).write_bytes(b"".join(rows))
    ran = run("traces", "verify", directory)
    assert ran.code == 1, ran
    assert ran.out.splitlines()[0].startswith("problem: index row 3 is not a row (bad index row")
    assert ran.out.splitlines()[-1] == "12 records verified, 1 problems"
    # get finds r7 past the damaged row; ls stops at it.
    assert run("traces", "get", directory, "r7").out.encode() == orjson.dumps(RECORDS[7]) + b"\n"
    ls = run("traces", "ls", directory)
    assert ls.code == 1, ls
    assert ls.out == ""
    assert ls.err[0].startswith(
        f"nodewise traces ls: {index_path(directory)} is damaged at row 3 (bad index row"
    )


# -- help, usage and --version ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "usage"),
    [
        (["--help"], "usage: nodewise [-h] [--version] COMMAND ..."),
        (["traces", "--help"], "usage: nodewise traces [-h] COMMAND ..."),
        (["traces", "get", "--help"], "usage: nodewise traces get [-h] DIR ID"),
        (["traces", "stat", "--help"], "usage: nodewise traces stat [-h] DIR"),
        (["traces", "cat", "--help"], "usage: nodewise traces cat [-h] [--fold] DIR"),
        (
            ["traces", "ls", "--help"],
            "usage: nodewise traces ls [-h] [--kind {train,eval}] [--sort FIELD]",
        ),
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
        (
            ["traces", "ls", ".", "--sort", "-bogus"],
            "nodewise traces ls: error: argument --sort: cannot sort by '-bogus': choose from "
            "line, step, kind, env, ok, reward, advantage, input_tokens, output_tokens, turns, "
            "num_errors, duration, id, cost, branches, chunk, dispatch, arrival (or in, out, "
            "errors), - first for largest first",
        ),
        (
            ["traces", "ls", ".", "--limit", "0"],
            "nodewise traces ls: error: argument --limit: '0' is not a positive number of rows",
        ),
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
