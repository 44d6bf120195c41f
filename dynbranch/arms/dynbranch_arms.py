"""DynBranch's own arms: the floor, C1 alone, C2 alone and the full system.

``floor`` is the reference of every measurement: the same stack with cross-request reuse
and speculation off (engines keep their own prefix caching).
"""

from __future__ import annotations

from dynbranch.arms.base import Arm, store_hook
from dynbranch.fill import BranchHook, FillPolicy, NoSpeculation, Speculator, TopK
from dynbranch.gate.priced import PricedPolicy
from dynbranch.predictors import make_predictor
from dynbranch.reuse.hook import NoReuse, ReuseHook
from dynbranch.runtime.affinity import AffinityPlacement
from dynbranch.runtime.run import RunContext


def c1_reuse(run: RunContext) -> ReuseHook:
    """C1: cross-request exact reuse with read-set freshness."""
    return store_hook(run)


def request_scoped_reuse(run: RunContext) -> ReuseHook:
    """Shadows promotable within their own request only: nothing is reused across requests."""
    return store_hook(run, cross_request=False)


def fill_policy(run: RunContext) -> FillPolicy:
    """The run's fill policy, by ``run.gate.policy``: ``priced`` (both levels priced),
    ``topk`` (no gate: the ``fanout`` best-ranked candidates), or one of the attribution
    variants of Fig. 13: ``fixed-threshold`` (Action 0 off, Action 1 admits when
    p̃ > ``p_star``), ``priced-a1-only`` (Action 0 off, Action 1 priced),
    ``priced-a0-fixed`` (Action 0 priced, Action 1 fixed at ``p_star``)."""
    if run.gate.policy == "topk":
        return TopK(run.fill.fanout)
    return PricedPolicy.for_run(run)


def speculator(run: RunContext, reuse: ReuseHook) -> BranchHook:
    """C2 with C3: the workload's predictor, fills admitted by the run's fill policy."""
    predictor = make_predictor(run.fill.predictor, **run.fill.predictor_options)
    return Speculator(run, predictor, fill_policy(run))


FLOOR = Arm("floor", "no cross-request reuse, no speculation (the reference)",
            NoReuse, NoSpeculation, AffinityPlacement)
C1 = Arm("c1", "cross-request exact subgraph reuse with read-set freshness, no fills",
         c1_reuse, NoSpeculation, AffinityPlacement)
C2 = Arm("c2", "early fill of predicted candidates, promoted within the request only",
         request_scoped_reuse, speculator, AffinityPlacement)
FULL = Arm("full", "C1 reuse and C2 early fill together", c1_reuse, speculator,
           AffinityPlacement)
