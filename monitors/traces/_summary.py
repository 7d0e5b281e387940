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

Only an episode's skeleton is read, never its messages or per-token lists, so a row costs
what the episode's node count costs, not its bytes: for a verifiers episode the fields the
encoder dumped for it as it wrote it (``TopFields``: its id, token counts, ...), each
trace's few small fields, and each node's parent and role and each call's usage, error and
finish reason read off the models; for another pydantic model one ``model_dump`` with an
``include`` of those fields.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final, TypeAlias

import encoder
from encoder._models import is_model

__all__ = ["TRUNCATING_STOPS", "Summary", "TopFields", "episode_ids", "episode_row"]

#: What a stream's index row says of a record, besides where it is: called with the record
#: and, when the encoder walked it, the fields it dumped for the record's own model (None
#: otherwise).
Summary: TypeAlias = Callable[[Any, "Mapping[str, Any] | None"], dict[str, Any]]

#: The stop conditions verifiers' ``Trace.is_truncated`` counts as a truncation.
TRUNCATING_STOPS: Final = frozenset(
    {"max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens", "compaction_failed"}
)

#: What a row reads of an episode's own fields (pydantic's ``include``).
_TOP: Final[dict[str, Any]] = dict.fromkeys(
    ("id", "env", "group", "ok", "errors", "run", "num_input_tokens", "num_output_tokens"), True
)
#: What it reads of a trace's, besides its nodes and calls.
_TRACE: Final[dict[str, Any]] = dict.fromkeys(
    ("id", "info", "rewards", "timing", "stop_condition"), True
)
#: Of any other model: all of the above, pydantic's dump picking out each part.
_SKELETON: Final[dict[str, Any]] = {
    **_TOP,
    "traces": {
        "__all__": {
            **_TRACE,
            "calls": {"__all__": {"usage": True, "error": True, "finish_reason": True}},
            "nodes": {"__all__": {"parent": True, "message": {"role": True}}},
        }
    },
}


class TopFields:
    """Keeps the fields the encoder dumps for a walked record's own model (its id, token
    counts, ...: what pydantic computes once for the record), so that its row need not
    compute them again. ``attach`` it to the ``ModelDump`` before it is encoded."""

    __slots__ = ("fields", "model")

    def __init__(self, model: Any) -> None:
        self.model = model
        self.fields: dict[str, Any] | None = None

    @classmethod
    def attach(cls, value: Any) -> TopFields | None:
        """A keeper for ``value`` when it is a ``ModelDump`` (chaining its ``edit``)."""
        if not isinstance(value, encoder.ModelDump):
            return None
        keeper = cls(value.model)
        form = value.form
        before = form.edit

        def edit(model: Any, fields: dict[str, Any]) -> None:
            if before is not None:
                before(model, fields)
            if model is keeper.model and keeper.fields is None:
                keeper.fields = dict(fields)  # the walk pops the keys it writes

        form.edit = edit
        return keeper


def _verifiers_episode(model: Any) -> bool:
    episode = sys.modules.get("verifiers.v1.episode")
    return episode is not None and isinstance(model, episode.Episode)


def _node(node: Any) -> dict[str, Any]:
    """A node's parent and role, as its record has them (no parent key for a root)."""
    out: dict[str, Any] = {}
    if node.parent is not None:
        out["parent"] = node.parent
    out["message"] = {"role": getattr(getattr(node, "message", None), "role", None)}
    return out


def _call(call: Any) -> dict[str, Any]:
    usage = call.usage
    cost = None if usage is None else usage.cost
    return {
        "usage": {} if cost is None else {"cost": cost},
        "error": call.error,
        "finish_reason": call.finish_reason,
    }


def _episode_skeleton(model: Any, top: Mapping[str, Any] | None, context: Any) -> dict[str, Any]:
    """A verifiers episode's skeleton: its own fields (``top``, or dumped), each trace's
    small fields dumped, its nodes and calls read off the models (cheaper than pydantic's
    include, which visits every field of every node)."""
    if top is None:
        top = model.model_dump(mode="json", include=_TOP, exclude_none=True, context=context)
    if "traces" in top:  # dumped whole with the rest: small
        return dict(top)
    traces = []
    for trace in model.traces:
        fields = trace.model_dump(mode="json", include=_TRACE, exclude_none=True, context=context)
        fields["nodes"] = [_node(node) for node in trace.nodes]
        fields["calls"] = [_call(call) for call in trace.calls]
        traces.append(fields)
    return {**top, "traces": traces}


def _skeleton(value: Any, top: Mapping[str, Any] | None) -> Any:
    """What the row reads of ``value``: a Mapping as it is, a model's few fields as its
    record has them; None for anything else."""
    if isinstance(value, Mapping):
        return value
    if isinstance(value, encoder.ModelDump):
        if value.whole is not None and top is not None:
            return top  # another verifiers series: the record, built whole by to_record()
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
        if _verifiers_episode(model):
            return _episode_skeleton(model, top, context)
        return model.model_dump(
            mode="json",
            include=_SKELETON,
            exclude=exclude,
            exclude_none=exclude_none,
            context=context,
        )
    except Exception:  # a model whose own serializer refuses: no summary
        return None


def episode_ids(value: Any) -> tuple[Any, list[str]]:
    """A record's id and its traces' (string) ids, read without dumping it."""
    model = value.model if isinstance(value, encoder.ModelDump) else value
    if isinstance(model, Mapping):
        traces = model.get("traces")
        traces = traces if isinstance(traces, list) else []
        ids = [t.get("id") for t in traces if isinstance(t, Mapping)]
        return model.get("id"), [i for i in ids if type(i) is str and i]
    if is_model(model):
        traces = getattr(model, "traces", None)
        traces = traces if isinstance(traces, list) else []
        ids = [getattr(t, "id", None) for t in traces]
        return getattr(model, "id", None), [i for i in ids if type(i) is str and i]
    return None, []


def _dict(value: Any) -> Mapping[str, Any]:
    if type(value) is dict:  # nearly always: no ABC check
        return value
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


def episode_row(value: Any, top: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The index row of one record, in prime-rl's key order, ``line``, ``offset`` and
    ``chunk`` left None for the writer. A value that is no episode (not a Mapping or a
    model), or whose fields have types no episode has, gets a row of Nones and zeros (and
    its ``id``): a row never stops a record from being written.

    A record whose token counts are not ints gets None for them (prime-rl then builds the
    episode with verifiers to count them: a whole parse this row never makes).

    :param value: The record: a Mapping, a pydantic model or the ``ModelDump`` of one.
    :param top: The fields the encoder dumped for the record's own model (``TopFields``),
        so that they are not computed twice.
    """
    record = _skeleton(value, top)
    if record is None:
        record = {}
    try:
        return _row(record)
    except (TypeError, ValueError, ArithmeticError, RecursionError):
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
