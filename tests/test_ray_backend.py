"""The Ray backend on a local Ray instance: engine actors in a placement group."""

import asyncio
import time

import pytest

from dynbranch.arms.registry import get_arm
from dynbranch.backend import EngineSpec
from dynbranch.clock import RealClock
from dynbranch.engines.protocol import GenerateRequest
from dynbranch.errors import ConfigError
from dynbranch.orchestrator import Orchestrator
from tests.toy import ToyRequest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from dynbranch.cluster import ENGINE_RESOURCE, RayBackend  # noqa: E402


def _engine_units_free(expected: float, timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if ray.available_resources().get(ENGINE_RESOURCE, 0.0) == expected:
            return True
        time.sleep(0.2)
    return False


def test_requests_run_on_engine_actors_and_nothing_outlives_shutdown(local_ray):
    clock = RealClock()
    backend = RayBackend(clock, {"target": EngineSpec("sim", "qwen3-0.6b@h200", 2)})

    async def main():
        await backend.start()
        try:
            orch = Orchestrator(clock, backend.clients(), get_arm("floor"))
            orch.start_run()
            records = await asyncio.gather(
                *(orch.run_request(ToyRequest(i, fail=(i == 3)), 0.0) for i in range(6)))
            client = backend.clients()["target"][0]
            load = await client.load()
            aborted = await client.abort("never-sent")
            lanes = [(c.lane.calls, dict(c.lane_counts)) for c in backend.clients()["target"]]
            return records, orch, load, aborted, lanes
        finally:
            await backend.shutdown()

    records, orch, load, aborted, lanes = clock.run(main())
    # NOTE: every engine call went over the engines' lanes, none as an actor call
    assert all(calls > 0 and counts["opened"] == 1 and counts["actor_calls"] == 0
               for calls, counts in lanes), lanes
    assert [r.status for r in records].count("completed") == 5
    assert records[3].error_type == "ToolCallError"
    engines = {s.engine for s in orch.log.stages if s.kind == "llm"}
    assert engines == {"sim-target-0", "sim-target-1"}
    assert load.engine_id == "sim-target-0" and load.running == 0 and load.kv_blocks_total > 0
    assert aborted is False
    assert _engine_units_free(4.0), ray.available_resources()


def test_without_lanes_engine_calls_are_actor_calls(local_ray):
    clock = RealClock()
    backend = RayBackend(clock, {"target": EngineSpec("sim", "qwen3-0.6b@h200", 1)},
                         stream_lanes=False)

    async def main():
        await backend.start()
        try:
            client = backend.clients()["target"][0]
            result = await client.generate(GenerateRequest("a-1", "hi", 4, replay_text="ok"))
            load = await client.load()
            return result, load, client.lane, dict(client.lane_counts)
        finally:
            await backend.shutdown()

    result, load, lane, counts = clock.run(main())
    assert result.text == "ok" and load.engine_id == "sim-target-0"
    assert lane is None and counts["opened"] == 0 and counts["actor_calls"] == 2


def test_streaming_through_the_actor_matches_the_replay_text(local_ray):
    clock = RealClock()
    backend = RayBackend(clock, {"target": EngineSpec("sim", "qwen3-0.6b@h200", 1)})

    async def main():
        await backend.start()
        try:
            actor = backend._actors[0]
            request = GenerateRequest("s-1", "hello there", 32, replay_text="one two three")
            text = ""
            async for ref in actor.generate_stream.remote(request):
                chunk = await ref
                text += chunk.text_delta
            return text, chunk.result.finish_reason
        finally:
            await backend.shutdown()

    assert clock.run(main()) == ("one two three", "stop")


def test_a_cluster_without_engine_slots_is_refused_before_placement(local_ray):
    clock = RealClock()
    backend = RayBackend(clock, {"target": EngineSpec("sim", "qwen3-0.6b@h200", 9)})

    async def main():
        try:
            await backend.start()
        finally:
            await backend.shutdown()

    with pytest.raises(ConfigError, match=r"dynbranch_engine: need 9, cluster has 4"):
        clock.run(main())


def test_replay_through_the_driver_on_local_ray(local_ray, tmp_path):
    from pathlib import Path

    from dynbranch.driver import ReplayConfig, prepare, run_replay

    fixture = Path(__file__).parent / "fixtures" / "bfcl"
    cfg = ReplayConfig(workload="routing", arm="floor", backend="ray", clock="real",
                       requests=8, rate=8.0, workers=2, profile="qwen3-0.6b@h200",
                       out=tmp_path / "run", progress=False,
                       workload_options={"root": str(fixture)})
    result = run_replay(prepare(cfg, progress=lambda _m: None))
    assert result.summary["backend"] == "ray"
    assert result.summary["completed"] == 8 and result.summary["accuracy"] == 1.0
    assert (tmp_path / "run" / "stages.parquet").exists()
    lanes = result.summary["engines"]["lanes"]  # NOTE: every engine call over a lane
    assert lanes["engine_opened"] == 2 and lanes["engine_actor_calls"] == 0
    assert lanes["engine_lane_calls"] >= 8 and lanes["engine_broken"] == 0
    assert _engine_units_free(4.0)
