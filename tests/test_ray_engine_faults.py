"""An engine actor that dies mid-run on the Ray backend: its calls come back as
``EngineDied`` and are retried on the other engine, Ray restarts it, the pool's probe takes
it back up, and the backend still shuts down cleanly."""

import asyncio
import os
import signal

import pytest

from dynbranch.arms.registry import get_arm
from dynbranch.backend import EngineSpec
from dynbranch.clock import RealClock
from dynbranch.engines.protocol import GenerateRequest
from dynbranch.errors import EngineDied
from dynbranch.orchestrator import Orchestrator
from tests.toy import ToyRequest

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from dynbranch.cluster import RayBackend  # noqa: E402


def test_requests_survive_an_engine_crash_and_the_engine_comes_back(local_ray):
    clock = RealClock()
    backend = RayBackend(clock, {"target": EngineSpec("sim", "qwen3-32b@h200", 2)})

    async def main():
        await backend.start()
        try:
            orch = Orchestrator(clock, backend.clients(), get_arm("floor"))
            orch.start_run()
            requests = [ToyRequest(i, answer_words=300) for i in range(8)]
            runs = [asyncio.ensure_future(orch.run_request(r, 0.0)) for r in requests]
            await asyncio.sleep(1.5)
            victim = backend._actors[0]
            os.kill(await victim.pid.remote(), signal.SIGKILL)
            records = await asyncio.gather(*runs)
            deaths = orch.pool.counts["went_down"]
            for _ in range(120):  # the probe takes the restarted engine back up
                if not orch.pool.down():
                    break
                await asyncio.sleep(0.25)
            back = await orch.pool.generate(
                "target", GenerateRequest("after", "hi", 4, replay_text="ok")
            )
            client = backend.clients()["target"][0]
            reopened = client.lane is not None and client.lane.broken is None
            await orch.pool.close()
            return records, deaths, orch.pool, back, dict(client.lane_counts), reopened
        finally:
            await backend.shutdown()

    records, deaths, pool, back, counts, reopened = clock.run(main())
    # NOTE: the killed engine's lane broke with it, and the probe opened one to the new actor
    assert counts["broken"] >= 1 and counts["opened"] >= 2 and reopened, counts
    assert [r.status for r in records] == ["completed"] * 8, [r.error for r in records]
    # NOTE: a restarted engine slow to answer its first probes may go down again meanwhile
    assert deaths >= 1 and pool.counts["retried"] >= 1
    assert pool.counts["recovered"] == pool.counts["went_down"]
    assert pool.down() == {} and back[1].text == "ok"


def test_a_call_on_a_dead_engine_raises_engine_died(local_ray):
    clock = RealClock()
    backend = RayBackend(clock, {"target": EngineSpec("sim", "qwen3-0.6b@h200", 1)})

    async def main():
        await backend.start()
        try:
            client = backend.clients()["target"][0]
            ray.kill(backend._actors[0], no_restart=True)
            # NOTE: the kill is asynchronous: Ray may call the actor dead while its process
            # still serves the lane for a moment (an actor call would already fail), so wait
            # for the process to be gone, which breaks the lane
            for _ in range(100):
                if client.lane is None or client.lane.broken is not None:
                    break
                await asyncio.sleep(0.1)
            with pytest.raises(EngineDied, match="engine sim-target-0 died under call x"):
                await client.generate(GenerateRequest("x", "hello", 4, replay_text="a"))
            return await client.health()
        finally:
            await backend.shutdown()

    assert clock.run(main()) is False
