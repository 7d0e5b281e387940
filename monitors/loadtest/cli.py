"""The ``nodewise`` command: ``nodewise loadtest ...`` (also ``python -m monitors.loadtest``),
``nodewise traces cat|stat|verify|get ...`` (also ``python -m monitors.traces``) and
``nodewise --version``."""

from __future__ import annotations

import argparse
import dataclasses
import importlib.metadata
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
from ._run import RUNS, Instrument, LoadtestReport, RunSpec, run_loadtest
from .errors import LoadtestError

__all__ = [
    "PROG",
    "config_from",
    "installed_monitors",
    "main",
    "nodewise",
    "parse_bytes",
    "parse_seconds",
    "parser",
    "run_cli",
    "version",
]

#: The load test's name in help and errors unless a caller passes its own.
PROG = "nodewise loadtest"
#: ``nodewise``'s commands and what each does.
COMMANDS = {
    "loadtest": "run the load test",
    "traces": "ls, cat, stat, verify, get or upload a run's trace stream",
}

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


class _GivenMonitors(argparse.Action):
    """Store ``--monitors`` and note that the user named them: a monitor named but not
    installed is an error, where one of the defaults is skipped."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        setattr(namespace, self.dest, values)
        namespace.monitors_named = True


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


def parser(*, prog: str = PROG) -> argparse.ArgumentParser:
    """The load test's options (``prog`` names the command in help and errors)."""
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
    p.set_defaults(prog=prog, monitors_named=False)
    p.add_argument(
        "--monitors",
        type=_monitors,
        action=_GivenMonitors,
        default=d.monitors,
        help="comma-separated, run one after the other (default: file,prime,wandb, "
        "skipping any whose package is not installed)",
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
        help="draw loop lag over time per monitor (needs matplotlib)",
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


def main(argv: Sequence[str] | None = None, *, prog: str = PROG) -> int:
    """``nodewise loadtest``: 0 when every nodewise monitor delivered every record, 1 when
    one did not, 2 for bad options or a run that cannot start (a monitor named in
    ``--monitors`` whose package is not installed among them), 130 when interrupted.

    :param argv: The arguments (default: the process's).
    :param prog: The name the user typed, for help and errors.
    """
    return run_cli(parser(prog=prog).parse_args(argv))


def installed_monitors(
    monitors: Sequence[MonitorName], *, named: bool
) -> tuple[tuple[MonitorName, ...], list[str]]:
    """The ``monitors`` whose packages are installed, and a line for each one skipped.

    :param monitors: The monitors asked for.
    :param named: Whether the user named them (``--monitors``): then a missing package is
        an error rather than a skip.
    :raises LoadtestError: A monitor the user named needs a package that is not installed.
    """
    kept: list[MonitorName] = []
    skipped: list[str] = []
    for name in monitors:
        spec = RUNS[name]
        package = spec.missing()
        if package is None:
            kept.append(name)
        elif named:
            raise LoadtestError(
                f"--monitors {name}: the {package} package is not installed: {spec.install}"
            )
        else:
            skipped.append(
                f"skipping {spec.name}: the {package} package is not installed: {spec.install}"
            )
    return tuple(kept), skipped


def _check_paths(args: argparse.Namespace) -> None:
    """Refuse, before a run of many minutes, the paths it could not write at the end.

    :raises LoadtestError: ``--out`` is or lies under a file, or ``--json`` or ``--plot``
        is a directory or lies in one that does not exist.
    """
    if args.out is not None:
        out: Path = args.out
        existing = next(p for p in (out, *out.parents) if p.exists())
        if not existing.is_dir():
            raise LoadtestError(
                f"--out {out}: {existing} is a file; give a directory (new or existing)"
            )
    for option, value in (("--json", args.json), ("--plot", args.plot)):
        if value is None or value == "-":
            continue
        path = Path(value)
        if path.is_dir():
            raise LoadtestError(f"{option} {path}: that is a directory; give a file's name")
        if not path.parent.is_dir():
            raise LoadtestError(
                f"{option} {path}: no such directory {path.parent}; create it or write elsewhere"
            )


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
    prog = getattr(args, "prog", PROG)
    try:
        _check_paths(args)
        if args.plot is not None:
            check_plotting()
        config = config_from(args)
        monitors, skipped = installed_monitors(
            config.monitors, named=getattr(args, "monitors_named", True)
        )
        config = dataclasses.replace(config, monitors=monitors)
        for line in skipped:
            print(f"{prog}: {line}", file=sys.stderr)
        report = anyio.run(
            lambda: run_loadtest(config, extra_runs=extra_runs, instrument=instrument)
        )
    except LoadtestError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:  # --out cannot be made or written
        print(f"{prog}: {exc.filename or args.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        where = f"; the files so far are in {args.out}" if args.out is not None else ""
        print(f"\n{prog}: interrupted{where}", file=sys.stderr)
        return 130
    data = to_json(report)
    # Past the run, a file that cannot be written still leaves the report printed.
    failed: list[str] = []
    plotted = False
    if args.plot is not None:
        try:
            plot(report, args.plot)
            plotted = True
        except (LoadtestError, OSError) as exc:
            failed.append(f"--plot {args.plot}: {exc}")
    if args.json not in (None, "-"):
        try:
            Path(args.json).write_text(json.dumps(data, indent=1) + "\n")
        except OSError as exc:
            failed.append(f"--json {args.json}: {exc}")
    if args.json == "-":
        print(json.dumps(data, indent=2))
    else:
        print(
            text(report, verbose=args.verbose, more=more(report) if more and args.verbose else ())
        )
        if plotted:
            print(f"\nloop lag over time: {args.plot}")
    for line in failed:
        print(f"{prog}: {line}", file=sys.stderr)
    if failed:
        return 2
    return 0 if all(r.all_delivered for r in report.ours) else 1


def version() -> str:
    """The installed ``nodewise`` distribution's version."""
    try:
        return importlib.metadata.version("nodewise")
    except importlib.metadata.PackageNotFoundError:
        return "unknown (the nodewise distribution is not installed)"


def _top_parser() -> argparse.ArgumentParser:
    """``nodewise`` itself: its help, ``--version`` and its usage errors (each command
    parses its own arguments)."""
    listing = "\n".join(f"  {name:<10} {what}" for name, what in COMMANDS.items())
    p = argparse.ArgumentParser(
        prog="nodewise",
        usage="%(prog)s [-h] [--version] COMMAND ...",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description=f"nodewise's command line.\n\ncommands:\n{listing}",
        epilog="nodewise COMMAND --help says more about each.",
    )
    p.add_argument("--version", action="version", version=f"%(prog)s {version()}")
    p.add_argument("command", metavar="COMMAND", help=argparse.SUPPRESS)  # listed above
    return p


def nodewise(argv: Sequence[str] | None = None) -> int:
    """The ``nodewise`` console script: ``nodewise loadtest ...``, ``nodewise traces ...``,
    ``nodewise --version``; 2 for a usage error."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] == "traces":
        from ..traces.__main__ import main as traces_main

        return traces_main(args[1:], prog="nodewise traces")
    if args and args[0] == "loadtest":
        return main(args[1:], prog="nodewise loadtest")
    top = _top_parser()
    choose = f"choose from {', '.join(COMMANDS)}"
    try:
        if args and not args[0].startswith("-"):
            top.error(f"unknown command {args[0]!r} ({choose})")
        if args and args[0] not in ("-h", "--help", "--version"):
            top.error(f"unknown option {args[0]!r}: the command comes first ({choose})")
        top.parse_args(args)  # exits: help, --version, or no command
    except SystemExit as exc:
        return exc.code if isinstance(exc.code, int) else 0
    return 2
