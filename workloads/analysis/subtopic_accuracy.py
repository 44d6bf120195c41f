"""How often the sub-topic predictor's top k hold the plan's sub-topics, on held-out plans.

The split's Sub-Agent requests are drawn as a replay draws them (``n`` of them, seeded; by
default every question once) and their plan branches visited in arrival order: each is
ranked from its evidence (the question and the ``train`` split's plans as history) and the
memory of the branches resolved before it, then the predictor observes the resolution, as
in a run. A hit is an exact match of a chosen sub-topic (what a fill must render to be
promoted); the branch is multi-valued, so top-1 can hold at most one of a plan's 2-4
sub-topics. Rows: ``first step`` (the decomposition's first step), ``later steps`` (whose
entity is an earlier step's answer), ``all``; ``candidates``: the sub-topic is among
everything proposed; ``plans``: branches with at least one candidate, with a hit in the top
k (``hit@k``, k in :data:`PLAN_KS`) and with every sub-topic of the plan in the top k
(``all@k``). NOTE: the
sub-agents run side by side and the answer waits for all of them, so a request is faster
only when every sub-topic was filled: ``all@fanout`` bounds what C2 can hide.

**The fit.** :func:`fit_weights` sets the weights on the ``train`` split: each train
question is ranked against the memory of every other train plan (left out, so its own
sub-topics are not remembered unless another question shares them), each of its
sub-topics one listwise group (:mod:`~workloads.analysis.listwise`, L2 0.001, 3,000 steps
of 0.3: of L2 0.1 / 0.01 / 0.001 the best top-3 on train, 37 / 39 / 40 %). Chained
candidates carry their parent's probability under the weights, so the fit runs twice: the
first from zero weights, the second with the first's.

Measured on ``test`` with ``plan="resolved"`` (train history 583 plans; top-1 / top-3 /
top-5 / candidates in % of the chosen sub-topics):

* the 100 requests a seed-0 replay draws (270 sub-topics): all 20 / 40 / 44 / 63, first
  steps 14 / 31 / 33 / 49, later steps 24 / 45 / 51 / 71; candidates at 100 of 100 plan
  branches; a hit in the top 1 / 2 / 3 / 5 for 55 / 64 / 70 / 71 % of plans, every
  sub-topic in them for 0 / 3 / 7 / 8 %;
* all 1,834 test plans in one stream: all 25 / 49 / 56 / 70, first steps 21 / 41 / 47 /
  60, later steps 27 / 54 / 62 / 75; every sub-topic in the top 2 / 3 / 5 / 8 for 5 / 14 /
  22 / 28 % of plans.

The ``recall`` predictor on the same 100: candidates at 3 plan branches, 0.4 % top-3.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from dynbranch.predictors import BranchContext, Predictor
from dynbranch.predictors.plans import PlanMemory
from dynbranch.predictors.subtopic import (
    FEATURES,
    SubtopicPredictor,
    SubtopicWeights,
    subtopic_features,
)
from dynbranch.workload import DataConfig
from workloads.analysis.listwise import listwise_fit
from workloads.analysis.trace import trace_all
from workloads.musique import line_refs
from workloads.subagent.template import DEFAULT_PLAN
from workloads.subagent.workload import SubAgentWorkload, known_plan

KS = (1, 3, 5)
PLAN_KS = (1, 2, 3, 5, 8)
"""Plan-level cut-offs: the fanouts a run may give the plan branch."""


def _data(data_dir: Path | None) -> DataConfig:
    from workloads.analysis.entity_accuracy import _data as data

    return data(data_dir)


def subtopic_accuracy(
    data_dir: Path | None = None,
    split: str = "test",
    n: int | None = None,
    seed: int = 0,
    weights: SubtopicWeights | None = None,
    predictor: Predictor | None = None,
    plan: str = DEFAULT_PLAN,
    split_by: str = "question",
) -> dict[str, Any]:
    """Top-1/3/5 of the sub-topic predictor (or of ``predictor``, e.g. ``recall``) over a
    replay's plan branches (module docstring). With ``plan="references"`` the plans are
    written with ``#k`` and ``plans`` also counts ``unreferenced@k``: every line without a
    reference (what a fill can cover while the plan is open) among the top k of the
    candidates without one (what C2 fills from)."""
    data = _data(data_dir)
    workload = SubAgentWorkload(tool_time="modelled", decode_lengths="recorded", plan=plan,
                                split_by=split_by)
    n = len(workload.records(data, split)) if n is None else n
    requests = workload.requests(data, n, seed, split)
    predictor = predictor or SubtopicPredictor(weights)
    hits: dict[str, list[list[int]]] = defaultdict(list)
    plans = []
    for request, trace in zip(requests, trace_all(requests), strict=True):
        point, chosen = trace.branches[0]
        ctx = BranchContext.of(request.request_id, point)
        ranked = predictor.rank(ctx, 1_000)
        first = request.record.steps[0].subtopic
        for subtopic in chosen:
            row = [int(subtopic in ranked[:k]) for k in KS] + [int(subtopic in ranked)]
            hits["all"].append(row)
            hits["first step" if subtopic == first else "later steps"].append(row)
        free = {s for s in chosen if not line_refs(s)}
        fillable = [c for c in ranked if not line_refs(c)]
        plans.append(
            [int(bool(ranked))]
            + [int(bool(set(chosen) & set(ranked[:k]))) for k in PLAN_KS]
            + [int(set(chosen) <= set(ranked[:k])) for k in PLAN_KS]
            + [int(free <= set(fillable[:k])) for k in PLAN_KS]
        )
        predictor.observe(ctx, chosen)
    return {
        "workload": "subagent",
        "split": split,
        "split_by": split_by,
        "requests": n,
        "seed": seed,
        "predictor": predictor.name,
        "rows": {name: _row(rows) for name, rows in hits.items()},
        "plans": {
            "branches": len(plans),
            "proposed": sum(p[0] for p in plans) / len(plans) if plans else 0.0,
            **{
                f"hit@{k}": sum(p[i + 1] for p in plans) / len(plans) for i, k in enumerate(PLAN_KS)
            },
            **{
                f"all@{k}": sum(p[i + 1 + len(PLAN_KS)] for p in plans) / len(plans)
                for i, k in enumerate(PLAN_KS)
            },
            **{
                f"unreferenced@{k}": sum(p[i + 1 + 2 * len(PLAN_KS)] for p in plans) / len(plans)
                for i, k in enumerate(PLAN_KS)
            },
        },
    }


def _row(rows: Sequence[list[int]]) -> dict[str, float | int]:
    out: dict[str, float | int] = {"subtopics": len(rows)}
    for i, k in enumerate(KS):
        out[f"top{k}"] = sum(r[i] for r in rows) / len(rows)
    out["candidates"] = sum(r[-1] for r in rows) / len(rows)
    return out


def fit_weights(
    data_dir: Path | None = None,
    l2: float = 0.001,
    iterations: int = 3000,
    rate: float = 0.3,
    plan: str = "resolved",
    split_by: str = "question",
) -> SubtopicWeights:
    """The predictor's weights fitted on the ``train`` split (module docstring), rounded
    to 0.01 as shipped. With ``plan="references"`` a group is a line without a reference
    (what a fill can cover while the plan is open), ranked as the predictor ranks such a
    plan (no chained candidates).

    NOTE: the shipped weights are the fit on ``resolved`` plans, also for the default
    ``references`` form: the fit on its unreferenced lines ranks the 300 plans of a seed-0
    300-request replay no better (every unreferenced line in the top 1 / 3 / 5 for 27.0 /
    38.7 / 43.3 % of plans against the shipped 27.7 / 38.7 / 42.0 %), so one set is kept.

    With ``split_by="step"`` (:mod:`workloads.musique`) a question is ranked with its whole
    step group left out of the memory, as a test question of that split meets none of its
    steps in the train history. NOTE: not what a run of that split sees: its test questions
    still meet the steps of earlier test questions, which the predictor learns online. On
    2026-12-07 the weights so fitted ranked the step split's 300-request stream worse than
    the shipped ones (a plan's top-1 / 3 0.213 / 0.310 against 0.403 / 0.517, plans written
    with references), so the shipped set serves both splits."""
    data = _data(data_dir)
    workload = SubAgentWorkload(plan=plan, split_by=split_by)
    records = workload.records(data, "train")
    groups = workload.groups(data) or {}  # NOTE: by question, each its own group
    plans = [known_plan(r, plan) for r in records]
    members: dict[str, list[int]] = defaultdict(list)
    for i, r in enumerate(records):
        members[groups.get(r.id, r.id)].append(i)
    left_out = [[plans[j] for j in members[groups.get(r.id, r.id)]] for r in records]
    memory = PlanMemory(plans)
    weights = SubtopicWeights(features=dict.fromkeys(FEATURES, 0.0))
    for _ in range(2):
        fit_groups = []
        ranked = replace(weights, parents=0) if plan == "references" else weights
        for known, out in zip(plans, left_out, strict=True):
            for other in out:  # NOTE: by question, the plan alone
                memory.remove(other)
            candidates = subtopic_features(known.question, memory, ranked)
            lines = dict.fromkeys(st.subtopic for st in known.steps)
            fit_groups += [(candidates, s) for s in lines if not line_refs(s)]
            for other in out:
                memory.add(other)
        fitted = listwise_fit(fit_groups, FEATURES, l2, iterations, rate)
        weights = SubtopicWeights(features={f: round(w, 2) + 0.0 for f, w in fitted.items()})
    return weights


def main() -> None:
    """Print the accuracy rows for a replay's stream (``--requests``) or the whole split."""
    import argparse
    import json

    from dynbranch.predictors import make_predictor

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--predictor", default="subtopic")
    ap.add_argument("--plan", default=DEFAULT_PLAN, choices=["references", "resolved"])
    ap.add_argument("--split-by", default="question", choices=["question", "step"])
    args = ap.parse_args()
    row = subtopic_accuracy(
        n=args.requests, seed=args.seed, predictor=make_predictor(args.predictor), plan=args.plan,
        split_by=args.split_by,
    )
    print(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
