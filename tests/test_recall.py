"""The recall predictor: remembered outcomes the evidence mentions, learned only from the past."""

from dynbranch.predictors import make_predictor
from dynbranch.predictors.base import BranchContext
from dynbranch.workflow import BranchCoordinate

COORD = BranchCoordinate("subagent", "plan", 0)


def ctx(question):
    return BranchContext("r", COORD, (), {"question": question})


def test_proposes_remembered_topics_the_question_mentions_most_chosen_first():
    p = make_predictor("recall")
    assert p.rank(ctx("Who married Steve Hillage?"), 3) == []  # nothing remembered yet
    p.observe(ctx("q1"), ("Steve Hillage >> spouse", "Green >> performer"))
    p.observe(ctx("q2"), ("Steve Hillage >> spouse", "Gong >> founder"))
    p.observe(ctx("q3"), ("Steve Hillage >> birthplace",))
    ranked = p.rank(ctx("Where was the spouse of steve hillage born? Not Gong."), 5)
    # ties (one choice each) keep the order of first sighting
    assert ranked == ["Steve Hillage >> spouse", "Gong >> founder", "Steve Hillage >> birthplace"]
    assert p.rank(ctx("Where was the spouse of steve hillage born?"), 1) == [
        "Steve Hillage >> spouse"]


def test_ranking_ignores_the_branch_being_ranked_and_short_anchors():
    p = make_predictor("recall")
    p.observe(ctx("q"), ("US >> capital",))
    assert p.rank(ctx("the US capital"), 3) == []
    other = BranchContext("r", BranchCoordinate("react", "think", 0), (), {"question": "US"})
    assert p.rank(other, 3) == []
