"""Independent checks over the stage log, written apart from the code that splices.

:func:`unsafe_splices` counts stages served from a record (``served_from`` other than
``exec``) whose value differs from what canonical execution of the same stage on the same
rendered input returned in this run. It reads only the stage log, never the store or the
gate, so a bug in either cannot hide from it.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from dynbranch.records import StageRecord


def unsafe_splices(stages: Iterable[StageRecord]) -> list[StageRecord]:
    """Served stages whose output differs from an executed twin's (same stage, same input)."""
    stages = list(stages)
    executed: dict[tuple[str, str], set[str]] = defaultdict(set)
    for s in stages:
        if s.served_from == "exec" and not s.speculative and not s.error:
            executed[(s.fingerprint, s.input_digest)].add(s.output_digest)
    bad = []
    for s in stages:
        if s.served_from == "exec":
            continue
        twins = executed.get((s.fingerprint, s.input_digest), set())
        if twins and s.output_digest not in twins:
            bad.append(s)
    return bad
