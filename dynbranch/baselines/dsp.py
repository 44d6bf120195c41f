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

* *Approximation agent* = the workload's predictor (``run.options["predictor"]``), whose
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
* *λ = 0.5* (run option ``dsp_lambda``): a second of speculative execution is worth half a
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
  ``probe_every``-th entry of a stage (run option ``dsp_probe_every``, default 10) runs one
  stage deeper than chosen — DSP's constant ``k`` offset — so a depth switched off keeps
  being measured and can come back.
* *Depth budget.* The fill mechanism's depth is one per run, so the per-fill ``k`` is
  enforced by this arm's reuse hook (:class:`DSPReuseHook`): the branch hook registers
  each fill's task with its budget, and the hook ends the fill
  (:class:`~dynbranch.errors.NotSpeculable`, counted ``stopped``) before stage ``k+1``.
  The same hook records each fill stage's duration and how long a canonical stage waited
  for the shadow it was served. NOTE: a per-fill ``depth=`` argument to
  ``BranchSession.start_fill`` (carried by ``Fill`` into ``FillContext``) would replace
  the budget half of the hook; see the arm's report.
* *Beyond the next branch.* DSP's ``k`` counts agent steps, and a run-ahead of two steps
  would speculate *through* the next decision. Our fills stop at the next branch
  (``FillContext.branch`` raises), so ``k`` counts the stages up to it; nothing here
  speculates a second decision.
* *Request-scoped shadows* (``StoreReuseHook(cross_request=False)``): a fill is promotable
  within its own request only, nothing is reused across requests; session-affinity
  placement, as the floor.
"""

from __future__ import annotations

import asyncio
import math
from collections import Counter
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dynbranch.errors import NotSpeculable
from dynbranch.fills import DEFAULT_DEPTH
from dynbranch.hooks import BranchSession, RunContext, Served, StageCall, StageOutcome
from dynbranch.placement import SessionAffinity
from dynbranch.reuse.hook import StoreReuseHook
from dynbranch.speculation import FillChoice, FillPolicy, Speculator
from dynbranch.workflow import BranchCoordinate

if TYPE_CHECKING:
    from dynbranch.arms import Arm

DSP_DESCRIPTION = ("DSP: top-1 predicted path filled k stages ahead, k learned online per "
                   "branch stage against saved latency - lambda x speculative seconds; "
                   "request-scoped shadows, no load pricing")


@dataclass(frozen=True)
class DSPConfig:
    """Settings of the ``dsp`` arm; each is checked when the config is made.

    ``trade_off`` (λ >= 0): latency seconds one speculative second costs. ``alpha`` in
    (0, 1]: weight of the newest branch entry in the running means. ``probe_every``
    (>= 1): every this-many entries of a stage run one stage deeper than chosen
    (1: always). ``max_depth`` (``K`` >= 0): the deepest run-ahead, the run's fill depth.
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
    def from_options(cls, options: Mapping[str, Any]) -> DSPConfig:
        """The config a run's options ask for (``dsp_lambda``, ``dsp_alpha``,
        ``dsp_probe_every``, ``depth``), defaults elsewhere."""
        d = cls()
        return cls(trade_off=float(options.get("dsp_lambda", d.trade_off)),
                   alpha=float(options.get("dsp_alpha", d.alpha)),
                   probe_every=int(options.get("dsp_probe_every", d.probe_every)),
                   max_depth=int(options.get("depth", d.max_depth)))


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


# -- the reuse hook: request-scoped shadows, per-fill depth budgets, stage traces ----------------


@dataclass
class StageTrace:
    """One stage a tracked fill ran: the reuse name it claimed and how long it executed
    (``""`` and 0.0 when the store already held the stage and nothing executed)."""

    name: str = ""
    duration_s: float = 0.0


@dataclass
class FillTrack:
    """A fill's depth budget and the stages it has run so far."""

    key: Hashable
    budget: int
    stages: list[StageTrace] = field(default_factory=list)


class DSPReuseHook(StoreReuseHook):
    """Request-scoped shadows (``cross_request=False``) plus what DSP needs to learn ``k``:
    a stage budget per tracked fill, each fill stage's duration, and how long a canonical
    stage waited for the shadow it was served."""

    name = "dsp"

    def __init__(self, store, run: RunContext) -> None:
        super().__init__(store, run, cross_request=False)
        self._tracks: dict[asyncio.Task, FillTrack] = {}
        self._waits: dict[str, dict[str, float]] = {}

    def track(self, task: asyncio.Task, track: FillTrack) -> None:
        """Budget the fill running in ``task`` (register before its second stage)."""
        self._tracks[task] = track

    def untrack(self, task: asyncio.Task | None) -> FillTrack | None:
        """Stop tracking ``task``'s fill; its track, if it had one."""
        return self._tracks.pop(task, None) if task is not None else None

    def served_wait(self, request_id: str, name: str) -> float | None:
        """How long the canonical stage named ``name`` waited to be served it, or ``None``
        if no canonical stage of the request was served that name."""
        return self._waits.get(request_id, {}).get(name)

    def forget(self, request_id: str) -> None:
        """Drop what was recorded about a finished request."""
        self._waits.pop(request_id, None)

    @property
    def tracked(self) -> int:
        """Fills still tracked (0 at teardown, or something leaked)."""
        return len(self._tracks)

    async def lookup(self, call: StageCall) -> Served | None:
        start = self.run.clock.now()
        served = await super().lookup(call)
        if served is not None and served.served_from in ("shadow", "join"):
            waits = self._waits.setdefault(call.request_id, {})
            waits.setdefault(served.reuse_name, self.run.clock.now() - start)
        return served

    async def fill_stage(self, call: StageCall, execute: Callable[[], Awaitable[StageOutcome]],
                         claimed: Callable[[str], None]) -> Any:
        # NOTE: a fill's stages all run inside the fill's own asyncio task, which is how a
        # stage is tied to its fill here without a fill id in the StageCall.
        track = self._tracks.get(asyncio.current_task())  # type: ignore[arg-type]
        if track is None:
            return await super().fill_stage(call, execute, claimed)
        if len(track.stages) >= track.budget:
            raise NotSpeculable(f"dsp run-ahead k={track.budget} reached at {call.stage.name}")
        trace = StageTrace()
        track.stages.append(trace)

        def claim(name: str) -> None:
            trace.name = name
            claimed(name)

        async def timed() -> StageOutcome:
            start = self.run.clock.now()
            try:
                return await execute()
            finally:
                trace.duration_s = self.run.clock.now() - start

        return await super().fill_stage(call, timed, claim)

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "tracked_fills": self.tracked}


# -- the policy and the branch hook ------------------------------------------------------------


class DSPPolicy(FillPolicy):
    """Action 0: speculate iff the learned ``k`` > 0. Action 1: the top-ranked candidate."""

    name = "dsp"

    def __init__(self, config: DSPConfig, reuse: DSPReuseHook) -> None:
        self.config, self.reuse = config, reuse
        self.learner = DepthLearner(config)
        self._planned: dict[int, int] = {}  # id(session) -> k, until its fills are tracked

    async def generation(self, session: BranchSession) -> bool:
        k = self.learner.plan(stage_key(session.point.coordinate))
        self._planned[id(session)] = k
        return k > 0

    async def choose(self, session: BranchSession, ranked: Sequence[str]) -> list[FillChoice]:
        return [FillChoice(ranked[0], 0)] if ranked else []

    def take_plan(self, session: BranchSession) -> int:
        """The ``k`` planned for ``session`` (once)."""
        return self._planned.pop(id(session), 0)

    async def request_done(self, request_id: str, fills: Sequence[Any]) -> None:
        """The request ended: turn each fill's trace into per-depth outcomes and learn."""
        for fill in fills:
            track = self.reuse.untrack(fill.task)
            if track is not None:
                self.learner.observe(track.key, self.outcomes(fill.request_id, track))

    def outcomes(self, request_id: str, track: FillTrack) -> list[DepthOutcome]:
        """Gain and cost of each depth ``1..budget`` of a tracked fill (zeros past where it
        stopped). A consumed stage saved its speculative duration less what the canonical
        stage still waited for it."""
        out = []
        for j in range(track.budget):
            trace = track.stages[j] if j < len(track.stages) else StageTrace()
            wait = self.reuse.served_wait(request_id, trace.name) if trace.name else None
            gain = max(0.0, trace.duration_s - wait) if wait is not None else 0.0
            out.append(DepthOutcome(gain, trace.duration_s))
        return out

    def stats(self) -> dict[str, Any]:
        return {**self.learner.stats(), "trade_off": self.config.trade_off}


class DSPSpeculator(Speculator):
    """The ``dsp`` branch hook: :class:`~dynbranch.speculation.Speculator` with the DSP
    policy, registering each fill's depth budget with the reuse hook as it starts."""

    name = "dsp"
    draft_beside = False  # NOTE: opened() tracks each fill's depth budget as it returns

    def __init__(self, run: RunContext, predictor, policy: DSPPolicy) -> None:
        super().__init__(run, predictor, policy)
        self.dsp = policy

    async def opened(self, session: BranchSession) -> None:
        await super().opened(session)
        k = self.dsp.take_plan(session)
        key = stage_key(session.point.coordinate)
        for fill in session.fills:
            if fill.task is not None:
                self.dsp.reuse.track(fill.task, FillTrack(key, k))

    async def request_done(self, request_id: str) -> None:
        await super().request_done(request_id)
        self.dsp.reuse.forget(request_id)

    def stats(self) -> dict[str, Any]:
        # NOTE: merged flat, as Speculator merges its policy's stats where it does so itself
        return {**super().stats(), **self.dsp.stats()}


# -- the arm -----------------------------------------------------------------------------------


def dsp_reuse(run: RunContext) -> DSPReuseHook:
    """The ``dsp`` arm's reuse hook over the run's store (request-scoped names)."""
    if run.make_store is None:
        raise ValueError(f"the {run.arm} arm needs a store; the backend provides none")
    return DSPReuseHook(run.make_store(), run)


def dsp_branch(run: RunContext, reuse) -> DSPSpeculator:
    """The ``dsp`` arm's branch hook: the workload's predictor as the approximation agent."""
    from dynbranch.predictors import make_predictor

    if not isinstance(reuse, DSPReuseHook):
        raise TypeError(f"the dsp branch hook needs a DSPReuseHook, got {type(reuse).__name__}")
    predictor = make_predictor(run.options.get("predictor", "frequency"))
    return DSPSpeculator(run, predictor, DSPPolicy(DSPConfig.from_options(run.options), reuse))


def dsp_arm() -> Arm:
    """The ``dsp`` arm."""
    from dynbranch.arms import Arm  # NOTE: here, not above: dynbranch.arms lists this arm

    return Arm("dsp", DSP_DESCRIPTION, dsp_reuse, dsp_branch, SessionAffinity)
