"""The load-priced gate (C3): Action 0 decides whether to predict, Action 1 what to fill.

Both levels are learned online, from what the caller reports:

* **Action 0** (:meth:`Gate.generation`) keeps one aggregate return per branch coordinate,
  fed once per branch entry by :meth:`Gate.settle`, and opens while an optimistic estimate
  of it is positive; a seeded audit reopens a closed coordinate now and then.
* **Action 1** (:meth:`Gate.admit`) scores each candidate with ``p~ = pi~_sel * pi_use``
  (a Bayes-UCB upper quantile of a rank-conditioned Beta times the posterior mean of
  "usable in time, given selected", both fed by :meth:`Gate.observe`) and admits greedily:
  the highest-utility candidate that fits the fanout and KV budgets and whose atomic KV
  reservation succeeds, then re-prices the rest at the load that admission projects, until
  none has positive utility. Every decision comes back as an :class:`Admission`; an
  admitted one carries the :class:`Reservation` the caller must :meth:`Gate.release` when
  the fill ends.

Pure and synchronous: no clock reads (every method that needs time takes ``now``), no I/O,
no event loop, so the same object runs in process or inside a Ray actor, and
:meth:`Gate.state` / :meth:`Gate.from_state` checkpoint it as plain JSON-able data.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import asdict, dataclass, fields, replace
from typing import Any

from dynbranch.gate.beta import (
    BetaPosterior,
    bayes_ucb_level,
    beta_quantile,
    quantile_upper_bound,
)
from dynbranch.gate.load import LoadView
from dynbranch.gate.policy import (
    BELOW_THRESHOLD,
    NEGATIVE_UTILITY,
    POLICIES,
    AdmissionPolicy,
    Score,
    make_policy,
)
from dynbranch.gate.price import ContentionModel, FillShape
from dynbranch.gate.reservations import KvLedger, Reservation
from dynbranch.gate.returns import BranchReturn, GenerationDecision, ReturnStats

ADMITTED = "admitted"
AUDIT = "audit"
FANOUT = "fanout"
NO_KV = "no_kv"
REASONS = (ADMITTED, AUDIT, NEGATIVE_UTILITY, BELOW_THRESHOLD, FANOUT, NO_KV)
STATE_VERSION = 1


@dataclass(frozen=True)
class Candidate:
    """One predicted downstream candidate at a branch.

    ``rank`` is the predictor's 0-based rank (only the ordering is used); ``stage_key``
    names the stage the fill would run (the posteriors are keyed by it); ``gain_ms`` is
    ``G^Δ``, the execution a consumed fill saves after C1 lookup; ``kv_blocks`` is what its
    reservation holds (e.g. ``shape.kv_blocks(block_size)``).
    """

    name: str
    rank: int
    stage_key: str
    gain_ms: float
    shape: FillShape
    kv_blocks: int
    confidence: float | None = None  # the predictor's own probability (selection_arm)

    def __post_init__(self) -> None:
        if self.confidence is not None and not 0.0 <= self.confidence <= 1.0:
            raise ValueError(f"candidate {self.name!r}: confidence {self.confidence} "
                             "must be a probability")
        if self.rank < 0 or self.kv_blocks < 0 or not math.isfinite(self.gain_ms):
            raise ValueError(
                f"candidate {self.name!r}: rank and kv_blocks must be >= 0 and gain finite "
                f"(rank={self.rank}, kv_blocks={self.kv_blocks}, gain_ms={self.gain_ms})"
            )


@dataclass(frozen=True)
class Admission:
    """The gate's decision on one candidate, with the numbers behind it."""

    candidate: str
    rank: int
    p_tilde: float  # p~ = p_sel * p_use
    p_sel: float  # Bayes-UCB upper quantile of selection at this rank
    p_use: float  # posterior mean of usable-in-time given selected
    gain_ms: float
    price_ms: float  # C_s at the projected load it was last priced at
    utility_ms: float
    reason: str  # one of REASONS
    audit: bool = False
    reservation: Reservation | None = None
    # NOTE: True when p_sel (and so p_tilde and utility_ms) is an upper bound that was
    # enough to refuse the candidate, not its solved quantile (see Gate._score).
    bounded: bool = False

    @property
    def admitted(self) -> bool:
        return self.reservation is not None


@dataclass(frozen=True)
class GateConfig:
    """The gate's knobs. Every field is validated; defaults are the priced gate's."""

    policy: str = "priced"
    p_star: float = 0.5  # fixed_threshold and priced_a0_fixed only
    # NOTE: K, the most fills one branch entry may admit; a run passes its FillOptions.fanout,
    # and this default equals dynbranch.runtime.run.DEFAULT_FANOUT (a test keeps them equal).
    fanout: int = 2
    kv_budget_blocks: int | None = None  # global reservation capacity (None: the budget's)
    branch_kv_blocks: int | None = None  # per branch entry (None: no cap below the global)
    audit_rate: float = 0.02  # Action 1: chance a call admits its best refused candidate anyway
    generation_audit_rate: float = 0.05  # Action 0: chance a closed coordinate opens anyway
    seed: int = 0
    ucb_c: float = 0.0  # Bayes-UCB exponent c (Kaufmann et al. use c = 0 in practice)
    ucb_horizon: int | None = None  # T in (log T)^c; None: anytime (T = t)
    ucb_t0: int = 1  # decisions counted before the first (see _optimistic)
    sel_prior: tuple[float, float] = (1.0, 1.0)  # Beta prior of pi_sel (per stage, rank)
    use_prior: tuple[float, float] = (1.0, 1.0)  # Beta prior of pi_use (per stage)
    return_scale_ms: float = 100.0  # prior spread of a branch return (Action 0's bonus)
    idle_audits: bool = False  # scale Action 1's audit rate by the engines' idle share
    name: str = "gate"  # names the ledger that signs receipts

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"unknown gate policy {self.policy!r}; known: {POLICIES}")
        checks = {
            "p_star": 0.0 <= self.p_star <= 1.0,
            "fanout": self.fanout >= 0,
            "kv_budget_blocks": self.kv_budget_blocks is None or self.kv_budget_blocks >= 0,
            "branch_kv_blocks": self.branch_kv_blocks is None or self.branch_kv_blocks >= 0,
            "audit_rate": 0.0 <= self.audit_rate <= 1.0,
            "generation_audit_rate": 0.0 <= self.generation_audit_rate <= 1.0,
            "ucb_c": self.ucb_c >= 0.0,
            "ucb_horizon": self.ucb_horizon is None or self.ucb_horizon >= 1,
            "ucb_t0": self.ucb_t0 >= 0,
            "sel_prior": len(self.sel_prior) == 2 and min(self.sel_prior) > 0.0,
            "use_prior": len(self.use_prior) == 2 and min(self.use_prior) > 0.0,
            "return_scale_ms": self.return_scale_ms > 0.0,
        }
        bad = [f"{k}={getattr(self, k)!r}" for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"invalid GateConfig: {', '.join(bad)}")

    def to_state(self) -> dict[str, Any]:
        state = asdict(self)
        state["sel_prior"], state["use_prior"] = list(self.sel_prior), list(self.use_prior)
        return state

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> GateConfig:
        known = {f.name for f in fields(cls)}
        values = {k: v for k, v in state.items() if k in known}
        values["sel_prior"] = tuple(values["sel_prior"])
        values["use_prior"] = tuple(values["use_prior"])
        return cls(**values)


CONFIDENCE_BINS = 10
"""Selection arms per stage when the predictor reports probabilities (their deciles)."""


def selection_arm(rank: int, confidence: float | None) -> int | str:
    """Which selection posterior a candidate reads and teaches: its rank, or the decile of
    the predictor's own probability when it reports one (``"p0"`` … ``"p9"``).

    NOTE: DESIGN §3 keys pi_sel by rank only, as predictor scores are uncalibrated. A rank
    mixes branches where the predictor is sure with branches where it is not: on Routing's
    router branches half the decisions end the turn, and the logit model's second-ranked
    function is chosen 12 % of the time over all branches, but 4 % when its probability is
    under 0.1 and 24 % when it is 0.2-0.3 (``dynbranch.predictors.logit``). Keying by the
    decile keeps C3's rule (a Beta learnt online from what was chosen, read through
    Bayes-UCB; the probability itself is never used as p) while letting it tell the two
    apart. Measured on Routing's ``table2`` c2 cell (300 requests at 1 req/s, 4 engines,
    the logit predictor before it read the turn's words): by rank, c2 −7.6 % against the
    floor (1,961 fills, 333 consumed); by decile −10.8 % (1,286 fills, 344 consumed)."""
    if confidence is None:
        return rank
    return f"p{min(CONFIDENCE_BINS - 1, int(confidence * CONFIDENCE_BINS))}"


class _Optimism:
    """A candidate's ``(p~_sel, p_use)`` for one admit call, its quantile solved only when a
    decision needs it (:meth:`Gate._score`); the posterior and level are those it was read
    at, so the solve gives what an eager one would have."""

    __slots__ = ("alpha", "beta", "level", "p_use", "_p_sel")

    def __init__(self, posterior: BetaPosterior, level: float, p_use: float) -> None:
        self.alpha, self.beta, self.level, self.p_use = posterior.alpha, posterior.beta, level, p_use
        self._p_sel: float | None = None

    @property
    def solved(self) -> bool:
        return self._p_sel is not None

    @property
    def p_sel(self) -> float:
        """The Bayes-UCB upper quantile (solved once)."""
        if self._p_sel is None:
            self._p_sel = beta_quantile(self.alpha, self.beta, self.level)
        return self._p_sel

    def p_sel_bound(self) -> float:
        """A number never below :attr:`p_sel`, without solving."""
        return quantile_upper_bound(self.alpha, self.beta, self.level)


class _LastPrice:
    """A contention model that remembers its last price.

    A branch's candidates are the same stage's fills: they share one fill shape (in a
    Routing ``full`` replay every one of 1,942 branches had one shape), so at one load they
    share one price, which :meth:`ContentionModel.price_ms` would otherwise work out again
    for each of a router branch's 18 candidates. The price is a function of the shape's
    values and the view: an equal shape at the same view object is the same price.
    """

    __slots__ = ("_fill", "_price", "_view", "model")

    def __init__(self, model: ContentionModel) -> None:
        self.model = model
        self._fill: FillShape | None = None
        self._view: LoadView | None = None
        self._price = 0.0

    def price_ms(self, fill: FillShape, view: LoadView) -> float:
        if view is not self._view or not (fill is self._fill or fill == self._fill):
            self._fill, self._view = fill, view
            self._price = self.model.price_ms(fill, view)
        return self._price

    def __getattr__(self, name: str) -> Any:
        return getattr(self.model, name)


@dataclass
class _SelArm:
    """pi_sel at one (stage_key, rank), and how many admission decisions read it."""

    posterior: BetaPosterior
    decisions: int = 0


_COUNTERS = (
    "generation_decisions", "generation_opened", "generation_audits", "settled",
    "admit_calls", "candidates", *REASONS, "released", "observations",
)  # fmt: skip


class Gate:
    """C3: the two-level, load-priced admission gate (see the module doc)."""

    def __init__(self, model: ContentionModel, config: GateConfig | None = None) -> None:
        self.model = model
        self.config = config = config or GateConfig()
        self._policy: AdmissionPolicy = make_policy(config.policy, config.p_star)
        capacity = config.kv_budget_blocks
        self.ledger = KvLedger(
            config.name, model.budget.total_spec_kv_blocks if capacity is None else capacity
        )
        self._rng = random.Random(config.seed)
        self._sel: dict[tuple[str, int | str], _SelArm] = {}
        self._use: dict[str, BetaPosterior] = {}
        self._returns: dict[str, ReturnStats] = {}
        self.counters: dict[str, int] = dict.fromkeys(_COUNTERS, 0)

    @property
    def policy(self) -> str:
        """The policy's name: ``priced``, ``priced_a1_only``, ``fixed_threshold(p*=…)`` or
        ``priced_a0_fixed(p*=…)``."""
        return self._policy.name

    @property
    def reserved_blocks(self) -> int:
        return self.ledger.reserved

    # -- Action 0 --------------------------------------------------------------------------

    def generation(self, coordinate: str, now: float) -> GenerationDecision:
        """Whether to run the predictor for one entry of branch ``coordinate``."""
        _check_time(now)
        stats = self._returns.setdefault(coordinate, ReturnStats())
        stats.entries += 1
        self.counters["generation_decisions"] += 1
        estimate = stats.optimistic(self.config.return_scale_ms, self._stage_stats(coordinate))
        decision = GenerationDecision(self._policy.generation_open(estimate), estimate)
        if (
            not decision.open
            and self._policy.audits
            and self._draw(self.config.generation_audit_rate)
        ):
            decision = GenerationDecision(True, estimate, audit=True)
            self.counters["generation_audits"] += 1
        self.counters["generation_opened"] += decision.open
        return decision

    def settle(self, coordinate: str, ret: BranchReturn) -> None:
        """Learn one branch entry's full-path return (call once per opened entry)."""
        self._returns.setdefault(coordinate, ReturnStats()).add(ret.value_ms)
        self.counters["settled"] += 1

    def return_estimate(self, coordinate: str) -> float:
        """Action 0's current optimistic estimate for ``coordinate`` (ms)."""
        stats = self._returns.get(coordinate, ReturnStats())
        return stats.optimistic(self.config.return_scale_ms, self._stage_stats(coordinate))

    def _stage_stats(self, coordinate: str) -> ReturnStats:
        """The returns of every coordinate of ``coordinate``'s stage (``workflow/stage``).

        NOTE: merged on demand, in the coordinates' insertion order, so a gate restored
        from :meth:`state` computes bit-identical estimates (a stage has a few dozen steps).
        """
        stage = _stage_of(coordinate)
        pooled = ReturnStats()
        for coord, stats in self._returns.items():
            if _stage_of(coord) == stage:
                pooled.merge(stats)
        return pooled

    # -- Action 1 --------------------------------------------------------------------------

    def admit(
        self, coordinate: str, candidates: Sequence[Candidate], view: LoadView, now: float
    ) -> list[Admission]:
        """Decide every candidate of one branch entry; one :class:`Admission` each, in order.

        ``view`` is the load to price against (the envelope's :meth:`priced` view); the
        gate raises it to at least its own outstanding reservations before projecting.
        """
        _check_time(now)
        names = [c.name for c in candidates]
        if len(set(names)) != len(names):
            raise ValueError(f"branch {coordinate!r}: candidate names repeat: {names}")
        probs = {c.name: self._optimistic(c) for c in candidates}
        view = view.max(self._reservation_view())
        decided, admitted, final = self._greedy(coordinate, candidates, probs, view, now)
        if self._policy.audits and self.config.audit_rate > 0.0:
            self._audit(coordinate, candidates, decided, admitted, view, now, probs, final)
        self.counters["admit_calls"] += 1
        self.counters["candidates"] += len(candidates)
        out = [decided[n] for n in names]
        for a in out:
            self.counters[a.reason] += 1
        return out

    def _greedy(
        self,
        coordinate: str,
        candidates: Sequence[Candidate],
        probs: dict[str, _Optimism],
        view: LoadView,
        now: float,
    ) -> tuple[dict[str, Admission], list[Candidate], LoadView]:
        """Admit the best feasible positive candidate, project, re-price; repeat. Also
        returns the load the candidates left pending were last priced at."""
        decided: dict[str, Admission] = {}
        pending, admitted = list(candidates), []
        scores: dict[str, Score] = {}  # NOTE: the pending candidates' scores at ``view``
        prices = _LastPrice(self.model)
        while pending and len(admitted) < self.config.fanout:
            scores = {c.name: self._score(c, probs, view, prices=prices) for c in pending}
            ranked = sorted(
                ((scores[c.name], c) for c in pending),
                # NOTE: passing candidates first (for a fixed threshold, passing is not
                # implied by utility), then by utility, rank and name for a total order.
                key=lambda sc: (not sc[0].passes, -sc[0].utility_ms, sc[1].rank, sc[1].name),
            )
            chosen = None
            for score, c in ranked:
                if not score.passes:
                    break  # nothing after this one passes either
                pending.remove(c)
                receipt = self._reserve(coordinate, c, admitted, now)
                reason = NO_KV if receipt is None else ADMITTED
                decided[c.name] = self._admission(c, probs, score, reason, receipt)
                if receipt is not None:
                    chosen = c
                    break
            if chosen is None:
                break
            admitted.append(chosen)
            view = self._project(view, chosen)
            scores = {}
        for c in pending:  # priced at the final projected load
            # NOTE: a score depends on the candidate and the load only, so one ranked at
            # this load (nothing admitted since) is not scored again
            score = scores.get(c.name) or self._score(c, probs, view, prices=prices)
            reason = FANOUT if score.passes else self._policy.refusal
            decided[c.name] = self._admission(c, probs, score, reason, None)
        return decided, admitted, view

    def _audit(
        self,
        coordinate: str,
        candidates: Sequence[Candidate],
        decided: dict[str, Admission],
        admitted: list[Candidate],
        view: LoadView,
        now: float,
        probs: dict[str, _Optimism],
        final: LoadView,
    ) -> None:
        """Seeded audits: now and then admit the refused candidate closest to passing.

        One draw per call with a refused candidate: at rate ``audit_rate`` the refused
        candidate of highest utility is admitted anyway, if it still fits.

        NOTE: DESIGN §3 says audits *occasionally* admit a refused candidate so closed gates
        keep learning. Drawn once per refused candidate instead, a Routing router branch
        (18 candidates, most refused) was audited at a third of its branches: at 16 req/s,
        with every priced fill refused, audits alone issued 436 fills (14 consumed) and
        slowed the arm 7.9 % behind the floor. The candidate closest to passing is the one
        whose rate is worth learning: a candidate far below its threshold teaches a rate
        already known to be low.

        With ``idle_audits`` (a departure from DESIGN §3, off by default) the rate is scaled
        by the engines' idle share ``1 - busy``: an audit is an exploration fill the price
        refused, cheap on idle engines and pure queueing on saturated ones.

        NOTE: one draw per call that refused something, whether or not the candidate then
        fits: the RNG stream depends only on the decisions, so runs replay exactly.
        """
        rate = self.config.audit_rate * ((1.0 - view.busy) if self.config.idle_audits else 1.0)
        refused = [c for c in candidates if decided[c.name].reason == self._policy.refusal]
        if not refused or not self._draw(rate) or len(admitted) >= self.config.fanout:
            return
        prices = _LastPrice(self.model)
        for r in refused:  # NOTE: the closest to passing by the solved quantiles, not bounds
            if decided[r.name].bounded:
                score = self._score(r, probs, final, solve=True, prices=prices)
                decided[r.name] = self._admission(r, probs, score, decided[r.name].reason, None)
        c = max(refused, key=lambda r: (decided[r.name].utility_ms, -r.rank))
        receipt = self._reserve(coordinate, c, admitted, now)
        if receipt is not None:
            decided[c.name] = replace(decided[c.name], reason=AUDIT, audit=True,
                                      reservation=receipt)
            admitted.append(c)

    def _optimistic(self, c: Candidate) -> _Optimism:
        """``(p~_sel, p_use)`` for a candidate; counts one decision at its key.

        NOTE: with c = 0 Kaufmann's level 1 - 1/t is 0 at t = 1 (the posterior minimum);
        bandits escape that by pulling every arm once, which a gate cannot (a refused fill
        teaches pi_use nothing). Counting ``ucb_t0`` decisions before the first starts the
        level at the prior median (0.5 for t0 = 1) and lets it rise towards 1 as 1 - 1/t.
        """
        arm = self._sel_arm(c.stage_key, selection_arm(c.rank, c.confidence))
        arm.decisions += 1
        level = bayes_ucb_level(
            arm.decisions + self.config.ucb_t0, self.config.ucb_c, self.config.ucb_horizon
        )
        return _Optimism(arm.posterior, level, self._use_posterior(c.stage_key).mean)

    def _score(self, c: Candidate, probs: dict[str, _Optimism], view: LoadView, *,
               solve: bool = False, prices: ContentionModel | _LastPrice | None = None
               ) -> Score:
        """The candidate's score at ``view``.

        NOTE: a policy's verdict only rises with p (its utility's slope in p is
        ``G + C_s >= 0``; a threshold passes above p*), so a candidate that fails even at an
        upper bound of its quantile (:func:`~dynbranch.gate.beta.quantile_upper_bound`) fails
        at the quantile, and its Newton solve is skipped (the record then says ``bounded``).
        Every decision is the same as with the quantile solved: each candidate that passes,
        and each that an audit compares, is scored at its solved quantile. Most of a
        Routing router branch's 18 candidates sit in low-probability deciles and are refused
        this way: in a Routing ``full`` replay at 4 req/s, 3.7 % of the candidates' quantiles
        were solved over 1,000 requests and 11.8 % over 4,000 (the bound widens as log t);
        the replay ran 10 % faster at 1,000 requests and 3 % at 10,000 (side by side).

        ``prices`` is the model to price with (default :attr:`model`): the loops over one
        branch's candidates pass a :class:`_LastPrice` over it.
        """
        o = probs[c.name]
        model = self.model if prices is None else prices
        if not (solve or o.solved):
            score = self._policy.score(o.p_sel_bound() * o.p_use, c.gain_ms, c.shape, view,
                                       model)  # type: ignore[arg-type]
            if not score.passes:
                return score
        return self._policy.score(o.p_sel * o.p_use, c.gain_ms, c.shape, view,
                                  model)  # type: ignore[arg-type]

    def _admission(
        self,
        c: Candidate,
        probs: dict[str, _Optimism],
        score: Score,
        reason: str,
        receipt: Reservation | None,
    ) -> Admission:
        o = probs[c.name]
        p_sel = o.p_sel if o.solved else o.p_sel_bound()
        return Admission(
            c.name, c.rank, p_sel * o.p_use, p_sel, o.p_use, c.gain_ms,
            score.price_ms, score.utility_ms, reason, False, receipt, not o.solved,
        )  # fmt: skip

    def _reserve(
        self, coordinate: str, c: Candidate, admitted: list[Candidate], now: float
    ) -> Reservation | None:
        """The atomic reservation for ``c``, if the branch cap and the ledger allow it."""
        cap = self.config.branch_kv_blocks
        if cap is not None and sum(a.kv_blocks for a in admitted) + c.kv_blocks > cap:
            return None
        return self.ledger.try_reserve(coordinate, c.name, c.kv_blocks, now)

    def _project(self, view: LoadView, c: Candidate) -> LoadView:
        budget = self.model.budget
        return view.with_fill(
            1.0 / budget.total_fill_slots, c.kv_blocks / budget.total_spec_kv_blocks
        )

    def _reservation_view(self) -> LoadView:
        """The load the gate's own outstanding reservations amount to."""
        budget = self.model.budget
        fills = self.ledger.held / budget.total_fill_slots
        kv = self.ledger.reserved / budget.total_spec_kv_blocks
        return LoadView(min(1.0, fills), min(1.0, kv), 0.0)

    # -- the fill's life after admission ---------------------------------------------------

    def release(self, reservation: Reservation) -> bool:
        """Free a fill's KV reservation when it ends (consumed, cancelled or failed).

        Returns True when blocks were freed, False for a receipt already released (safe to
        call twice); raises :class:`ReservationError` for a receipt this gate never issued.
        """
        freed = self.ledger.release(reservation)
        self.counters["released"] += freed
        return freed

    def observe(
        self, stage_key: str, rank: int, selected: bool, usable: bool | None = None,
        confidence: float | None = None,
    ) -> None:
        """Learn from a resolved branch, once per candidate the predictor proposed.

        ``selected``: the branch chose this candidate (teaches ``pi_sel`` at its rank).
        ``usable``: for a selected candidate that was filled, whether the fill's result was
        usable in time (teaches ``pi_use``); None when it was not filled or not selected.
        """
        self._sel_arm(stage_key, selection_arm(rank, confidence)).posterior.update(selected)
        if selected and usable is not None:
            self._use_posterior(stage_key).update(usable)
        self.counters["observations"] += 1

    def _sel_arm(self, stage_key: str, rank: int | str) -> _SelArm:
        arm = self._sel.get((stage_key, rank))
        if arm is None:
            arm = self._sel[(stage_key, rank)] = _SelArm(BetaPosterior(*self.config.sel_prior))
        return arm

    def _use_posterior(self, stage_key: str) -> BetaPosterior:
        post = self._use.get(stage_key)
        if post is None:
            post = self._use[stage_key] = BetaPosterior(*self.config.use_prior)
        return post

    def _draw(self, rate: float) -> bool:
        return rate > 0.0 and self._rng.random() < rate

    # -- checkpoint --------------------------------------------------------------------------

    def state(self) -> dict[str, Any]:
        """Everything the gate knows, as plain JSON-able data (lists, dicts, numbers)."""
        version, internal, gauss = self._rng.getstate()
        return {
            "version": STATE_VERSION,
            "config": self.config.to_state(),
            "model": self.model.to_state(),
            "sel": [
                [k, r, *a.posterior.to_state(), a.decisions] for (k, r), a in self._sel.items()
            ],
            "use": [[k, *p.to_state()] for k, p in self._use.items()],
            "returns": [[coord, s.entries, s.n, s.mean, s.m2] for coord, s in self._returns.items()],
            "counters": dict(self.counters),
            "rng": [version, list(internal), gauss],
            "ledger": self.ledger.to_state(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> Gate:
        """The gate :meth:`state` describes; it decides exactly as the original would."""
        if state.get("version") != STATE_VERSION:
            raise ValueError(
                f"gate state version {state.get('version')!r}, expected {STATE_VERSION}"
            )
        gate = cls(
            ContentionModel.from_state(state["model"]), GateConfig.from_state(state["config"])
        )
        for key, rank, alpha, beta, decisions in state["sel"]:
            gate._sel[(key, rank)] = _SelArm(BetaPosterior(alpha, beta), decisions)
        for key, alpha, beta in state["use"]:
            gate._use[key] = BetaPosterior(alpha, beta)
        for coord, entries, n, mean, m2 in state["returns"]:
            gate._returns[coord] = ReturnStats(entries, n, mean, m2)
        gate.counters = dict(state["counters"])
        version, internal, gauss = state["rng"]
        gate._rng.setstate((version, tuple(internal), gauss))
        gate.ledger = KvLedger.from_state(state["ledger"])
        return gate


def _stage_of(coordinate: str) -> str:
    """``workflow/stage`` of a ``workflow/stage/step`` coordinate (itself without a step)."""
    head, _, step = coordinate.rpartition("/")
    return head if head and step.isdigit() else coordinate


def _check_time(now: float) -> None:
    if not math.isfinite(now):
        raise ValueError(f"time must be finite, got {now!r}")
