"""Each fuzz target runs for a few seconds over its seed corpus (committed regression cases
and the shared corpus): a change that breaks a target's contract fails here, not only in
``make fuzz``. A fixed seed keeps these runs repeatable; ``make fuzz`` explores with new ones."""

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


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target_holds_its_contract(target: str) -> None:
    done = subprocess.run(
        [sys.executable, str(FUZZ / "run.py"), target, "--seconds", "5", "--seed", "1"],
        capture_output=True,
        text=True,
        check=False,
    )
    tail = "\n".join((done.stdout + done.stderr).splitlines()[-40:])
    assert done.returncode == 0, tail
    assert "Done" in done.stderr, tail  # it really ran (libFuzzer's closing line)
