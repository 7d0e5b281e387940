"""bench.prime_monitor's outbox paths, at the smallest size: the outbox configuration
delivers every episode and leaves no scratch directory, and the outage run of each mode
counts what it lost and reports both rows."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest

from bench import prime_monitor

SIZE = 300_000  # bytes of JSON per episode: small, so each run takes seconds


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Small episodes, and scratch directories under ``tmp_path`` (returned)."""
    monkeypatch.setattr(prime_monitor, "lognormal_sizes", lambda n, seed=0: [SIZE] * n)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    monkeypatch.setattr(prime_monitor, "scratch_dir", lambda: Path(tempfile.mkdtemp(dir=scratch)))
    return scratch


def test_the_outbox_configuration_delivers_every_episode_and_cleans_up(small: Path) -> None:
    result = prime_monitor.run_one("outbox:none:2", 4, 0)
    assert result.uploader == "PrimeMonitor, outbox"
    assert (result.submitted, result.delivered, result.stored) == (4, 4, 4)
    assert (result.lost, result.pending) == ({}, 0)
    assert result.file_seconds > 0  # the file monitor's time, kept apart from the Prime call's
    assert result.slowest_log < result.file_seconds
    assert "| PrimeMonitor, outbox | none | 2 |" in prime_monitor.table([result])
    assert list(small.iterdir()) == []


def test_an_outage_costs_the_in_memory_mode_records_and_the_outbox_none(
    small: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    queue_bytes = 2**20  # 2 MiB are logged while the server is down
    memory = prime_monitor.run_outage("memory", 1.0, queue_bytes, 0)
    outbox = prime_monitor.run_outage("outbox", 1.0, queue_bytes, 0)
    episodes = len(prime_monitor.outage_sizes(queue_bytes))
    assert memory.episodes == outbox.episodes == episodes
    assert memory.lost.get("queue_full", 0) > 0
    assert memory.delivered + sum(memory.lost.values()) == episodes
    assert (outbox.delivered, outbox.lost, outbox.pending) == (episodes, {}, 0)
    assert outbox.caught_up is not None
    assert list(small.iterdir()) == []
    prime_monitor.outage_report([memory, outbox], 0)
    out = capsys.readouterr().out
    assert "| in memory |" in out
    assert "| outbox |" in out
