"""The encoder's core is sans-IO: importing it pulls in no event loop or HTTP library."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("asyncio", "anyio", "aiohttp", "trio", "sniffio")


def _modules_after_import(*modules: str) -> list[str]:
    code = (
        "import json, sys\n"
        + "".join(f"import {m}\n" for m in modules)
        + "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize(
    "modules",
    [("encoder._walk",), ("encoder._chunks",), ("encoder._walk", "encoder._chunks")],
)
def test_core_imports_no_event_loop(modules: tuple[str, ...]) -> None:
    loaded = _modules_after_import(*modules)
    assert set(modules) <= set(loaded)
    bad = [name for name in loaded if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)]
    assert not bad, f"{modules} imported {bad}"


def test_the_check_can_see_an_event_loop() -> None:
    """The probe itself works: the async driver does bring anyio in."""
    loaded = _modules_after_import("encoder.aio")
    assert "anyio" in loaded
