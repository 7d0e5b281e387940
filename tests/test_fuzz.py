"""Each fuzz target replays a fixed number of inputs from a fixed seed over its seed corpus
(committed regression cases and the shared corpus): a change that breaks a target's contract
fails here, not only in ``make fuzz``. A count of inputs, not a time limit, and a fresh
output corpus (``fuzz/run.py --runs``) make the verdict the same on any machine; ``make
fuzz`` explores for a time with new seeds."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

FUZZ = Path(__file__).resolve().parents[1] / "fuzz"
_spec = importlib.util.spec_from_file_location("fuzz_run", FUZZ / "run.py")
assert _spec is not None
assert _spec.loader is not None
_run = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_run)
TARGETS: tuple[str, ...] = _run.TARGETS

#: Inputs per target, the seeds included. Each test takes, on the 2-core development
#: machine, start-up (instrumenting the imports) included: encode 7.1-7.6 s, traces_reader
#: 8.6-9.7 s, traces_server 11-12 s.
RUNS = {"encode": 2000, "traces_reader": 5000, "traces_server": 20000}


def test_every_target_has_a_count() -> None:
    assert set(RUNS) == set(TARGETS)


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_holds_its_contract(target: str, tmp_path: Path) -> None:
    runs = RUNS[target]
    done = subprocess.run(
        [
            sys.executable,
            str(FUZZ / "run.py"),
            target,
            "--runs",
            str(runs),
            "--seed",
            "1",
            "--work",
            str(tmp_path),  # a crash input lands in tmp_path/<target>/crash-*
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    assert done.returncode == 0, tail
    assert f"Done {runs} in" in done.stderr, tail  # atheris's closing line: all of them ran
