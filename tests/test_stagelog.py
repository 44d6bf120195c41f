"""The stage-log readers: per-stage durations, branch windows and the Eq. 2 bound."""

import pandas as pd
import pytest

from dynbranch.stagelog import RunLogFrames, branch_windows, overlap_bound, stage_durations


def _stage(rid, stage, kind, coord, start, end, *, reusable=True, served="exec", spec=False,
           out=0):
    return {"request_id": rid, "stage": stage, "kind": kind, "coordinate": coord,
            "start": start, "end": end, "duration": end - start, "served_from": served,
            "speculative": spec, "reusable": reusable, "error": "", "prompt_tokens": 100,
            "output_tokens": out}


def _run():
    stages = pd.DataFrame([
        _stage("a", "router", "llm", "w/r/0", 0.0, 2.0, out=200),
        _stage("a", "handler", "llm", "w/r/0", 2.0, 3.0, out=50),   # 1.0 s
        _stage("a", "executor", "tool", "w/r/0", 3.0, 3.5),          # 0.5 s
        _stage("a", "answer", "llm", "w/r/0", 3.5, 6.0),             # past the depth of 2
        _stage("a", "handler", "llm", "w/r/0", 2.0, 2.5, spec=True),  # a fill: not canonical
        _stage("b", "router", "llm", "w/r/0", 0.0, 0.5, out=100),
        _stage("b", "write", "tool", "w/r/0", 0.5, 4.0, reusable=False),  # never fillable
        _stage("b", "handler", "llm", "w/r/0", 4.0, 5.0, out=40),
    ])
    branches = pd.DataFrame([
        {"request_id": "a", "coordinate": "w/r/0", "opened_at": 0.0, "resolved_at": 2.0},
        {"request_id": "b", "coordinate": "w/r/0", "opened_at": 0.0, "resolved_at": 0.5},
    ])
    requests = pd.DataFrame([
        {"request_id": "a", "latency": 6.0, "status": "completed"},
        {"request_id": "b", "latency": 5.0, "status": "completed"},
    ])
    return RunLogFrames(stages, branches, requests)


def test_the_bound_is_min_of_window_and_the_fillable_execution_after_it():
    bound = overlap_bound(_run(), depth=2)
    per = dict(zip(bound.per_request["request_id"], bound.per_request["bound_s"], strict=True))
    assert per["a"] == pytest.approx(1.5)  # min(2.0 window, handler 1.0 + executor 0.5)
    assert per["b"] == pytest.approx(0.5)  # min(0.5 window, handler 1.0); the write is no fill
    assert bound.share == pytest.approx(2.0 / 11.0)
    assert overlap_bound(_run(), depth=1).per_request["bound_s"].tolist() == [1.0, 0.5]


def test_a_fill_stops_before_a_stage_no_fill_can_run():
    # NOTE: a's executor and b's handler read what only the resolution brings (HCI's reply)
    bound = overlap_bound(_run(), depth=2, unfillable=frozenset({"executor"}))
    per = dict(zip(bound.per_request["request_id"], bound.per_request["bound_s"], strict=True))
    assert per["a"] == pytest.approx(1.0)  # the handler alone, before the executor
    assert per["b"] == pytest.approx(0.5)
    first = overlap_bound(_run(), depth=2, unfillable=frozenset({"handler"}))
    assert first.per_request["bound_s"].tolist() == [0.0, 0.0]  # nothing before it to fill


def test_the_hci_reply_is_no_fill():
    from workloads import get_workload

    assert get_workload("hci").unfillable_stages == frozenset({"respond"})
    assert get_workload("routing").unfillable_stages == frozenset()


def test_stage_durations_count_canonical_executions_only():
    table = stage_durations(_run().stages).set_index("stage")
    assert table.loc["handler", "executions"] == 2
    assert table.loc["handler", "mean_s"] == pytest.approx(1.0)
    assert table.loc["router", "output_tokens"] == pytest.approx(150)


def test_branch_windows_per_coordinate_stage():
    w = branch_windows(_run().branches)
    assert w.to_dict("records") == [{"stage": "w/r", "entries": 2, "mean_window_s": 1.25}]
