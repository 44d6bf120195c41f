"""How often the drafter's vote names the branch taken, on a workload's held-out branches.

:func:`drafter_accuracy` measures the top-1 accuracy of the
:class:`~dynbranch.predictors.drafter.DrafterPredictor`'s vote on held-out branches after
learning online on the ``train`` split (the paper's Figure 11b statistic). With the defaults
(N = 8, T = 1; seed 0), learning on all of ``train`` and on each ``test`` branch after
ranking it: Routing, 1,903 test branches, top-1 61 % (the model's argmax 61 %, top-3 75 %;
the frequency predictor 42 %; seeds 1 and 2: 62 %); HCI, 1,463 branches, 86 % (frequency
88 %); ReAct (300 train requests), 527 branches with passages, 12 % (the entity ranker 13 %).

It runs workload data through :mod:`~workloads.analysis.trace` (choices only, no engines),
so it lives here, above the core, and not beside the predictor.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from dynbranch.datasets import cache_dir, resolve_data_dir
from dynbranch.predictors import make_predictor
from dynbranch.predictors.base import BranchContext
from dynbranch.predictors.drafter import DrafterPredictor, rank_by_votes
from dynbranch.workload import DataConfig
from workloads import get_workload
from workloads.analysis.trace import trace_request


@dataclass(frozen=True)
class DrafterAccuracy:
    """Top-1 accuracy of the drafter on a workload's held-out (``test``) branches.

    ``top1`` is the N-sample vote's; ``top1_expected`` the choice model's argmax (N → ∞);
    ``top3`` the vote's top-3 coverage; ``baseline_top1`` the same branches under the
    ``baseline`` predictor learned the same way. ``mean_named`` is the mean number of
    distinct candidates the N samples named (what a drafter can offer for filling).
    """

    workload: str
    samples: int
    temperature: float
    train_requests: int
    train_branches: int
    test_requests: int
    branches: int
    top1: float
    top1_expected: float
    top3: float
    mean_named: float
    baseline: str
    baseline_top1: float

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def drafter_accuracy(
    workload: Any = "routing",
    data: Any = None,
    n_train: int | None = None,
    n_test: int | None = None,
    seed: int = 0,
    *,
    samples: int = 8,
    temperature: float = 1.0,
    baseline: str = "frequency",
    online: bool = True,
) -> DrafterAccuracy:
    """Learn online on ``n_train`` requests of ``train``, then rank every branch of
    ``n_test`` requests of ``test`` (``None``: the whole split) before it is observed.

    ``workload`` is a name or a :class:`~dynbranch.workload.Workload`; ``data`` a
    :class:`~dynbranch.workload.DataConfig` (default: the resolved data directory).
    Requests run through a sequential tracing context (choices only, no engines:
    :func:`workloads.analysis.trace.trace_request`). With ``online`` both predictors keep
    learning from each test branch *after* ranking it, as they do in a run. Branches with
    nothing to draft over (no candidates, no passages) are not scored.
    """
    w, data = _workload(workload, data)
    drafter = DrafterPredictor(samples=samples, temperature=temperature, seed=seed)
    other = make_predictor(baseline)
    n_tr, train = _traced_branches(w, data, "train", n_train, seed)
    for ctx, chosen in train:
        drafter.observe(ctx, chosen)
        other.observe(ctx, chosen)
    n_te, test = _traced_branches(w, data, "test", n_test, seed)
    hits: Counter[str] = Counter()
    for ctx, chosen in test:
        pool, p, votes = drafter.sample(ctx)
        if pool:
            ranked = rank_by_votes(votes, pool, p)
            expected = rank_by_votes((), pool, p, pad=True)
            hits["scored"] += 1
            hits["top1"] += bool(ranked) and ranked[0] in chosen
            hits["top3"] += any(c in chosen for c in ranked[:3])
            hits["expected"] += expected[0] in chosen
            hits["baseline"] += any(c in chosen for c in other.rank(ctx, 1))
            hits["named"] += len(ranked)
        if online:
            drafter.observe(ctx, chosen)
            other.observe(ctx, chosen)
        else:
            drafter.remember(ctx, chosen)  # branch-time knowledge for the next branch
    scored = hits["scored"]
    rate = (lambda x: x / scored) if scored else (lambda _x: 0.0)
    return DrafterAccuracy(
        workload=w.name,
        samples=samples,
        temperature=temperature,
        train_requests=n_tr,
        train_branches=len(train),
        test_requests=n_te,
        branches=scored,
        top1=rate(hits["top1"]),
        top1_expected=rate(hits["expected"]),
        top3=rate(hits["top3"]),
        mean_named=rate(hits["named"]),
        baseline=baseline,
        baseline_top1=rate(hits["baseline"]),
    )


def _workload(workload: Any, data: Any) -> tuple[Any, Any]:
    if data is None:
        data = DataConfig(resolve_data_dir(None), cache_dir())
    w = get_workload(workload) if isinstance(workload, str) else workload
    w.fetch_data(data, lambda _m: None)
    return w, data


def _traced_branches(
    w: Any, data: Any, split: str, n: int | None, seed: int
) -> tuple[int, list[tuple[BranchContext, tuple[str, ...]]]]:
    """``n`` requests of ``split`` (``None``: each record once) and their branches, traced."""
    if n is None:
        pool = getattr(w, "records", None) or getattr(w, "episodes", None)
        if pool is None:
            raise ValueError(f"{w.name}: give the number of {split} requests")
        n = len(pool(data, split))
    out = []
    for request in w.requests(data, n, seed, split):
        for point, chosen in trace_request(request).branches:
            out.append((BranchContext.of(request.request_id, point), chosen))
    return n, out
