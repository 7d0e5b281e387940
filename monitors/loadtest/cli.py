"""The ``nodewise`` command: ``nodewise loadtest ...`` (also ``python -m monitors.loadtest``)
and ``nodewise traces cat|stat|verify DIR`` (also ``python -m monitors.traces``)."""

from __future__ import annotations

import argparse
import json
import logging
import re
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from ._config import MONITORS, LoadtestConfig, MonitorName
from ._report import check_plotting, plot, text, to_json
from ._run import Instrument, LoadtestReport, RunSpec, run_loadtest
from .errors import LoadtestError

__all__ = [
    "config_from",
    "main",
    "nodewise",
    "parse_bytes",
    "parse_seconds",
    "parser",
    "run_cli",
]

_UNITS = {
    "": None,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "k": 10**3,
    "m": 10**6,
    "g": 10**9,
}
_QUANTITY = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$", re.IGNORECASE)


def parse_bytes(value: str, *, default_unit: int) -> int:
    """``"2.2MB"``, ``"5GiB"``, ``"512kB"``; a bare number is in ``default_unit`` bytes."""
    m = _QUANTITY.match(value)
    unit = m.group(2).lower() if m else None
    if m is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a size (say 2.2MB, 5GiB or 512kB; units: kB MB GB KiB MiB GiB)"
        )
    scale = _UNITS[unit] or default_unit
    return round(float(m.group(1)) * scale)


def parse_seconds(value: str) -> float:
    """``"100ms"``, ``"0.1s"``, ``"2"`` (seconds)."""
    m = _QUANTITY.match(value)
    scales = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "m": 60.0, "min": 60.0}
    if m is None or m.group(2).lower() not in scales:
        raise argparse.ArgumentTypeError(f"{value!r} is not a duration (say 100ms, 0.5s or 60)")
    return float(m.group(1)) * scales[m.group(2).lower()]


def _bandwidth(value: str) -> float:
    """``"100"`` or ``"100MB/s"`` (MB per second) -> bytes per second."""
    text = value.strip()
    if text.lower().endswith("/s"):
        text = text[:-2]
    return float(parse_bytes(text, default_unit=10**6))


def _monitors(value: str) -> tuple[MonitorName, ...]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    for name in names:
        if name not in MONITORS:
            raise argparse.ArgumentTypeError(
                f"unknown monitor {name!r}: choose among {', '.join(MONITORS)}"
            )
    return tuple(names)  # type: ignore[arg-type]


def _int(minimum: int) -> Any:
    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
        if number < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, not {number}")
        return number

    return parse


def _mb(value: str) -> int:
    return parse_bytes(value, default_unit=10**6)


def parser(*, prog: str = "nodewise loadtest") -> argparse.ArgumentParser:
    """The load test's options (``prog`` names the command in messages)."""
    p = argparse.ArgumentParser(
        prog=prog,
        description=(
            "Push production-like RL episodes through nodewise's monitors (file, Prime "
            "Traces API against a local TracesServer, W&B offline) the way an orchestrator "
            "logs them, while a probe samples the event loop every 1 ms; print per monitor "
            "what was delivered and lost, the slowest log() call, loop lag, wall time, "
            "throughput and peak memory, then whether the targets were met."
        ),
        epilog=(
            "Sizes take units (2.2MB, 5GiB; a bare number is MB, bytes for --chunk-bytes); "
            "durations too (100ms, 0.5s; a bare number is seconds). Example: nodewise "
            "loadtest --episodes 200 --latency 100ms --bandwidth 100 --verbose"
        ),
    )
    d = LoadtestConfig()
    p.add_argument(
        "--monitors",
        type=_monitors,
        default=d.monitors,
        help="comma-separated, run one after the other (default: file,prime,wandb)",
    )
    p.add_argument("--episodes", type=_int(1), default=d.episodes, help="default %(default)s")
    sizes = p.add_argument_group("episode sizes (default: production's lognormal)")
    sizes.add_argument("--size", type=_mb, default=None, help="every episode about this size")
    sizes.add_argument("--size-median", type=_mb, default=d.size_median, metavar="SIZE")
    sizes.add_argument("--size-p90", type=_mb, default=d.size_p90, metavar="SIZE")
    sizes.add_argument("--size-cap", type=_mb, default=d.size_cap, metavar="SIZE")
    p.add_argument(
        "--step-size",
        type=_int(1),
        default=d.step_size,
        help="episodes per step: each is logged alone with subset 'all', then the step's "
        "batch at once with subset 'effective' (default %(default)s)",
    )
    p.add_argument(
        "--no-effective",
        action="store_true",
        help="log each episode once (subset 'all') instead of once more with its step",
    )
    p.add_argument(
        "--ahead",
        type=_int(0),
        default=d.ahead,
        help="before each log call, wait while more records than this are pending in the "
        "monitor, as a trainer that runs only so far ahead would (0: never wait; "
        "default %(default)s)",
    )
    p.add_argument("--seed", type=int, default=d.seed, help="episodes are seeded (default 0)")
    p.add_argument(
        "--no-gc-freeze",
        action="store_true",
        help="do not gc.freeze() the start-up heap once a monitor has started: full "
        "collections then scan every imported module too (wandb's: +14 ms each)",
    )
    net = p.add_argument_group("the Prime run's network, injected by the TracesServer")
    net.add_argument(
        "--latency", type=parse_seconds, default=d.latency, help="added to every request"
    )
    net.add_argument(
        "--bandwidth",
        type=_bandwidth,
        default=d.bandwidth,
        help="MB/s each request body is read at (default: no limit)",
    )
    net.add_argument("--in-flight", type=_int(1), default=d.in_flight, help="default 8")
    net.add_argument(
        "--server-nice",
        type=_int(0),
        default=d.server_nice,
        help="run the TracesServer this much nicer than the load test: it stands in for a "
        "remote service but shares the cores here (default %(default)s; 0: same priority)",
    )
    net.add_argument(
        "--drain-timeout", type=parse_seconds, default=d.drain_timeout, help="default 60 s"
    )
    p.add_argument(
        "--chunk-bytes",
        type=lambda v: parse_bytes(v, default_unit=1),
        default=d.chunk_bytes,
        help="trace chunk size of the file and W&B monitors (default 5GiB)",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        metavar="DIR",
        help="write and keep the trace files here (default: a temporary directory, "
        "each monitor's files removed as soon as its run ends)",
    )
    p.add_argument(
        "--json",
        nargs="?",
        const="-",
        default=None,
        metavar="FILE",
        help="the report as JSON (with each run's lag over time, its worst sample every "
        "0.1 s): on stdout instead of the table, or into FILE beside it",
    )
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="FILE.png",
        help="draw loop lag over time per monitor (needs nodewise[plot], i.e. matplotlib)",
    )
    p.add_argument(
        "--verbose",
        action="store_true",
        help="also say what ran, what the columns mean, the machine's own lag and speed, "
        "garbage collections, where lag came from, CPU per GB and what the server stored",
    )
    p.add_argument("--no-progress", action="store_true", help="no live progress display on stderr")
    return p


def config_from(args: argparse.Namespace) -> LoadtestConfig:
    """The run ``parser()``'s arguments ask for (raises ``LoadtestError`` on bad values)."""
    return LoadtestConfig(
        monitors=args.monitors,
        episodes=args.episodes,
        size=args.size,
        size_median=args.size_median,
        size_p90=args.size_p90,
        size_cap=args.size_cap,
        step_size=args.step_size,
        effective=not args.no_effective,
        ahead=args.ahead,
        seed=args.seed,
        latency=args.latency,
        bandwidth=args.bandwidth,
        in_flight=args.in_flight,
        server_nice=args.server_nice,
        drain_timeout=args.drain_timeout,
        chunk_bytes=args.chunk_bytes,
        out=args.out,
        gc_freeze=not args.no_gc_freeze,
        progress=not args.no_progress and sys.stderr.isatty(),
    )


def main(argv: Sequence[str] | None = None) -> int:
    """``nodewise loadtest``: 0 when every nodewise monitor delivered every record, 1 when
    one did not, 2 for bad options or a run that cannot start, 130 when interrupted."""
    return run_cli(parser().parse_args(argv))


def run_cli(
    args: argparse.Namespace,
    *,
    extra_runs: Sequence[RunSpec] = (),
    instrument: Instrument | None = None,
    more: Callable[[LoadtestReport], list[str]] | None = None,
) -> int:
    """Run the load test ``parser()``'s ``args`` ask for and print its report, as ``main``
    does; the benchmarks pass what they measure beside it (``run_loadtest``'s
    ``extra_runs`` and ``instrument``, and ``more`` lines for ``--verbose``)."""
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(name)s: %(message)s")
    try:
        if args.plot is not None:
            check_plotting()
        if args.json not in (None, "-") and not Path(args.json).parent.is_dir():
            raise LoadtestError(f"--json {args.json}: no such directory")
        config = config_from(args)
        report = anyio.run(
            lambda: run_loadtest(config, extra_runs=extra_runs, instrument=instrument)
        )
    except LoadtestError as exc:
        print(f"nodewise loadtest: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = f"; the files so far are in {args.out}" if args.out is not None else ""
        print(f"\nnodewise loadtest: interrupted{where}", file=sys.stderr)
        return 130
    if args.plot is not None:
        plot(report, args.plot)
    data = to_json(report)
    if args.json not in (None, "-"):
        Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
    if args.json == "-":
        print(json.dumps(data, indent=2))
    else:
        print(
            text(report, verbose=args.verbose, more=more(report) if more and args.verbose else ())
        )
        if args.plot is not None:
            print(f"\nloop lag over time: {args.plot}")
    return 0 if all(r.all_delivered for r in report.ours) else 1


def nodewise(argv: Sequence[str] | None = None) -> int:
    """The ``nodewise`` console script: ``nodewise loadtest ...``, ``nodewise traces ...``."""
    args = list(sys.argv[1:] if argv is None else argv)
    commands = {
        "loadtest": "run the load test",
        "traces": "cat, stat, verify or get from a trace stream",
    }
    if not args or args[0] in ("-h", "--help") or args[0] not in commands:
        usage = "usage: nodewise {loadtest,traces} ...\n\n" + "\n".join(
            f"  {name:<10} {what}" for name, what in commands.items()
        )
        if args and args[0] not in ("-h", "--help"):
            print(f"nodewise: unknown command {args[0]!r}\n\n{usage}", file=sys.stderr)
            return 2
        print(usage)
        return 0 if args else 2
    if args[0] == "traces":
        from ..traces.__main__ import main as traces_main

        return traces_main(args[1:])
    return main(args[1:])
