"""Three Ray nodes in one process tree (``ray.cluster_utils.Cluster``): the placement group
puts one engine on each node, a replay completes across them, and when a node is removed
mid-run its engine goes down, its calls move to the others, and the replay still ends with
every request accounted for and typed."""

import asyncio
from pathlib import Path

import pandas as pd
import pytest

from dynbranch.driver import ReplayConfig, make_backend, prepare, run_replay
from dynbranch.errors import typed_error_names

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from ray.cluster_utils import Cluster  # noqa: E402

from dynbranch.cluster import ENGINE_RESOURCE, RayBackend  # noqa: E402

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
NODE = {"num_cpus": 1, "resources": {ENGINE_RESOURCE: 1}, "object_store_memory": 100 * 1024 * 1024}


@pytest.fixture(scope="module")
def cluster():
    # NOTE: Cluster records its address as this machine's "current" Ray cluster, the file
    # other Ray users' `address="auto"` reads; put theirs back.
    current = Path(ray._private.utils.get_ray_address_file(None))
    before = current.read_text() if current.is_file() else None
    c = Cluster(initialize_head=True, head_node_args=NODE)
    try:
        workers = [c.add_node(**NODE) for _ in range(2)]
        c.wait_for_nodes()
        ray.init(address=c.address, log_to_driver=False, configure_logging=False)
        yield c, workers
    finally:
        ray.shutdown()
        c.shutdown()
        if before is not None:
            current.write_text(before)


class NodeLoss(RayBackend):
    """The Ray backend, plus the removal at ``at_s`` (``None``: no fault) of a worker node
    (not the head, where the driver runs) and its engine; remembers where each engine ran."""

    def __init__(self, clock, roles, cluster, workers, at_s=None):
        super().__init__(clock, roles)
        self.cluster, self.workers, self.at_s = cluster, workers, at_s
        self.nodes: list[str] = []
        self.removed: str | None = None
        self.victim: str | None = None  # the engine on the removed node

    async def start(self):
        await super().start()
        self.nodes = [await a.node.remote() for a in self._actors]
        if self.at_s is not None:
            asyncio.get_running_loop().create_task(self._remove())

    async def _remove(self):
        await asyncio.sleep(self.at_s)
        # NOTE: placement decides which engine lands where; take the first on a worker node
        index, node = next(
            (i, w) for i, n in enumerate(self.nodes) for w in self.workers if w.node_id == n
        )
        self.removed, self.victim = node.node_id, self.clients()["target"][index].engine_id
        await asyncio.to_thread(self.cluster.remove_node, node, False)


def _replay(tmp_path, name, cluster, workers, at_s=None):
    cfg = ReplayConfig(
        workload="routing",
        arm="full",
        backend="ray",
        workers=3,
        requests=30,
        rate=3.0,
        seed=2,
        out=tmp_path / name,
        progress=False,
        workload_options={"root": str(FIXTURE)},
    )
    prepared = prepare(cfg, progress=lambda _m: None)
    backend = NodeLoss(
        prepared.clock, make_backend(cfg, prepared.clock)._roles, cluster, workers, at_s
    )
    return run_replay(prepared, backend), backend


def test_engines_spread_one_per_node_and_a_replay_completes(cluster, tmp_path):
    c, workers = cluster
    result, backend = _replay(tmp_path, "whole", c, workers)
    assert len(set(backend.nodes)) == 3  # one engine on each node
    assert set(backend.nodes) == {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert result.summary["completed"] == 30 and result.summary["failed"] == 0
    engines = {
        s.engine
        for s in result.orchestrator.log.stages
        if s.kind == "llm" and s.served_from == "exec"
    }
    assert engines == {f"sim-target-{i}" for i in range(3)}


def test_a_node_removed_mid_run_costs_its_engine_not_the_replay(cluster, tmp_path):
    c, workers = cluster
    result, backend = _replay(tmp_path, "loss", c, workers, at_s=4.0)
    s = result.summary
    frame = pd.read_parquet(tmp_path / "loss" / "requests.parquet")
    assert backend.removed is not None and len(frame) == 30  # nothing lost
    assert s["engines"]["went_down"] >= 1
    assert backend.victim in s["engines"]["down_at_end"]  # no node left to restart it on
    bad = frame[frame.status != "completed"]
    assert set(bad.error_type) <= typed_error_names()
    assert s["completed"] >= 27, s["errors"]  # at least 90 %
    rows = [
        r for r in result.orchestrator.log.stages if r.kind == "llm" and r.served_from == "exec"
    ]
    # nothing starts on the lost engine once the pool has seen it go (within a sweep and a
    # probe timeout), while the others keep serving
    assert not [r for r in rows if r.engine == backend.victim and r.start > 4.0 + 6.0]
    assert [r for r in rows if r.engine != backend.victim and r.start > 4.0 + 2.0]
