"""Routing: BFCL function calling as a router → handler → executor workflow (DESIGN.md §4).

Modules: :mod:`~workloads.routing.bfcl_wheel` (the pinned ``bfcl-eval`` wheel, fetched from
PyPI into the cache), :mod:`~workloads.routing.bfcl_data` (loading and validation),
:mod:`~workloads.routing.apis` (the executable API classes and their declared effects),
:mod:`~workloads.routing.schema` (single-turn schemas), :mod:`~workloads.routing.tools` (the
``bfcl`` tool), :mod:`~workloads.routing.template`, :mod:`~workloads.routing.request`,
:mod:`~workloads.routing.conflicts` (records no replayed model could answer, left out) and
:mod:`~workloads.routing.workload`.
"""

from workloads.routing.bfcl_data import CATEGORIES, BFCLData, Record, load_bfcl
from workloads.routing.request import ExecutedCall, RoutingOutcome, RoutingRequest
from workloads.routing.template import END_OF_TURN, TEMPLATE
from workloads.routing.workload import SPLITS, RoutingWorkload, draw, scenario_of, split_of

__all__ = [
    "CATEGORIES",
    "END_OF_TURN",
    "SPLITS",
    "TEMPLATE",
    "BFCLData",
    "ExecutedCall",
    "Record",
    "RoutingOutcome",
    "RoutingRequest",
    "RoutingWorkload",
    "draw",
    "load_bfcl",
    "scenario_of",
    "split_of",
]
