"""The encoder's core is sans-IO: importing it pulls in no event loop or HTTP library.

(sniffio may load: the package's async driver asks it, at call time, which loop runs; it
starts none and imports none.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FORBIDDEN = ("asyncio", "anyio", "aiohttp", "trio")


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
    """The probe itself works: the monitors do bring anyio in."""
    loaded = _modules_after_import("monitors")
    assert "anyio" in loaded


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_first_async_call_imports_nothing(backend: str) -> None:
    """``import encoder`` does the async driver's set-up: its first call on a running loop
    loads no module (an import on the loop held it ~13 ms when the driver loaded lazily)."""
    code = f"""
import json, sys
import anyio
import encoder

async def main():
    before = set(sys.modules)
    async for _ in encoder.aiterencode({{"a": [1, 2.5, "x" * 300_000]}}):
        pass
    await encoder.adump([1], _sink)
    print(json.dumps(sorted(set(sys.modules) - before)))

async def _sink(chunk):
    pass

anyio.run(main, backend={backend!r})
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == []


def test_an_encoding_leaves_no_garbage_for_the_collector() -> None:
    """Everything a walk makes is freed by reference counting, even when it raises: garbage
    left for the collector sets off collections, which stall the loop (docs/design.md D7)."""
    code = """
import gc, sys
from encoder import EncodeError, encode, iterencode

class Unsupported:
    pass

value = {"a": [1, 2.5, "x" * 100_000], "b": [{"c": i} for i in range(2_000)]}
gc.collect()
gc.disable()
for _ in range(20):
    b"".join(iterencode(value, chunk_size=4096))
    encode([value, [[[1]]] * 300], option=None)
    try:
        encode({"k": [Unsupported()]}, default=lambda o: o)
    except EncodeError:
        pass
print(gc.collect())
"""
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) == 0
