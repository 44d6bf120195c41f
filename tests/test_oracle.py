"""The oracle bound: handed each branch's resolved candidates, on the real gate and engines."""

from pathlib import Path

import pytest

from dynbranch.arms.oracle import BranchOutcomes, OraclePredictor
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.errors import ConfigError
from dynbranch.predictors import BranchContext
from dynbranch.workflow import BranchCoordinate, BranchPoint

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"


def _ctx(rid, step=0):
    return BranchContext(rid, BranchCoordinate("w", "r", step), ("a", "b", "c"))


def test_the_oracle_ranks_each_entrys_resolution_in_order():
    outcomes = BranchOutcomes()
    p0 = BranchPoint(BranchCoordinate("w", "r", 0), ("a", "b", "c"))
    p1 = BranchPoint(BranchCoordinate("w", "r", 1), ("a", "b", "c"))
    outcomes.add("q", [(p0, ("b",)), (p0, ("c", "a")), (p1, ("a",))])
    oracle = OraclePredictor(outcomes)
    assert oracle.rank(_ctx("q"), 3) == ["b"]
    oracle.observe(_ctx("q"), ("b",))  # resolved: the second entry of w/r/0 is next
    assert oracle.rank(_ctx("q"), 3) == ["c", "a"] and oracle.rank(_ctx("q"), 1) == ["c"]
    assert oracle.rank(_ctx("q", 1), 3) == ["a"]
    assert oracle.rank(_ctx("other"), 3) == []


def _cfg(tmp_path, **kw):
    settings = {"workload": "routing", "backend": "local", "clock": "virtual", "requests": 12,
                "out": tmp_path / "run", "progress": False,
                "workload_options": {"root": str(FIXTURE)}, **kw}
    return ReplayConfig(**settings)


def test_the_oracle_arm_fills_only_what_each_branch_resolves_to(tmp_path):
    oracle = run_replay(prepare(_cfg(tmp_path, arm="oracle"), progress=lambda _m: None))
    s = oracle.summary
    assert s["completed"] == 12 and s["unsafe_splices"] == 0 and s["accuracy"] == 1.0
    assert s["speculation"]["oracle_requests"] == 12
    assert s["fills_issued"] > 0 and s["fills_consumed"] > 0
    stages = oracle.orchestrator.log.stages
    chosen = {(b.request_id, b.coordinate): set(b.chosen)
              for b in oracle.orchestrator.log.branches}
    for row in stages:
        if row.speculative:  # every fill is of a candidate the branch did resolve to
            assert row.fill in chosen[(row.request_id, row.coordinate)]


def test_the_oracle_is_refused_with_a_real_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")  # a model directory as the check sees it
    with pytest.raises(ConfigError, match="oracle"):
        prepare(_cfg(tmp_path, arm="oracle", engine="hf", model=str(tmp_path),
                     clock="real"), progress=lambda _m: None)
