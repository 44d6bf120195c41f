"""Online top-k coverage: rank from branch-time evidence, then learn what was chosen."""

import pytest

from dynbranch.predictors import make_predictor
from dynbranch.workflow import BranchCoordinate, BranchPoint
from workloads.analysis.accuracy import branch_accuracy
from workloads.analysis.trace import Trace


def _trace(rid, picks, multi=False):
    t = Trace(rid)
    for step, chosen in enumerate(picks):
        point = BranchPoint(BranchCoordinate("w", "pick", step), ("a", "b", "c", "d"),
                            multi_valued=multi)
        t.branches.append((point, tuple(chosen)))
    return t


def test_coverage_is_online_and_counts_each_chosen_candidate():
    # "c" is always chosen; a cold frequency predictor ranks in candidate order, so the
    # first branch misses top-1 and top-2, and every later one is learned
    test = [_trace("q1", ["c"]), _trace("q2", ["c"]), _trace("q3", ["c"])]
    (row,) = branch_accuracy(test, make_predictor("frequency"), ks=(1, 3))
    assert row.branches == 3 and row.coverage[1] == pytest.approx(2 / 3)
    assert row.coverage[3] == pytest.approx(1.0)
    multi = [_trace("m", [["a", "d"]], multi=True)]
    (row,) = branch_accuracy(multi, make_predictor("frequency"), ks=(1, 3))
    assert row.coverage[1] == pytest.approx(0.5) and row.coverage[3] == pytest.approx(0.5)
    assert row.chosen_per_branch == 2


def test_warming_on_train_branches_teaches_before_the_first_test_branch():
    train = [_trace("t", ["d", "d"])]
    (row,) = branch_accuracy([_trace("q", ["d"])], make_predictor("frequency"), ks=(1,),
                             train=train)
    assert row.coverage[1] == 1.0
