"""The load test's report: the table, a short summary against the targets, the details
(``--verbose``), JSON, and a plot of loop lag over time."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ._run import MB, STALL_MS, LoadtestReport, RunResult
from .errors import LoadtestError

__all__ = [
    "PLOT_HINT",
    "check_plotting",
    "details",
    "lag_figure",
    "plot",
    "summary",
    "table",
    "targets",
    "text",
    "to_json",
]

MIB = 2**20
PLOT_HINT = "pip install matplotlib (or pip install '.[plot]' in the nodewise checkout)"
#: The targets a run of nodewise's monitors is held to (docs/design.md D14).
SLOWEST_LOG_PRIME = 1e-3
LAG_P99 = 5.0
#: Below this share of their lag spent running, a run's stalls were the machine's.
MOSTLY = 0.5


def _lost(r: RunResult, reason: str) -> str:
    return str(r.lost.get(reason, 0))


def table(results: list[RunResult]) -> str:
    """A Markdown table, one row per run."""
    head = (
        "| monitor | network | in flight | delivered | lost: queue full | lost: drain | "
        "lost: other | slowest log (ms) | lag p50 (ms) | lag p99 (ms) | lag max (ms) | "
        "wall (s) | MB/s | peak RSS (MiB) |"
    )
    rule = (
        "| --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | "
        "---: | ---: |"
    )
    rows = [head, rule]
    for r in results:
        other = {k: v for k, v in r.lost.items() if k not in ("queue_full", "drain_timeout")}
        other_text = ", ".join(f"{k}: {v}" for k, v in sorted(other.items())) or "0"
        if r.error:
            other_text += f" (error: {r.error})"
        rows.append(
            f"| {r.name} | {r.network} | {r.in_flight if r.in_flight is not None else '-'} | "
            f"{r.delivered} / {r.submitted} | {_lost(r, 'queue_full')} | "
            f"{_lost(r, 'drain_timeout')} | {other_text} | {r.slowest_log * 1e3:.2f} | "
            f"{r.lag.p50:.2f} | {r.lag.p99:.2f} | {r.lag.max:.2f} | {r.wall:.1f} | "
            f"{r.mbps:.0f} | {r.peak_rss / MIB:.0f} |"
        )
    return "\n".join(rows)


def _whose(running_ms: float | None, spent_ms: float) -> str:
    """Whose time an over-target span was: the loop's own work, or the machine's."""
    if running_ms is None:
        return ""
    if running_ms >= MOSTLY * spent_ms:
        return f" (the loop's thread ran {running_ms:.2f} ms of it)"
    return (
        f" (the loop's thread ran only {running_ms:.2f} ms of it: the rest it was kept off "
        "its core, the machine's stall rather than nodewise's work)"
    )


def summary(report: LoadtestReport) -> list[str]:
    """At most three lines: whether every record was delivered, lag p99 and the slowest
    Prime ``log()`` against the targets (saying whose a miss was), and where more is."""
    ours = report.ours
    if not ours:
        return []
    short = [r for r in ours if not r.all_delivered]
    if not short:
        delivered = f"Every record delivered ({ours[0].records} per monitor)."
    else:
        delivered = (
            "NOT every record delivered: "
            + "; ".join(
                f"{r.name} {r.delivered} of {r.records}"
                + (f", lost {dict(sorted(r.lost.items()))}" if r.lost else "")
                + (f", error: {r.error}" if r.error else "")
                for r in short
            )
            + "."
        )
    worst = max(ours, key=lambda r: r.lag.p99)
    lag = f"Loop lag p99 {worst.lag.p99:.2f} ms at worst ({worst.name}; target {LAG_P99:g} ms): "
    if worst.lag.p99 <= LAG_P99:
        lag += "met"
    else:
        count, running = worst.stalls()
        lag += (
            f"over, in {count} samples over {STALL_MS:g} ms during which the loop's thread ran "
            f"{running:.0%} of the time"
            + (
                ": the machine kept it off its core, not nodewise's work"
                if running < MOSTLY
                else ": the loop's own work"
            )
        )
    prime = [r for r in ours if r.run == "prime"]
    if prime:
        p = max(prime, key=lambda r: r.slowest_log)
        ms = p.slowest_log * 1e3
        lag += f"; slowest Prime log() {ms:.2f} ms (target {SLOWEST_LOG_PRIME * 1e3:g} ms): " + (
            "met"
            if p.slowest_log <= SLOWEST_LOG_PRIME
            else "over" + _whose(p.slowest_log_running, ms)
        )
    return [delivered, lag + ".", "More: --verbose (where the lag came from), --json (everything)."]


def details(report: LoadtestReport) -> list[str]:
    """The paragraphs of ``--verbose``: what ran, what the columns mean, the machine, the
    garbage collector, where lag came from, CPU per GB and what the server stored."""
    c = report.config
    sizes = (
        f"all ~{c.size / MB:g} MB"
        if c.size is not None
        else f"lognormal, median {c.size_median / MB:g} MB, p90 {c.size_p90 / MB:g} MB, "
        f"cap {c.size_cap / MB:g} MB"
    )
    out = [
        f"{c.episodes} episodes ({report.json_bytes / 1e9:.2f} GB of JSON; {sizes}; seed "
        f"{c.seed}), "
        + (
            f"each logged as it arrives (subset 'all'), then with its step of {c.step_size} "
            "(subset 'effective')"
            if c.effective
            else "each logged once as it arrives (subset 'all')"
        )
        + f": {c.records} records per monitor.",
        "Delivered: written (file, W&B) or committed by the server (Prime). Slowest log: the "
        "longest log_episodes call. Lag: how late a task asking to wake every "
        f"{c.lag_interval * 1e3:g} ms woke, from the first log call to the end of finalize "
        "(wall). MB/s: JSON delivered over wall. Peak RSS: this process"
        + ("" if report.rss_per_run else "'s peak so far (it cannot be reset here)")
        + "; the TracesServer and wandb-core are processes of their own"
        + (
            f" (the server at nice +{c.server_nice}: a remote service would not share these cores)."
            if any(r.server is not None for r in report.results)
            else "."
        ),
        f"The machine: {report.machine.get('cpus')} CPUs, Python {report.machine.get('python')};"
        f" the idle loop's own lag p50 {report.idle_lag.p50:.2f}, p99 {report.idle_lag.p99:.2f},"
        f" max {report.idle_lag.max:.2f} ms"
        + (
            f"; orjson.dumps at {speed:.0f} MB/s on the median episode"
            if (speed := report.machine.get("orjson_mb_s"))
            else ""
        )
        + f"; {report.seconds:.0f} s in all."
        + (
            " Each run's files were removed before the next (the disk could not hold them all)."
            if report.removed_between_runs
            else ""
        ),
        "Garbage collector during each run ("
        + ("start-up heap gc.freeze()d" if c.gc_freeze else "nothing frozen")
        + "): "
        + "; ".join(
            f"{r.name} {r.gc_full} full, longest pause {r.gc_longest:.0f} ms"
            for r in report.results
        )
        + ".",
    ]
    started = [r for r in report.ours if r.error is None]
    if started:
        out.append(
            "Loop lag while each monitor started (not in the table): "
            + "; ".join(f"{r.name} max {r.start_lag_max:.2f} ms" for r in started)
            + "."
        )
    parts = []
    for r in report.results:
        count, running = r.stalls()
        parts.append(
            f"{r.name} {count}"
            + (f", the loop's thread running {running:.0%} of their lag" if count else "")
        )
    out.append(
        f"Samples over {STALL_MS:g} ms (the loop's thread running most of a stall: its own "
        "steps or a collection; running little: kept off its core by the machine or another "
        "thread's GIL): " + "; ".join(parts) + "."
    )
    out.append(
        "CPU seconds per GB of JSON delivered (this process / the TracesServer): "
        + "; ".join(
            f"{r.name} {r.cpu / max(r.delivered_bytes / 1e9, 1e-9):.1f}"
            + (
                f" / {r.server_cpu / max(r.delivered_bytes / 1e9, 1e-9):.1f}"
                if r.server_cpu is not None
                else ""
            )
            for r in report.results
            if r.delivered_bytes
        )
        + "."
    )
    for r in report.results:
        if r.server is not None:
            s = r.server
            ratio = s.get("uncompressed_bytes", 0) / max(1, s.get("compressed_bytes", 1))
            out.append(
                f"{r.name}: the TracesServer stored {s.get('lines_stored')} lines, "
                f"{s.get('unique_ids')} unique ids, {s.get('body_bytes', 0) / MB:.0f} MB on the "
                f"wire ({ratio:.1f}x gzip), {s.get('requests_total')} requests, at most "
                f"{s.get('max_in_flight')} at once."
            )
    return out


def text(report: LoadtestReport, *, verbose: bool = False, more: Sequence[str] = ()) -> str:
    """What the CLI prints: a title, the table and the summary; ``verbose``, the details
    and then ``more`` (an instrument's) between them."""
    c = report.config
    out = [
        f"nodewise loadtest: {c.episodes} episodes, {report.json_bytes / 1e9:.2f} GB of JSON, "
        f"{c.records} records per monitor",
        "",
        table(report.results),
        "",
    ]
    if verbose:
        out += [*details(report), *more, ""]
    out += summary(report)
    return "\n".join(out)


#: The name ``summary`` had before 0.1.0.
targets = summary


def to_json(report: LoadtestReport) -> dict[str, Any]:
    """The report as JSON-ready values, with the summary's lines."""
    data = report.to_dict()
    data["summary"] = summary(report)
    return data


def check_plotting() -> None:
    """Raise ``LoadtestError`` now, before a long run, if ``plot`` could not draw."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise LoadtestError(f"--plot needs matplotlib: {PLOT_HINT}") from exc


def plot(report: LoadtestReport, path: str | Path) -> None:
    """Loop lag over time, one panel per run, to a PNG at ``path``."""
    check_plotting()
    data = report.to_dict()
    if not any(r["lag_trace_ms"]["max"] for r in data["results"]):
        raise LoadtestError("nothing to plot: no run has lag samples")
    import matplotlib.pyplot as plt

    fig = lag_figure(data)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def lag_figure(report: Mapping[str, Any]) -> Any:
    """The matplotlib ``Figure`` of loop lag over a run, one panel per monitor: the worst
    sample of every 0.1 s (the JSON report's ``lag_trace_ms``) against the p99 target.
    ``report`` is the JSON report, so the docs draw it from a saved one too."""
    import matplotlib

    matplotlib.use("Agg")  # no display needed
    import matplotlib.pyplot as plt

    runs = [r for r in report["results"] if r["lag_trace_ms"]["max"]]
    fig, axes = plt.subplots(
        len(runs),
        1,
        figsize=(9, 1.9 * len(runs) + 0.8),
        sharey=True,
        squeeze=False,
        layout="constrained",
    )
    top = max(max(r["lag_trace_ms"]["max"]) for r in runs)
    for ax, r in zip(axes[:, 0], runs, strict=True):
        trace = r["lag_trace_ms"]
        xs = [i * trace["bin_s"] for i in range(len(trace["max"]))]
        ax.fill_between(xs, trace["max"], step="post", color="#08306b", linewidth=0)
        ax.axhline(LAG_P99, color="#ff7f0e", linewidth=0.8, linestyle="--", label="p99 target 5 ms")
        lag = r["lag_ms"]
        ax.set_title(
            f"{r['name']}: {r['delivered']} / {r['submitted']} delivered, lag p99 "
            f"{lag['p99']:.1f} ms, max {lag['max']:.1f} ms, {r['mb_per_s']:.0f} MB/s",
            fontsize=9,
            loc="left",
        )
        ax.set_ylabel("lag (ms)")
        ax.set_yscale("symlog", linthresh=1.0)
        ax.set_ylim(0, max(20.0, top * 1.3))
        ax.grid(axis="y", alpha=0.3)
    axes[-1, 0].set_xlabel("seconds since the first log call")
    axes[0, 0].legend(loc="upper right", fontsize=8)
    c = report["config"]
    fig.suptitle(
        f"nodewise loadtest: {c['episodes']} episodes, {report['episode_json_bytes'] / 1e9:.1f} GB "
        f"of JSON{', each logged twice' if c['effective'] else ''}; worst loop lag in each 0.1 s",
        fontsize=10,
    )
    return fig
