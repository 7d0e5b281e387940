"""Key each uploaded record to the run, as the service joins traces to runs.

The Traces service reads a trace's run from ``run.id`` inside the trace itself; verifiers
records the run on the episode. prime-runs (``prime_runs.sinks.stamp_run``) therefore sets
``run.id`` and ``run.type`` on the episode and on every member trace before it uploads, and
so does the monitor, as it walks the record (a dict, or a model it never turns into one).
The tests hold the two to the same bytes. prime-runs is not a dependency for these few
lines: it brings httpx to every install.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["Stamp"]


class Stamp:
    """prime-runs' ``stamp_run`` as an ``edit`` of the encoder's ``ModelDump`` (or of a
    record's dict): it sees the episode's dumped fields first, then each member trace's (or,
    where the members were dumped with the episode, their dicts there), and sets ``run`` on
    each: ``run.id`` and ``run.type`` over the rest of the block, a member without one
    taking the episode's. ``traces`` says whether the record has member traces (prime-runs'
    line format).
    """

    __slots__ = ("members", "run", "run_id", "run_type", "traces")

    def __init__(self, run_id: str, run_type: str) -> None:
        self.run_id = run_id
        self.run_type = run_type
        self.run: dict[str, Any] | None = None
        self.members: set[int] = set()
        self.traces = False

    def __call__(self, model: Any, fields: dict[str, Any]) -> None:
        if self.run is None:
            run = self.run = fields["run"] = _rekey(fields.get("run"), self.run_id, self.run_type)
            members = fields.get("traces")
            self.traces = "traces" in fields
            if isinstance(members, list):
                fields["traces"] = [
                    {**m, "run": _rekey(m.get("run") or run, self.run_id, self.run_type)}
                    if isinstance(m, Mapping)
                    else m
                    for m in members
                ]
            elif "traces" not in fields and isinstance(getattr(model, "traces", None), list):
                self.traces = True  # walked on their own: each comes back here
                self.members = {id(m) for m in model.traces}
        elif id(model) in self.members:
            fields["run"] = _rekey(fields.get("run") or self.run, self.run_id, self.run_type)


def _rekey(run: Any, run_id: str, run_type: str) -> dict[str, Any]:
    keyed = dict(run) if isinstance(run, Mapping) else {}
    keyed["id"] = run_id
    keyed["type"] = run_type
    return keyed
