"""An episode's index row: what prime-rl's dashboard and scripts read about an episode without
opening it (prime-rl's ``index_row``; docs/design.md D9).

The fields and their meanings are prime-rl's (``src/prime_rl/monitors/file/traces/index.py``):
``id``, ``kind``, ``trace_ids``, ``env``, ``group``, ``ok``, ``num_errors``, ``reward`` (the mean
over traces with rewards of each trace's weighted score sum), ``advantage`` (the mean of the
traces' ``info.advantage``), ``input_tokens``/``output_tokens`` (the episode's counts),
``turns`` (assistant nodes), ``branches`` (leaf nodes), ``stop_condition`` (the last trace's
that has one), ``truncated`` (verifiers' ``Trace.is_truncated`` of any trace), ``dispatch``,
``arrival``, ``duration`` (from the first trace's info, else its summed timing phases) and
``cost`` (the calls' summed usage cost). A record's positions (``line``, ``offset``,
``chunk``) are the writer's to fill in.

Only an episode's skeleton is read: for a pydantic model one ``model_dump`` that takes the
few fields above (a node's parent and role, a call's usage, error and finish reason), never
the messages or the per-token lists, so a row costs what the episode's node count costs,
not its bytes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias

import encoder
from encoder._models import is_model

__all__ = ["TRUNCATING_STOPS", "Summary", "episode_row"]

#: What a stream's index row says of a record, besides where it is.
Summary: TypeAlias = Callable[[Any], dict[str, Any]]

#: The stop conditions verifiers' ``Trace.is_truncated`` counts as a truncation.
TRUNCATING_STOPS: Final = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed"}
)

#: What a row reads of an episode model (pydantic's ``include``).
_SKELETON: Final[dict[str, Any]] = {
    "id": True,
    "env": True,
    "group": True,
    "ok": True,
    "errors": True,
    "run": True,
    "num_input_tokens": True,
    "num_output_tokens": True,
    "traces": {
        "__all__": {
            "id": True,
            "info": True,
            "rewards": True,
            "timing": True,
            "stop_condition": True,
            "calls": {"__all__": {"usage": True, "error": True, "finish_reason": True}},
            "nodes": {"__all__": {"parent": True, "message": {"role": True}}},
        }
    },
}


def _skeleton(value: Any) -> Any:
    """What the row reads of ``value``: a Mapping as it is, a model's few fields dumped as
    its record dumps them; None for anything else."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, encoder.ModelDump):
        form = value.form
        model, exclude, exclude_none, context = (
            value.model,
            value.exclude,
            form.exclude_none,
            form.context,
        )
    elif is_model(value):
        model, exclude, exclude_none, context = value, None, False, None
    else:
        return None
    try:
        return model.model_dump(
            mode="json",
            include=_SKELETON,
            exclude=exclude,
            exclude_none=exclude_none,
            context=context,
        )
    except Exception:  # a model whose own serializer refuses the include: no summary
        return None


def _dict(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _real(value: Any) -> bool:
    """A number as prime-rl's ``isinstance(v, (int, float))`` takes one (bools included)."""
    return isinstance(value, (int, float))


def _phases(timing: Mapping[str, Any], prefix: str, out: dict[str, float]) -> None:
    """Seconds per phase of a trace's timing tree (``a/b`` for nested phases): a phase's
    ``duration``, else its ``end - start``."""
    if _real(timing.get("duration")):
        out[prefix] = out.get(prefix, 0.0) + timing["duration"]
    elif _real(timing.get("start")) and _real(timing.get("end")):
        out[prefix] = out.get(prefix, 0.0) + (timing["end"] - timing["start"])
    for key, sub in timing.items():
        if isinstance(sub, Mapping):
            _phases(sub, f"{prefix}/{key}" if prefix else key, out)


def _truncated(trace: Mapping[str, Any]) -> bool:
    if trace.get("stop_condition") in TRUNCATING_STOPS:
        return True
    for call in reversed(_list(trace.get("calls"))):
        if _dict(call).get("error") is None:
            return _dict(call).get("finish_reason") == "length"
    return False


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _mean(values: list[Any]) -> Any:
    return sum(values) / len(values) if values else None


def _kind(record: Mapping[str, Any], traces: Iterable[Any]) -> Any:
    """The kind a trace's info stamps, else the run's work type, else the run's, else eval."""
    for trace in traces:
        kind = _dict(_dict(trace).get("info")).get("kind")
        if kind in ("train", "eval"):
            return kind
    run = _dict(record.get("run"))
    return _dict(run.get("work")).get("type") or run.get("type") or "eval"


def episode_row(value: Any) -> dict[str, Any]:
    """The index row of one record, in prime-rl's key order, ``line``, ``offset`` and
    ``chunk`` left None for the writer. A value that is no episode (not a Mapping or a
    model), or whose fields have types no episode has, gets a row of Nones and zeros (and
    its ``id``): a row never stops a record from being written.

    A record whose token counts are not ints gets None for them (prime-rl then builds the
    episode with verifiers to count them: a whole parse this row never makes).
    """
    record = _skeleton(value)
    if record is None:
        record = {}
    try:
        return _row(record)
    except (TypeError, ValueError, ArithmeticError):
        return _row({"id": record.get("id")})


def _row(record: Mapping[str, Any]) -> dict[str, Any]:
    traces = [_dict(t) for t in _list(record.get("traces"))]
    rewards: list[Any] = []
    advantages: list[Any] = []
    costs: list[Any] = []
    timing: dict[str, float] = {}
    turns = branches = 0
    stop_condition = None
    truncated = False
    for trace in traces:
        for call in _list(trace.get("calls")):
            cost = _dict(_dict(call).get("usage")).get("cost")
            if _real(cost):
                costs.append(cost)
        nodes = [_dict(n) for n in _list(trace.get("nodes"))]
        parents = {node.get("parent") for node in nodes if "parent" in node}
        branches += max(0, len(nodes) - len(parents))
        turns += sum(1 for node in nodes if _dict(node.get("message")).get("role") == "assistant")
        scores = _dict(trace.get("rewards"))
        if scores:
            total = 0
            for reward in scores.values():
                if isinstance(reward, Mapping):
                    weight = reward.get("weight")
                    total += (reward.get("score") or 0) * (1 if weight is None else weight)
            rewards.append(total)
        if isinstance(trace.get("timing"), Mapping):
            _phases(trace["timing"], "", timing)
        advantage = _dict(trace.get("info")).get("advantage")
        if advantage is not None:
            advantages.append(advantage)
        if "stop_condition" in trace:
            stop_condition = trace["stop_condition"]
        truncated = truncated or _truncated(trace)
    first = _dict(traces[0].get("info")) if traces else {}
    dispatch: Any = _dict(first.get("dispatch")).get("time")
    arrival: Any = _dict(first.get("arrival")).get("time")
    if _real(dispatch) and _real(arrival):
        duration: Any = max(0.0, arrival - dispatch)
    else:
        top = [seconds for phase, seconds in timing.items() if "/" not in phase]
        duration = sum(top) if top else None
    env = _dict(record.get("env"))
    inputs, outputs = record.get("num_input_tokens"), record.get("num_output_tokens")
    if type(inputs) is not int or type(outputs) is not int:
        inputs = outputs = None
    return {
        "cost": sum(costs) if costs else None,
        "line": None,
        "offset": None,
        "id": record.get("id"),
        "kind": _kind(record, traces),
        "trace_ids": [t["id"] for t in traces if t.get("id")],
        "env": env.get("name") or env.get("id"),
        "group": _dict(record.get("group")).get("id"),
        "ok": record.get("ok"),
        "num_errors": len(_list(record.get("errors"))),
        "reward": _mean(rewards),
        "advantage": _mean(advantages),
        "input_tokens": inputs,
        "output_tokens": outputs,
        "turns": turns,
        "branches": branches,
        "stop_condition": stop_condition,
        "truncated": truncated,
        "dispatch": dispatch,
        "arrival": arrival,
        "duration": duration,
        "chunk": None,
    }
