"""The benchmark plots, drawn from the committed benchmark snapshots in ``docs/data/``.

Used two ways:

- by the mkdocs hook (``docs/hooks.py``): every build draws the PNGs in memory and adds them
  to the site as ``img/*.png``, so they always match the snapshot and nothing generated lands
  in the source tree;
- as a script, ``python docs/gen_plots.py [OUTDIR]``, to look at them outside a build.

Inputs: ``data/encoder.json`` (``python -m bench --json ...``) and
``data/lag_trace.json`` (``docs/record_lag.py``) and ``data/loadtest.json`` (``nodewise
loadtest --json FILE``); ``make docs-data`` refreshes them.
"""

from __future__ import annotations

import io
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display; must come before pyplot is imported

import matplotlib.pyplot as plt
from matplotlib.figure import Figure

from monitors.loadtest._report import lag_figure  # the same figure as `nodewise loadtest --plot`

DATA = Path(__file__).resolve().parent / "data"

# One colour per way of encoding, the same on every plot.
COLORS = {
    "orjson": "#7f7f7f",
    "msgspec": "#bcbd22",
    "json iter": "#d62728",
    "encode": "#1f77b4",
    "iter": "#2ca02c",
    "aiter": "#9467bd",
}
LABELS = {
    "msgspec": "msgspec",
    "json iter": "stdlib iterencode",
    "encode": "encode",
    "iter": "iterencode",
    "aiter": "aiterencode",
}


def _load(name: str) -> Any:
    return json.loads((DATA / name).read_text())


def _subtitle(bench: dict[str, Any]) -> str:
    versions = bench["versions"]
    return (
        f"python -m bench ({bench['mode']} run), Python {bench['python']}, "
        f"orjson {versions['orjson']}, msgspec {versions['msgspec']}"
    )


def throughput(bench: dict[str, Any]) -> Figure:
    """Throughput of each driver (and the peers) relative to orjson.dumps, per document."""
    docs = bench["documents"]
    names = [d["name"] for d in docs]
    ways = ["encode", "iter", "aiter", "msgspec", "json iter"]
    fig, ax = plt.subplots(figsize=(9, 5.2), layout="constrained")
    height = 0.8 / len(ways)
    for k, way in enumerate(ways):
        ratios = [d["mb_per_s"][way] / d["mb_per_s"]["orjson"] for d in docs]
        ys = [i + (k - (len(ways) - 1) / 2) * height for i in range(len(docs))]
        ax.barh(ys, ratios, height=height, color=COLORS[way], label=LABELS[way])
    ax.axvline(1.0, color="black", linewidth=1)
    ax.text(1.0, -0.75, "orjson.dumps = 1 ", ha="right", va="center", fontsize=8)
    ax.set_yticks(range(len(docs)), names)
    ax.invert_yaxis()
    ax.set_ylim(len(docs) - 0.5, -0.95)
    ax.set_xlabel("throughput relative to orjson.dumps (higher is faster)")
    ax.set_title("Throughput vs orjson\n" + _subtitle(bench), fontsize=10)
    ax.grid(axis="x", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1), fontsize=8)
    return fig


def lag(bench: dict[str, Any]) -> Figure:
    """Loop lag (p50, p99, max) while aiterencode encodes each document, against the idle
    loop's own."""
    docs = [d for d in bench["documents"] if d["lag_ms"]]
    names = [d["name"] for d in docs]
    idle = bench["idle_lag_ms"]
    fig, ax = plt.subplots(figsize=(9, 4.8), layout="constrained")
    stats = [("p50", "#aec7e8"), ("p99", "#1f77b4"), ("max", "#08306b")]
    width = 0.8 / len(stats)
    for k, (stat, color) in enumerate(stats):
        xs = [i + (k - 1) * width for i in range(len(docs))]
        ax.bar(xs, [d["lag_ms"][stat] for d in docs], width=width, color=color, label=stat)
    for stat, style in (("p99", ":"), ("max", "--")):
        ax.axhline(idle[stat], color="#d62728", linestyle=style, linewidth=1)
        ax.text(
            len(docs) - 0.5,
            idle[stat],
            f"idle loop {stat} {idle[stat]:.2f} ms",
            color="#d62728",
            ha="right",
            va="bottom",
            fontsize=8,
            bbox={"facecolor": "white", "edgecolor": "none", "pad": 1},
        )
    ax.set_xticks(range(len(docs)), names, rotation=20, ha="right")
    ax.set_ylabel("loop lag (ms)")
    budget = bench["default_budget_s"] * 1000
    ax.set_title(
        f"Loop lag while aiterencode streams each document (budget {budget:g} ms)\n"
        + _subtitle(bench),
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    return fig


def budget_sweep(bench: dict[str, Any]) -> Figure:
    """Loop lag and throughput of aiterencode on the 60 MB episode for each budget."""
    rows = bench["budget_sweep"]
    budgets = [r["budget_s"] * 1000 for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.8), layout="constrained")
    for stat, color in (("p50", "#aec7e8"), ("p99", "#1f77b4"), ("max", "#08306b")):
        left.plot(budgets, [r["lag_ms"][stat] for r in rows], "o-", color=color, label=stat)
    left.plot(budgets, [2.5 * b for b in budgets], ":", color="black", label="2.5 x budget")
    left.set_xscale("log")
    left.set_xlabel("budget (ms)")
    left.set_ylabel("loop lag (ms)")
    left.set_title("Loop lag", fontsize=10)
    left.legend(fontsize=8)
    left.grid(alpha=0.3)
    right.plot(budgets, [r["mb_per_s"] for r in rows], "o-", color=COLORS["aiter"])
    orjson = next(d for d in bench["documents"] if d["name"].startswith("episode 60"))
    right.axhline(orjson["mb_per_s"]["orjson"], color=COLORS["orjson"], linestyle="--")
    right.text(budgets[0], orjson["mb_per_s"]["orjson"], " orjson.dumps", va="bottom", fontsize=8)
    right.set_xscale("log")
    right.set_ylim(bottom=0)
    right.set_xlabel("budget (ms)")
    right.set_ylabel("MB/s")
    right.set_title("aiterencode throughput", fontsize=10)
    right.grid(alpha=0.3)
    fig.suptitle("Budget sweep on the 60 MB episode, " + _subtitle(bench), fontsize=10)
    return fig


def lag_over_time(trace: dict[str, Any]) -> Figure:
    """How long a task that became ready at each moment waited for the loop, while one
    episode is encoded three ways in turn.

    A probe sample taken at ``t`` with lag ``L`` means the loop was busy from about ``t - L``
    to ``t``: a task ready at ``x`` in between waited ``t - x``. Each sample is drawn as that
    triangle, so a stall fills the time it lasted instead of showing as one late dot.
    """
    fig, ax = plt.subplots(figsize=(9, 4.2), layout="constrained")
    shades = ["#fdd0a2", "#fdae6b", "#c7e9c0"]
    for phase, shade in zip(trace["phases"], shades, strict=False):
        ax.axvspan(phase["start"], phase["end"], color=shade, alpha=0.6, linewidth=0)
    xs: list[float] = []
    ys: list[float] = []
    for t, ms in trace["samples"]:
        xs += [t - ms / 1000, t - ms / 1000, t]
        ys += [0.0, ms, 0.0]
    ax.fill_between(xs, ys, color="#08306b", linewidth=0.6, edgecolor="#08306b")
    top = max(ys) * 1.25
    ax.set_ylim(0, top)
    for phase in trace["phases"]:
        # A stall is sampled when it ends, so a sample just after a phase belongs to it.
        inside = [ms for t, ms in trace["samples"] if phase["start"] < t <= phase["end"] + 0.02]
        worst = max(inside, default=0.0)
        ax.text(
            (phase["start"] + phase["end"]) / 2,
            top * 0.97,
            f"{phase['name']}\nlongest wait {worst:.1f} ms",
            ha="center",
            va="top",
            fontsize=8,
        )
    ax.set_xlabel("time (s)")
    ax.set_ylabel("wait for the loop (ms)")
    mb = trace["episode_bytes"] / 1e6
    ax.set_title(
        f"Loop lag over time: one {mb:.0f} MB episode encoded three ways "
        f"(Python {trace['python']}, orjson {trace['orjson']})",
        fontsize=10,
    )
    ax.grid(axis="y", alpha=0.3)
    return fig


#: Image name -> (input file, how to draw it).
PLOTS: dict[str, tuple[str, Callable[[Any], Figure]]] = {
    "throughput.png": ("encoder.json", throughput),
    "lag.png": ("encoder.json", lag),
    "budget_sweep.png": ("encoder.json", budget_sweep),
    "lag_over_time.png": ("lag_trace.json", lag_over_time),
    "loadtest_lag.png": ("loadtest.json", lag_figure),
}


def render() -> dict[str, bytes]:
    """Every plot as PNG bytes, by image name."""
    images = {}
    for name, (source, draw) in PLOTS.items():
        fig = draw(_load(source))
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=110)
        plt.close(fig)
        images[name] = buf.getvalue()
    return images


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    out = Path(args[0] if args else "site-check/plots")
    out.mkdir(parents=True, exist_ok=True)
    for name, png in render().items():
        (out / name).write_bytes(png)
        print(f"wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
