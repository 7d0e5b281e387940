"""Key each uploaded record to the run, as the service joins traces to runs.

The Traces service reads a trace's run from ``run.id`` inside the trace itself; verifiers
records the run on the episode. prime-runs (``prime_runs.sinks.stamp_run``) therefore sets
``run.id`` and ``run.type`` on the episode and on every member trace before it uploads, and
so does the monitor. The tests hold the two to the same bytes. prime-runs is not a
dependency for these few lines: it brings httpx and pydantic to every install.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["stamp_run"]


def stamp_run(record: Any, run_id: str, run_type: str) -> Any:
    """``record`` with ``run.id`` and ``run.type`` set on it and on each member trace (a
    member without a ``run`` takes the episode's), the rest of each ``run`` block kept.

    A shallow overlay: the episode and each member become new dicts that hold the same
    values, so nothing large (nodes, token arrays, text) is copied, and the caller's record
    is not changed. A record that is not a Mapping is returned as it is.
    """
    if not isinstance(record, Mapping):
        return record
    stamped = dict(record)
    run = stamped["run"] = _rekey(stamped.get("run"), run_id, run_type)
    members = stamped.get("traces")
    if isinstance(members, list):
        stamped["traces"] = [
            {**member, "run": _rekey(member.get("run") or run, run_id, run_type)}
            if isinstance(member, Mapping)
            else member
            for member in members
        ]
    return stamped


def _rekey(run: Any, run_id: str, run_type: str) -> dict[str, Any]:
    keyed = dict(run) if isinstance(run, Mapping) else {}
    keyed["id"] = run_id
    keyed["type"] = run_type
    return keyed
