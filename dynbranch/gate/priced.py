"""C3 as a fill policy: the async adapter that drives the pure gate from C2.

:class:`PricedPolicy` is the :class:`~dynbranch.fill.speculator.FillPolicy` of the ``c2`` and
``full`` arms. Per branch entry it asks the gate's Action 0 whether to predict at all, turns
the predictor's ranking into priced :class:`~dynbranch.gate.Candidate` s (expected saving
``Ĝ`` in ms, fill shape, KV blocks) — every candidate the predictor ranked, none cut — and
starts the fills Action 1 admits with their atomic KV reservations. It learns what the gate
needs online, from what the run measures:

* ``Ĝ`` = min(branch resolution time, fill execution time) per decision stage (eq. 2), as
  exponentially weighted means of observed branch windows and completed fills;
* fill shapes from the token counts of past speculative stages;
* the load envelope (eq. 3) from every engine's load snapshot, read at each branch and by a
  periodic probe that keeps it current while gates are closed; its window ``H`` is the
  measured co-residency window, the mean lifetime of the fills that ran to the end.

When a fill ends (done, stopped, failed or cancelled) its reservation is released at once
and the load it ran under is kept. When its request ends, each branch entry reports, per
ranked candidate, whether it was selected and whether its fill was used in time (the rank
and usability posteriors), and settles one aggregate return (Action 0, DESIGN §3 eq. 4):

``R_b = Σ Ĝ^Δ − T_setup − K̂_b − Ŵ_b``, with ``Ĝ^Δ`` the execution each consumed fill
spared canonical stages (of any request) after C1, ``T_setup`` the run-clock time from the
branch's opening to its fills' start (prediction, drafting and admission), ``K̂_b`` the
contention price of the work the entry's fills really did (their tokens) at the load they
ran under, and ``Ŵ_b`` the time canonical stages waited on those fills, served or not.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynbranch.engines.profile import load_profile
from dynbranch.engines.protocol import LoadSnapshot
from dynbranch.fill import BranchSession, Fill, FillChoice, FillPolicy, Ranked
from dynbranch.fill.speculator import HistoryBranch
from dynbranch.gate import (
    Admission,
    BranchReturn,
    Candidate,
    ContentionModel,
    FillShape,
    Gate,
    GateConfig,
    LoadBudget,
    LoadEnvelope,
    LoadView,
    Observation,
    Settlement,
)
from dynbranch.gate.client import GateClient, LocalGateClient
from dynbranch.runtime.run import RunContext
from dynbranch.workflow import BranchCoordinate

PROBE_S = 0.05
"""Period of the load probe, in seconds on the run clock."""
PRIOR_GAIN_MS = 500.0
"""Optimistic saving assumed for a decision stage before anything was measured there."""
PRIOR_SHAPE = FillShape(prompt_tokens=512, output_tokens=64)
PRIOR_WINDOW_S = 2.0
"""``H`` before any fill has run to its end (then the measured co-residency window)."""


class _Ewma:
    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha, self.value = alpha, None

    def add(self, x: float) -> None:
        self.value = x if self.value is None else self.value + self.alpha * (x - self.value)


@dataclass
class _Entry:
    """One branch entry the gate decided on, until its request is done."""

    session: BranchSession
    stage_key: str
    ranked: list[Ranked] = field(default_factory=list)
    admitted: dict[str, Admission] = field(default_factory=dict)
    chosen: tuple[str, ...] = ()
    resolved_after_s: float | None = None


class PricedPolicy(FillPolicy):
    """Action 0 and Action 1 of C3 around one :class:`~dynbranch.gate.Gate`."""

    name = "priced"

    def __init__(self, run: RunContext, gate: GateClient, budget: LoadBudget,
                 model: ContentionModel, window_s: float = PRIOR_WINDOW_S) -> None:
        self.run, self.gate, self.budget, self.model = run, gate, budget, model
        self.name = gate.policy
        self.envelope = LoadEnvelope(window_s)
        self._window: dict[str, _Ewma] = {}
        self._exec: dict[str, _Ewma] = {}
        self._tokens: dict[str, tuple[_Ewma, _Ewma]] = {}
        self._lifetime = _Ewma()
        self._ran_under: dict[str, LoadView] = {}  # fill id -> the load it ran under
        self._entries: dict[str, list[_Entry]] = {}
        self._probe: asyncio.Task | None = None
        self._load_seen = False  # whether the envelope has had one load reading
        self.counts = {"entries": 0, "opened": 0, "admitted": 0, "refused": 0, "audits": 0,
                       "history_observations": 0}

    @classmethod
    def for_run(cls, run: RunContext) -> PricedPolicy:
        """A policy over a new gate for ``run``'s :class:`~dynbranch.runtime.run.GateOptions`:
        in process, or the backend's central gate if it has one."""
        options = run.gate
        profile = load_profile(options.profile)
        budget = LoadBudget.from_profile(profile, engines=options.engines)
        model = ContentionModel.from_profile(profile, budget)
        config = GateConfig(policy=options.policy.replace("-", "_"), p_star=options.p_star,
                            fanout=run.fill.fanout, seed=options.seed)
        client = (run.make_gate(model, config) if run.make_gate
                  else LocalGateClient(Gate(model, config)))
        return cls(run, client, budget, model)

    # -- Action 0 -------------------------------------------------------------------------

    @property
    def decides_at_once(self) -> bool:
        """Whether the gate answers Actions 0 and 1 in one round trip (a remote gate)."""
        return self.gate.batches_decisions

    async def generation(self, session: BranchSession) -> bool:
        self._start_probe(session)
        self.counts["entries"] += 1
        decision = await self.gate.generation(str(session.point.coordinate), session.now())
        if decision.open:
            self._opened(session)
        return decision.open

    def _opened(self, session: BranchSession) -> _Entry:
        self.counts["opened"] += 1
        entry = _Entry(session, _stage_key(session))
        self._entries.setdefault(session.request_id, []).append(entry)
        return entry

    async def decide(self, session: BranchSession,
                     ranked: Sequence[Ranked]) -> list[FillChoice] | None:
        """Actions 0 and 1 in one gate call, priced against the load envelope as the probe
        keeps it. NOTE: unlike :meth:`choose`, no fresh load read first (it would be one
        more round trip per branch, to every engine); the probe observes every
        :data:`PROBE_S`, and the first entry of a run waits for one reading."""
        self._start_probe(session)
        self.counts["entries"] += 1
        if not self._load_seen:
            await self._observe_load(session)
        now = session.now()
        stage_key = _stage_key(session)
        candidates = [self._candidate(stage_key, c) for c in ranked]
        decision = await self.gate.decide(str(session.point.coordinate), candidates,
                                          self.envelope.priced(now), now)
        if not decision.generation.open:
            return None
        entry = self._opened(session)
        entry.ranked = list(ranked)
        return self._choices(entry, decision.admissions)

    # -- Action 1 -------------------------------------------------------------------------

    async def choose(self, session: BranchSession,
                     ranked: Sequence[Ranked]) -> list[FillChoice]:
        entry = self._entry(session)
        entry.ranked = list(ranked)
        await self._observe_load(session)
        now = session.now()
        candidates = [self._candidate(entry.stage_key, c) for c in entry.ranked]
        admissions = await self.gate.admit(str(session.point.coordinate), candidates,
                                           self.envelope.priced(now), now)
        return self._choices(entry, admissions)

    def _choices(self, entry: _Entry, admissions: Sequence[Admission]) -> list[FillChoice]:
        choices = []
        for a in admissions:
            if a.admitted:
                entry.admitted[a.candidate] = a
                self.counts["audits" if a.audit else "admitted"] += 1
                choices.append(FillChoice(a.candidate, a.rank, a.reservation,
                                          on_end=self._fill_ended))
            else:
                self.counts["refused"] += 1
        return choices

    def _candidate(self, stage_key: str, ranked: Ranked) -> Candidate:
        shape = self._shape(stage_key)
        return Candidate(ranked.name, ranked.rank, stage_key, self._gain_ms(stage_key), shape,
                         shape.kv_blocks(self.budget.block_size), ranked.confidence)

    def _gain_ms(self, stage_key: str) -> float:
        window = self._window.get(stage_key)
        exec_ = self._exec.get(stage_key)
        if window is None or window.value is None or exec_ is None or exec_.value is None:
            return PRIOR_GAIN_MS
        return 1e3 * min(window.value, exec_.value)  # eq. 2's min(T_gen, T_exec)

    def _shape(self, stage_key: str) -> FillShape:
        prompt, output = self._tokens.get(stage_key, (None, None))
        if prompt is None or prompt.value is None:
            return PRIOR_SHAPE
        return FillShape(max(1, int(prompt.value)), max(1, int(output.value)))

    # -- a fill's end -----------------------------------------------------------------------

    async def _fill_ended(self, fill: Fill) -> None:
        """Release the fill's reservation now, and keep the load it ran under."""
        self._ran_under[fill.fill_id] = self.envelope.priced(self.run.clock.now())
        if fill.state == "done" and fill.ended_at is not None:
            self._lifetime.add(fill.ended_at - fill.started_at)
            self.envelope.set_window(self._lifetime.value)
        if fill.reservation is not None:
            await self.gate.release([fill.reservation])

    # -- learning -------------------------------------------------------------------------

    def settled(self, session: BranchSession, chosen: tuple[str, ...]) -> None:
        entry = self._entry(session, create=False)
        elapsed = session.now() - session.opened_at
        self._window.setdefault(_stage_key(session), _Ewma()).add(elapsed)
        if entry is not None:
            entry.chosen, entry.resolved_after_s = chosen, elapsed

    learns_history = True

    async def learn_history(self, branches: Sequence[HistoryBranch]) -> None:
        """Teach the gate's selection rates what the train split's branches chose among
        the candidates the predictor ranked at each (one batched call).

        NOTE: DESIGN §3 learns pi_sel online only, from a Beta(1, 1) prior, so a run spends
        its first hundred-odd branches filling at optimistic rates: on Routing the lowest
        decile is chosen 4 % of the time but read near the prior's 0.5 until enough of its
        branches have resolved. The train split the predictor already learns from (never a
        measured record) says the same before the run. pi_use (was a chosen fill used in time) and
        Action 0's returns need fills to run and still start at their priors. Only for a
        predictor that ranks each train branch out of sample (it learns the split online,
        :attr:`~dynbranch.predictors.base.Predictor.in_sample_on_train`). Measured, c2 with
        the predictor trained on the whole train split: Routing's ``table2`` cell (300
        requests at 1 req/s) 16.10 → 15.99 s (959 → 810 fills, 376 → 379 consumed);
        ``fig8``'s quick commodity Routing cell (24 requests) 18.12 → 17.25 s (171 → 80
        fills, 32 → 35 consumed). ReAct's entity ranker was fitted on the train split and
        ranks it in sample: warm-started from those rankings, its 24-request cell was 0.8 %
        slower. Sub-Agent's sub-topic predictor ranks each train branch against the plans
        observed before it, out of sample, so it is warm-started: ``table2``'s Sub-Agent c2
        cell 30.70 → 30.72 s, ``fig8``'s commodity at-load Sub-Agent ``full`` −4.1 → −3.5 %
        against the floor, and with ``--plan references`` (100 requests) 45.91 → 44.47 s.
        """
        observations = [
            Observation(_key_of(point.coordinate), c.rank, c.name in chosen, None, c.confidence)
            for point, ranked, chosen in branches for c in ranked
        ]
        self.counts["history_observations"] = len(observations)
        if observations:
            await self.gate.learn(observations, [])

    async def request_done(self, request_id: str, fills: Sequence[Fill]) -> None:
        """Teach the gate what each of the request's branch entries turned out to be (one
        batched call). Every fill has ended, so every reservation is already back."""
        observations: list[Observation] = []
        settlements: list[Settlement] = []
        for entry in self._entries.pop(request_id, []):
            settlements.append(self._settle(entry, observations))
        for fill in fills:
            self._ran_under.pop(fill.fill_id, None)
        if observations or settlements:
            await self.gate.learn(observations, settlements)

    def _settle(self, entry: _Entry, observations: list[Observation]) -> Settlement:
        fills = {f.candidate: f for f in entry.session.fills}
        for c in entry.ranked:
            fill = fills.get(c.name)
            selected = c.name in entry.chosen
            # NOTE: a covered fill (it executed nothing: the store held all it reached) says
            # nothing of whether a fill here is usable in time
            usable = (fill.consumed if (fill is not None and selected and not fill.covered)
                      else None)
            observations.append(
                Observation(entry.stage_key, c.rank, selected, usable, c.confidence))
        saved = waits = cost = 0.0
        for fill in entry.session.fills:
            self._learn_from(entry.stage_key, fill)
            saved += 1e3 * fill.saved_s
            waits += 1e3 * fill.waited_s
            cost += self._cost_ms(entry, fill)
        return Settlement(str(entry.session.point.coordinate),
                          BranchReturn(saved_ms=saved, setup_ms=1e3 * entry.session.setup_s,
                                       fill_cost_ms=cost, wait_ms=waits))

    def _learn_from(self, stage_key: str, fill: Fill) -> None:
        done = fill.state == "done" and fill.ended_at is not None
        if done:
            self._exec.setdefault(stage_key, _Ewma()).add(fill.ended_at - fill.started_at)
        generated = [s for s in fill.trace if s.kind == "llm" and s.done]
        # NOTE: a fill that ran to its end on tools alone teaches a shape of no engine work
        # (priced near zero), so a stage whose fills are lookups is not priced forever at
        # the prior shape of an LLM call.
        if generated or (done and not any(s.kind == "llm" for s in fill.trace)):
            prompt, output = self._tokens.setdefault(stage_key, (_Ewma(), _Ewma()))
            prompt.add(sum(s.prompt_tokens for s in generated))
            output.add(sum(s.output_tokens for s in generated))

    def _cost_ms(self, entry: _Entry, fill: Fill) -> float:
        """``K̂`` of one fill: the contention price of the work it did that no canonical
        stage was served, at the load it ran under.

        NOTE: a stage a canonical stage was served (shadow or join) is work that stage
        would have done itself, on the same engines, so it adds no contention; eq. 5
        charges a fill's price only when it is not consumed, ``(1 - p) C_s``, and this
        keeps eq. 4's return consistent with it. Charging consumed stages too counted each
        hit's work twice: on Routing's ``fig14`` cell at 4 req/s (480 requests) Action 0
        then closed 34 % of first-decision entries whose fills paid, and ``full`` ran
        23.67 s against 22.97 s with Action 0 off. A fill that generated nothing to the end
        (stopped early, cancelled mid-decode) is charged the shape it was admitted with:
        what it was expected to cost, an upper bound of what it did."""
        served = {c.reuse_name for c in fill.consumptions if c.served}
        llm = [s for s in fill.trace if s.kind == "llm"]
        wasted = [s for s in llm if s.done and s.claimed not in served]
        if wasted:
            shape = FillShape(max(1, sum(s.prompt_tokens for s in wasted)),
                              max(1, sum(s.output_tokens for s in wasted)))
        elif (not any(s.done for s in llm) and any(s.claimed for s in llm)
              and fill.candidate in entry.admitted):
            shape = self._shape(entry.stage_key)
        else:
            return 0.0  # nothing it ran on an engine went unused
        view = self._ran_under.get(fill.fill_id, LoadView())
        return self.model.price_ms(shape, view)

    # -- load -----------------------------------------------------------------------------

    async def _observe_load(self, session: BranchSession) -> None:
        await self._observe(session.load_reader)

    async def _observe(self, loads: Callable[[], Awaitable[list[LoadSnapshot]]]) -> None:
        snapshots = await loads()
        self.envelope.observe(LoadView.from_snapshots(snapshots, self.budget),
                              self.run.clock.now())
        self._load_seen = True

    def _start_probe(self, session: BranchSession) -> None:
        if self._probe is None or self._probe.done():
            self._probe = asyncio.get_running_loop().create_task(
                self._probe_loop(session.load_reader))

    async def _probe_loop(self, loads: Callable[[], Awaitable[list[LoadSnapshot]]]) -> None:
        # NOTE: the pool's reader, not the session: the probe outlives the request.
        while True:
            await self._observe(loads)
            await self.run.clock.sleep(PROBE_S)

    def _entry(self, session: BranchSession, create: bool = True) -> _Entry | None:
        for entry in self._entries.get(session.request_id, []):
            if entry.session is session:
                return entry
        if not create:
            return None
        entry = _Entry(session, _stage_key(session))
        self._entries.setdefault(session.request_id, []).append(entry)
        return entry

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "window_s": round(self.envelope.window_s, 6)}

    async def snapshot(self) -> dict[str, Any]:
        gate = await self.gate.stats()
        return {**self.stats(), "reserved_blocks": gate.pop("reserved_blocks", 0), "gate": gate}

    def close(self) -> None:
        if self._probe is not None:
            self._probe.cancel()


def _stage_key(session: BranchSession) -> str:
    return _key_of(session.point.coordinate)


def _key_of(c: BranchCoordinate) -> str:
    return f"{c.workflow}/{c.stage}"
