"""Recipe: log a run to trace files and to the Prime Traces API at once, then read it back.

``main(directory)`` runs a ``FileMonitor`` and a ``PrimeMonitor`` (pointed at a local
``TracesServer``, a real server process on 127.0.0.1) behind one ``Monitors`` fan-out, and
checks that every episode was delivered to both (``tests/test_docs.py`` runs it).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import anyio

from monitors import DeliveryStats, FileMonitor, Monitors, PrimeMonitor
from monitors.testing import TracesServer
from monitors.traces import read_record, read_records

# --8<-- [start:log]


async def log_run(root: Path, url: str, api_key: str) -> dict[str, DeliveryStats]:
    files = FileMonitor(root)
    # Unset arguments come from PRIME_API_KEY, PRIME_TRACES_URL, PRIME_API_BASE_URL, ...
    prime = PrimeMonitor(api_key=api_key, traces_url=url, base_url=url, run_id="run-42")
    async with Monitors(files, prime) as monitors:  # starts both; leaving finalizes both
        for step in range(3):
            # An episode as the Traces service takes one: an object with a "traces" list.
            episodes = [
                {"id": f"{step}-{i}", "reward": i / 8, "traces": [{"id": f"{step}-{i}-0"}]}
                for i in range(8)
            ]
            await monitors.log_episodes(episodes, step=step, kind="train", subset="all")
            await monitors.log_metrics({"reward/mean": 0.4375, "loss": 1.5}, step=step)
    # A monitor whose call failed was logged and counted in monitors.failures, never raised.
    return {**monitors.stats_by_monitor(), "PrimeMonitor metrics": prime.metrics_stats()}


# --8<-- [end:log]
# --8<-- [start:read]


def read_back(root: Path) -> tuple[int, Any, Any]:
    # FileMonitor(root) writes prime-rl's layout:
    #   root/monitors/file/metrics.jsonl              a row per log_metrics call
    #   root/monitors/file/traces/stream/             every episode, train and eval, in
    #                                                 arrival order (full chunks zstd-sealed)
    #   root/monitors/file/traces/stream.index.jsonl  a row per episode: id, kind, step,
    #                                                 reward, ... and where it is
    # The readers take the run's directory (or the stream's: root/monitors/file/traces/stream).
    count = sum(1 for _ in read_records(root))  # every record, in order, streamed
    first = read_record(root, 0)  # one record, through the index
    last = read_record(root, -1)
    return count, first, last


# --8<-- [end:read]


def main(directory: str | os.PathLike[str]) -> dict[str, DeliveryStats]:
    root = Path(directory)
    with TracesServer(api_key="test-key", keep_lines=True) as server:
        stats = anyio.run(log_run, root, server.url, "test-key")
        served = server.stats()
    assert stats["FileMonitor"] == DeliveryStats(submitted=24, delivered=24, lost={})
    assert stats["PrimeMonitor"] == DeliveryStats(submitted=24, delivered=24, lost={})
    assert stats["PrimeMonitor metrics"] == DeliveryStats(submitted=3, delivered=3, lost={})
    assert (served["lines_stored"], served["metrics_received"]) == (24, 3), served
    count, first, last = read_back(root)
    assert (count, first["id"], last["id"]) == (24, "0-0", "2-7")
    assert len((root / "monitors/file/metrics.jsonl").read_bytes().splitlines()) == 3
    stream = root / "monitors/file/traces/stream"
    assert read_record(stream, -1) == last
    assert (root / "monitors/file/traces/stream.index.jsonl").is_file()
    print(f"24 episodes delivered to both monitors: {stats}")
    return stats


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        main(tmp)
