"""Sub-Agent: an orchestrator dispatches MuSiQue research sub-topics to sub-agents (DESIGN.md §4).

Modules: :mod:`~workloads.subagent.template`, :mod:`~workloads.subagent.request` and
:mod:`~workloads.subagent.workload`; data and scoring in :mod:`workloads.musique`, the
``retrieve`` tool in :mod:`workloads.react.retrieval`.
"""

from workloads.subagent.request import (
    MAX_SUBTOPICS,
    PLAN_COORDINATE,
    SubAgentOutcome,
    SubAgentRequest,
    parse_plan,
    search_coordinate,
)
from workloads.subagent.template import NO_SEARCH, NO_SUBTOPIC, TEMPLATE
from workloads.subagent.workload import SubAgentWorkload, load_subagent_questions

__all__ = [
    "MAX_SUBTOPICS",
    "NO_SEARCH",
    "NO_SUBTOPIC",
    "PLAN_COORDINATE",
    "TEMPLATE",
    "SubAgentOutcome",
    "SubAgentRequest",
    "SubAgentWorkload",
    "load_subagent_questions",
    "parse_plan",
    "search_coordinate",
]
