"""Independent checks over the stage log, written apart from the code that splices.

A stage served from a record (``served_from`` other than ``exec``) is an **unsafe splice**
when either

* its value differs from what canonical execution of that stage, on its recorded input,
  returned at the moment it was served (``audit_digest``: the orchestrator re-executes
  every served stage out of band — the replay oracle for LLM stages, the tool itself on the
  request's current state for tool stages), or
* its read-set was stale: some resource it read had been written to another version by a
  stage that finished before it was served.

Both checks read only the stage log, never the store or the gate, so a bug in either
cannot hide from them.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Iterable

from dynbranch.runtime.runlog import StageRecord


def unsafe_splices(stages: Iterable[StageRecord]) -> list[StageRecord]:
    """The served stages that are unsafe (see the module docstring)."""
    stages = list(stages)
    writes = _write_timeline(stages)
    return [s for s in stages if s.served_from != "exec"
            and (_value_differs(s) or _stale_reads(s, writes))]


def _value_differs(s: StageRecord) -> bool:
    return bool(s.audit_digest) and s.audit_digest != s.output_digest


def _write_timeline(stages: list[StageRecord]) -> dict[str, tuple[list[float], list[str]]]:
    events: dict[str, list[tuple[float, str]]] = defaultdict(list)
    for s in stages:
        if s.served_from == "exec" and not s.error:
            for resource, version in s.writes.items():
                events[resource].append((s.end, version))
    out = {}
    for resource, evs in events.items():
        evs.sort()
        out[resource] = ([t for t, _ in evs], [v for _, v in evs])
    return out


def _stale_reads(s: StageRecord, writes: dict[str, tuple[list[float], list[str]]]) -> bool:
    for resource, version in s.read_set.items():
        times, versions = writes.get(resource, ([], []))
        i = bisect.bisect_right(times, s.start)
        if i and versions[i - 1] != version:
            return True
    return False
