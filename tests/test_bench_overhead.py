"""scripts/bench_overhead.py's own reading of its stamps: the to-the-engine leg split by the
engine's queue, and the lanes' floor (the same calls over lanes to bare actors)."""

from __future__ import annotations

import time

import pytest

from dynbranch.engines.protocol import GenerateRequest
from tests import scripts

bench = scripts.load("bench_overhead")
Call = bench.Call


def _request(i: int) -> GenerateRequest:
    return GenerateRequest(request_id=f"r{i}", prompt="p" * 40_000, max_tokens=8)


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
