"""bench.seal: its smallest run prints every part's table and the targets, and writes both
snapshots."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import seal


def _rows(out: str) -> list[str]:
    """The first cell of every table row (not the header or the rule)."""
    cells = [line.split("|")[1].strip() for line in out.splitlines() if line.startswith("| ")]
    return [c for c in cells if c and set(c) != {"-"}]


def test_the_smallest_run_prints_every_table(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["--size", "200kB", "--mix-bytes", "1MB", "--repeats", "1"]
    argv += ["--episodes", "3", "--chunk-bytes", "300kB", "--big-bytes", "1.2MB"]
    argv += ["--json", str(tmp_path / "seal.json"), "--md", str(tmp_path / "seal.md")]
    assert seal.main(argv) == 0
    out = capsys.readouterr().out
    rows = _rows(out)
    assert rows.count("production mix (5 eps)") == len(seal.SETTINGS)
    assert rows.count("JSONL") == 1
    assert "same, ids + logprobs redrawn (5 eps)" in rows
    assert "text-heavy (5 eps)" in rows
    assert {"sealing on", "sealing off"} <= set(rows)
    assert {"start", "middle", "end"} <= set(rows)
    assert (tmp_path / "seal.md").read_text() == out
    data = json.loads((tmp_path / "seal.json").read_text())
    goals = [t["goal"] for t in data["targets"]]
    assert len(goals) == 4, goals
    assert goals[0].startswith("sealed chunks take >= 4x less disk")
    assert goals[2] == "at most one full chunk waits to be sealed"
    on = next(r for r in data["file_monitor"] if r["compress"])
    assert on["plain_chunks"] == 0, on
    assert on["sealed_chunks"] == 3, on
    assert on["backlog"] <= 1
    assert on["degraded"] == {}
    assert [lk["n"] for lk in data["big_chunk"]["lookups"]] == [0, 2, 4]
