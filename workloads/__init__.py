"""Workloads by name: the requests, tools and scoring each paper workload runs on.

``routing``, ``react``, ``subagent`` and ``hci`` are built (DESIGN.md §4).
"""

from __future__ import annotations

from typing import Any

from dynbranch.errors import NotBuiltError, UnknownNameError
from dynbranch.workload import Workload

BUILT = ("routing", "react", "subagent", "hci")
PLANNED: tuple[str, ...] = ()
WORKLOAD_NAMES = ("routing", "react", "subagent", "hci")  # DESIGN.md §4 order


def get_workload(name: str, **options: Any) -> Workload:
    """The workload called ``name``, constructed with ``options``."""
    if name == "routing":
        from workloads.routing import RoutingWorkload

        return RoutingWorkload(**options)
    if name == "react":
        from workloads.react import ReActWorkload

        return ReActWorkload(**options)
    if name == "subagent":
        from workloads.subagent import SubAgentWorkload

        return SubAgentWorkload(**options)
    if name == "hci":
        from workloads.hci import HCIWorkload

        return HCIWorkload(**options)
    if name in PLANNED:
        raise NotBuiltError("workload", name, list(BUILT))
    raise UnknownNameError("workload", name, list(WORKLOAD_NAMES))


def unfillable_stages(name: str | None) -> frozenset[str]:
    """The stages no fill of the workload called ``name`` can run
    (:attr:`~dynbranch.workload.Workload.unfillable_stages`; none for ``None``, a run whose
    summary names no workload)."""
    return get_workload(name).unfillable_stages if name else frozenset()
