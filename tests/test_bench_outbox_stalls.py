"""bench.outbox_stalls: a small run delivers every episode and reports the loop's stalls."""

from __future__ import annotations

import asyncio

from bench import outbox_stalls


def test_a_small_run_delivers_everything_and_reports_stalls() -> None:
    report = asyncio.run(outbox_stalls.run(3))
    assert "DeliveryStats(submitted=3, delivered=3, lost={})" in report
    assert "Stalls of the loop over 8 ms" in report
