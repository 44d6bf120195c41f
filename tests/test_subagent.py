"""The Sub-Agent workload: decompositions, the plan branch, concurrent sub-agents whose inputs
hold only their sub-task, replay and scoring.

Fixture tests (``tests/fixtures/musique``) always run; tests marked ``data`` read the shared
data directory and skip, saying so, when it is absent.
"""

from __future__ import annotations

import asyncio
import json
import shutil
import statistics
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from dynbranch.decode_lengths import THINK_CLOSE, THINK_OPEN, decision_of
from dynbranch.engines.tokenizer import count_tokens
from dynbranch.errors import ConfigError, DataMissingError, MalformedRecordError
from dynbranch.predictors.plans import PlanMemory, split_subtopic
from dynbranch.predictors.subtopic import observed_plan, rank_subtopics
from dynbranch.workflow import BranchCoordinate
from dynbranch.workload import DataConfig, MeasuredCost
from tests.data_sets import shared_data
from workloads import get_workload
from workloads.analysis.trace import TraceContext, trace_all, trace_request
from workloads.musique import (
    SUBTOPIC_SEP,
    line_refs,
    load_decompositions,
    substitute_refs,
    subtopic_entity,
)
from workloads.react.lengths import SUBAGENT_DECODE, SUBAGENT_LENGTHS, theta
from workloads.subagent import (
    MAX_SUBTOPICS,
    NO_SEARCH,
    NO_SUBTOPIC,
    PLAN_COORDINATE,
    TEMPLATE,
    SubAgentWorkload,
    parse_plan,
    search_coordinate,
)
from workloads.subagent.template import SUBAGENT_STAGES, TEMPLATE_REFERENCES
from workloads.subagent.workload import known_plan

FIXTURE = Path(__file__).parent / "fixtures" / "musique"
DATA = DataConfig(FIXTURE, Path("/nonexistent-cache"))


def fixture_requests(split: str = "all", n: int | None = None, seed: int = 0, **options):
    workload = SubAgentWorkload(tool_time="modelled", **options)
    pool = workload.records(DATA, split)
    return workload.requests(DATA, len(pool) if n is None else n, seed, split)


def by_record(requests, record_id):
    return next(r for r in requests if r.record.id == record_id)


@pytest.fixture(scope="module")
def real_dir() -> Path:
    return shared_data("musique", "hotpotqa")


# -- loading ----------------------------------------------------------------------------------


def test_fixture_decompositions_load():
    workload = SubAgentWorkload()
    records = workload.load(DATA).records
    assert len(records) == 8 and {r.source for r in records} == {"dev2417"}
    three = next(r for r in records if r.kind == "3hop2")
    assert [s.subtopic for s in three.steps] == [
        "Quillfeather Press >> founded by",
        "Lantern Song >> performer",
        "Mira Calloway >> were Ansel Dunmore and Mira Calloway born in the same city",
    ]
    assert three.steps[2].support_title == "Mira Calloway"  # from document_id "…_1"
    assert {r.id for r in workload.records(DATA, "train")} == {
        "2hop__1001_1002",
        "2hop__1007_1008",
        "2hop__1009_1002",
    }
    assert len(workload.records(DATA, "test")) == 5


BROKEN = {
    "document id": (
        lambda r: r["question_decomposition"][0].update(document_id="Lantern Song"),
        "step 1: document_id 'Lantern Song' is not '<title>_<n>'",
    ),
    "no document id": (
        lambda r: r["question_decomposition"][1].pop("document_id"),
        "step 2: missing field 'document_id'",
    ),
    "steps": (lambda r: r.update(question_decomposition="x"), "field 'question_decomposition'"),
    "step": (lambda r: r["question_decomposition"].__setitem__(0, "x"), "step 1 is not an object"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_decomposition_loader_names_file_record_and_problem(tmp_path, case):
    change, message = BROKEN[case]
    root = tmp_path / "data"
    shutil.copytree(FIXTURE, root)
    path = root / "musique" / "dev_2417_decompositions.json"
    rows = json.loads(path.read_text())
    change(rows[0])
    path.write_text(json.dumps(rows))
    with pytest.raises(MalformedRecordError) as err:
        SubAgentWorkload().check_data(DataConfig(root, tmp_path))
    assert err.value.path == str(path) and err.value.record == "2hop__1001_1002"
    assert message in err.value.problem
    path.write_text("not json")
    with pytest.raises(MalformedRecordError, match="record file: not JSON"):
        load_decompositions(path)


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(DataMissingError, match="data set 'musique' not found"):
        SubAgentWorkload().check_data(DataConfig(tmp_path, tmp_path))


# -- the request program ----------------------------------------------------------------------


@pytest.mark.parametrize("plan", ["references", "resolved"])
def test_every_fixture_request_replays_to_the_gold_answer(plan):
    requests = fixture_requests(plan=plan)
    assert SubAgentWorkload().plan == "references"  # the default
    for request, trace in zip(requests, trace_all(requests), strict=True):
        outcome = trace.outcome
        steps = request.record.steps
        assert outcome.subtopics == [s.subtopic for s in steps]
        assert outcome.findings == [s.answer for s in steps]
        assert request.score(outcome) == 1.0 and request.f1(outcome) == 1.0
        (point, chosen), *searches = trace.branches
        assert point.coordinate == PLAN_COORDINATE == BranchCoordinate("subagent", "plan", 0)
        assert point.multi_valued and point.candidates == ()
        evidence = {"question": request.record.question, "history": ()}
        assert dict(point.evidence) == (
            {**evidence, "plan": plan} if plan == "references" else evidence
        )
        lines = [s.plan_line if plan == "references" else s.subtopic for s in steps]
        assert chosen == tuple(lines)  # every result is kept
        # each sub-agent's search is a branch of its own, one winner: the entity searched
        assert sorted((p.coordinate, dict(p.evidence), c) for p, c in searches) == [
            (search_coordinate(i), {"subtopic": s.subtopic}, (s.entity,))
            for i, s in enumerate(steps)
        ]
        assert not any(p.multi_valued for p, _ in searches)
        assert [dict(r.fields)["query"] for r in trace.inputs("retrieve")] == [
            s.entity for s in steps
        ]


def test_subagent_inputs_hold_only_the_subtask():
    requests = fixture_requests()
    traces = {r.record.id: trace_request(r) for r in requests}
    for record_id, trace in traces.items():
        question = by_record(requests, record_id).record.question
        for rendered in trace.inputs("research"):
            assert set(rendered.fields) == {"subtopic", "passages"}
            assert question not in rendered.text
    # the same sub-topic in two questions renders byte-identically
    a = {r.fields["subtopic"]: r for r in traces["2hop__1001_1002"].inputs("research")}
    b = {r.fields["subtopic"]: r for r in traces["2hop__1009_1002"].inputs("research")}
    shared = "Mira Calloway >> spouse"
    assert a[shared].text == b[shared].text and a[shared].input_digest == b[shared].input_digest
    assert a["Lantern Song >> performer"].input_digest not in {r.input_digest for r in b.values()}


def test_sub_agents_run_concurrently():
    request = by_record(fixture_requests(plan="resolved"), "3hop1__1004_1005_1006")
    events = []

    class Interleaved(TraceContext):
        async def tool(self, stage, values):
            events.append(("start", values["query"]))
            await asyncio.sleep(0)
            value = await super().tool(stage, values)
            events.append(("end", values["query"]))
            return value

    asyncio.run(request.run(Interleaved(request)))
    starts = [i for i, (kind, _) in enumerate(events) if kind == "start"]
    ends = [i for i, (kind, _) in enumerate(events) if kind == "end"]
    assert len(starts) == 3 and max(starts) < min(ends)  # all three started before any ended


def test_replay_of_each_stage():
    request = by_record(fixture_requests(plan="resolved"), "2hop__1007_1008")
    trace = trace_request(request)
    (plan,) = trace.inputs("plan")
    assert decision_of(request.replay_text(plan)) == (
        "what is the capital of elandria\nPort Verity >> which river flows through Port Verity"
    )
    think = TEMPLATE.stage("sub_think").render({"subtopic": "Port Verity >> mayor"})
    assert decision_of(request.replay_text(think)) == (
        " I need to find out: mayor\nAction: search[Port Verity]"
    )
    research = TEMPLATE.stage("research")
    off = research.render(
        {"subtopic": "Port Verity >> mayor", "passages": [{"title": "Port Verity", "text": "..."}]}
    )
    assert decision_of(request.replay_text(off)) == "Port Verity"  # the top passage's title
    empty = research.render({"subtopic": "Nowhere >> mayor", "passages": []})
    assert decision_of(request.replay_text(empty)) == "unknown"
    synth = TEMPLATE.stage("synthesise").render(
        request.synthesise_values(["a"], ["anything at all"])
    )
    assert decision_of(request.replay_text(synth)) == "the Silvermere River"
    for rendered in (plan, think, off, synth):  # reasoning first, the decision last
        assert request.replay_text(rendered).startswith("<think>\n")
    stranger = TEMPLATE.stage("plan").render({"question": "Who?"})
    assert request.replay_text(stranger) is None
    assert request.replay_text(TEMPLATE.stage("retrieve").render({"query": "x", "k": 3})) is None
    assert request.replay_text(research.render({"subtopic": "x", "passages": "?"})) is None
    assert request.replay_text(TEMPLATE.stage("sub_think").render({"subtopic": " "})) is None


def test_parse_plan():
    assert parse_plan(" - A >> b\n\n* C >> d\nA >> b\n<none>\n") == ["A >> b", "C >> d"]
    many = "\n".join(f"E{i} >> x" for i in range(20))
    assert len(parse_plan(many)) == MAX_SUBTOPICS
    assert subtopic_entity("Mira Calloway >> spouse") == "Mira Calloway"
    assert subtopic_entity("what is the capital of elandria") == "what is the capital of elandria"


def test_an_empty_plan_resolves_and_synthesises():
    request = by_record(fixture_requests(), "2hop__1001_1002")

    class Silent(TraceContext):
        async def llm(self, stage, values):
            text = await super().llm(stage, values)
            return "" if stage == "plan" else text

    ctx = Silent(request)
    outcome = asyncio.run(request.run(ctx))
    assert outcome.subtopics == [] and ctx.trace.branches[0][1] == (NO_SUBTOPIC,)
    assert request.score(outcome) == 1.0  # the replayed synthesis still answers gold


def test_fill_values_match_the_canonical_inputs():
    request = by_record(fixture_requests(), "2hop__1003_1002")
    fills = {}

    searched = {}

    class Spy(TraceContext):
        def branch(self, point):
            if point.coordinate != PLAN_COORDINATE:
                subtopic = point.evidence["subtopic"]
                entity = subtopic.split(" >> ")[0]
                searched[subtopic] = request.fill_values(point.coordinate, entity)
                assert request.fill_values(point.coordinate, NO_SEARCH) is None
                assert request.fill_values(point.coordinate, "") is None
                return super().branch(point)
            for s in request.record.steps:
                fills[s.subtopic] = request.fill_values(point.coordinate, s.subtopic)
            assert request.fill_values(point.coordinate, NO_SUBTOPIC) is None
            assert not request.fillable(point, NO_SUBTOPIC)
            assert request.fill_values(BranchCoordinate("subagent", "plan", 1), "x") is None
            assert request.fill_values(search_coordinate(0), "x") is None  # not open yet
            return super().branch(point)

    ctx = Spy(request)
    asyncio.run(request.run(ctx))
    thinks = {r.fields["subtopic"]: r.input_digest for r in ctx.trace.inputs("sub_think")}
    for subtopic, fill in fills.items():
        assert fill == {"subtopic": subtopic}
        assert TEMPLATE.stage("sub_think").render(fill).input_digest == thinks[subtopic]
    assert request.fill_values(PLAN_COORDINATE, "Mira Calloway >> spouse") is None  # closed
    retrieves = {r.input_digest for r in ctx.trace.inputs("retrieve")}
    assert set(searched) == set(fills)
    for fill in searched.values():
        assert TEMPLATE.stage("retrieve").render(fill).input_digest in retrieves
    assert request.fill_values(search_coordinate(0), "Mira Calloway") is None  # closed


def test_speculate_runs_whole_sub_agents_ahead():
    request = by_record(fixture_requests(), "3hop2__1010_1011_1012")
    fill = TraceContext(request)

    class Early(TraceContext):
        @asynccontextmanager
        async def branch(self, point):
            if point.coordinate == PLAN_COORDINATE:
                for step in request.record.steps:
                    await request.speculate(fill, point, step.subtopic)
                await request.speculate(fill, point, NO_SUBTOPIC)  # nothing to fill
            async with super().branch(point) as scope:
                yield scope

    ctx = Early(request)
    asyncio.run(request.run(ctx))
    for stage in SUBAGENT_STAGES:
        canonical = sorted(r.input_digest for r in ctx.trace.inputs(stage))
        assert sorted(r.input_digest for r in fill.trace.inputs(stage)) == canonical
    assert fill.trace.inputs("plan") == [] and fill.trace.inputs("synthesise") == []
    asyncio.run(request.speculate(fill, ctx.trace.branches[0][0], "X >> y"))  # closed
    assert len(fill.trace.inputs("research")) == 3


def test_options_and_registry():
    with pytest.raises(ConfigError, match="tool_time"):
        SubAgentWorkload(tool_time="guessed")
    with pytest.raises(ConfigError, match="top_k"):
        SubAgentWorkload(top_k=21)
    with pytest.raises(ConfigError, match="split"):
        SubAgentWorkload().records(DATA, "dev")
    workload = get_workload("subagent", tool_time="modelled")
    assert isinstance(workload, SubAgentWorkload)
    request = SubAgentWorkload().requests(DATA, 1, 0)[0]
    assert isinstance(request.tool("retrieve").cost, MeasuredCost)
    with pytest.raises(KeyError, match="one tool"):
        request.tool("search")
    ids = [r.request_id for r in fixture_requests("test", 7, seed=1)]
    assert ids == [r.request_id for r in fixture_requests("test", 7, seed=1)]
    assert ids[0].startswith("subagent-00000-")



def test_the_partial_overlap_mix_keeps_each_split_to_its_own_questions():
    # NOTE: InstCache pre-populates from a train stream; a test question in it would be
    # served from its cache when the measured stream asks it
    workload = SubAgentWorkload(tool_time="modelled", mix="partial-overlap")
    train = {r.id for r in workload.records(DATA, "train")}
    test = {r.id for r in workload.records(DATA, "test")}
    for seed in range(5):
        trained = workload.requests(DATA, 50, seed, "train")
        assert trained and {r.record.id for r in trained} <= train
        measured = workload.requests(DATA, 50, seed, "test")
        popular = {r.record.id for r in measured if "-popular-" in r.request_id}
        assert popular and popular <= train
        assert {r.record.id for r in measured} - popular <= test


# -- plans written with references -----------------------------------------------------------


def test_plan_lines_write_bridges_as_references():
    for record in SubAgentWorkload().load(DATA).records:
        for step in record.steps:
            earlier = {s.index: s.answer for s in record.steps[: step.index]}
            assert substitute_refs(step.plan_line, earlier) == step.subtopic
            assert bool(line_refs(step.plan_line)) == bool(step.refs)
            for answer in earlier.values():
                if step.refs:
                    assert answer not in step.plan_line
    three = by_record(fixture_requests(), "3hop1__1004_1005_1006").record
    assert [s.plan_line for s in three.steps][1:] == [
        f"#1{SUBTOPIC_SEP}{three.steps[1].question.split('>>')[1].strip()}",
        f"#2{SUBTOPIC_SEP}{three.steps[2].question.split('>>')[1].strip()}",
    ]
    assert substitute_refs("#1 >> #3 or #2", {0: "A", 1: "B"}) == "A >> #3 or B"
    assert line_refs("#2 and #1 and #2") == (1, 0)


def test_references_research_the_chain_in_order_to_the_same_answer():
    resolved = {r.record.id: trace_request(r) for r in fixture_requests()}
    for request in fixture_requests(plan="references"):
        assert request.template is TEMPLATE_REFERENCES
        events, fillable = [], {}

        class Ordered(TraceContext):
            def branch(self, point, request=request, fillable=fillable):
                if point.coordinate == PLAN_COORDINATE:
                    for step in request.record.steps:
                        fillable[step.plan_line] = request.fillable(point, step.plan_line)
                return super().branch(point)

            async def tool(self, stage, values, events=events):
                events.append(("start", values["query"]))
                await asyncio.sleep(0)
                value = await super().tool(stage, values)
                events.append(("end", values["query"]))
                return value

        ctx = Ordered(request)
        outcome = asyncio.run(request.run(ctx))
        steps = request.record.steps
        before = resolved[request.record.id]
        # the same sub-agents and synthesis as the resolved plan, one plan line each
        assert outcome.subtopics == before.outcome.subtopics == [s.subtopic for s in steps]
        assert outcome.findings == [s.answer for s in steps] and request.score(outcome) == 1.0
        assert [r.input_digest for r in ctx.trace.inputs("synthesise")] == [
            r.input_digest for r in before.inputs("synthesise")
        ]
        (point, chosen), *searches = ctx.trace.branches
        assert chosen == tuple(s.plan_line for s in steps)
        assert sorted(c for _, c in searches) == sorted((s.entity,) for s in steps)
        assert point.evidence["plan"] == "references"
        # a sub-agent starts only after the sub-agents its line names have ended
        for step in steps:
            start = events.index(("start", step.entity))
            for k in step.refs:
                assert events.index(("end", steps[k].entity)) < start
        free = [s for s in steps if not s.refs]
        assert all(events.index(("start", s.entity)) < len(free) for s in free)
        assert fillable == {s.plan_line: not s.refs for s in steps}  # "#k" lines wait
        assert not request.fillable(point, steps[0].plan_line)  # closed after the plan


def test_a_failing_sub_agent_of_a_chain_fails_the_request_once_and_stops_the_rest():
    request = by_record(fixture_requests(plan="references"), "3hop2__1010_1011_1012")
    first = request.record.steps[0].entity

    class Broken(TraceContext):
        async def tool(self, stage, values):
            if values["query"] == first:
                raise RuntimeError("search service down")
            await asyncio.sleep(0)
            return await super().tool(stage, values)

    async def main():
        with pytest.raises(RuntimeError, match="search service down"):
            await request.run(Broken(request))
        await asyncio.sleep(0)
        return [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]

    assert asyncio.run(main()) == []  # nothing of the request is left running


def test_references_predictor_forms_no_chained_candidates():
    records = SubAgentWorkload().load(DATA).records
    memory = PlanMemory(known_plan(r) for r in records)
    as_written = [known_plan(r, "references") for r in records]
    assert any(line_refs(step.subtopic) for plan in as_written for step in plan.steps)
    answers = {s.answer for r in records for s in r.steps}

    def chained(question, plan):
        ranked = rank_subtopics({"question": question, "plan": plan}, memory, 100)
        return [
            c
            for c in ranked
            if split_subtopic(c)[0] in answers
            and split_subtopic(c)[0] not in question
            and c not in memory.steps
        ]

    questions = [r.question for r in records]
    assert any(chained(q, "resolved") for q in questions)  # "<answer> >> <relation>"
    assert not any(chained(q, "references") for q in questions)
    observed = observed_plan(
        "Who is the spouse of the Green performer?",
        ("Green >> performer", "#1 >> spouse"),
        PlanMemory(),
    )
    assert [s.answer for s in observed.steps] == ["", ""]


def test_plan_option_is_checked():
    with pytest.raises(ConfigError, match="plan 'guessed'"):
        SubAgentWorkload(plan="guessed")
    assert SubAgentWorkload(plan="references").template is TEMPLATE_REFERENCES
    assert SubAgentWorkload().template is TEMPLATE


# -- the real data ----------------------------------------------------------------------------


@pytest.mark.data
def test_real_decompositions_split_and_replay(real_dir):
    workload = SubAgentWorkload(tool_time="modelled")
    data = DataConfig(real_dir, Path("/nonexistent-cache"))
    assert len(workload.load(data).records) == 2417
    assert len(workload.records(data, "train")) == 583
    assert len(workload.records(data, "test")) == 1834
    requests = workload.requests(data, 2417, 0, "all")
    traces = trace_all(requests)
    assert all(r.score(t.outcome) == 1.0 for r, t in zip(requests, traces, strict=True))
    assert sum(len(t.outcome.subtopics) for t in traces) == 6404


@pytest.mark.data
def test_real_replayed_stages_decode_their_modelled_lengths(real_dir):
    workload = SubAgentWorkload(tool_time="modelled")
    data = DataConfig(real_dir, Path("/nonexistent-cache"))
    requests = workload.requests(data, 300, 0, "test")
    traces = trace_all(requests)
    for stage, model in SUBAGENT_LENGTHS.items():
        reasoning = []
        for request, trace in zip(requests, traces, strict=True):
            for rendered in trace.inputs(stage):
                text = request.replay_text(rendered)
                filler = text[len(THINK_OPEN) : text.rindex(THINK_CLOSE)]
                n = SUBAGENT_DECODE.reasoning_tokens(rendered, theta(request.template.stage(stage)))
                assert count_tokens(filler) == n and model.min_tokens <= n <= model.max_tokens
                reasoning.append(n)
        assert len(reasoning) >= 200
        assert statistics.median(reasoning) == pytest.approx(model.median_tokens, rel=0.1)
