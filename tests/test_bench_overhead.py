"""scripts/bench_overhead.py's own reading of its stamps: the to-the-engine leg split by the
engine's queue, and the lanes' floor (the same calls over lanes to bare actors)."""

from __future__ import annotations

import time

import pytest

from dynbranch.engines.protocol import GenerateRequest
from dynbranch.runtime.runlog import StageRecord
from tests import scripts

bench = scripts.load("bench_overhead")
Call = bench.Call


def _request(i: int) -> GenerateRequest:
    return _request_id(f"r{i}")


def _request_id(request_id: str) -> GenerateRequest:
    return GenerateRequest(request_id=request_id, prompt="p" * 40_000, max_tokens=8)


def test_a_call_sent_while_its_engine_works_on_another_is_counted_as_queued() -> None:
    calls = [
        Call(0.0, 0.1, 1.0, 1.1, "a", _request(0)),
        # NOTE: sent while r0 is worked on by the same engine: it waits until 1.0
        Call(0.5, 1.0, 1.2, 1.3, "a", _request(1)),
        Call(2.0, 2.1, 2.2, 2.3, "a", _request(2)),  # the engine had nothing to do
        Call(0.5, 0.6, 0.7, 0.8, "b", _request(3)),  # another engine, idle
    ]
    got = bench.behind_engine_work(calls)
    assert got["calls"] == 4 and got["sent while the engine was busy"] == 1
    assert got["busy"]["p50"] == pytest.approx(500.0)  # ms: 0.5 s behind r0
    assert got["idle"]["p50"] == pytest.approx(100.0)
    assert got["idle"]["p99"] == pytest.approx(100.0)


def test_with_every_engine_idle_there_is_no_busy_row() -> None:
    calls = [Call(0.0, 0.001, 0.002, 0.003, "a", _request(0)),
             Call(1.0, 1.002, 1.003, 1.004, "a", _request(1))]
    got = bench.behind_engine_work(calls)
    assert got["sent while the engine was busy"] == 0 and "busy" not in got
    assert got["idle"]["p50"] == pytest.approx(1.5)


@pytest.mark.ray
def test_the_lane_floor_sends_every_call_again_over_lanes_to_bare_actors() -> None:
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(bench)  # NOTE: as for the script's __main__
    t0 = time.monotonic()
    calls = [Call(t0 + 0.01 * i, 0.0, 0.0, 0.0, f"e{i % 2}", _request(i)) for i in range(12)]
    floor = bench.lane_floor(calls)
    assert set(floor) == {"to the actor, lane", "back to the caller, lane"}
    for leg in floor.values():
        assert 0.0 < leg["p50"] <= leg["p99"] < 5_000.0  # ms: one machine, real stamps


def _stage(request_id: str, stage: str, engine: str, start: float, end: float,
           engine_s: float, call_id: str) -> StageRecord:
    return StageRecord(request_id, stage, "llm", 0, None, start, end, engine=engine,
                       call_id=call_id, engine_s=engine_s)


def test_a_stage_overhead_splits_into_the_driver_s_parts_and_the_call_s_legs() -> None:
    # NOTE: the run's clock starts at 100 s; stages are in run time, calls in clock time
    rel = lambda t: t - 100.0  # noqa: E731
    stages = [_stage("r0", "router", "e0", 1.0, 2.0, 0.5, "r0/1/router"),
              _stage("r1", "router", "e1", 3.0, 3.1, 0.02, "r1/1/router")]
    calls = [Call(101.1, 101.3, 101.8, 101.9, "e0", _request_id("r0/1/router")),
             Call(103.01, 103.02, 103.04, 103.05, "e1", _request_id("r1/1/router"))]
    got = bench.stage_parts(stages, calls, rel)
    assert got["stages"] == 2 and got["unmatched"] == 0
    q = got["quantiles"]
    # r0: 0.1 s of driver before, 0.2 to the engine, 0.1 back, 0.1 after: 0.5 s of overhead
    assert q["the driver before the call"]["p99"] == pytest.approx(100.0, rel=0.05)
    assert q["to the engine"]["p99"] == pytest.approx(200.0, rel=0.1)
    slow = got["slowest"]
    assert slow["stages"] == 1 and slow["overhead"] == pytest.approx(500.0)
    parts = [slow[name] for name in bench.PARTS]
    assert parts == pytest.approx([100.0, 200.0, 100.0, 100.0])
    assert sum(parts) == pytest.approx(slow["overhead"])


def test_parallel_stages_of_a_request_on_one_engine_each_match_their_own_call() -> None:
    # NOTE: two handlers of r0 on e0 whose spans nest: only the call id tells them apart
    rel = lambda t: t  # noqa: E731
    stages = [_stage("r0", "handler", "e0", 0.0, 1.0, 0.1, "r0/1/handler"),
              _stage("r0", "handler", "e0", 0.05, 0.9, 0.1, "r0/2/handler")]
    calls = [Call(0.2, 0.3, 0.4, 0.5, "e0", _request_id("r0/2/handler")),
             Call(0.1, 0.2, 0.3, 0.4, "e0", _request_id("r0/1/handler"))]
    got = bench.stage_parts(stages, calls, rel)
    assert got["stages"] == 2 and got["unmatched"] == 0
    # NOTE: r0/1 had 0.1 s before its call, r0/2 0.15 s (matched by span, each would be both)
    assert got["quantiles"]["the driver before the call"]["mean"] == pytest.approx(125.0)
    assert got["quantiles"]["the driver after the call"]["mean"] == pytest.approx(500.0)


def test_a_stage_whose_call_was_not_seen_or_was_seen_twice_is_left_out_and_counted() -> None:
    rel = lambda t: t  # noqa: E731
    stages = [_stage("r0", "handler", "e0", 0.0, 1.0, 0.1, "r0/1/handler"),
              _stage("r1", "handler", "e0", 0.0, 1.0, 0.1, "r1/1/handler")]
    calls = [Call(0.1, 0.2, 0.3, 0.4, "e0", _request_id("r0/1/handler")),
             Call(0.5, 0.6, 0.7, 0.8, "e0", _request_id("r0/1/handler"))]
    got = bench.stage_parts(stages, calls, rel)
    assert got == {"stages": 0, "unmatched": 2}
