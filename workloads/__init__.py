"""Workloads by name: the requests, tools and scoring each paper workload runs on.

``routing`` is built; ``react``, ``subagent`` and ``hci`` are part of the design (DESIGN.md
§4) and not built yet.
"""

from __future__ import annotations

from typing import Any

from dynbranch.errors import NotBuiltError, UnknownNameError
from dynbranch.workload import Workload

BUILT = ("routing",)
PLANNED = ("react", "subagent", "hci")
WORKLOAD_NAMES = (*BUILT, *PLANNED)


def get_workload(name: str, **options: Any) -> Workload:
    """The workload called ``name``, constructed with ``options``."""
    if name == "routing":
        from workloads.routing import RoutingWorkload

        return RoutingWorkload(**options)
    if name in PLANNED:
        raise NotBuiltError("workload", name, list(BUILT))
    raise UnknownNameError("workload", name, list(WORKLOAD_NAMES))
