"""What Fig. 9a (fill width) and Fig. 9b (replicas) share: the workload, the load, the tests.

**Workload: Sub-Agent**, for the reasons :data:`WHY` gives (quoted in both reports).

**Load.** ρ = 1 canonical LLM call in flight per engine (:mod:`experiments.rates`, from a
pilot's measured canonical LLM time per request), so fills compete with canonical work
without the engines being idle or saturated; Fig. 9b keeps that per-engine load as workers
are added (λ ∝ W).

**Tests.** Welch's t-test over per-request latencies (every request of every seed of the
configuration against those of the reference one), as the paper's "Welch's t-test against
K = 0".
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from experiments.common import Cell
from experiments.facts import cell_latencies
from experiments.stats import Welch, welch

WORKLOAD = "subagent"
WHY = (
    "Workload: Sub-Agent. The paper does not name Fig. 9's workload; three of its numbers "
    "point to Sub-Agent. \"Consumed work is nearly flat once width reaches the workload's "
    "average of 2.67 candidates per branch\": only Sub-Agent's plan branch takes several "
    "candidates at once (a multi-valued branch: every named sub-topic is a valid result), and "
    "MuSiQue's decompositions name 2–4 sub-topics (our mean per plan branch is "
    "`f_chosen_per_plan_branch` in the table); on the single-winner workloads a fanout past 1 can "
    "only add losers. Mean latencies of 15–22 s are whole multi-sub-agent research requests, "
    "not Routing's few-second tool calls. And a fanout sweep says something only where a "
    "wider fill can still be used."
)
RHO = 1.0
ORACLE_FANOUT = 3
"""The oracle's fill width in these sweeps: every resolved sub-topic of a plan branch (2–4)
up to the widest configuration measured, so the bound is the same for every K."""


def plan_branch_facts(cell: Cell, result: Any) -> dict[str, Any]:
    """``f_chosen_per_plan_branch``: sub-topics chosen per resolved plan branch (each
    sub-agent's search branch, which chooses one entity, is left out)."""
    chosen = [
        len(b.chosen)
        for b in result.orchestrator.log.branches
        if b.resolved_at is not None and b.coordinate.split("/")[1] == "plan"
    ]
    return {"f_chosen_per_plan_branch": sum(chosen) / len(chosen) if chosen else None}


def replay(workers: int, fanout: int) -> dict[str, Any]:
    """Replay settings of one configuration."""
    return {"workers": workers, "fanout": fanout, "tool_time": "modelled"}


def welch_against(out: Path, cells: Sequence[Cell], variant: str, reference: str) -> Welch:
    """Welch's test of ``variant``'s per-request latencies against ``reference``'s (all
    seeds pooled)."""

    def pooled(v: str) -> list[float]:
        return [
            x
            for c in cells
            if c.variant == v and c.arm != "floor" and c.arm != "oracle"
            for x in cell_latencies(out, c)
        ]

    return welch(pooled(variant), pooled(reference))
