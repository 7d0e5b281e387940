"""Fold a run's annotations onto its episodes, as prime-rl's readers do (its ``update.py``).

An annotation (an update) names a trace and carries an ``info`` dict, merged deep into the
trace's own, and per-token streams over its branches (``advantages``, ``trainer_logprobs``,
``entropies``, ``is_masked``, ``mismatch_kl``), each full-length over a branch's tokens with
nulls where nothing is known. A stream is put on a node, compacted over the node's ``mask``
as its own ``logprobs`` are, only where it covers the node's every token; ``is_masked`` and
``mismatch_kl`` may hold nulls (one value known is enough), the others may not. Updates
apply in write order, newest winning.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

__all__ = ["STREAM_FIELDS", "fold", "read_annotations"]

#: The per-token streams an update may carry, put on the node fields of the same name.
STREAM_FIELDS: Final = ("advantages", "trainer_logprobs", "entropies", "is_masked", "mismatch_kl")
#: Streams that may leave some tokens unknown (null): put on a node with one value known.
PARTIAL: Final = frozenset({"is_masked", "mismatch_kl"})


def read_annotations(directory: Path) -> dict[str, list[Mapping[str, Any]]]:
    """Every update of every producer's stream under ``directory`` (``annotations/``), by
    trace id, in write order (producers by name; a producer's in its own order). Missing:
    none."""
    from ._reader import read_records  # a stream's reader; it reads these streams too

    found: dict[str, list[Mapping[str, Any]]] = {}
    try:
        producers = sorted(p for p in directory.iterdir() if p.is_dir())
    except FileNotFoundError:
        return found
    for producer in producers:
        for update in read_records(producer):
            if isinstance(update, Mapping) and type(update.get("trace_id")) is str:
                found.setdefault(update["trace_id"], []).append(update)
    return found


def _merged(old: Any, new: Any) -> Any:
    if not (isinstance(old, dict) and isinstance(new, Mapping)):
        return new
    out = dict(old)
    for key, value in new.items():
        out[key] = _merged(old.get(key), value)
    return out


def _branches(nodes: list[Any]) -> list[list[int]]:
    """Each branch's node indexes from its root to its leaf, leaves in order (a node no
    other names as parent is a leaf)."""
    count = len(nodes)

    def parent(i: int) -> Any:  # a node's parent index (anything, in a damaged record)
        node = nodes[i]
        return node.get("parent") if isinstance(node, Mapping) else None

    parents = {p for i in range(count) if type(p := parent(i)) is int and 0 <= p < count}
    paths = []
    for leaf in range(count):
        if leaf in parents:
            continue
        path: list[int] = []
        at: Any = leaf
        while type(at) is int and 0 <= at < count and at not in path:
            path.append(at)
            at = parent(at)
        paths.append(path[::-1])
    return paths


def _project(nodes: list[Any], path: list[int], name: str, stream: list[Any]) -> None:
    at = 0
    for i in path:
        node = nodes[i]
        if not isinstance(node, dict):
            return
        tokens = node.get("token_ids") or []
        span = stream[at : at + len(tokens)]
        at += len(tokens)
        if len(span) < len(tokens):
            return  # a stream cut short leaves the rest of the branch as it was
        mask = node.get("mask") or []
        values = [v for v, sampled in zip(span, mask, strict=False) if sampled]
        if not values:
            continue
        unknown = sum(v is None for v in values)
        if unknown and (name not in PARTIAL or unknown == len(values)):
            continue
        node[name] = values


def fold_trace(trace: dict[str, Any], updates: list[Mapping[str, Any]]) -> None:
    """Apply ``updates`` to one trace record, in place, in order."""
    nodes = trace.get("nodes")
    nodes = nodes if isinstance(nodes, list) else []
    paths: list[list[int]] | None = None
    for update in updates:
        info = update.get("info")
        if info:
            trace["info"] = _merged(trace.get("info") or {}, info)
        for branch in update.get("branches") or []:
            if not isinstance(branch, Mapping):
                continue
            if paths is None:
                paths = _branches(nodes)
            index = branch.get("index")
            if type(index) is not int or not 0 <= index < len(paths):
                continue
            for name in STREAM_FIELDS:
                stream = branch.get(name)
                if isinstance(stream, list) and stream:
                    _project(nodes, paths[index], name, stream)


def fold(records: Iterator[Any], annotations: dict[str, list[Mapping[str, Any]]]) -> Iterator[Any]:
    """``records`` with each trace's updates folded on (records are changed in place)."""
    for record in records:
        if isinstance(record, dict):
            for trace in record.get("traces") or []:
                trace_id = trace.get("id") if isinstance(trace, dict) else None
                if type(trace_id) is str and (updates := annotations.get(trace_id)):
                    fold_trace(trace, updates)
        yield record
