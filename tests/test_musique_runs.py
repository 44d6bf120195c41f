"""ReAct and Sub-Agent through the orchestrator on the fixture: what a fill hides, what it
decodes, what C1 serves across requests, and what a retrieval is charged.

Runs use the sim engines on the virtual clock (``tests/fixtures/musique``). A test-only
``gold`` predictor, registered for these tests, ranks the recorded choice first (the
resolved branch, read from the fixture record): it exercises the fill mechanics with
perfect prediction, which no shipped predictor may do.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from pathlib import Path

import pytest

from dynbranch.arms.registry import get_arm
from dynbranch.audit import unsafe_splices
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.clock import VirtualClock
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.gate import Gate
from dynbranch.gate.client import LocalGateClient
from dynbranch.orchestrator import Orchestrator
from dynbranch.predictors import PREDICTORS, BranchContext, Predictor
from dynbranch.runtime.run import FillOptions, GateOptions, RunContext
from dynbranch.workload import DataConfig
from workloads.react import ReActWorkload
from workloads.react.retrieval import MODELLED_RETRIEVE_S, Bm25Index
from workloads.subagent import SubAgentWorkload
from workloads.subagent.template import SUBAGENT_STAGES

FIXTURE = Path(__file__).parent / "fixtures" / "musique"
DATA = DataConfig(FIXTURE, Path("/nonexistent-cache"))
PROFILE = "qwen3-32b@h200"


class GoldPredictor(Predictor):
    """Test only: the recorded choice of every fixture branch, ranked first."""

    name = "gold"

    def __init__(self) -> None:
        records = [*ReActWorkload().load(DATA).records, *SubAgentWorkload().load(DATA).records]
        self._chains = {r.question: [s.entity for s in r.steps] for r in records}
        self._plans = {r.question: [s.subtopic for s in r.steps] for r in records}
        self._lines = {r.question: [s.plan_line for s in r.steps] for r in records}
        self._searches = {s.subtopic: s.entity for r in records for s in r.steps}

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        if "subtopic" in ctx.evidence:  # a sub-agent's search
            entity = self._searches.get(ctx.evidence["subtopic"])
            return [entity][:k] if entity else []
        question = ctx.evidence["question"]
        if ctx.coordinate.workflow == "subagent":
            plans = self._lines if ctx.evidence.get("plan") == "references" else self._plans
            return plans.get(question, [])[:k]
        chain = self._chains.get(question, [])
        step = ctx.coordinate.step
        return chain[step : step + 1] if step < len(chain) else []


@pytest.fixture
def gold(monkeypatch):
    monkeypatch.setitem(PREDICTORS, "gold", (__name__, "GoldPredictor"))
    return "gold"


def run(
    arm,
    requests,
    *,
    spacing=0.0,
    depth=2,
    predictor="entity",
    fanout=3,
    workers=2,
    policy="topk",
    make_gate=None,
):
    """Run ``requests`` on ``arm`` (``spacing`` seconds apart); the records and the log."""
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", PROFILE, workers)})
    gate_options = {} if make_gate is None else {"make_gate": make_gate}

    async def main():
        await backend.start()
        try:
            ctx = RunContext(
                clock=clock,
                arm=arm,
                models=backend.models(),
                fill=FillOptions(fanout=fanout, depth=depth, predictor=predictor),
                gate=GateOptions(policy=policy, engines=workers, profile=PROFILE),
                make_store=lambda: backend.make_store(1 << 28),
                **gate_options,
            )
            orch = Orchestrator(clock, backend.clients(), get_arm(arm), run=ctx)
            t0 = orch.start_run()

            async def one(i, req):
                await clock.sleep_until(t0 + i * spacing)
                return await orch.run_request(req, i * spacing)

            records = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
            await orch.finish_run()
            return records, orch
        finally:
            await backend.shutdown()

    return clock.run(main())


def react(*ids, **options):
    workload = ReActWorkload(tool_time="modelled", **options)
    pool = workload.requests(DATA, 6, 0, "all")
    return [next(r for r in pool if r.record.id == i) for i in ids]


def subagent(*ids, **options):
    workload = SubAgentWorkload(tool_time="modelled", **options)
    pool = workload.requests(DATA, 8, 0, "all")
    return [next(r for r in pool if r.record.id == i) for i in ids]


def _canonical(orch, request_id=None):
    return [
        s
        for s in orch.log.stages
        if not s.speculative and (request_id is None or s.request_id == request_id)
    ]


# -- the sub-agent's structure ----------------------------------------------------------------


def test_a_sub_agent_is_two_llm_stages_and_a_retrieval_in_the_stage_log():
    (request,) = subagent("3hop1__1004_1005_1006", plan="resolved")
    records, orch = run("floor", [request])
    assert records[0].status == "completed" and records[0].correct == 1.0
    stages = _canonical(orch)
    by_digest = {(s.stage, s.input_digest): s for s in stages}
    template = request.template
    subtopics = [s.subtopic for s in request.record.steps]
    assert len(subtopics) == 3
    for step in request.record.steps:
        think = by_digest[
            (
                "sub_think",
                template.stage("sub_think")
                .render(request.sub_think_values(step.subtopic))
                .input_digest,
            )
        ]
        search = by_digest[
            (
                "retrieve",
                template.stage("retrieve")
                .render(request.retrieve_values(step.entity))
                .input_digest,
            )
        ]
        passages = request.tool("retrieve").call(request.retrieve_values(step.entity)).value
        research = by_digest[
            (
                "research",
                template.stage("research")
                .render(request.research_values(step.subtopic, passages))
                .input_digest,
            )
        ]
        kinds = [think.kind, search.kind, research.kind]
        assert kinds.count("llm") >= 2 and kinds.count("tool") >= 1
        assert think.end <= search.start and search.end <= research.start  # one chain
        assert think.output_tokens > 16 and research.output_tokens > 16  # it reasons
    # the three sub-agents run side by side, between the plan and the synthesis
    plan = next(s for s in stages if s.stage == "plan")
    synth = next(s for s in stages if s.stage == "synthesise")
    thinks = [s for s in stages if s.stage == "sub_think"]
    assert len(thinks) == 3 and all(plan.end <= t.start < synth.start for t in thinks)
    assert max(t.start for t in thinks) < min(t.end for t in thinks)
    assert [s.stage for s in stages].count("research") == 3


def test_each_sub_agent_s_stages_carry_its_own_search_branch():
    # NOTE: the three sub-agents run at once, each opening its branch; a row carries the
    # coordinate its own path opened, not whichever opened last
    (request,) = subagent("3hop1__1004_1005_1006", plan="resolved")
    _, orch = run("floor", [request])
    by_subtopic = {
        s.subtopic: f"subagent/sub_think/{i}" for i, s in enumerate(request.record.steps)
    }
    rows = _canonical(orch)
    thinks = [s for s in rows if s.stage == "sub_think"]
    starts = sorted(s.start for s in thinks)
    assert starts[0] == starts[-1]  # concurrent
    for step in request.record.steps:
        think = next(
            s
            for s in thinks
            if s.input_digest
            == request.template.stage("sub_think")
            .render(request.sub_think_values(step.subtopic))
            .input_digest
        )
        assert think.coordinate == by_subtopic[step.subtopic]
    per_coordinate = {}
    for s in rows:
        per_coordinate.setdefault(s.coordinate, []).append(s.stage)
    assert per_coordinate["subagent/plan/0"] == ["plan", "synthesise"]
    for coordinate in by_subtopic.values():
        assert per_coordinate[coordinate] == list(SUBAGENT_STAGES)
    branches = [b.coordinate for b in orch.log.branches]
    assert sorted(branches) == ["subagent/plan/0", *sorted(by_subtopic.values())]


def test_a_fill_runs_a_whole_sub_agent_and_every_named_one_is_kept(gold):
    (request,) = subagent("3hop1__1004_1005_1006", plan="resolved")
    records, orch = run("c2", [request], depth=3, predictor=gold)
    assert records[0].status == "completed" and records[0].correct == 1.0
    spec = [s for s in orch.log.stages if s.speculative]
    subtopics = {s.subtopic for s in request.record.steps}
    assert {s.fill for s in spec} == subtopics  # one fill per sub-topic the plan names
    assert {s.coordinate for s in spec} == {"subagent/plan/0"}
    for subtopic in subtopics:
        assert [s.stage for s in spec if s.fill == subtopic] == list(SUBAGENT_STAGES)
    served = {s.stage: s.served_from for s in _canonical(orch) if s.stage in SUBAGENT_STAGES}
    assert set(served.values()) <= {"shadow", "join"}  # no sub-agent stage re-executed
    speculation = orch.mechanism_stats["speculation"]
    fills = speculation["fills"]
    # the sub-agents' search branches open too, but their sub_think is served from the plan's
    # fills at once: decided before C2 began, so they are neither priced nor filled
    assert speculation["decided_first"] == 3
    assert fills["issued"] == 3 and fills["consumed"] == 3
    assert fills["discarded"] == 0 and fills["covered"] == 0
    assert unsafe_splices(orch.log.stages) == []


def test_a_covered_fill_teaches_the_gate_nothing_of_use(gold, monkeypatch):
    # NOTE: the search branches' fills find every stage held by the plan's fills: whether a
    # fill there is usable in time is not observed, so pi_use does not learn "unused". Here
    # their decisions run as one already under way when the body decided does (a gate round
    # trip on Ray): the session is never marked decided, so they fill.
    from dynbranch.fill.runner import BranchSession

    monkeypatch.setattr(BranchSession, "decide", lambda self: None)
    learned = []

    class Recording(LocalGateClient):
        async def learn(self, observations, settlements):
            learned.extend(observations)
            await super().learn(observations, settlements)

    (request,) = subagent("3hop1__1004_1005_1006", plan="resolved")
    records, orch = run(
        "c2",
        [request],
        depth=3,
        predictor=gold,
        policy="priced",
        make_gate=lambda model, config: Recording(Gate(model, config)),
    )
    assert records[0].correct == 1.0
    fills = orch.mechanism_stats["speculation"]["fills"]
    assert fills["consumed"] == 3 and fills["covered"] == 3 and fills["discarded"] == 0
    selected = [(o.stage_key, o.usable) for o in learned if o.selected]
    assert sorted(u for st, u in selected if "plan" in st) == [True] * 3
    assert [u for st, u in selected if "sub_think" in st] == [None] * 3


def test_a_plan_with_references_researches_its_chain_in_order_and_fills_its_first_step(gold):
    (request,) = subagent("3hop1__1004_1005_1006", plan="references")
    steps = request.record.steps
    records, orch = run("floor", [request])
    assert records[0].correct == 1.0
    thinks = sorted((s for s in _canonical(orch) if s.stage == "sub_think"), key=lambda s: s.start)
    research = sorted((s for s in _canonical(orch) if s.stage == "research"), key=lambda s: s.start)
    assert len(thinks) == len(research) == 3
    for later, earlier in zip(thinks[1:], research, strict=False):
        assert later.start >= earlier.end  # each hop waits for the finding it names
    floor_latency = records[0].latency
    records, orch = run("c2", [request], depth=3, predictor=gold)
    assert records[0].correct == 1.0 and records[0].latency < floor_latency
    spec = [s for s in orch.log.stages if s.speculative]
    planned = {s.fill for s in spec if s.coordinate == "subagent/plan/0"}
    assert planned == {steps[0].plan_line}  # "#1 >> ..." cannot be filled at the plan
    # the later hops' searches are filled while their sub_think decodes
    searched = {s.fill: s.coordinate for s in spec if s.coordinate != "subagent/plan/0"}
    assert searched == {s.entity: f"subagent/sub_think/{i}" for i, s in enumerate(steps) if i}
    served = [(s.stage, s.served_from) for s in _canonical(orch) if s.stage in SUBAGENT_STAGES]
    assert [st for st, how in served if how == "exec"] == ["sub_think"] * 2  # the later hops
    fills = orch.mechanism_stats["speculation"]["fills"]
    assert fills["consumed"] == 3
    assert unsafe_splices(orch.log.stages) == []


def test_a_fill_stops_at_the_run_depth(gold):
    (request,) = subagent("2hop__1001_1002", plan="resolved")
    _, orch = run("c2", [request], depth=2, predictor=gold)
    spec = [s for s in orch.log.stages if s.speculative]
    planned = [s.stage for s in spec if s.coordinate == "subagent/plan/0"]
    assert sorted(planned) == sorted(["sub_think", "retrieve"] * 2)  # two stages each
    # a search branch's fill runs at most two stages too: retrieve (held) and research
    assert {s.stage for s in spec if s.coordinate != "subagent/plan/0"} <= {"research"}


# -- a fill decodes what the canonical stage decodes ------------------------------------------


@pytest.mark.parametrize("workload", ["react", "subagent"])
def test_fill_and_canonical_of_one_name_decode_identical_text(gold, workload):
    ids = (
        ("2hop__1001_1002", "3hop1__1004_1005_1006")
        if workload == "react"
        else ("2hop__1001_1002", "3hop2__1010_1011_1012")
    )
    make = react if workload == "react" else subagent
    _, floor = run("floor", make(*ids), spacing=60.0)
    records, c2 = run("c2", make(*ids), spacing=60.0, depth=3, predictor=gold)
    assert all(r.correct == 1.0 for r in records)
    floor_out = {s.reuse_name: s.output_digest for s in _canonical(floor) if s.kind == "llm"}
    spec = [s for s in c2.log.stages if s.speculative and s.kind == "llm" and s.output_digest]
    promoted = {s.reuse_name for s in _canonical(c2) if s.served_from in ("shadow", "join")}
    assert len(spec) >= 4 and len(promoted & {s.reuse_name for s in spec}) >= 4
    for s in spec:
        if s.reuse_name in floor_out:  # a fill of the chosen candidate: the floor ran it
            assert s.output_digest == floor_out[s.reuse_name]
            assert s.output_tokens > 16  # reasoning and decision, not the decision alone
    assert unsafe_splices(c2.log.stages) == []


def test_react_fills_hide_the_retrieve_and_the_read(gold):
    (request,) = react("3hop1__1004_1005_1006")
    records, orch = run("c2", [request], predictor=gold)  # depth 2: retrieve + read
    assert records[0].correct == 1.0
    spec = [s for s in orch.log.stages if s.speculative]
    assert {s.stage for s in spec} == {"retrieve", "read"}
    canon = [s for s in _canonical(orch) if s.stage in ("retrieve", "read")]
    assert len(canon) == 6 and {s.served_from for s in canon} <= {"shadow", "join"}


def test_hop_0_is_filled_from_the_entities_the_question_names():
    (request,) = react("3hop1__1004_1005_1006")  # "... the founder of Quillfeather Press ..."
    _, orch = run("c2", [request])  # the shipped entity ranker
    hop0 = [s for s in orch.log.stages if s.speculative and s.coordinate == "react/think/0"]
    assert "Quillfeather Press" in {s.fill for s in hop0}
    first = next(s for s in _canonical(orch) if s.stage == "retrieve")
    assert first.served_from in ("shadow", "join")


# -- C1 across requests -----------------------------------------------------------------------


@pytest.mark.parametrize("arm", ["c1", "full"])
def test_a_shared_sub_topic_is_served_from_the_first_requests_sub_agent(arm):
    first, second = subagent("2hop__1001_1002", "2hop__1009_1002")
    shared = "Mira Calloway >> spouse"
    assert shared in {s.subtopic for s in first.record.steps} & {
        s.subtopic for s in second.record.steps
    }
    records, orch = run(arm, [first, second], spacing=120.0, fanout=0)
    assert [r.correct for r in records] == [1.0, 1.0]
    later = _canonical(orch, second.request_id)
    think = second.template.stage("sub_think").render(second.sub_think_values(shared))
    (served,) = [s for s in later if s.input_digest == think.input_digest]
    assert served.served_from == "cache"
    chain = [s for s in later if s.stage in SUBAGENT_STAGES and s.served_from == "cache"]
    assert [s.stage for s in chain] == list(SUBAGENT_STAGES)  # the whole sub-agent
    executed = {s.stage for s in later if s.served_from == "exec"}
    assert {"plan", "synthesise", "sub_think", "research"} <= executed  # its own sub-topic
    assert unsafe_splices(orch.log.stages) == []


def test_the_floor_never_reuses_a_shared_sub_topic():
    first, second = subagent("2hop__1001_1002", "2hop__1009_1002")
    _, orch = run("floor", [first, second], spacing=120.0)
    assert {s.served_from for s in orch.log.stages} == {"exec"}


# -- what a retrieval is charged --------------------------------------------------------------


def _replay(tmp_path, workload, **kw):
    cfg = ReplayConfig(
        workload=workload,
        arm="floor",
        backend="local",
        clock="virtual",
        requests=4,
        rate=0.05,
        seed=1,
        workers=2,
        data_dir=str(FIXTURE),
        split="test",
        out=tmp_path / workload,
        progress=False,
        **kw,
    )
    return prepare(cfg, progress=lambda _m: None)


def test_measured_retrieval_is_charged_what_the_index_really_took(tmp_path, monkeypatch):
    search = Bm25Index.search

    def slow(self, query, k):
        time.sleep(0.03)  # real time spent inside the call, as a loaded CPU would
        return search(self, query, k)

    monkeypatch.setattr(Bm25Index, "search", slow)
    result = run_replay(_replay(tmp_path, "react", tool_time="measured"))
    retrieves = [s for s in result.orchestrator.log.stages if s.stage == "retrieve"]
    assert retrieves and all(0.03 <= s.duration < 0.5 for s in retrieves)
    assert len({round(s.duration, 9) for s in retrieves}) > 1  # measured, not a constant


def test_modelled_retrieval_is_charged_the_search_service_median(tmp_path):
    result = run_replay(_replay(tmp_path, "react", tool_time="modelled"))
    retrieves = [s for s in result.orchestrator.log.stages if s.stage == "retrieve"]
    assert retrieves and all(s.duration == pytest.approx(MODELLED_RETRIEVE_S) for s in retrieves)


def test_the_run_depth_defaults_to_the_workloads_fill_unit(tmp_path):
    assert _replay(tmp_path, "subagent").config.depth == 3
    assert _replay(tmp_path, "react").config.depth == 2
    explicit = _replay(tmp_path, "subagent", depth=1)
    assert explicit.config.depth == 1
    prepared = _replay(tmp_path, "subagent")
    assert dataclasses.asdict(prepared.config)["depth"] == 3  # what summary.json records
