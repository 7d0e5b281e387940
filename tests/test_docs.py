"""The documentation cannot drift: every recipe the site shows runs here, against a real local
aiohttp server, real files or trio; every snippet it includes exists; the plots draw from the
committed benchmark snapshot. (``make docs`` builds the site itself, with ``--strict``.)
"""

from __future__ import annotations

import importlib.util
import json
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"
RECIPES = DOCS / "recipes"
#: A snippet include in its block form (``--8<--`` lines around the file name): unlike the
#: one-line form, ruff's Markdown formatter leaves it alone inside a Python code block.
_SNIPPET = re.compile(r"^--8<--\n(?P<file>[^:\n]+)(?::(?P<section>[\w-]+))?\n--8<--$", re.M)
_SECTION = "# --8<-- [{}:{}]"


def load(path: Path) -> ModuleType:
    """Import a file under docs/ as a module of its own (docs/ is not a package)."""
    name = "docs_" + "_".join(path.relative_to(DOCS).with_suffix("").parts)
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def docs_on_path() -> Iterator[None]:
    """docs/ importable by name, as mkdocs makes it for the hook."""
    sys.path.insert(0, str(DOCS))
    try:
        yield
    finally:
        sys.path.remove(str(DOCS))


# -- the recipes ------------------------------------------------------------------------------


def _stream(module: ModuleType, tmp: Path) -> None:
    assert module.main(megabytes=5) > 4_000_000


def _upload(module: ModuleType, tmp: Path) -> None:
    one, many = module.main()
    assert one["chunked"]
    assert many["chunked"]


def _jsonl(module: ModuleType, tmp: Path) -> None:
    module.main(tmp)


def _trio(module: ModuleType, tmp: Path) -> None:
    lag = module.main(tmp / "doc.json")
    assert lag.count > 0  # the probe ran on the trio loop meanwhile


def _monitors(module: ModuleType, tmp: Path) -> None:
    stats = module.main(tmp)
    assert stats["FileMonitor"].delivered == 24


def _objects(module: ModuleType, tmp: Path) -> None:
    read, want = module.main(tmp)
    assert read == want


RUNS: dict[str, Callable[[ModuleType, Path], None]] = {
    "aiohttp_stream.py": _stream,
    "aiohttp_upload.py": _upload,
    "jsonl.py": _jsonl,
    "trio_save.py": _trio,
    "monitors_run.py": _monitors,
    "log_objects.py": _objects,
}


def test_every_recipe_file_is_run_here() -> None:
    assert sorted(p.name for p in RECIPES.glob("*.py")) == sorted(RUNS)


@pytest.mark.parametrize("name", sorted(RUNS))
def test_recipe_runs(name: str, tmp_path: Path) -> None:
    RUNS[name](load(RECIPES / name), tmp_path)


# -- the pages ------------------------------------------------------------------------------


def _snippets() -> list[tuple[str, str, str | None]]:
    found = []
    for page in sorted(DOCS.rglob("*.md")):
        if DOCS / "data" in page.parents:
            continue
        for m in _SNIPPET.finditer(page.read_text()):
            found.append((str(page.relative_to(DOCS)), m["file"], m["section"]))
    return found


def test_pages_include_snippets() -> None:
    assert {file for _, file, _ in _snippets()} >= {f"recipes/{name}" for name in RUNS} | {
        "data/file_monitor.md",
        "data/prime_monitor.md",
        "data/loadtest_big.md",
    }


@pytest.mark.parametrize(("page", "file", "section"), _snippets())
def test_snippet_exists(page: str, file: str, section: str | None) -> None:
    text = (DOCS / file).read_text()
    if section is not None:
        start = text.find(_SECTION.format("start", section))
        end = text.find(_SECTION.format("end", section))
        assert 0 <= start < end, f"{page}: no section {section!r} in {file}"


def test_benchmark_placeholders_resolve(docs_on_path: None) -> None:
    hooks = load(DOCS / "hooks.py")
    page = (DOCS / "benchmarks.md").read_text()
    placeholders = list(hooks._SNAPSHOT.finditer(page))
    assert len(placeholders) >= 8
    assert {m["file"] for m in placeholders} == {"encoder.md", "adversarial.md", "loadtest.md"}
    for m in placeholders:
        assert hooks.snapshot_block(m["file"], m["prefix"]).startswith(m["prefix"])


def test_snapshot_table_and_json_are_one_run() -> None:
    """encoder.md (the printed tables) and encoder.json (the plots) came from the same
    ``python -m bench`` run: its header names the run's mode and length."""
    data: dict[str, Any] = json.loads((DOCS / "data" / "encoder.json").read_text())
    header = (DOCS / "data" / "encoder.md").read_text().splitlines()[0]
    assert f"({data['mode']} run, {data['elapsed_s']:.0f} s)" in header


def test_load_test_table_and_json_are_one_run() -> None:
    """loadtest.md (the printed report) and loadtest.json (the plot) came from the same
    ``nodewise loadtest --json FILE`` run: the same rows, to the last digit."""
    data: dict[str, Any] = json.loads((DOCS / "data" / "loadtest.json").read_text())
    text = (DOCS / "data" / "loadtest.md").read_text()
    for r in data["results"]:
        lag = r["lag_ms"]
        row = (
            f"| {r['name']} | {r['network']} | {r['in_flight'] or '-'} | "
            f"{r['delivered']} / {r['submitted']} |"
        )
        assert row in text, row
        assert f"| {lag['p99']:.2f} | {lag['max']:.2f} | {r['wall_s']:.1f} |" in text
        assert max(r["lag_trace_ms"]["max"]) == pytest.approx(lag["max"], abs=1e-3)


def test_plots_render(docs_on_path: None) -> None:
    gen_plots = load(DOCS / "gen_plots.py")
    images = gen_plots.render()
    assert set(images) == {
        "throughput.png",
        "lag.png",
        "budget_sweep.png",
        "lag_over_time.png",
        "loadtest_lag.png",
    }
    for name, png in images.items():
        assert png.startswith(b"\x89PNG\r\n\x1a\n"), name
        assert len(png) > 20_000, name  # a drawn plot, not an empty canvas
