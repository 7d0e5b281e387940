"""The load test's report: a table per run, the DESIGN targets, JSON, and a lag plot."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ._run import MB, LoadtestReport, RunResult
from .errors import LoadtestError

__all__ = ["PLOT_HINT", "check_plotting", "lag_figure", "plot", "table", "targets", "text"]

MIB = 2**20
PLOT_HINT = "pip install 'nodewise[plot]'"
#: DESIGN section 5.
SLOWEST_LOG_PRIME = 1e-3
LAG_P99 = 5.0
LAG_MAX = 15.0
RSS_LIMIT = 1 << 30
#: What the net lag of ``RunResult.lag_net`` leaves out, as the verdicts say it.
NET = (
    "net of the moments the loop's core stood still (taken off each sample: the larger of "
    "the hypervisor's steal on the core the loop's thread was on and the time a witness "
    "process on that core woke late)"
)


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


def _verdict(ok: bool) -> str:
    return "met" if ok else "NOT met"


def targets(report: LoadtestReport) -> list[str]:
    """The DESIGN section 5 targets for nodewise's monitors in this run, one line each."""
    ours = [r for r in report.results if not r.run.startswith("baseline")]
    if not ours:
        return []
    lines = []
    delivered = all(r.all_delivered for r in ours)
    lines.append(
        "all delivered: "
        + ", ".join(f"{r.name} {r.delivered}/{r.submitted}" for r in ours)
        + f" -> {_verdict(delivered)}"
    )
    for r in ours:
        if r.run == "prime":
            ok = r.slowest_log <= SLOWEST_LOG_PRIME
            lines.append(
                f"slowest log() <= 1 ms (PrimeMonitor): {r.slowest_log * 1e3:.2f} ms"
                + _meanwhile(r)
                + f" -> {_verdict(ok)}"
            )
    worst_p99 = max(ours, key=lambda r: r.lag.p99)
    worst_max = max(ours, key=lambda r: r.lag.max)
    ok = worst_p99.lag.p99 <= LAG_P99 and worst_max.lag.max <= LAG_MAX
    line = (
        f"loop lag p99 <= {LAG_P99:g} ms and max <= {LAG_MAX:g} ms (every monitor): worst p99 "
        f"{worst_p99.lag.p99:.2f} ms ({worst_p99.name}), worst max {worst_max.lag.max:.2f} ms "
        f"({worst_max.name}) -> {_verdict(ok)}"
    )
    if not ok:
        net = [(r, r.lag_net()) for r in ours]
        if any(lag != r.lag for r, lag in net):
            net_p99 = max(net, key=lambda x: x[1].p99)
            net_max = max(net, key=lambda x: x[1].max)
            net_ok = net_p99[1].p99 <= LAG_P99 and net_max[1].max <= LAG_MAX
            line += (
                f"; {NET}: worst p99 {net_p99[1].p99:.2f} ms ({net_p99[0].name}), worst max "
                f"{net_max[1].max:.2f} ms ({net_max[0].name}) -> {_verdict(net_ok)}"
            )
    lines.append(line)
    if report.config.episodes >= 10_000:
        for r in ours:
            if r.run == "prime":
                lines.append(
                    f"peak RSS <= 1 GiB at {report.config.episodes} episodes (PrimeMonitor): "
                    f"{r.peak_rss / MIB:.0f} MiB -> {_verdict(r.peak_rss <= RSS_LIMIT)}"
                )
    return lines


def _meanwhile(r: RunResult) -> str:
    """What the loop's thread did during the slowest log call, where the kernel tells."""
    if r.slowest_log_waiting is None or r.slowest_log_running is None:
        return ""
    return (
        f" (the loop's thread meanwhile: {r.slowest_log_waiting:.2f} ms waiting for a core, "
        f"{r.slowest_log_running:.2f} ms running)"
    )


def in_kernel(w: dict[str, float]) -> str:
    """Of a worst sample's running, what the kernel did: " (K ms in the kernel, F page
    faults, R direct reclaims or compactions on the machine)", as far as it tells."""
    said = []
    if "worst_faults" in w:
        said += [
            f"{w['worst_kernel_ms']:.1f} in the kernel",
            f"{w['worst_faults']:.0f} page faults",
        ]
    if "worst_reclaims" in w:
        said.append(f"{w['worst_reclaims']:.0f} direct reclaims or compactions on the machine")
    return f" ({', '.join(said)})" if said else ""


def _lag_causes(name: str, w: dict[str, float]) -> str:
    """One monitor's part of the "where lag came from" sentence."""
    worst = (
        f"worst {w['worst_lag_ms']:.1f} ms: {w['worst_wait_ms']:.1f} waiting, "
        f"{w['worst_running_ms']:.1f} running{in_kernel(w)}, {w['worst_stolen_ms']:.1f} stolen"
    )
    if "worst_witnessed_ms" in w:
        worst += f" (its core's witness stood still {w['worst_witnessed_ms']:.1f})"
    if not w["samples"]:
        return f"{name} no samples over 5 ms, {worst}"
    neither = max(0.0, 1 - w["share"] - w["running_share"] - w["stolen_share"])
    return (
        f"{name} {w['samples']:.0f} samples over 5 ms, of their lag {w['share']:.0%} waiting, "
        f"{w['running_share']:.0%} running, {w['stolen_share']:.0%} stolen, "
        f"{neither:.0%} neither; {worst}"
    )


def text(report: LoadtestReport) -> str:
    """What the CLI prints: what ran, the table, the notes and the targets."""
    c = report.config
    sizes = (
        f"all ~{c.size / MB:g} MB"
        if c.size is not None
        else f"lognormal, median {c.size_median / MB:g} MB, p90 {c.size_p90 / MB:g} MB, "
        f"cap {c.size_cap / MB:g} MB"
    )
    out = [
        f"nodewise loadtest: {c.episodes} episodes ({report.json_bytes / 1e9:.2f} GB of JSON; "
        f"{sizes}; seed {c.seed}), "
        + (
            "each logged twice (subset 'all' one by one as it arrives, then its step of "
            f"{c.step_size} with subset 'effective')"
            if c.effective
            else "each logged once, with subset 'all', as it arrives"
        )
        + f": {c.records} records per monitor",
        "",
        table(report.results),
        "",
        "delivered = records written (file, W&B) or committed by the server (Prime); slowest "
        "log = the longest log_episodes call; lag = how late a task asking to wake every "
        f"{c.lag_interval * 1e3:g} ms woke, from the first log call to the end of finalize; "
        "wall = first log call to end of finalize; MB/s = JSON delivered / wall; peak RSS = "
        + (
            "this process's high-water mark during the run"
            if report.rss_per_run
            else "this process's high-water mark so far (cannot be reset here)"
        )
        + " (the TracesServer and wandb-core are processes of their own"
        + (
            f"; the TracesServer runs at nice +{c.server_nice}: a service elsewhere would not "
            "take these cores)."
            if any(r.server is not None for r in report.results)
            else ")."
        ),
        f"The idle loop's own lag here ({report.idle_lag.count} samples before the runs): p50 "
        f"{report.idle_lag.p50:.2f} ms, p99 {report.idle_lag.p99:.2f} ms, max "
        f"{report.idle_lag.max:.2f} ms. {report.machine.get('cpus')} CPUs, Python "
        f"{report.machine.get('python')}; {report.seconds:.0f} s in all."
        + (
            f" orjson.dumps ran at {speed:.0f} MB/s on the median episode before the runs (the"
            " same code runs up to twice as slow on a day the machine's host is busy)."
            if (speed := report.machine.get("orjson_mb_s"))
            else ""
        )
        + (
            " Each run's trace files were removed before the next run (the disk could not hold"
            " them all): on a VM that hands freed memory back to its host, the next run's first"
            " seconds can stall."
            if report.removed_between_runs
            else ""
        ),
    ]
    out.append(
        "Garbage collector during each run (its pauses stall the loop too; "
        + (
            "the start-up heap, imported modules and shared episode bodies, was gc.freeze()d "
            "once each monitor had started, so a full collection walks only what came after"
            if c.gc_freeze
            else "nothing was frozen (--no-gc-freeze), so a full collection walks every "
            "imported module and the episodes' shared token lists"
        )
        + "): "
        + "; ".join(
            f"{r.name} {r.gc_full} full, longest pause {r.gc_longest:.0f} ms"
            for r in report.results
        )
        + "."
    )
    starts = [r for r in report.results if not r.run.startswith("baseline") and r.error is None]
    if starts:
        out.append(
            "Loop lag while each monitor started, before its first log call (not in the "
            "table; start() runs once): "
            + "; ".join(f"{r.name} max {r.start_lag_max:.2f} ms" for r in starts)
            + (
                " (WandbMonitor imports wandb and calls wandb.init in a worker thread: the "
                "GIL that thread holds in long stretches keeps the loop waiting)."
                if any(r.run == "wandb" for r in starts)
                else "."
            )
        )
    waits = [(r, r.cpu_wait()) for r in report.results]
    if any(w is not None for _, w in waits):
        out.append(
            "Where lag over 5 ms came from (Linux schedstat, for the loop's thread: waiting "
            "for a core, because more threads wanted one than there are cores; running, the "
            "loop busy with a long step or a collection, or in the kernel (page faults: "
            "memory touched afresh), as the thread's CPU clock counts it (on a virtual "
            "machine that may include moments its core stood still unseen by the steal "
            "count: python -m bench.hiccup); stolen, the loop's core stopped by "
            "the hypervisor (steal time on the core its thread was on, to the kernel's clock "
            "tick); or "
            "neither, asleep past its time, waiting for a GIL another thread held or woken "
            "late; where it says so, the witness process on the loop's core, which only "
            "sleeps 1 ms at a time, woke late with it): "
            + "; ".join(_lag_causes(r.name, w) for r, w in waits if w is not None)
            + "."
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
            out.append(
                f"{r.name}: the TracesServer stored {s.get('lines_stored')} lines, "
                f"{s.get('unique_ids')} unique ids, {s.get('body_bytes', 0) / MB:.0f} MB on the "
                f"wire ({s.get('uncompressed_bytes', 0) / max(1, s.get('compressed_bytes', 1)):.1f}x"
                f" gzip), {s.get('requests_total')} requests, at most {s.get('max_in_flight')} "
                "at once."
            )
    lines = targets(report)
    if lines:
        out += ["", "DESIGN targets (section 5), for nodewise's monitors:"]
        out += [f"- {line}" for line in lines]
    return "\n".join(out)


def check_plotting() -> None:
    """Raise ``LoadtestError`` now, before a long run, if ``plot`` could not draw."""
    try:
        import matplotlib  # noqa: F401
    except ImportError as exc:
        raise LoadtestError(f"--plot needs matplotlib: {PLOT_HINT}") from exc


def plot(report: LoadtestReport, path: str | Path) -> None:
    """Loop lag over time, one panel per run, to a PNG at ``path``."""
    check_plotting()
    data = to_json(report)
    if not any(r["lag_trace_ms"]["max"] for r in data["results"]):
        raise LoadtestError("nothing to plot: no run has lag samples")
    import matplotlib.pyplot as plt

    fig = lag_figure(data)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def lag_figure(report: Mapping[str, Any]) -> Any:
    """The matplotlib ``Figure`` of loop lag over a run, one panel per monitor: the worst
    sample of every 0.1 s (the JSON report's ``lag_trace_ms``) against the DESIGN targets.
    ``report`` is ``to_json``'s output, so the docs draw it from a saved report too."""
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
        ax.axhline(
            LAG_MAX, color="#d62728", linewidth=0.8, linestyle="--", label="max target 15 ms"
        )
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


def to_json(report: LoadtestReport) -> dict[str, Any]:
    data = report.to_dict()
    data["targets"] = targets(report)
    return data
