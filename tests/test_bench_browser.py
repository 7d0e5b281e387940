"""bench.browser: its smallest run serves a production-like run, a synthetic index and a live
run from a real server process, and prints every row of its table; a second run reuses the
production run it kept, with the stall sampler in the server. No timing is asserted."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench import browser

#: The first cell of every row of the targets table, in order.
ROWS = [
    "reading the index (server start -> every row read)",
    "reading the index (server start -> every row read)",
    "first page by reward",
    "first page by reward, again",
    "filtered (kind, env) by reward",
    "deep offset by reward",
    "first page by reward",
    "largest episode's outline, first open",
    "outline, cached",
    "one node (median / max)",
    "server RSS, peak (VmHWM)",
    "server RSS, largest of",
    "loop lag while the run writes and the requests run, p50 / p99 / max",
    "of its samples over 5 ms, those with the loop on its CPU clock",
]


def _targets(out: str) -> list[list[str]]:
    """The cells of the targets table's rows (the first table printed)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| measure "))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("| "):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _check(out: str, data: dict[str, Any], *, episodes: int, rows: int) -> None:
    table = _targets(out)
    firsts = [r[0] for r in table]
    assert len(firsts) == len(ROWS), firsts
    for got, want in zip(firsts, ROWS, strict=True):
        assert got.startswith(want), (got, want)
    for cells in table:
        assert len(cells) == 5, cells
        assert cells[2], cells  # a value measured
        assert cells[4] in ("met", "NOT met", "-"), cells
    # Every request was answered, and the server had read every row before the first page.
    assert data["rows"] == {"production": episodes, "synthetic": rows}
    assert data["first_versions"]["synthetic"] == {"total": rows, "matched": rows, "version": rows}
    assert data["first_versions"]["production"]["version"] == episodes
    names = {r["name"] for r in data["requests"]}
    assert {"first page by reward", "outline, first open", "one node", "live status"} <= names
    assert all(r["status"] == 200 for r in data["requests"])
    assert all(r["server_ms"] is not None for r in data["requests"])
    nodes = [r for r in data["requests"] if r["name"] == "one node"]
    assert 1 <= len(nodes) <= browser.QUICK.nodes
    assert len(data["targets"]) == len(ROWS)
    assert data["server"]["vm_hwm"] > 0
    # The writer appended to the live run while the requests ran, and lost nothing.
    writer = data["writer"]
    assert writer["episodes"] >= 1
    assert writer["delivered"] == writer["submitted"] == writer["episodes"] + 1
    for phase in ("reading the indexes", "idle", "serving while the run writes"):
        assert data["phases"][phase]["lag_ms"]["count"] > 0, phase
    # Every late sample while serving is in the JSON, with one of the causes the table counts.
    over = data["targets"][-1]["numbers"]["over"]
    late = [s for s in data["late_samples"] if s["phase"] == "serving while the run writes"]
    assert len(late) == sum(over.values())
    for cause in over:
        assert sum(s["cause"] == cause for s in late) == over[cause]
    assert all(s["lag_ms"] > browser.LAG_MS for s in data["late_samples"])


def test_the_smallest_run_prints_every_row_then_reuses_its_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kept = tmp_path / "production"
    argv = ["--quick", "--episodes", "3", "--rows", "1000", "--run", str(kept)]
    assert browser.main([*argv, "--json", str(tmp_path / "a.json")]) == 0
    data = json.loads((tmp_path / "a.json").read_text())
    _check(capsys.readouterr().out, data, episodes=3, rows=1000)
    assert data["production_written"] is True
    marker = (kept / browser.MARKER).read_text()
    assert json.loads(marker)["episodes"] == 3

    assert browser.main([*argv, "--stalls", "--json", str(tmp_path / "b.json")]) == 0
    again = json.loads((tmp_path / "b.json").read_text())
    out = capsys.readouterr().out
    _check(out, again, episodes=3, rows=1000)
    assert again["production_written"] is False
    assert (kept / browser.MARKER).read_text() == marker
    assert again["runs"]["production"]["path"] == data["runs"]["production"]["path"]
    assert isinstance(again["server"]["stalls"], list)
    assert "Stalls of the server's loop over 8 ms (bench.stalls' sampler" in out
