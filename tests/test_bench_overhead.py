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


def _stage(call_id: str, engine: str, start: float, end: float, engine_s: float) -> StageRecord:
    """The row of an LLM stage that made the call ``call_id`` (``request/n/stage``)."""
    request_id, _n, stage = call_id.split("/")
    return StageRecord(request_id, stage, "llm", 0, None, start, end, engine=engine,
                       call_id=call_id, engine_s=engine_s)


def _call(call_id: str, engine: str, *stamps: float) -> Call:
    """A call's four stamps (start, arrived, finished, end), its engine and its id."""
    return Call(*stamps, engine, _request_id(call_id))


def _run_clock(t: float) -> float:
    return t


def test_a_stage_overhead_splits_into_the_driver_s_parts_and_the_call_s_legs() -> None:
    # NOTE: the run's clock starts at 100 s; stages are in run time, calls in clock time
    stages = [_stage("r0/1/router", "e0", 1.0, 2.0, 0.5),
              _stage("r1/1/router", "e1", 3.0, 3.1, 0.02)]
    calls = [_call("r0/1/router", "e0", 101.1, 101.3, 101.8, 101.9),
             _call("r1/1/router", "e1", 103.01, 103.02, 103.04, 103.05)]
    oracle = {"r0/1/router": 0.04}  # NOTE: seconds of r0's replay text, in the driver's part
    got = bench.stage_parts(stages, calls, lambda t: t - 100.0, oracle)
    assert got["stages"] == 2 and got["unmatched"] == 0
    q = got["quantiles"]
    # r0: 0.1 s of driver before (0.04 of it the oracle's), 0.2 to the engine, 0.1 back, 0.1
    # after: 0.5 s of overhead
    assert q["the driver before the call"]["p99"] == pytest.approx(60.0, rel=0.05)
    assert q["the replay oracle"]["p99"] == pytest.approx(40.0, rel=0.05)
    assert q["to the engine"]["p99"] == pytest.approx(200.0, rel=0.1)
    slow = got["slowest"]
    assert slow["stages"] == 1 and slow["overhead"] == pytest.approx(500.0)
    parts = [slow[name] for name in bench.PARTS]
    assert parts == pytest.approx([40.0, 60.0, 200.0, 100.0, 100.0])
    assert sum(parts) == pytest.approx(slow["overhead"])


def test_the_oracle_is_timed_per_engine_call_and_the_rest_of_the_instance_is_its_own() -> None:
    class Instance:
        request_id = "r0"

        def replay_text(self, rendered: Rendered) -> str:
            time.sleep(0.002)
            return rendered.text.upper()

    class Rendered:
        text = "go"

        @property
        def input_digest(self) -> str:
            time.sleep(0.25)  # NOTE: the driver's work (the row logs it), not the oracle's
            return "d"

    spent: dict[str, float] = {}
    timed = bench._TimedOracle(Instance(), "r0/1/router", spent)
    assert timed.replay_text(Rendered()) == "GO" and timed.request_id == "r0"
    assert set(spent) == {"r0/1/router"} and 0.002 <= spent["r0/1/router"] < 0.25


def test_parallel_stages_of_a_request_on_one_engine_each_match_their_own_call() -> None:
    # NOTE: two handlers of r0 on e0 whose spans nest: only the call id tells them apart
    stages = [_stage("r0/1/handler", "e0", 0.0, 1.0, 0.1),
              _stage("r0/2/handler", "e0", 0.05, 0.9, 0.1)]
    calls = [_call("r0/2/handler", "e0", 0.2, 0.3, 0.4, 0.5),
             _call("r0/1/handler", "e0", 0.1, 0.2, 0.3, 0.4)]
    got = bench.stage_parts(stages, calls, _run_clock)
    assert got["stages"] == 2 and got["unmatched"] == 0
    # NOTE: r0/1 had 0.1 s before its call, r0/2 0.15 s (matched by span, each would be both)
    assert got["quantiles"]["the driver before the call"]["mean"] == pytest.approx(125.0)
    assert got["quantiles"]["the driver after the call"]["mean"] == pytest.approx(500.0)


def test_a_stage_whose_call_was_not_seen_or_was_seen_twice_is_left_out_and_counted() -> None:
    stages = [_stage(f"r{i}/1/handler", "e0", 0.0, 1.0, 0.1) for i in range(2)]
    calls = [_call("r0/1/handler", "e0", t, t + 0.1, t + 0.2, t + 0.3) for t in (0.1, 0.5)]
    assert bench.stage_parts(stages, calls, _run_clock) == {"stages": 0, "unmatched": 2}


def test_the_spread_over_runs_counts_the_runs_under_the_goal_and_pairs_each_with_its_own() -> None:
    def q(p99: float) -> dict[str, float]:
        return {"p50": p99 / 2, "p99": p99}

    runs = [(q(1.0), q(2.4)), (q(0.5), q(1.5)), (q(1.0), q(2.0))]
    line = bench.spread(runs)
    assert "over 3 runs: least 1.500, median 2.000, most 2.400 ms" in line
    assert "at most 2 ms in 2 of 3" in line
    assert line.endswith("median ratio to the in-process p99 of the same run 2.4x")  # 2.4, 3, 2


def test_the_slowest_stage_s_window_is_split_into_its_own_task_s_steps_others_and_gc() -> None:
    # NOTE: run time is clock time less 100 s; r1 is the slowest stage (0.5 s of overhead)
    stages = [_stage("r0/1/router", "e0", 1.0, 1.2, 0.1),
              _stage("r1/1/router", "e1", 2.0, 3.0, 0.5)]
    calls = [Call(101.05, 0, 0, 101.15, "e0", _request_id("r0/1/router"), 7),
             Call(102.1, 0, 0, 102.9, "e1", _request_id("r1/1/router"), 9)]
    steps = [bench.Step(102.0, 102.1, 9),    # r1's own work before its call
             bench.Step(102.5, 102.7, 7),    # another task's step while r1 waited
             bench.Step(102.95, 103.2, 9),   # r1's row, half of it after the stage ended
             bench.Step(101.0, 101.05, 7)]   # r0's, before r1 opened
    collections = [(102.55, 102.6), (104.0, 104.1)]  # NOTE: the second after every stage
    got = bench.tail_causes(stages, calls, steps, collections, lambda t: t - 100.0)
    assert got["stages"] == 2 and got["slowest"] == 1
    assert got["overhead"] == pytest.approx(500.0)
    assert got["own task"] == pytest.approx(150.0)     # ms: 0.1 + 0.05 inside [2, 3]
    assert got["other tasks"] == pytest.approx(200.0)
    assert got["collector"] == pytest.approx(50.0)
    assert got["overlapping a collection"] == 1 and got["collections"] == 1


def test_a_call_made_by_no_known_task_is_left_out_of_the_loop_split() -> None:
    stages = [_stage("r0/1/router", "e0", 1.0, 1.2, 0.1)]
    calls = [Call(1.05, 0, 0, 1.15, "e0", _request_id("r0/1/router"))]  # task unknown: 0
    assert bench.tail_causes(stages, calls, [], [], _run_clock) == {"stages": 0}


def test_the_loop_s_long_steps_are_kept_with_their_task_and_gc_passes_are_timed() -> None:
    import asyncio
    import gc

    async def slow() -> int:
        await asyncio.sleep(0)
        time.sleep(0.01)  # NOTE: a step of 10 ms, between two awaits
        await asyncio.sleep(0)
        return id(asyncio.current_task())

    async def main() -> int:
        return await asyncio.create_task(slow())

    plain = asyncio.events.Handle._run
    with bench.timed_loop_steps() as (steps, collections):
        task = asyncio.run(main())
        gc.collect()
    assert asyncio.events.Handle._run is plain  # NOTE: the loop is left as it was
    long = [s for s in steps if s.end - s.start >= 0.009]
    # NOTE: the 10 ms step is kept with its task (on a loaded machine another step may cross
    # 9 ms too, so this reads "among them", not "alone")
    assert task in [s.task for s in long]
    assert collections and all(b >= a for a, b in collections)
