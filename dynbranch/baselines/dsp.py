"""The ``dsp`` arm: Dynamic Speculative Planning, run-ahead depth learned online.

**Taken from DSP** (Guan et al., 2025, arXiv 2509.01920): a cheap *approximation agent*
proposes the next steps of the plan and they are executed speculatively while the *target
agent* decides; the target's decision verifies them, so the result is lossless (the final
trajectory is always the target's). How many steps ``k`` to run ahead is not fixed (as in
Interactive Speculative Planning) but learned online, during serving, with no training
before deployment, against a joint latency–cost objective whose trade-off is one
user-set parameter. Mismatched speculation is cancelled; there is no notion of engine load
in the decision, and nothing is reused across requests.

**How it maps onto the stack.**

* *Approximation agent* = the workload's predictor (``run.fill.predictor``), whose
  top-ranked candidate is the proposed next action: DSP's approximation agent proposes one
  trajectory, so one candidate per branch (top-1), never a fan-out.
* *Speculative execution* = a fill of that candidate; *verification* = the canonical
  resolution of the branch, which promotes a fill's shadow only on an exact reuse-name
  match (lossless by construction; a mismatched fill is cancelled and dropped).
* *k steps ahead* = **depth**: the number of stages of the proposed path a fill may run,
  ``k ∈ {0, …, K}`` with ``K`` the run's fill depth (``--depth``, default 2: e.g. handler
  then executor, retrieve then the next think). Stage ``j`` of a fill renders from stage
  ``j-1``'s output, so — as DSP's steps — it can only be used if every earlier one was.
  ``k = 0`` does not speculate (the predictor is not even asked).

**Decided here.**

* *The objective.* Per coordinate **stage** (``workflow/stage``, pooling the steps of one
  decision point) and per depth ``j``, running means (EWMA, ``alpha``) of what depth ``j``
  gave per branch entry that speculated it: ``gain_j``, the latency a consumed stage saved
  (its speculative duration minus what the canonical stage still waited for it; 0 when not
  consumed), and ``cost_j``, the seconds the stage ran speculatively (whether consumed or
  not; 0 when it never ran). ``k = argmax_k Σ_{j≤k} (gain_j − λ·cost_j)``, ties to the
  smaller ``k``. Only observed consumption and durations enter: no engine load, no price.
* *λ = 0.5* (``DSPConfig.trade_off``): a second of speculative execution is worth half a
  second of latency. DSP's single knob is an expectile ``τ`` of its value regression, and
  its default ``τ = 0.5`` (plain mean) speculates a step when it is more likely than not
  to be used; with a consumed stage saving about its own duration, ``λ = 0.5`` draws the
  same line (speculate depth ``j`` when its use rate exceeds one half).
* *The learner.* DSP regresses ``k`` from the trajectory text with a DistilBERT value
  model trained by TD(λ) on a replay buffer. Our branch evidence has no text model, so the
  state is the coordinate stage alone and the "regression" is the running means above.
* *Exploration.* A depth never tried counts as worth trying (an optimistic start: the
  first entry of a stage speculates one stage, the next two, … until every depth up to
  ``K`` has been measured once). Every
  ``probe_every``-th entry of a stage (``DSPConfig.probe_every``, default 10) runs one
  stage deeper than chosen — DSP's constant ``k`` offset — so a depth switched off keeps
  being measured and can come back.
* *Depth budget.* Each fill carries its own ``k`` as a fill budget (:class:`DSPDepth`,
  checked by the fill runner before every stage, counted ``stopped`` when it ends a fill),
  and the fill's stage trace gives each stage's duration and the canonical consumption of
  it how long the canonical stage waited for its shadow.
* *Beyond the next branch.* DSP's ``k`` counts agent steps, and a run-ahead of two steps
  would speculate *through* the next decision. Our fills stop at the next branch
  (``FillContext.branch`` raises), so ``k`` counts the stages up to it; nothing here
  speculates a second decision.
* *Request-scoped shadows* (``StoreReuseHook(cross_request=False)``): a fill is promotable
  within its own request only, nothing is reused across requests; the floor's placement
  (:class:`~dynbranch.runtime.affinity.AffinityPlacement`).
"""

from __future__ import annotations

import dataclasses
import math
import weakref
from collections import Counter
from collections.abc import Hashable, Sequence
from dataclasses import dataclass
from typing import Any

from dynbranch.arms.base import Arm, store_hook
from dynbranch.fill import (
    BranchHook,
    BranchSession,
    DepthBudget,
    Fill,
    FillChoice,
    FillPolicy,
    Ranked,
    Speculator,
)
from dynbranch.predictors import make_predictor
from dynbranch.reuse.hook import ReuseHook
from dynbranch.runtime.affinity import AffinityPlacement
from dynbranch.runtime.run import DEFAULT_DEPTH, RunContext
from dynbranch.workflow import BranchCoordinate

DSP_DESCRIPTION = ("DSP: top-1 predicted path filled k stages ahead, k learned online per "
                   "branch stage against saved latency - lambda x speculative seconds; "
                   "request-scoped shadows, no load pricing")


@dataclass(frozen=True)
class DSPConfig:
    """Settings of the ``dsp`` arm; each is checked when the config is made.

    ``trade_off`` (λ >= 0): latency seconds one speculative second costs. ``alpha`` in
    (0, 1]: weight of the newest branch entry in the running means. ``probe_every``
    (>= 1): every this-many entries of a stage run one stage deeper than chosen
    (1: always). ``max_depth`` (``K`` >= 0): the deepest run-ahead, the run's fill depth
    (:meth:`for_run` sets it from ``run.fill.depth``).
    """

    trade_off: float = 0.5
    alpha: float = 0.1
    probe_every: int = 10
    max_depth: int = DEFAULT_DEPTH

    def __post_init__(self) -> None:
        if not (self.trade_off >= 0.0 and math.isfinite(self.trade_off)):
            raise ValueError(f"DSPConfig.trade_off={self.trade_off} must be finite and >= 0")
        if not 0.0 < self.alpha <= 1.0:
            raise ValueError(f"DSPConfig.alpha={self.alpha} outside (0, 1]")
        if self.probe_every < 1:
            raise ValueError(f"DSPConfig.probe_every={self.probe_every} must be >= 1")
        if self.max_depth < 0:
            raise ValueError(f"DSPConfig.max_depth={self.max_depth} must be >= 0")

    @classmethod
    def for_run(cls, run: RunContext) -> DSPConfig:
        """The run's DSP settings (its ``arm_config``, else the defaults), with ``K`` the
        run's fill depth."""
        config = run.arm_config if isinstance(run.arm_config, DSPConfig) else cls()
        return dataclasses.replace(config, max_depth=run.fill.depth)


# -- the learner ------------------------------------------------------------------------------


@dataclass
class DepthEstimate:
    """Running means of what one depth gave per branch entry that speculated it."""

    n: int = 0
    gain_s: float = 0.0
    cost_s: float = 0.0

    def update(self, gain_s: float, cost_s: float, alpha: float) -> None:
        if self.n == 0:
            self.gain_s, self.cost_s = gain_s, cost_s
        else:
            self.gain_s += alpha * (gain_s - self.gain_s)
            self.cost_s += alpha * (cost_s - self.cost_s)
        self.n += 1

    def net_s(self, trade_off: float) -> float:
        """Expected saved latency minus λ·speculative seconds; +inf until observed."""
        return self.gain_s - trade_off * self.cost_s if self.n else math.inf


@dataclass(frozen=True)
class DepthOutcome:
    """What one speculated depth gave in one branch entry (seconds)."""

    gain_s: float
    cost_s: float


class DepthLearner:
    """Chooses the run-ahead depth ``k`` per coordinate stage from observed outcomes."""

    def __init__(self, config: DSPConfig) -> None:
        self.config = config
        self._estimates: dict[Hashable, list[DepthEstimate]] = {}
        self._entries: Counter[Hashable] = Counter()
        self.counts = {"probes": 0, "observed": 0}
        self.chosen: Counter[int] = Counter()

    def estimates(self, key: Hashable) -> list[DepthEstimate]:
        """The per-depth estimates of ``key`` (depth ``j`` at index ``j - 1``)."""
        return self._estimates.setdefault(
            key, [DepthEstimate() for _ in range(self.config.max_depth)])

    def best_k(self, key: Hashable) -> int:
        """``argmax_k Σ_{j≤k} net_j`` over ``k ∈ {0..K}``; ties go to the smaller ``k``."""
        best_k, best, total = 0, 0.0, 0.0
        for j, estimate in enumerate(self.estimates(key), start=1):
            total += estimate.net_s(self.config.trade_off)
            if total > best:
                best_k, best = j, total
        return best_k

    def plan(self, key: Hashable) -> int:
        """The depth for the next branch entry of ``key`` (the learned one, or one deeper
        on a probe entry)."""
        k = self.best_k(key)
        self._entries[key] += 1
        if k < self.config.max_depth and self._entries[key] % self.config.probe_every == 0:
            k += 1
            self.counts["probes"] += 1
        self.chosen[k] += 1
        return k

    def observe(self, key: Hashable, outcomes: Sequence[DepthOutcome]) -> None:
        """Learn from one branch entry that speculated ``len(outcomes)`` depths."""
        estimates = self.estimates(key)
        for estimate, outcome in zip(estimates, outcomes, strict=False):
            estimate.update(outcome.gain_s, outcome.cost_s, self.config.alpha)
        self.counts["observed"] += 1

    def stats(self) -> dict[str, Any]:
        lam = self.config.trade_off
        stages = {
            _label(key): {"k": self.best_k(key), "entries": self._entries[key],
                          "net_s": [round(e.net_s(lam), 6) if e.n else None for e in est],
                          "n": [e.n for e in est]}
            for key, est in self._estimates.items()}
        return {**self.counts, "k_chosen": {str(k): n for k, n in sorted(self.chosen.items())},
                "stages": stages}


def stage_key(coordinate: BranchCoordinate) -> tuple[str, str]:
    """The coordinate stage a depth is learned for: ``(workflow, stage)``, all steps pooled."""
    return (coordinate.workflow, coordinate.stage)


def _label(key: Hashable) -> str:
    return "/".join(map(str, key)) if isinstance(key, tuple) else str(key)


# -- the policy -------------------------------------------------------------------------------


@dataclass(frozen=True)
class DSPDepth(DepthBudget):
    """The run-ahead ``k`` planned for one fill, and the coordinate stage it is learned for."""

    key: Hashable = ()
    name: str = "dsp run-ahead k"


class DSPPolicy(FillPolicy):
    """Action 0: speculate iff the learned ``k`` > 0. Action 1: the top-ranked candidate,
    bounded to ``k`` stages."""

    name = "dsp"

    def __init__(self, config: DSPConfig) -> None:
        self.config = config
        self.learner = DepthLearner(config)
        # NOTE: weakly keyed by the session itself: an entry whose branch resolved before its
        # fill was chosen goes with the session (keyed by id() it stayed, and a later session
        # at the same address could have found it).
        self._planned: weakref.WeakKeyDictionary[BranchSession, int] = (
            weakref.WeakKeyDictionary())

    async def generation(self, session: BranchSession) -> bool:
        k = self.learner.plan(stage_key(session.point.coordinate))
        if k > 0:
            self._planned[session] = k
        return k > 0

    async def choose(self, session: BranchSession,
                     ranked: Sequence[Ranked]) -> list[FillChoice]:
        k = self._planned.pop(session, 0)
        if not ranked or k <= 0:
            return []
        budget = DSPDepth(k, key=stage_key(session.point.coordinate))
        return [FillChoice(ranked[0].name, ranked[0].rank, budgets=(budget,))]

    async def request_done(self, request_id: str, fills: Sequence[Fill]) -> None:
        """The request ended: turn each fill's trace into per-depth outcomes and learn."""
        for fill in fills:
            budget = next((b for b in fill.budgets if isinstance(b, DSPDepth)), None)
            if budget is not None:
                self.learner.observe(budget.key, self.outcomes(fill, budget.depth))

    @staticmethod
    def outcomes(fill: Fill, k: int) -> list[DepthOutcome]:
        """Gain and cost of each depth ``1..k`` of a fill (zeros past where it stopped). A
        consumed stage saved its speculative duration less what the canonical stage still
        waited for it."""
        out = []
        for j in range(k):
            stage = fill.trace[j] if j < len(fill.trace) else None
            duration = stage.duration_s if stage is not None else 0.0
            wait = fill.waited_for(stage.claimed) if stage is not None and stage.claimed else None
            gain = max(0.0, duration - wait) if wait is not None else 0.0
            out.append(DepthOutcome(gain, duration))
        return out

    def stats(self) -> dict[str, Any]:
        return {**self.learner.stats(), "trade_off": self.config.trade_off}


# -- the arm -----------------------------------------------------------------------------------


def dsp_reuse(run: RunContext) -> ReuseHook:
    """The ``dsp`` arm's reuse hook: request-scoped shadows over the run's store."""
    return store_hook(run, cross_request=False, name="dsp")


def dsp_branch(run: RunContext, reuse: ReuseHook) -> BranchHook:
    """The ``dsp`` arm's branch hook: the workload's predictor as the approximation agent."""
    predictor = make_predictor(run.fill.predictor)
    return Speculator(run, predictor, DSPPolicy(DSPConfig.for_run(run)))


def dsp_arm() -> Arm:
    """The ``dsp`` arm."""
    return Arm("dsp", DSP_DESCRIPTION, dsp_reuse, dsp_branch, AffinityPlacement)
