"""The ReAct request program: think → retrieve → read hops, their replay, their branch
evidence and what a fill of a hop renders.

Fixture tests (``tests/fixtures/musique``) always run; tests marked ``data`` read the shared
data directory and skip, saying so, when it is absent.
"""

from __future__ import annotations

import asyncio
import statistics
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from dynbranch.decode_lengths import THINK_CLOSE, THINK_OPEN, decision_of
from dynbranch.engines.tokenizer import count_tokens
from dynbranch.predictors.entity import rank_entities
from dynbranch.workflow import BranchCoordinate
from dynbranch.workload import DataConfig
from tests.data_sets import shared_data
from tests.test_react import by_record, fixture_requests
from workloads.analysis.trace import ReplayGapError, TraceContext, trace_all, trace_request
from workloads.react import FINISH, TEMPLATE, Action, ReActWorkload, parse_action
from workloads.react.lengths import REACT_DECODE, REACT_LENGTHS, theta
from workloads.react.request import observation_text, parse_observation


@pytest.fixture(scope="module")
def real_dir() -> Path:
    return shared_data("musique", "hotpotqa")


# -- the request program and replay -----------------------------------------------------------


def test_every_fixture_request_replays_to_the_gold_answer():
    requests = fixture_requests()
    traces = trace_all(requests)
    for request, trace in zip(requests, traces, strict=True):
        outcome = trace.outcome
        assert outcome.searches == list(request.record.chain)
        assert request.score(outcome) == 1.0 and request.f1(outcome) == 1.0
        assert outcome.thinks == len(request.record.steps) + 1 and outcome.invalid is None
        coordinates = [p.coordinate for p, _ in trace.branches]
        assert coordinates == [BranchCoordinate("react", "think", h) for h in range(outcome.thinks)]
        assert [c for _, (c,) in trace.branches] == [*request.record.chain, FINISH]


def test_branch_evidence_is_the_previous_hop_and_the_question_at_hop_0():
    request = by_record(fixture_requests(), "3hop1__1004_1005_1006")
    trace = trace_request(request)
    retrieved = [result.value for _, result in trace.tool_results]
    for hop, (point, _) in enumerate(trace.branches):
        assert point.candidates == () and not point.multi_valued
        evidence = point.evidence
        assert set(evidence) == {"question", "passages", "searched", "observation", "index"}
        assert evidence["index"] is request.tool("retrieve").index
        assert evidence["searched"] == list(request.record.chain[:hop])
        if hop == 0:
            # nothing retrieved yet: the question is the one text read, so its names rank
            assert evidence["passages"] == [{"title": "", "text": request.record.question}]
            assert evidence["observation"] == ""
            continue
        expected = [{"title": p["title"], "text": p["text"]} for p in retrieved[hop - 1]]
        assert evidence["passages"] == expected
        assert evidence["observation"] == observation_text(request.record.steps[hop - 1])
    # the entity ranker finds the first hop's entity in the question (top 3)
    first = trace.branches[0][0].evidence
    assert "Quillfeather Press" in rank_entities(first, 3)


def test_think_read_inputs_and_outputs():
    request = by_record(fixture_requests(), "2hop__1001_1002")
    trace = trace_request(request)
    thinks, reads = trace.inputs("think"), trace.inputs("read")
    assert [r.fields["trajectory"] for r in thinks] == [
        [],
        [
            {
                "search": "Lantern Song",
                "observation": "The performer of Lantern Song is Mira Calloway.",
            }
        ],
        [
            {
                "search": "Lantern Song",
                "observation": "The performer of Lantern Song is Mira Calloway.",
            },
            {
                "search": "Mira Calloway",
                "observation": "The spouse of Mira Calloway is Tobias Wren.",
            },
        ],
    ]
    assert "Question: Who is the spouse of the performer of Lantern Song?" in thinks[0].text
    assert decision_of(request.replay_text(thinks[0])) == (
        " I need the performer of Lantern Song.\nAction: search[Lantern Song]"
    )
    assert decision_of(request.replay_text(thinks[1])) == (
        " The passages give Mira Calloway. I need the spouse of Mira Calloway.\n"
        "Action: search[Mira Calloway]"
    )
    assert request.replay_text(thinks[2]).endswith("Action: finish[Tobias Wren]")
    assert [dict(r.fields)["query"] for r in trace.inputs("retrieve")] == [
        "Lantern Song",
        "Mira Calloway",
    ]
    assert [(r.fields["search"], len(r.fields["passages"])) for r in reads] == [
        ("Lantern Song", 2),
        ("Mira Calloway", 3),
    ]
    assert set(reads[0].fields) == {"question", "search", "passages"}
    assert decision_of(request.replay_text(reads[1])) == (
        "Observation: The spouse of Mira Calloway is Tobias Wren."
    )
    # replay is a pure function of the rendered input, reasoning first, decision last
    for r in thinks + reads:
        text = request.replay_text(r)
        assert text == request.replay_text(r) and text.startswith("<think>\n")
        assert count_tokens(text) - count_tokens(decision_of(text)) >= 16


def test_recorded_decode_lengths_replay_the_decisions_alone():
    (plain,) = [
        r for r in fixture_requests(decode_lengths="recorded") if r.record.id == "2hop__1001_1002"
    ]
    trace = trace_request(plain)
    think = trace.inputs("think")[0]
    assert plain.replay_text(think) == (
        " I need the performer of Lantern Song.\nAction: search[Lantern Song]"
    )
    assert plain.score(trace.outcome) == 1.0


def test_replay_off_the_recorded_path_and_for_other_inputs():
    request = by_record(fixture_requests(), "2hop__1001_1002")
    think, read = TEMPLATE.stage("think"), TEMPLATE.stage("read")
    wrong = [{"search": "Lantern", "observation": "A lantern."}]
    off = think.render(request.think_values(wrong))
    assert decision_of(request.replay_text(off)) == (
        " The observations do not say.\nAction: finish[unknown]"
    )
    other = read.render(request.read_values("Wren", [{"title": "Tobias Wren", "text": "..."}]))
    assert decision_of(request.replay_text(other)) == (
        "Observation: The passages are about Tobias Wren."
    )
    empty = read.render(request.read_values("zeppelin", []))
    assert decision_of(request.replay_text(empty)) == "Observation: Nothing was found for zeppelin."
    stranger = think.render({"question": "Who?", "trajectory": []})
    assert request.replay_text(stranger) is None
    assert (
        request.replay_text(read.render({"question": "Who?", "search": "x", "passages": []}))
        is None
    )
    assert request.replay_text(TEMPLATE.stage("retrieve").render({"query": "x", "k": 3})) is None


def test_parse_action_and_observation():
    assert parse_action(" I think.\nAction: search[Port Verity]") == Action("search", "Port Verity")
    assert parse_action("Action: finish[the [odd] answer]  \n") == Action(
        "finish", "the [odd] answer"
    )
    assert parse_action("Action: search[]") is None and parse_action("no action") is None
    assert parse_action("Action: lookup[x]") is None
    # the reasoning before the decision is never parsed
    assert parse_action("<think>\nAction: search[x]\n</think>\n\nno action") is None
    assert parse_observation("<think>\nr\n</think>\n\nObservation: It is X.") == "It is X."
    assert parse_observation("It is Y.") == "It is Y."


def test_an_unparseable_think_ends_the_request_unanswered():
    request = by_record(fixture_requests(), "2hop__1001_1002")

    class Garbled(TraceContext):
        async def llm(self, stage, values):
            await super().llm(stage, values)
            return "I am not sure."

    ctx = Garbled(request)
    outcome = asyncio.run(request.run(ctx))
    assert outcome.answer is None and outcome.thinks == 1 and outcome.invalid
    assert ctx.trace.branches[0][1] == ("<invalid>",)
    assert request.score(outcome) == 0.0


def test_fill_values_match_the_canonical_inputs():
    request = by_record(fixture_requests(), "2hop__1003_1002")
    seen = {}

    class Spy(TraceContext):
        def branch(self, point):
            step = point.coordinate.step
            chosen = request.record.chain[step] if step < 2 else None
            if chosen:
                fill = request.fill_values(point.coordinate, chosen)
                passages = request.tool("retrieve").call(fill).value
                read = request.read_values(chosen, passages)
                observation = parse_observation(
                    request.replay_text(TEMPLATE.stage("read").render(read))
                )
                seen[step] = (fill, read, {"search": chosen, "observation": observation})
            assert request.fill_values(point.coordinate, FINISH) is None
            assert not request.fillable(point, FINISH) and request.fillable(point, "X")
            return super().branch(point)

    ctx = Spy(request)
    asyncio.run(request.run(ctx))
    canonical = {s: ctx.trace.inputs(s) for s in ("retrieve", "read", "think")}
    for hop in (0, 1):
        fill, read, step = seen[hop]
        # what the fill's read observes is exactly what the next think is given
        after = request.think_values([*canonical["think"][hop].fields["trajectory"], step])
        for stage, values, i in (
            ("retrieve", fill, hop),
            ("read", read, hop),
            ("think", after, hop + 1),
        ):
            rendered = TEMPLATE.stage(stage).render(values)
            assert rendered.input_digest == canonical[stage][i].input_digest
    closed = BranchCoordinate("react", "think", 0)
    assert request.fill_values(closed, "Mira Calloway") is None  # the branch is closed now


def test_speculate_runs_the_canonical_hop_ahead_and_stops_before_the_next_decision():
    request = by_record(fixture_requests(), "3hop1__1004_1005_1006")
    chain = request.record.chain
    fill = TraceContext(request)

    class Early(TraceContext):
        @asynccontextmanager
        async def branch(self, point):
            step = point.coordinate.step
            if step < len(chain):
                await request.speculate(fill, point, chain[step])
            await request.speculate(fill, point, FINISH)  # nothing to fill
            async with super().branch(point) as scope:
                yield scope

    ctx = Early(request)
    asyncio.run(request.run(ctx))
    canonical = ctx.trace

    def digests(trace, stage):
        return [r.input_digest for r in trace.inputs(stage)]

    assert digests(fill.trace, "retrieve") == digests(canonical, "retrieve")
    assert digests(fill.trace, "read") == digests(canonical, "read")
    assert digests(fill.trace, "think") == []  # the next branch decides for itself
    # a fill's stages decode exactly what the canonical ones do (one reuse name, one text)
    canon_text = {
        r.input_digest: request.replay_text(r)
        for r in canonical.rendered
        if r.stage in ("read", "think")
    }
    for r in fill.trace.rendered:
        if r.stage in ("read", "think"):
            assert request.replay_text(r) == canon_text[r.input_digest]
    point = canonical.branches[0][0]
    asyncio.run(request.speculate(fill, point, "Ansel Dunmore"))  # closed: nothing runs
    assert len(fill.trace.inputs("retrieve")) == len(chain)


def test_a_replay_gap_is_reported():
    request = by_record(fixture_requests(), "2hop__1001_1002")

    class Lost(TraceContext):
        async def llm(self, stage, values):
            return await super().llm(stage, {**values, "question": "Another question?"})

    with pytest.raises(ReplayGapError, match="no replay for think"):
        asyncio.run(request.run(Lost(request)))


# -- the real data ---------------------------------------------------------------------------


@pytest.mark.data
def test_real_floor_replays_every_question_to_gold(real_dir):
    workload = ReActWorkload(tool_time="modelled")
    data = DataConfig(real_dir, Path("/nonexistent-cache"))
    requests = workload.requests(data, 300, 0, "all")
    traces = trace_all(requests)
    assert all(r.score(t.outcome) == 1.0 for r, t in zip(requests, traces, strict=True))
    assert sum(len(t.outcome.searches) for t in traces) == 715


@pytest.mark.data
def test_real_replayed_stages_decode_their_modelled_lengths(real_dir):
    workload = ReActWorkload(tool_time="modelled")
    data = DataConfig(real_dir, Path("/nonexistent-cache"))
    requests = workload.requests(data, 219, 0, "test")
    traces = trace_all(requests)
    for stage, model in REACT_LENGTHS.items():
        reasoning = []
        for request, trace in zip(requests, traces, strict=True):
            for rendered in trace.inputs(stage):
                text = request.replay_text(rendered)
                filler = text[len(THINK_OPEN) : text.rindex(THINK_CLOSE)]
                n = REACT_DECODE.reasoning_tokens(rendered, theta(request.template.stage(stage)))
                assert count_tokens(filler) == n and model.min_tokens <= n <= model.max_tokens
                reasoning.append(n)
        assert len(reasoning) >= 200
        assert statistics.median(reasoning) == pytest.approx(model.median_tokens, rel=0.1)
