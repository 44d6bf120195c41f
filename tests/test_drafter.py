"""The drafter predictor: votes, seeding, branch-time only, online learning, engine drafting."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest

from dynbranch.arms.registry import get_arm
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.clock import VirtualClock
from dynbranch.engines.protocol import SPECULATIVE, GenerateRequest, GenerateResult
from dynbranch.orchestrator import Orchestrator
from dynbranch.predictors import BranchContext, make_predictor
from dynbranch.predictors.base import EVIDENCE_KEY
from dynbranch.predictors.drafter import (
    DrafterConfig,
    DrafterPredictor,
    _evidence_words,
    parse_vote,
    rank_by_votes,
    render_prompt,
)
from dynbranch.runtime.run import FillOptions, GateOptions, RunContext
from dynbranch.workflow import BranchCoordinate, BranchPoint
from dynbranch.workload import DataConfig, RequestInstance
from tests.toy import KEYS, ToyRequest
from workloads.analysis.drafter import drafter_accuracy
from workloads.analysis.trace import trace_request
from workloads.routing.request import RouterEvidence

NAMES = ("alpha", "beta", "gamma", "delta")


def _ctx(request_id="r0", stage="pick", step=0, candidates=NAMES, **evidence) -> BranchContext:
    return BranchContext(request_id, BranchCoordinate("synthetic", stage, step),
                         tuple(candidates), evidence)


def _result(request: GenerateRequest, text: str, arrived: float, finished: float,
            engine: str = "fake") -> GenerateResult:
    return GenerateResult(request.request_id, text, len(request.prompt.split()), 2, 0, "stop",
                          arrived, arrived, arrived, finished, engine_id=engine)


class FakeDrafterEngine:
    """A ``generate`` callable: records each call, sleeps on the clock, answers ``answer``
    (the call's ``replay_text`` when ``answer`` is None, as the sim engine does)."""

    def __init__(self, clock: VirtualClock, answer=None, step_s: float = 0.01) -> None:
        self.clock, self.answer, self.step_s = clock, answer, step_s
        self.calls: list[GenerateRequest] = []

    async def __call__(self, request: GenerateRequest) -> GenerateResult:
        self.calls.append(request)
        arrived = self.clock.now()
        await self.clock.sleep(self.step_s * len(self.calls))
        text = request.replay_text if self.answer is None else self.answer(request)
        return _result(request, text, arrived, self.clock.now())


# -- votes ------------------------------------------------------------------------------------


def test_votes_rank_by_count_and_ties_break_by_prior_then_position():
    votes = ["beta", "alpha", "beta", "gamma", "alpha", "elsewhere"]
    assert rank_by_votes(votes, NAMES) == ["alpha", "beta", "gamma"]  # tie: pool order
    assert rank_by_votes(votes, NAMES, prior=[0.1, 0.5, 0.3, 0.1]) == ["beta", "alpha", "gamma"]
    assert rank_by_votes(votes, NAMES, pad=True) == ["alpha", "beta", "gamma", "delta"]
    assert rank_by_votes(votes, NAMES, prior=[0.1, 0.1, 0.1, 0.7], pad=True)[-1] == "delta"
    assert rank_by_votes([], NAMES) == []


def test_engine_text_is_parsed_into_a_candidate():
    assert parse_vote(" beta\n", NAMES) == "beta"
    assert parse_vote("I would pick Gamma, then alpha.", NAMES) == "gamma"
    assert parse_vote("alphabet soup", ("alpha", "alphabet")) == "alphabet"  # longer wins
    assert parse_vote("none of them", NAMES) is None


def test_config_ranges_are_checked():
    for bad in ({"samples": 0}, {"temperature": 0.0}, {"learning_rate": -1.0}, {"l2": -0.1},
                {"max_tokens": 0}, {"max_context_chars": -1}):
        with pytest.raises(ValueError):
            DrafterConfig(**bad)
    with pytest.raises(ValueError, match="either"):
        DrafterPredictor(DrafterConfig(), samples=4)
    assert isinstance(make_predictor("drafter", samples=4), DrafterPredictor)


# -- determinism and branch-time only ---------------------------------------------------------


def _history(p: DrafterPredictor) -> DrafterPredictor:
    rng = random.Random(7)
    for i in range(30):
        p.observe(_ctx(f"h{i}"), (rng.choice(NAMES[:2]),))
    return p


def test_rank_is_seeded_and_deterministic():
    a, b = _history(DrafterPredictor(seed=3)), _history(DrafterPredictor(seed=3))
    contexts = [_ctx(f"q{i}") for i in range(20)]
    assert [a.rank(c, 4) for c in contexts] == [b.rank(c, 4) for c in contexts]
    assert [a.rank(c, 4) for c in contexts] == [a.rank(c, 4) for c in contexts]  # no drift
    other = _history(DrafterPredictor(seed=4))
    assert [a.sample(c)[2] for c in contexts] != [other.sample(c)[2] for c in contexts]


class _Pick(RequestInstance):
    """One branch whose evidence is known at branch time and whose outcome is ``future``."""

    template = ToyRequest.template

    def __init__(self, future: str) -> None:
        self.request_id, self.future = "pick-0", future

    async def run(self, ctx):
        point = BranchPoint(BranchCoordinate("synthetic", "pick", 0), NAMES,
                            evidence={"question": "which one is like beta or gamma?"})
        async with ctx.branch(point) as branch:
            branch.resolve(self.future)

    def tool(self, name):
        raise KeyError(name)

    def replay_text(self, rendered):
        return None

    def score(self, outcome):
        return 1.0


def test_the_ranking_does_not_depend_on_the_branch_outcome():
    ranked = []
    for future in NAMES:
        (point, chosen), = trace_request(_Pick(future)).branches
        assert chosen == (future,)
        ctx = BranchContext.of("pick-0", point)
        p = _history(DrafterPredictor(seed=1))
        clock = VirtualClock()
        engine = FakeDrafterEngine(clock)
        draft = clock.run(p.draft(ctx, 4, engine, now=clock.now))
        assert {c.replay_text for c in engine.calls} <= set(NAMES)
        ranked.append((p.rank(ctx, 4), draft.ranked, draft.samples))
    assert all(r == ranked[0] for r in ranked)  # the same whatever the future holds


# -- learning ---------------------------------------------------------------------------------


def _patterned_stream(n: int, seed: int = 0):
    """Requests of two decisions at one stage: the first takes the candidate the question
    names (among shuffled candidates), the second the successor of the first."""
    rng = random.Random(seed)
    for i in range(n):
        order = rng.sample(NAMES, len(NAMES))
        first = rng.choice(NAMES)
        noise = rng.sample(["red", "green", "blue", "small", "large"], 2)
        yield _ctx(f"s{i}", "pick", 0, order, question=f"the {noise[0]} {first} {noise[1]}"), first
        follow = NAMES[(NAMES.index(first) + 1) % len(NAMES)]
        yield _ctx(f"s{i}", "pick", 1, rng.sample(NAMES, len(NAMES))), follow


def _top1(p: DrafterPredictor, stream) -> float:
    hits = []
    for ctx, chosen in stream:
        hits.append(p.rank(ctx, 1) == [chosen])
        p.remember(ctx, (chosen,))  # what the next branch may know, without learning
    return sum(hits) / len(hits)


def test_learning_online_improves_top1_on_a_patterned_stream():
    cold = _top1(DrafterPredictor(seed=0), _patterned_stream(50, seed=1))
    p = DrafterPredictor(seed=0)
    for ctx, chosen in _patterned_stream(100, seed=0):
        p.observe(ctx, (chosen,))
    assert p.model.learned == 200
    learned = _top1(p, _patterned_stream(50, seed=1))
    assert cold < 0.5 and learned >= 0.9


def test_drafter_accuracy_on_the_hci_fixture():
    from workloads.hci import HCIWorkload

    fixture = Path(__file__).parent / "fixtures" / "sgd"
    report = drafter_accuracy(HCIWorkload(root=fixture), DataConfig(None, Path("/nonexistent")))
    assert (report.workload, report.branches, report.train_branches) == ("hci", 4, 2)
    assert 0.0 <= report.top1 <= report.top3 <= 1.0
    assert report.baseline == "frequency" and report.samples == 8


# -- drafting on an engine --------------------------------------------------------------------


def test_draft_calls_generate_n_times_speculatively_and_measures_setup():
    p = _history(DrafterPredictor(samples=8, seed=2))
    ctx = _ctx("d0", question="alpha or beta?")
    clock = VirtualClock()
    engine = FakeDrafterEngine(clock, step_s=0.01)
    draft = clock.run(p.draft(ctx, 3, engine, now=clock.now))
    assert len(engine.calls) == 8 and len({c.request_id for c in engine.calls}) == 8
    assert all(c.priority == SPECULATIVE for c in engine.calls)
    assert len({c.prompt for c in engine.calls}) == 1 and "alpha or beta?" in engine.calls[0].prompt
    assert all(1 <= c.max_tokens <= 4 for c in engine.calls)  # a few tokens: one name
    assert all(c.session == "d0" for c in engine.calls)
    assert draft.setup_s == pytest.approx(0.08)  # concurrent: the slowest of the 8 calls
    assert draft.samples == tuple(c.replay_text for c in engine.calls)
    assert draft.engine_votes == 8 and draft.output_tokens == 16
    assert list(draft.ranked) == p.rank(ctx, 3)  # the engine echoed the choice model


def test_a_real_engines_text_is_the_vote_and_unparsed_text_falls_back():
    p = DrafterPredictor(samples=4, seed=0)
    ctx = _ctx("d1")
    clock = VirtualClock()
    picks = iter(["gamma", "I think gamma", "???", "delta."])
    engine = FakeDrafterEngine(clock, answer=lambda _r: next(picks))
    draft = clock.run(p.draft(ctx, 4, engine))
    assert draft.samples[:2] == ("gamma", "gamma") and draft.samples[3] == "delta"
    assert draft.samples[2] == engine.calls[2].replay_text  # the choice model stands in
    assert draft.engine_votes == 3 and draft.ranked[0] == "gamma"
    assert draft.setup_s == pytest.approx(0.04)  # engine times when no clock is given


def test_a_thinking_drafter_reasons_before_its_answer():
    p = DrafterPredictor(samples=2, seed=0, think_tokens=40)
    ctx = _ctx("d2")
    clock = VirtualClock()
    engine = FakeDrafterEngine(clock)
    draft = clock.run(p.draft(ctx, 2, engine))
    texts = [c.replay_text for c in engine.calls]
    assert all(t.startswith("<think>") and t.count(" .") == 40 for t in texts)
    assert draft.samples == tuple(t.rsplit("</think>", 1)[1] for t in texts)
    assert all(c.max_tokens > 40 for c in engine.calls)
    assert parse_vote("<think>alpha? no.</think> gamma", NAMES) == "gamma"


def test_the_replays_drafter_settings_reach_the_drafter():
    from dynbranch.driver import ReplayConfig, run_options

    cfg = ReplayConfig(predictor="drafter", drafter_samples=3, drafter_think_tokens=64, seed=5,
                       fanout=3, depth=2)  # as prepare() resolves them
    options = run_options(cfg, "logit").fill.predictor_options
    assert options == {"samples": 3, "seed": 5, "think_tokens": 64}
    p = make_predictor("drafter", **options)
    assert p.config.think_tokens == 64 and p.config.samples == 3
    plain = ReplayConfig(drafter_think_tokens=64, fanout=3, depth=2)
    assert run_options(plain, "logit").fill.predictor_options == {}


# -- end to end: the Speculator drafts on the drafter engine ----------------------------------


def _record_calls(client, log: list) -> None:
    """Keep every (request, result) the engine client serves."""
    generate = client.generate

    async def recorded(request):
        result = await generate(request)
        log.append((request, result))
        return result

    client.generate = recorded


def _run_toy_with_drafter(requests, gate="topk", samples=8, arm="c2"):
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", "qwen3-8b@rtx4090", 2),
                                   "drafter": EngineSpec("sim", "qwen3-0.6b@h200", 1)})
    calls: dict[str, list] = {"target": [], "drafter": []}

    async def main():
        await backend.start()
        try:
            for role, clients in backend.clients().items():
                for client in clients:
                    _record_calls(client, calls[role])
            run = RunContext(clock=clock, arm="c2", models=backend.models(),
                             fill=FillOptions(fanout=3, predictor="drafter",
                                              predictor_options={"samples": samples}),
                             gate=GateOptions(policy=gate, engines=2,
                                              profile="qwen3-8b@rtx4090"),
                             make_store=lambda: backend.make_store(1 << 26))
            orch = Orchestrator(clock, backend.clients(), get_arm(arm), run=run)
            learned = _record_settlements(orch)
            t0 = orch.start_run()

            async def one(i, req):
                await clock.sleep_until(t0 + 2.0 * i)
                return await orch.run_request(req, 2.0 * i)

            records = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
            await orch.finish_run()
            loads = [await c.load() for cs in backend.clients().values() for c in cs]
            return records, orch, loads, learned
        finally:
            await backend.shutdown()

    records, orch, loads, learned = clock.run(main())
    orch.settlements = learned
    return records, orch, loads, calls


def _record_settlements(orch) -> list:
    """Keep the Action 0 returns the priced policy settles (none under ``topk``)."""
    out: list = []
    gate = getattr(orch.branch_hook.policy, "gate", None)
    if gate is not None:
        learn = gate.learn

        async def recorded(observations, settlements):
            out.extend(settlements)
            return await learn(observations, settlements)

        gate.learn = recorded
    return out


def test_the_speculator_drafts_on_the_drafter_engine_beside_the_canonical_path():
    records, orch, loads, calls = _run_toy_with_drafter(
        [ToyRequest(i, context_words=1500) for i in range(6)])
    assert [r.status for r in records] == ["completed"] * 6
    assert [r.correct for r in records] == [1.0] * 6
    spec = orch.branch_hook
    assert spec.drafting["drafts"] == 6 and spec.drafting["samples"] == 48
    assert spec.drafting["late"] == 0
    # every draft call ran on the 0.6B drafter, at speculative priority, and none elsewhere
    assert len(calls["drafter"]) == 48
    assert all(q.request_id.startswith("draft/") and q.priority == SPECULATIVE
               and res.engine_id == "sim-drafter-0" for q, res in calls["drafter"])
    assert not any(q.request_id.startswith("draft/") for q, _ in calls["target"])
    setup = {}
    for r in records:
        mine = [res for q, res in calls["drafter"] if q.session == r.request_id]
        setup[r.request_id] = max(x.finished_at for x in mine) - min(x.arrived_at for x in mine)
        assert 0.004 < setup[r.request_id] < 0.5  # engine time on the 0.6B profile
        plan = next(s for s in orch.log.stages if s.request_id == r.request_id
                    and s.stage == "plan" and not s.speculative)
        assert plan.start == pytest.approx(r.start)  # drafting never delayed the decision
        fills = [s for s in orch.log.stages if s.request_id == r.request_id and s.speculative]
        assert all(s.start >= r.start + setup[r.request_id] - 1e-9 for s in fills)
    assert spec.drafting["drafting_s"] == pytest.approx(sum(setup.values()))
    assert all(load.running == load.waiting == 0 for load in loads)
    issued = orch.mechanism_stats["speculation"]["fills"]["issued"]
    assert issued == spec.counts["candidates"] and issued >= 6
    assert {s.fill for s in orch.log.stages if s.speculative} <= set(KEYS)
    assert orch.mechanism_stats["speculation"]["drafting"]["samples"] == 48


def test_the_priced_gate_charges_drafting_time_to_action_0():
    records, orch, _loads, calls = _run_toy_with_drafter(
        [ToyRequest(i, context_words=1500) for i in range(4)], gate="priced")
    assert [r.status for r in records] == ["completed"] * 4
    spec = orch.branch_hook
    assert spec.drafting["failed"] == 0 and spec.drafting["drafts"] >= 1
    assert orch.mechanism_stats["speculation"]["fills"]["issued"] >= 1  # loads priced fine
    setups = [s.ret.setup_ms for s in orch.settlements]
    assert len(setups) == spec.counts["generated"] and all(s > 4.0 for s in setups)
    assert sum(setups) == pytest.approx(1e3 * spec.drafting["drafting_s"])


def test_a_baseline_with_its_own_fill_budgets_drafts_beside_the_decision_too():
    # dsp bounds each fill by its learned k through the fill choice, so it needs nothing of
    # the fills as opened() returns and drafts beside the decision like every arm
    records, orch, _loads, calls = _run_toy_with_drafter(
        [ToyRequest(i, context_words=1500) for i in range(4)], arm="dsp")
    assert [r.status for r in records] == ["completed"] * 4
    drafted = {q.session for q, _ in calls["drafter"]}
    assert drafted and orch.branch_hook.drafting["drafts"] == len(drafted)
    for r in records:
        if r.request_id in drafted:
            plan = next(s for s in orch.log.stages if s.request_id == r.request_id
                        and s.stage == "plan" and not s.speculative)
            assert plan.start == r.start  # the decision did not wait for the draft


class _Index:
    """An object a predictor reads from the evidence (ReAct's passage index)."""


def test_the_prompt_holds_the_evidence_text_and_no_object_whatever_its_address():
    """An object in the evidence is left out of the drafter's prompt: rendered, its repr
    held its memory address, so the prompt's tokens (and every later time of a run) varied
    with where it landed. A set comes out sorted."""
    def prompt(index: _Index) -> str:
        ctx = BranchContext("r", BranchCoordinate("react", "think", 0), (),
                            {"question": "Who?", "index": index, "searched": ["A"],
                             "seen": {"b", "a"}, "nested": {"x": [1, index]},
                             "count": np.int64(2), "keyed": {index: 1, "k": 2}})
        return render_prompt(ctx, ["A", "B"], 10_000)

    first, second = prompt(_Index()), prompt(_Index())
    assert first == second
    assert "object at" not in first and "_Index" not in first
    assert ('{"count": 2, "keyed": {"k": 2}, "nested": {"x": [1]}, "question": "Who?", '
            '"searched": ["A"], "seen": ["a", "b"]}' in first)


def test_the_evidence_name_is_neither_prompt_nor_feature():
    """A workload's name for its evidence (``EVIDENCE_KEY``) is not something the branch
    says: the drafter's prompt and its word features are the same with or without it."""
    plain = _ctx(question="Which ridge?")
    named = _ctx(question="Which ridge?", **{EVIDENCE_KEY: ("routing", "zebra-7", ("ls",))})
    assert render_prompt(named, NAMES, 10_000) == render_prompt(plain, NAMES, 10_000)
    assert _evidence_words(named.evidence) == _evidence_words(plain.evidence) == {
        "which", "ridge"}
    # nor does either read the features, which a workload may build only when asked
    def unread() -> dict:
        raise AssertionError("the features were built")

    lazy = BranchContext("r", BranchCoordinate("routing", "router", 0), NAMES,
                         RouterEvidence("Which ridge?", ("routing", "r", ()), unread))
    assert "Which ridge?" in render_prompt(lazy, NAMES, 10_000)
    assert _evidence_words(lazy.evidence) == {"which", "ridge"}
