"""The entity ranker (ReAct's next search): spans, page titles, the fitted scorer, and its
accuracy on the real questions (``data`` tests: fitted on train, measured on test)."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.datasets import resolve_data_dir
from dynbranch.predictors import BranchContext, Predictor, make_predictor
from dynbranch.predictors.entity import (
    FITTED_FOLLOW,
    FITTED_QUESTION,
    PassageWeights,
    RankerWeights,
    answer_clause,
    name_spans,
    passage_ranking,
    rank_entities,
)
from dynbranch.predictors.hops import FITTED_HOPS, finish_probability, hop_distribution
from dynbranch.predictors.spans import norm
from dynbranch.predictors.titles import TitleIndex, title_key
from dynbranch.workflow import BranchCoordinate
from workloads.analysis.entity_accuracy import (
    entity_accuracy,
    entity_branches,
    fit_hop_weights,
    fit_weights,
    with_observation,
)
from workloads.analysis.listwise import listwise_fit
from workloads.react.retrieval import Bm25Index, Passage, make_corpus

PAGES = [
    ("A Dog's Purpose (film)", "A Dog's Purpose is a 2017 film in which Dennis Quaid plays Ethan."),
    ("Dennis Quaid", "Dennis Quaid is an American actor, once married to Meg Ryan."),
    ("Miracle on 34th Street", "Miracle on 34th Street is a 1947 film with Natalie Wood."),
    ("Beyoncé", "Beyoncé is a singer."),
]
DOG = "Who is the spouse of the actor of Ethan in A Dog's Purpose?"


@pytest.fixture(scope="module")
def index() -> Bm25Index:
    passages = [Passage(f"p{i}", title, text) for i, (title, text) in enumerate(PAGES)]
    return Bm25Index(make_corpus([("pages", passages)]))


def hop0(question: str, index: Bm25Index | None) -> dict:
    evidence = {"question": question, "searched": [], "observation": ""}
    evidence["passages"] = [{"title": "", "text": question}]
    return {**evidence, "index": index} if index is not None else evidence


def test_name_spans():
    spans = name_spans(
        "In 1921 the poet Ansel Dunmore of Port Verity founded St. Louis Press; "
        "The Band played in Finland's north."
    )
    maximal = [s for s, _, whole in spans if whole]
    assert maximal == ["Ansel Dunmore of Port Verity", "St. Louis Press", "Band", "Finland"]
    parts = {s for s, _, whole in spans if not whole}
    assert {"Ansel Dunmore", "Port Verity", "St. Louis"} <= parts
    assert ("Ansel Dunmore of Port Verity", 17, True) in spans
    assert name_spans("The Glenn L. Martin Company built it.")[0][0] == "Glenn L. Martin Company"
    assert name_spans("It was Natalie Wood and Edmund Gwenn.")[0][0] == "Natalie Wood"


def test_title_index_maps_phrases_to_page_titles():
    assert title_key("The Lego Batman Movie") == title_key("lego batman movie")
    assert title_key("A Dog’s Purpose") == "a dogs purpose"
    titles = TitleIndex(title for title, _ in PAGES)
    assert len(titles) == 4 and "Dennis Quaid" in titles and "dennis quaid" not in titles
    assert titles.named("Miracle on 34th street") == ("Miracle on 34th Street",)
    assert titles.named("A Dog's Purpose") == ("A Dog's Purpose (film)",)
    assert titles.named("Beyonce") == ("Beyoncé",)  # accents folded
    assert titles.named("The") == () and titles.named("film") == ()
    assert titles.mentioned("Did Beyonce sing in Miracle on 34th street?") == [
        ("Miracle on 34th Street", "Miracle on 34th street", 20),
        ("Beyoncé", "Beyonce", 4),
    ]


def test_hop_0_ranks_the_question_s_names_and_the_titles_they_name(index):
    assert rank_entities(hop0(DOG, index), 3) == [
        "A Dog's Purpose (film)",  # the page a phrase names
        "A Dog's Purpose",  # the phrase itself, as a knowledge-base step names it
        "Ethan",
    ]
    # without the index: the question's own name spans only
    assert rank_entities(hop0(DOG, None), 5) == ["Ethan", "Dog", "Purpose"]
    sibling = "Who is the sibling of the actress in Miracle on 34th street?"
    assert rank_entities(hop0(sibling, index), 1) == ["Miracle on 34th Street"]


def test_later_hops_read_the_observation_first(index):
    passages = [{"title": t, "text": x} for t, x in PAGES[:1]]
    evidence = {
        "question": DOG,
        "searched": ["A Dog's Purpose (film)"],
        "passages": passages,
        "observation": "Who plays Ethan in A Dog's Purpose? Dennis Quaid.",
        "index": index,
    }
    assert rank_entities(evidence, 1) == ["Dennis Quaid"]
    moved = {**evidence, "observation": "The actor of Ethan in A Dog's Purpose is Meg Ryan."}
    assert rank_entities(moved, 1) == ["Meg Ryan"]  # the observation, not the passage
    blind = {**evidence, "observation": ""}
    assert rank_entities(blind, 2) == passage_ranking(blind, 2) == ["Dennis Quaid", "Ethan"]
    assert "A Dog's Purpose (film)" not in rank_entities(evidence, 50)


def test_a_likely_finish_and_unlikely_candidates_are_not_proposed(index):
    two_hop = "Who is the spouse of the Green performer?"
    assert finish_probability(two_hop, 1) == 0.0 and finish_probability(two_hop, 4) == 1.0
    assert sum(hop_distribution(two_hop).values()) == pytest.approx(1.0)
    assert finish_probability(two_hop, 2) > RankerWeights().finish_above
    evidence = {
        "question": two_hop,
        "searched": ["Green", "Steve Hillage"],
        "passages": [{"title": "Steve Hillage", "text": "Steve Hillage married Miquette Giraudy."}],
        "observation": "The spouse of Steve Hillage is Miquette Giraudy.",
    }
    assert rank_entities(evidence, 3) == []  # the chain is likely done
    ranking = RankerWeights(finish_above=1.0, min_probability=0.0)
    assert rank_entities(evidence, 3, ranking) == ["Miquette Giraudy", "Giraudy", "Miquette"]
    cut = RankerWeights(finish_above=1.0, min_probability=0.1)
    assert rank_entities(evidence, 3, cut) == ["Miquette Giraudy"]


def test_answer_clause():
    assert answer_clause("The performer of Green is Steve Hillage.") == "Steve Hillage"
    assert answer_clause("who is the head of NSA? ADM Michael S. Rogers.") == (
        "ADM Michael S. Rogers"
    )
    assert answer_clause("Paris") == "Paris" and answer_clause("") == ""
    assert answer_clause("It is " + "very " * 12 + "long.") == ""


@settings(max_examples=60, deadline=None)
@given(st.sets(st.sampled_from(["Lantern Song", "Mira Calloway", "Mira", "Quillfeather"])))
def test_never_proposes_what_was_searched(searched):
    evidence = {
        "question": "Who is the spouse of the performer of Lantern Song?",
        "searched": sorted(searched) or ["Lantern Song"],
        "passages": [
            {
                "title": "Lantern Song",
                "text": "Lantern Song is by Mira Calloway on Quillfeather Records.",
            }
        ],
        "observation": "The performer of Lantern Song is Mira Calloway.",
    }
    keys = [norm(s) for s in evidence["searched"]]
    for name in rank_entities(evidence, 50):
        assert not any(f" {norm(name)} " in f" {k} " for k in keys), name


def test_the_ranker_is_a_predictor_over_evidence_only(index):
    ranker = make_predictor("entity")
    assert isinstance(ranker, Predictor) and ranker.name == "entity"
    a = ranker.rank(
        BranchContext("r1", BranchCoordinate("react", "think", 0), (), hop0(DOG, index)), 3
    )
    ranker.observe(BranchContext("r1", BranchCoordinate("react", "think", 0), (), {}), ("Ethan",))
    b = ranker.rank(
        BranchContext("r2", BranchCoordinate("react", "think", 4), (), hop0(DOG, index)), 3
    )
    assert a == b == rank_entities(hop0(DOG, index), 3)
    assert rank_entities(hop0(DOG, index), 0) == [] and rank_entities({}, 3) == []


def test_weights_are_validated():
    for bad in ({"w_rank": 0.0}, {"char_scale": 0.0}, {"part_factor": 1.5}, {"page_bonus": 0.0}):
        with pytest.raises(ValueError):
            PassageWeights(**bad)
    with pytest.raises(ValueError, match="features"):
        RankerWeights(question={"span": 1.0})
    with pytest.raises(ValueError, match="not finite"):
        RankerWeights(follow={**FITTED_FOLLOW, "answer": math.nan})
    with pytest.raises(ValueError, match="search_decay"):
        RankerWeights(search_decay=0.0)
    assert dict(RankerWeights().question) == FITTED_QUESTION


def test_listwise_fit_learns_the_feature_that_picks():
    # "a" marks the chosen candidate in every group; "b" never tells candidates apart
    groups = [
        ({"x": {"a": 1.0, "b": 1.0}, "y": {"a": 0.0, "b": 1.0}}, "x"),
        ({"x": {"a": 0.0, "b": 0.0}, "y": {"a": 1.0, "b": 0.0}}, "y"),
        ({"x": {"a": 0.0}, "y": {"a": 0.0}}, "z"),  # chosen not offered: skipped
    ]
    w = listwise_fit(groups, ("a", "b"), l2=0.1, iterations=500)
    assert w["a"] > 1.0 and w["b"] == pytest.approx(0.0, abs=1e-12)
    assert listwise_fit(groups, ("a", "b"), iterations=500) == w  # deterministic
    assert listwise_fit([], ("a",)) == {"a": 0.0}
    with pytest.raises(ValueError):
        listwise_fit(groups, ("a",), rate=0.0)


# -- the real data ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_dir() -> Path:
    found = resolve_data_dir(None)
    if found is None or not (found / "musique").is_dir() or not (found / "hotpotqa").is_dir():
        pytest.skip("the shared data directory (musique, hotpotqa) is absent")
    return found


@pytest.mark.data
def test_the_shipped_weights_are_the_train_fit(real_dir):
    assert fit_weights(real_dir) == RankerWeights()
    assert fit_hop_weights(real_dir) == {n: dict(w) for n, w in FITTED_HOPS.items()}


@pytest.mark.data
def test_accuracy_on_the_test_split_beats_the_paper(real_dir):
    branches = entity_branches(real_dir, "test")
    assert {b.request_id.split("-", 2)[2] for b in branches}.isdisjoint(
        {b.request_id.split("-", 2)[2] for b in entity_branches(real_dir, "train")}
    )
    ranking = RankerWeights(finish_above=1.0, min_probability=0.0)
    rows = entity_accuracy(branches=branches, weights=ranking)["rows"]
    assert (rows["hop 0"]["branches"], rows["hops 1+"]["branches"]) == (219, 308)
    assert rows["hop 0"]["top3"] == pytest.approx(180 / 219)
    assert rows["hops 1+"]["top3"] == pytest.approx(281 / 308)
    reader = entity_accuracy(branches=branches, observation="reader", weights=ranking)["rows"]
    none = entity_accuracy(branches=branches, observation="none", weights=ranking)["rows"]
    assert reader["hop 0"] == rows["hop 0"] == none["hop 0"]  # hop 0 has no observation
    assert none["hops 1+"]["top3"] < reader["hops 1+"]["top3"] < rows["hops 1+"]["top3"]
    for row in (rows, reader):
        assert min(row["hop 0"]["top3"], row["hops 1+"]["top3"]) >= 0.61
    later = next(b for b in branches if b.hop == 1)
    assert with_observation(later, "none")["observation"] == ""
    # as proposed: the finish gate and the probability cut trade hits for fewer losing fills
    shipped = entity_accuracy(branches=entity_branches(real_dir, "test", finishes=True))
    assert shipped["finish"] == {"branches": 219, "quiet": pytest.approx(182 / 219)}
    assert shipped["rows"]["hops 1+"]["top3"] == pytest.approx(262 / 308)
