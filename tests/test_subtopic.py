"""The sub-topic predictor (Sub-Agent's plan branch): its memory of known plans, the
candidates it writes and chains, what it learns, and its accuracy on the real plans
(``data`` tests: fitted on train, measured on test)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.datasets import resolve_data_dir
from dynbranch.predictors import BranchContext, make_predictor
from dynbranch.predictors.plans import KnownPlan, KnownStep, PlanMemory, split_subtopic
from dynbranch.predictors.search import search_candidates
from dynbranch.predictors.spans import title_phrases
from dynbranch.predictors.subtopic import (
    FEATURES,
    FITTED,
    SubtopicPredictor,
    SubtopicWeights,
    observed_plan,
)
from dynbranch.workflow import BranchCoordinate
from dynbranch.workload import DataConfig
from workloads.analysis.subtopic_accuracy import fit_weights, subtopic_accuracy
from workloads.musique import split_of
from workloads.subagent.workload import SubAgentWorkload, known_plan

PLAN = BranchCoordinate("subagent", "plan", 0)


def kb(entity: str, relation: str, answer: str = "") -> KnownStep:
    return KnownStep(f"{entity} >> {relation}", entity, relation, answer, True)


HISTORY = (
    KnownPlan(
        "Who is the spouse of the Green performer?",
        (kb("Green", "performer", "Steve Hillage"), kb("Steve Hillage", "spouse", "M. Giraudy")),
    ),
    KnownPlan(
        "Who married the performer of Blue Sky?",
        (kb("Blue Sky", "performer", "Ann Lee"), kb("Ann Lee", "spouse", "Bo Chen")),
    ),
    KnownPlan(
        "Where was the performer of Green born?",
        (kb("Green", "performer", "Steve Hillage"), kb("Steve Hillage", "place of birth")),
    ),
)


def ctx(question: str, history=HISTORY) -> BranchContext:
    return BranchContext("r", PLAN, (), {"question": question, "history": history})


def test_memory_counts_answers_and_cues_relations():
    memory = PlanMemory(HISTORY)
    assert memory.count["Green >> performer"] == 2 and memory.questions == 3
    assert memory.answer("Green >> performer") == "Steve Hillage"
    assert memory.answer("Steve Hillage >> place of birth") == ""  # not recorded
    assert memory.of_entity("Steve Hillage") == {
        "Steve Hillage >> spouse",
        "Steve Hillage >> place of birth",
    }
    top = memory.relations("Who is the wife of the Green performer?")[0]
    assert (top.name, top.words) == ("performer", frozenset({"performer"}))
    assert split_subtopic("Green >> performer") == ("Green", "performer")
    assert split_subtopic("who plays vision") == ("who plays vision", "who plays vision")


@settings(max_examples=40, deadline=None)
@given(st.sampled_from(HISTORY), st.permutations(list(HISTORY)))
def test_remove_undoes_add(plan, order):
    memory, before = PlanMemory(order), PlanMemory(order)
    memory.add(plan)
    memory.remove(plan)
    assert memory.count == before.count and memory.steps == before.steps
    assert [memory.answer(s) for s in before.steps] == [before.answer(s) for s in before.steps]
    question = "Who is the spouse of the Blue Sky performer?"
    assert memory.relations(question) == before.relations(question)
    assert memory.sharing({"green", "spouse"}) == before.sharing({"green", "spouse"})


def test_title_phrases():
    assert title_phrases("What award did the author of The Red Tree receive?") == [
        "The Red Tree",
        "Red Tree",
        "Red",
        "Tree",
    ]
    assert title_phrases('Who did the creator of Push, Nevada play in "Dazed"?')[:2] == [
        "Dazed",
        "Push, Nevada",
    ]
    assert title_phrases("The 1967 Federation Cup was held.")[:2] == [
        "The 1967 Federation Cup",
        "1967 Federation Cup",
    ]


def test_writes_first_steps_and_chains_through_remembered_answers():
    p = make_predictor("subtopic")
    assert isinstance(p, SubtopicPredictor) and p.name == "subtopic"
    # a new name with the relations its words cue
    assert p.rank(ctx("Who is the spouse of the Red Moon performer?"), 2) == [
        "Red Moon >> performer",
        "Red Moon >> spouse",
    ]
    # a remembered first step, then the step its remembered answer opens
    ranked = p.rank(ctx("Where was the Green performer's spouse born?"), 3)
    assert ranked == ["Green >> performer", "Steve Hillage >> spouse", "Green >> spouse"]
    assert p.rank(ctx("Who is the spouse of the Red Moon performer?", ()), 3) == []


def test_learns_only_from_resolved_branches_and_never_mutates_the_history():
    p = SubtopicPredictor()
    question = "Who is the producer of Night Train?"
    before = p.rank(ctx(question), 5)
    assert "Night Train >> producer" not in before  # no relation "producer" known yet
    p.observe(ctx(question), ("Night Train >> producer", "<none>"))
    assert "Night Train >> producer" in p.rank(ctx("Who was the producer of Night Train?"), 5)
    assert len(HISTORY) == 3 and all("producer" not in s.ask for h in HISTORY for s in h.steps)
    # a new history object rebuilds the memory, keeping what was observed
    again = p.rank(ctx("Who was the producer of Night Train?", HISTORY[:2] + HISTORY[2:]), 5)
    assert "Night Train >> producer" in again
    # a branch of a question the history holds (a train request replayed before the run)
    # is not counted again, even when observed before the history arrives
    known = SubtopicPredictor()
    known.observe(ctx(HISTORY[0].question, ()), ("Green >> performer",))
    memory = known.memory(ctx("q").evidence)
    assert memory.count["Green >> performer"] == 2 and memory.questions == 3
    known.observe(ctx(HISTORY[0].question), ("Green >> performer",))
    assert known.memory(ctx("q").evidence).count["Green >> performer"] == 2
    plan = observed_plan(question, ("<none>", "Night Train >> producer"), PlanMemory())
    assert plan.steps == (
        KnownStep("Night Train >> producer", "Night Train", "producer", "", True),
    )
    asked = observed_plan(question, ("Night Train >> Who produced Night Train?",), PlanMemory())
    assert not asked.steps[0].relation


def test_weights_are_validated():
    with pytest.raises(ValueError, match="features"):
        SubtopicWeights(features={"cover": 1.0})
    with pytest.raises(ValueError, match="not finite"):
        SubtopicWeights(features={**FITTED, "cover": float("inf")})
    with pytest.raises(ValueError, match="names"):
        SubtopicWeights(names=-1)
    assert set(SubtopicWeights().features) == set(FEATURES)


# -- the real data ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_dir() -> Path:
    found = resolve_data_dir(None)
    if found is None or not (found / "musique").is_dir() or not (found / "hotpotqa").is_dir():
        pytest.skip("the shared data directory (musique, hotpotqa) is absent")
    return found


@pytest.mark.data
def test_the_history_is_the_train_split_and_only_test_runs_see_it(real_dir):
    workload = SubAgentWorkload(tool_time="modelled")
    data = DataConfig(real_dir, Path("/nonexistent-cache"))
    (test,) = workload.requests(data, 1, 0, "test")
    (train,) = workload.requests(data, 1, 0, "train")
    history = test.evidence()["history"]
    assert len(history) == 583 and train.evidence()["history"] == ()
    assert history == tuple(known_plan(r) for r in workload.records(data, "train"))
    assert {split_of(r.id) for r in workload.records(data, "train")} == {"train"}
    assert history[0].steps[0] == known_plan(workload.records(data, "train")[0]).steps[0]


@pytest.mark.data
def test_the_shipped_weights_are_the_train_fit(real_dir):
    assert fit_weights(real_dir, plan="resolved") == SubtopicWeights()


@pytest.mark.data
def test_accuracy_on_the_test_split(real_dir):
    # the stream a 100-request replay draws, plans written with the bridges' answers
    run = subtopic_accuracy(real_dir, n=100, plan="resolved")
    assert run["plans"]["proposed"] == 1.0  # candidates at every plan branch
    assert run["rows"]["all"]["subtopics"] == 270
    assert run["rows"]["all"]["top5"] == pytest.approx(120 / 270)
    assert run["plans"]["all@3"] == 0.07  # plans whose every sub-topic is in the top 3
    recall = subtopic_accuracy(real_dir, n=100, predictor=make_predictor("recall"), plan="resolved")
    assert recall["plans"]["proposed"] == 0.03 and recall["rows"]["all"]["top5"] < 0.01


def test_accuracy_counts_the_unreferenced_lines_of_a_plan_written_with_references():
    fixture = Path(__file__).parent / "fixtures" / "musique"
    resolved = subtopic_accuracy(fixture, split="all", plan="resolved")
    references = subtopic_accuracy(fixture, split="all", plan="references")
    for k in (1, 2, 3, 5, 8):  # every line of a resolved plan is unreferenced
        assert resolved["plans"][f"unreferenced@{k}"] == resolved["plans"][f"all@{k}"]
    shares = [references["plans"][f"unreferenced@{k}"] for k in (1, 2, 3, 5, 8)]
    assert shares == sorted(shares) and 0.0 < shares[-1] <= 1.0
    # a later line is written "#k >> ...", which no fill can cover while the plan is open
    assert references["plans"]["all@8"] <= shares[-1]


def test_the_step_split_fit_leaves_a_question_s_whole_step_group_out_of_the_memory():
    fixture = Path(__file__).parent / "fixtures" / "musique"
    by_question, by_step = fit_weights(fixture), fit_weights(fixture, split_by="step")
    # by question, a train question meets the steps other train questions share with it
    assert by_question.features["seen"] > 0.0
    # by step, those questions leave with it: no sub-topic it ranks was ever seen
    assert by_step.features["seen"] == 0.0 and by_step.features["foreign_seen"] == 0.0


@pytest.mark.data
def test_unreferenced_lines_on_the_test_split(real_dir):
    run = subtopic_accuracy(real_dir, n=300, plan="references")
    assert run["plans"]["unreferenced@3"] == pytest.approx(116 / 300)


# -- a sub-agent's search (the SearchRanker the predictor hands those branches to) -------------


def search_ctx(subtopic: str) -> BranchContext:
    return BranchContext(
        "r", BranchCoordinate("subagent", "sub_think", 0), (), {"subtopic": subtopic}
    )


def test_search_candidates_are_the_names_a_sub_topic_gives_in_order():
    assert search_candidates("Steve Hillage >> spouse") == [("Steve Hillage", "head")]
    assert search_candidates("Germans >> What king united the Franks and Saxons?") == [
        ("Germans", "head"),
        ("Franks", "ask1"),
        ("Saxons", "ask2"),
    ]
    assert search_candidates("Count of Barcelona >> spouse") == [("Count of Barcelona", "head")]
    assert search_candidates("Who founded Quillfeather Press?") == [
        ("Who founded Quillfeather Press?", "head"),
        ("Quillfeather Press", "inner1"),
    ]
    assert search_candidates(" >> ") == []


def test_the_search_ranking_is_learnt_from_what_was_searched():
    p = SubtopicPredictor()
    subtopic = "Germans >> What king united the Franks?"
    assert p.rank(search_ctx(subtopic), 3) == ["Germans", "Franks"]  # text order, untaught
    for _ in range(3):  # sub-agents that searched the name inside the ask
        p.observe(search_ctx("Danes >> Who ruled the Jutes?"), ("Jutes",))
    assert p.search.rate("ask1") == 4 / 5 and p.search.rate("head") == 1 / 5
    assert p.rank(search_ctx(subtopic), 3) == ["Franks", "Germans"]
    assert p.rank(search_ctx(subtopic), 1) == ["Franks"]
    # a search branch teaches the plan memory nothing, and a plan branch the ranker nothing
    assert p.memory(ctx("q").evidence).questions == 3
    p.observe(ctx("Who is the producer of Night Train?"), ("Night Train >> producer",))
    assert sum(p.search.proposed.values()) == 6
    assert make_predictor("subtopic").rank(search_ctx("Ann Lee >> spouse"), 2) == ["Ann Lee"]
