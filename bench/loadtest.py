"""``nodewise loadtest`` with what only a benchmark needs: today's way measured beside the
monitors, and where the loop's lag came from.

    python -m bench.loadtest [nodewise loadtest options] [--baseline] [--no-witnesses]

``--baseline`` adds a run of today's way for each monitor that has one (``bench.baselines``:
``orjson.dumps`` in ``asyncio.to_thread`` to a file; an SDK-like uploader). Every run gets
``bench.attribution``'s probe and witnesses; ``--verbose`` says what they found, and
``--json`` has it per run. ``make demo`` runs ``--episodes 60 --baseline``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

from monitors.loadtest import LoadtestConfig, LoadtestReport, run_loadtest
from monitors.loadtest.cli import parser as loadtest_parser
from monitors.loadtest.cli import run_cli

from .attribution import Attribution
from .baselines import baseline_runs

__all__ = ["main", "parser", "run"]


def parser() -> argparse.ArgumentParser:
    p = loadtest_parser(prog="python -m bench.loadtest")
    p.add_argument(
        "--baseline",
        action="store_true",
        help="also run today's way: orjson.dumps in asyncio.to_thread to a file, and an "
        "SDK-like uploader (a queue put that blocks, gzip 9, one request in flight)",
    )
    p.add_argument(
        "--no-witnesses",
        action="store_true",
        help="no witness processes (the loop's lag is then net of steal only)",
    )
    return p


def run(
    config: LoadtestConfig, *, baseline: bool = False, witnesses: bool = True
) -> tuple[LoadtestReport, Attribution]:
    """The load test with ``Attribution`` (and, ``baseline``, today's way), from outside a
    loop; the report and what the attribution found per run."""
    attribution = Attribution(use_witnesses=witnesses)
    extra = baseline_runs(config.monitors) if baseline else []

    async def main() -> LoadtestReport:
        return await run_loadtest(config, extra_runs=extra, instrument=attribution)

    return anyio.run(main), attribution


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    attribution = Attribution(use_witnesses=not args.no_witnesses)
    return run_cli(
        args,
        extra_runs=baseline_runs(args.monitors) if args.baseline else (),
        instrument=attribution,
        more=attribution.paragraphs,
    )


if __name__ == "__main__":
    sys.exit(main())
