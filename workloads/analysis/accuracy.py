"""How often a predictor's top-k holds what a branch resolved to, on held-out requests.

A run's predictor learns online: at each branch it ranks from branch-time evidence, and
only after the branch resolves is it told what was chosen. :func:`branch_accuracy` replays
exactly that over traced requests (:mod:`workloads.analysis.trace`): optionally warmed on
the train split's branches first, then, branch by branch in the test split's order, rank
(``k`` = the largest asked) → score → observe. A branch's top-``k`` *coverage* is the share of
its chosen candidates inside the predictor's first ``k`` (1 or 0 for an exclusive branch;
a fraction for a multi-valued one, where every chosen candidate needs its own fill).

    python -m workloads.analysis.accuracy --workload routing|hci [--requests 300]
"""

from __future__ import annotations

import argparse
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from dynbranch.predictors import BranchContext, Predictor, make_predictor
from workloads.analysis.trace import Trace

KS = (1, 3, 5)


@dataclass(frozen=True)
class StageAccuracy:
    """Top-k coverage of one branch coordinate stage (``workflow/stage``)."""

    stage: str
    branches: int
    coverage: dict[int, float]  # k -> mean top-k coverage of the chosen candidates
    chosen_per_branch: float


def branch_accuracy(test: Sequence[Trace], predictor: Predictor, ks: Sequence[int] = KS, *,
                    train: Sequence[Trace] = ()) -> list[StageAccuracy]:
    """Per coordinate stage, the predictor's online top-k coverage over ``test``."""
    for trace in train:
        for point, chosen in trace.branches:
            predictor.observe(BranchContext.of(trace.request_id, point), chosen)
    hits: dict[str, dict[int, float]] = defaultdict(lambda: dict.fromkeys(ks, 0.0))
    counts: dict[str, int] = defaultdict(int)
    chosen_n: dict[str, int] = defaultdict(int)
    k_max = max(ks)
    for trace in test:
        for point, chosen in trace.branches:
            ctx = BranchContext.of(trace.request_id, point)
            ranked = predictor.rank(ctx, max(k_max, len(point.candidates)))
            stage = f"{point.coordinate.workflow}/{point.coordinate.stage}"
            counts[stage] += 1
            chosen_n[stage] += len(chosen)
            for k in ks:
                top = set(ranked[:k])
                hits[stage][k] += sum(c in top for c in chosen) / max(1, len(chosen))
            predictor.observe(ctx, chosen)
    return [StageAccuracy(s, counts[s], {k: hits[s][k] / counts[s] for k in ks},
                          chosen_n[s] / counts[s]) for s in counts]


def table(rows: Sequence[StageAccuracy]) -> str:
    """The accuracy rows as text."""
    lines = ["stage                 branches  chosen/branch  " +
             "  ".join(f"top-{k}" for k in rows[0].coverage) if rows else "no branches"]
    for r in rows:
        cover = "  ".join(f"{100 * v:5.1f}%" for v in r.coverage.values())
        lines.append(f"{r.stage:<22}{r.branches:>8}  {r.chosen_per_branch:>13.2f}  {cover}")
    return "\n".join(lines)


def main() -> None:
    from dynbranch.datasets import cache_dir, resolve_data_dir
    from dynbranch.workload import DataConfig
    from workloads import get_workload
    from workloads.analysis.trace import trace_all

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="routing")
    ap.add_argument("--predictor", default=None)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--train", type=int, default=0, help="train-split requests to warm on")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    workload = get_workload(args.workload)
    data = DataConfig(resolve_data_dir(None), cache_dir())
    workload.fetch_data(data, lambda _m: None)
    test = trace_all(workload.requests(data, args.requests, args.seed, "test"))
    train = trace_all(workload.requests(data, args.train, args.seed, "train")) if args.train else ()
    predictor = make_predictor(args.predictor or workload.predictor)
    print(f"{args.workload}, predictor {predictor.name}, {args.requests} test requests"
          f"{f', warmed on {args.train} train requests' if args.train else ''}:")
    print(table(branch_accuracy(test, predictor, train=train)))


if __name__ == "__main__":
    main()
