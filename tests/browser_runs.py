"""Run directories for the trace browser's tests, written by a real ``FileMonitor`` with
verifiers-schema episodes (``monitors.testing.episodes.EpisodeMaker``).

``build_runs(root)`` writes four runs under ``root``:

- ``train``: 200 small episodes over 5 steps, train and eval, in groups of 4 rollouts, some
  with errors, with a metrics row per step; small chunks, sealed with zstd.
- ``big``: a ~60 MB episode of more than 600 nodes (its first trace alone holds
  ``BIG_TRACE0_NODES``), an episode whose one sampled node holds ``LONG_TOKENS`` tokens (the
  heatmap's windowing), and two small ones; sealed.
- ``live``: ``LIVE_EPISODES`` small episodes in a plain chunk; ``append_live`` adds more while
  the browser shows it.
- ``hostile``: episodes whose strings are markup and script (``<script>``, ``<img onerror>``,
  ``javascript:``) in contents, tool calls, ids, env names and metric names, and a 2 MB unbroken
  string; plain chunks (not sealed), as a live run's.

Every string that would run script if a page used it as HTML sets ``window.__pwned``.
"""

from __future__ import annotations

import copy
import hashlib
import random
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import anyio
import orjson

from monitors import FileMonitor
from monitors.testing.episodes import EpisodeMaker

__all__ = [
    "BIG_TRACE0_NODES",
    "HOSTILE",
    "IMG",
    "JS_URL",
    "LIVE_EPISODES",
    "LONG_TOKENS",
    "SCRIPT",
    "UNBROKEN",
    "Runs",
    "append_live",
    "build_runs",
]

SCRIPT: Final = "<script>window.__pwned=1</script>"
IMG: Final = '<img src=x onerror="window.__pwned=1">'
JS_URL: Final = "javascript:window.__pwned=1"
#: Each hostile string, as a record holds it.
HOSTILE: Final = (SCRIPT, IMG, JS_URL)
#: A 2 MB string without a space or a break opportunity but the ones ``overflow-wrap`` makes.
UNBROKEN: Final = "0123456789abcdefghijklmnopqrstuv" * (2_000_000 // 32)

#: Nodes of the big episode's first trace (the 500th node overall is among them).
BIG_TRACE0_NODES: Final = 640
#: The 500th node (of the first trace).
PROBE_NODE: Final = 499
#: The big episode's size, about.
BIG_BYTES: Final = 60_000_000
#: Episodes the ``live`` run starts with.
LIVE_EPISODES: Final = 6
#: Index rows of the ``wide`` run.
WIDE_ROWS: Final = 100_000
#: Tokens of the long node (more than the heatmap draws at once).
LONG_TOKENS: Final = 40_000

ENVS: Final = ("math-python", "wiki-search", "swe-lite", "code-contests")
STEPS: Final = 5
#: Per step: train groups and eval groups, each of ``GROUP`` rollouts.
TRAIN_GROUPS: Final = 8
EVAL_GROUPS: Final = 2
GROUP: Final = 4


@dataclass(frozen=True)
class Runs:
    """The runs written, and where to find the episodes the tests look at.

    :ivar root: the folder holding the runs.
    :ivar train: the ``train`` run's directory (likewise ``big``, ``hostile``, ``live``).
    :ivar wide: a run whose index holds ``WIDE_ROWS`` rows (pointing, in turn, at a few
        records), for a list of 100,000 episodes.
    :ivar big_line: the index line of the ~60 MB episode in ``big``.
    :ivar big_nodes: its node count per trace.
    :ivar big_bytes: its bytes, as written.
    :ivar probe: the 500th node of the big episode: ``(trace, node)``, and ``probe_role``
        and ``probe_text`` (the first 200 characters of its content) to know it by.
    :ivar long_line: the line of the episode holding the long node, in ``big``.
    :ivar long_node: ``(trace, node)`` of the long node.
    :ivar hostile_lines: the lines of ``hostile``'s episodes.
    :ivar unbroken_line: the line of the episode whose node holds ``UNBROKEN``, and
        ``unbroken_node`` its ``(trace, node)``.
    :ivar metrics: the metric names of ``train``'s metrics rows.
    """

    root: Path
    train: Path
    big: Path
    hostile: Path
    live: Path
    wide: Path
    big_line: int
    big_nodes: tuple[int, ...]
    big_bytes: int
    probe: tuple[int, int]
    probe_role: str
    probe_text: str
    long_line: int
    long_node: tuple[int, int]
    hostile_lines: tuple[int, ...]
    unbroken_line: int
    unbroken_node: tuple[int, int]
    metrics: tuple[str, ...]


def _uuid(name: str) -> str:
    return hashlib.blake2b(name.encode(), digest_size=16).hexdigest()


def _small(maker: EpisodeMaker, index: int) -> dict[str, Any]:
    """A small episode's record (16 to ~46 kB; every 10th ~150 kB, with several traces)."""
    size = 150_000 if index % 10 == 9 else 16_000 + (index * 7919) % 30_000
    return maker.episode(size, index=index).to_record()


def _train_records(maker: EpisodeMaker) -> list[tuple[int, str, list[dict[str, Any]]]]:
    """(step, kind, records) batches: each step's train groups, then its eval groups. The
    rollouts of a group share its id and task, as rollouts of one prompt do."""
    batches: list[tuple[int, str, list[dict[str, Any]]]] = []
    index = 0
    for step in range(STEPS):
        for kind, groups in (("train", TRAIN_GROUPS), ("eval", EVAL_GROUPS)):
            records = []
            for g in range(groups):
                group = _uuid(f"group-{step}-{kind}-{g}")
                env = ENVS[(step + g) % len(ENVS)]
                first: dict[str, Any] | None = None
                for _ in range(GROUP):
                    record = _small(maker, index)
                    index += 1
                    record["group"] = {"id": group}
                    record["env"] = {"id": env, "name": env.split("-")[0]}
                    record["run"]["work"]["type"] = kind
                    if first is None:
                        first = record
                    else:  # one prompt per group
                        record["task"] = first["task"]
                        for trace in record["traces"]:
                            trace["task"] = first["task"]
                    if index % 7 == 0:
                        record["errors"] = [{"type": "SandboxError", "message": "boot timed out"}]
                        record["ok"] = False
                    records.append(record)
                if kind == "train":
                    _advantages(records[-GROUP:])
            batches.append((step, kind, records))
    return batches


def _reward(record: dict[str, Any]) -> float:
    """The record's reward as its index row has it: the mean of its traces' weighted sums."""
    sums = [
        sum(r["score"] * r["weight"] for r in trace["rewards"].values())
        for trace in record["traces"]
    ]
    return float(sum(sums) / len(sums))


def _advantages(group: list[dict[str, Any]]) -> None:
    """Each rollout's advantage (its reward less the group's mean) in its traces' ``info``,
    where prime-rl puts it and its index row reads it."""
    mean = sum(_reward(record) for record in group) / len(group)
    for record in group:
        for trace in record["traces"]:
            trace["info"]["advantage"] = round(_reward(record) - mean, 4)


def _chain(bodies: list[dict[str, Any]], count: int) -> tuple[list[Any], list[Any], list[Any]]:
    """One conversation of ``count`` nodes made of the bodies' nodes one after another
    (cycling), each node's ``parent`` the one before it and each call's ``node`` moved
    along: (tools, nodes, calls). Nodes are shallow copies: their token lists are shared."""
    nodes: list[dict[str, Any]] = []
    calls: list[dict[str, Any]] = []
    k = 0
    while len(nodes) < count:
        body = bodies[k % len(bodies)]
        k += 1
        at = len(nodes)
        for node in body["nodes"]:
            if len(nodes) == count:
                break
            copied = {key: value for key, value in node.items() if key not in ("parent", "tools")}
            if nodes and copied["message"]["role"] == "system":  # one system prompt, first
                copied["message"] = {**copied["message"], "role": "user"}
            if nodes:
                copied = {"parent": len(nodes) - 1, **copied}
            else:
                copied = {"tools": bodies[0]["tools"], **copied}
            nodes.append(copied)
        calls += [
            {**call, "node": call["node"] + at}
            for call in body["calls"]
            if call["node"] + at < count
        ]
    return bodies[0]["tools"], nodes, calls


def _big_record(maker: EpisodeMaker) -> dict[str, Any]:
    """An episode of ``BIG_BYTES`` (within a few bytes) whose first trace has
    ``BIG_TRACE0_NODES`` nodes (bodies 16-18 chained, ~65 kB a node), then traces of one body
    each (the largest that fits) while one fits, then plain text in the first trace's
    ``info`` for the rest."""
    record = maker.episode(3_000_000, index=10_000).to_record()
    record["id"] = _uuid("big-episode")
    template = record["traces"][0]

    def trace(k: int, tools: list[Any], nodes: list[Any], calls: list[Any]) -> dict[str, Any]:
        return {
            **template,
            "id": _uuid(f"big-trace-{k}"),
            "agent": {**template["agent"], "name": f"agent_{k}"},
            "info": {},
            "tools": tools,
            "nodes": nodes,
            "calls": calls,
        }

    traces = [trace(0, *_chain([maker.body(i) for i in (16, 17, 18)], BIG_TRACE0_NODES))]
    record["traces"] = traces
    size = len(orjson.dumps(record))
    sizes = {i: len(orjson.dumps(trace(0, **maker.body(i)))) + 1 for i in range(8, 19)}
    while fits := [i for i, n in sizes.items() if size + n <= BIG_BYTES]:
        body = maker.body(max(fits))
        traces.append(trace(len(traces), **body))
        size += sizes[max(fits)]
    pad = BIG_BYTES - size - len('{"feedback":""}') + len("{}")
    traces[0]["info"] = {"feedback": "filler " * (max(0, pad) // 7)}
    return record


def _long_record(maker: EpisodeMaker) -> dict[str, Any]:
    """A small episode whose assistant node (trace 0, node 2) sampled ``LONG_TOKENS`` tokens,
    with logprobs that change along the node (so the heatmap's windows differ)."""
    record = maker.episode(20_000, index=20_000).to_record()
    trace = record["traces"][0]
    nodes = [dict(node) for node in trace["nodes"][:3]]
    node = nodes[2]
    n = LONG_TOKENS
    words = " ".join(n["message"]["content"] for n in maker.body(12)["nodes"])
    node["message"] = {"role": "assistant", "content": words[:20_000]}
    node["sampled"] = True
    node["token_ids"] = [(i * 7919) % 151_000 for i in range(n)]
    node["mask"] = [True] * n
    node["is_content"] = [i % 50 != 0 for i in range(n)]
    # Mostly confident (near 0) in the first half, less so in the second.
    rng = random.Random(LONG_TOKENS)
    node["logprobs"] = [round(-rng.expovariate(4.0 if i < n // 2 else 0.7), 4) for i in range(n)]
    node["advantages"] = [0.5 if i < n // 2 else -0.5 for i in range(n)]
    trace = {**trace, "nodes": nodes, "calls": []}
    record["traces"] = [trace]
    record["id"] = _uuid("long-episode")
    return record


def _hostile_records(maker: EpisodeMaker) -> list[dict[str, Any]]:
    """Episodes whose strings are markup: in the content, reasoning, tool calls and their
    ids, the episode, trace and group ids, the env, the agent; one holds ``UNBROKEN``."""
    records = []
    for k, bad in enumerate((*HOSTILE, "mixed")):
        text = " ".join(HOSTILE) if bad == "mixed" else bad
        record = copy.deepcopy(maker.episode(16_000, index=30_000 + k).to_record())
        record["id"] = f"{text} #{k}"
        record["env"] = {"id": text, "name": text}
        record["group"] = {"id": SCRIPT}  # one group: the group view shows them all
        trace = record["traces"][0]
        trace["id"] = f"{text} trace {k}"
        trace["agent"]["name"] = text
        trace["info"] = {"note": text, "link": JS_URL}
        for node in trace["nodes"]:
            message = node["message"]
            message["content"] = f"{text}\n{message['content'][:200]}\n{text}"
            if message["role"] == "tool":
                message["name"] = text
                message["tool_call_id"] = JS_URL
            if "reasoning_content" in message:
                message["reasoning_content"] = text
            for call in message.get("tool_calls", []):
                call["id"] = JS_URL
                call["name"] = IMG
                call["arguments"] = orjson.dumps({"query": text, "url": JS_URL}).decode()
        records.append(record)
    long = copy.deepcopy(maker.episode(16_000, index=30_100).to_record())
    long["id"] = "unbroken-" + UNBROKEN[:3000]  # a 3,000-character id, for the list's cells
    long["env"] = {"id": "long", "name": "long"}
    long["group"] = {"id": SCRIPT}
    long["traces"][0]["nodes"][1]["message"]["content"] = UNBROKEN
    records.append(long)
    return records


def _live_records(start: int, n: int) -> list[dict[str, Any]]:
    """Episodes ``start`` to ``start + n`` of the ``live`` run."""
    maker = EpisodeMaker(seed=9)
    return [_small(maker, 50_000 + i) for i in range(start, start + n)]


async def append_live(run: Path, n: int) -> None:
    """Write ``n`` more episodes to the ``live`` run, as a training loop does while the
    browser shows it (a new ``FileMonitor`` on the run goes on where the last one stopped)."""
    index = run / "monitors" / "file" / "traces" / "stream.index.jsonl"
    start = len(index.read_bytes().splitlines())
    await _write(run, [(1, "train", _live_records(start, n))], {}, compress=False)


async def _write(
    root: Path,
    batches: list[tuple[int, str, list[dict[str, Any]]]],
    metrics: dict[int, dict[str, float]],
    **options: Any,
) -> None:
    monitor = FileMonitor(root, fsync=False, **options)
    await monitor.start()
    try:
        for step, kind, records in batches:
            await monitor.log_episodes(records, step=step, kind=kind, subset="all")  # type: ignore[arg-type]
        for step, values in sorted(metrics.items()):
            await monitor.log_metrics(values, step=step)
    finally:
        await monitor.finalize()
    stats = monitor.stats()
    assert stats.delivered == sum(len(r) for _, _, r in batches), stats


def _train_metrics() -> dict[int, dict[str, float]]:
    return {
        step: {
            "loss": round(1.0 / (step + 1), 4),
            "reward/mean": round(0.2 + 0.1 * step, 4),
            "entropy": round(2.0 - 0.3 * step + 0.05 * (step % 2), 4),
        }
        for step in range(STEPS)
    }


async def _build(root: Path) -> Runs:
    maker = EpisodeMaker(seed=5)
    train = root / "train"
    await _write(train, _train_records(maker), _train_metrics(), chunk_bytes=512 * 1024)

    big = root / "big"
    small = [_small(maker, 40_000), _small(maker, 40_001)]
    record = _big_record(maker)
    big_nodes = tuple(len(t["nodes"]) for t in record["traces"])
    probe = record["traces"][0]["nodes"][PROBE_NODE]["message"]
    long = _long_record(maker)
    await _write(big, [(0, "train", [small[0], record, long, small[1]])], {0: {"loss": 0.5}})

    hostile = root / "hostile"
    records = _hostile_records(maker)
    hostile_metrics = {step: {name: float(step) for name in HOSTILE} for step in range(3)}
    await _write(hostile, [(0, "train", records)], hostile_metrics, compress=False)

    live = root / "live"
    await _write(live, [(0, "train", _live_records(0, LIVE_EPISODES))], {}, compress=False)

    wide = root / "wide"
    await _write(wide, [(0, "train", _live_records(100, 4))], {}, compress=False)
    _widen(wide / "monitors/file/traces/stream.index.jsonl")

    big_bytes = (big / "monitors/file/traces/stream.index.jsonl").read_bytes().splitlines()[1]
    return Runs(
        root=root,
        train=train,
        big=big,
        hostile=hostile,
        live=live,
        wide=wide,
        big_line=2,
        big_nodes=big_nodes,
        big_bytes=int(orjson.loads(big_bytes)["length"]),
        probe=(0, PROBE_NODE),
        probe_role=probe["role"],
        probe_text=probe["content"][:200],
        long_line=3,
        long_node=(0, 2),
        hostile_lines=tuple(range(1, len(records) + 1)),
        unbroken_line=len(records),
        unbroken_node=(0, 1),
        metrics=tuple(_train_metrics()[0]),
    )


def _widen(index: Path) -> None:
    """Rewrite ``index`` as ``WIDE_ROWS`` rows pointing at its records in turn, with
    rewards of their own (a reward in 1,000 missing): an index as large as a long run's."""
    rows = [orjson.loads(line) for line in index.read_bytes().splitlines()]
    rng = random.Random(7)
    out = []
    for line in range(1, WIDE_ROWS + 1):
        row = dict(rows[line % len(rows)], line=line, step=line // 1000)
        row["reward"] = None if line % 1000 == 0 else round(rng.random(), 4)
        out.append(orjson.dumps(row))
    index.write_bytes(b"\n".join(out) + b"\n")


def build_runs(root: Path) -> Runs:
    """Write the five runs under ``root`` (which must exist) and say where things are.
    Runs its own event loop in a thread of its own, so it can be called from anywhere
    (a fixture of a test whose loop is running, too)."""
    found: list[Runs] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            found.append(anyio.run(_build, root))
        except BaseException as exc:  # handed to the caller's thread
            failed.append(exc)

    thread = threading.Thread(target=run, name="build-runs")
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return found[0]
