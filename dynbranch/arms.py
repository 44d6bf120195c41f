"""Arms: one flag that sets which mechanisms and baselines a run uses.

An arm is a small named object that builds the hooks and the placement policy for a run.
``floor`` is the reference of every measurement: the same stack with cross-request reuse
and speculation off (engines keep their own prefix caching).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from dynbranch.baselines import dsp_arm, helium_arm, instcache_arm, parrot_arm, spagent_arm
from dynbranch.errors import NotBuiltError, UnknownNameError
from dynbranch.hooks import BranchHook, NoReuse, NoSpeculation, ReuseHook, RunContext
from dynbranch.placement import PlacementPolicy, SessionAffinity


@dataclass(frozen=True)
class Arm:
    """A named configuration of the stack: factories of its hooks and placement policy."""

    name: str
    description: str
    make_reuse: Callable[[RunContext], ReuseHook]
    make_branch: Callable[[RunContext, ReuseHook], BranchHook]
    make_placement: Callable[[], PlacementPolicy]


def _store_hook(run: RunContext, **options) -> ReuseHook:
    from dynbranch.reuse.hook import StoreReuseHook

    if run.make_store is None:
        raise ValueError(f"the {run.arm} arm needs a store; the backend provides none")
    return StoreReuseHook(run.make_store(), run, **options)


def _c1_reuse(run: RunContext) -> ReuseHook:
    return _store_hook(run)


def _c2_reuse(run: RunContext) -> ReuseHook:
    return _store_hook(run, cross_request=False)


def _speculator(run: RunContext, reuse: ReuseHook) -> BranchHook:
    """C2 with C3: the workload's predictor, fills admitted by the load-priced gate.

    ``run.options["gate"]``: ``priced`` (default: both levels priced), ``topk`` (no gate:
    the ``fanout`` best-ranked candidates), or one of the attribution variants of Fig. 13:
    ``fixed-threshold`` (Action 0 off, Action 1 admits when p̃ > ``p_star``),
    ``priced-a1-only`` (Action 0 off, Action 1 priced), ``priced-a0-fixed`` (Action 0
    priced, Action 1 fixed at ``p_star``).
    """
    from dynbranch.engines.profile import load_profile
    from dynbranch.predictors import make_predictor
    from dynbranch.pricing import PricedPolicy
    from dynbranch.speculation import Speculator, TopK

    predictor = make_predictor(run.options.get("predictor", "frequency"),
                               **run.options.get("predictor_options", {}))
    fanout = int(run.options.get("fanout", 2))
    gate = run.options.get("gate", "priced")
    if gate == "topk":
        return Speculator(run, predictor, TopK(fanout))
    policy = PricedPolicy.for_run(
        run, fanout=fanout, engines=int(run.options.get("workers", 1)),
        profile=load_profile(run.options.get("profile", "qwen3-32b@h200")),
        policy=gate.replace("-", "_"),
        p_star=float(run.options.get("p_star", 0.5)), seed=int(run.options.get("seed", 0)))
    return Speculator(run, predictor, policy)


BUILT: dict[str, Arm] = {
    "floor": Arm("floor", "no cross-request reuse, no speculation (the reference)",
                 NoReuse, NoSpeculation, SessionAffinity),
    "c1": Arm("c1", "cross-request exact subgraph reuse with read-set freshness, no fills",
              _c1_reuse, NoSpeculation, SessionAffinity),
    "c2": Arm("c2", "early fill of predicted candidates, promoted within the request only",
              _c2_reuse, _speculator, SessionAffinity),
    "full": Arm("full", "C1 reuse and C2 early fill together", _c1_reuse, _speculator,
                SessionAffinity),
    "instcache": instcache_arm(SessionAffinity),  # the floor's placement: only hits change
    "helium": helium_arm(),
    "parrot": parrot_arm(),
    "dsp": dsp_arm(),
    "spagent": spagent_arm(),
}

PLANNED: tuple[str, ...] = ()


def get_arm(name: str) -> Arm:
    """The arm called ``name``; a typed error naming what exists otherwise."""
    if name in BUILT:
        return BUILT[name]
    if name in PLANNED:
        raise NotBuiltError("arm", name, list(BUILT))
    raise UnknownNameError("arm", name, [*BUILT, *PLANNED])
