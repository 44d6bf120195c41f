"""The modelled driver-to-worker network: exact delays on the virtual clock, and a replay
through it."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from dynbranch.clock import VirtualClock
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.engines.client import LocalEngineClient
from dynbranch.engines.network import (
    FRAMING_BYTES,
    NETWORKS,
    NetworkClient,
    NetworkModel,
    network_model,
    with_network,
)
from dynbranch.engines.protocol import GenerateRequest
from dynbranch.engines.zero import ZeroEngine
from dynbranch.errors import UnknownNameError

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"


def test_one_way_is_half_the_rtt_plus_the_bytes_over_the_bandwidth():
    m = NetworkModel("t", rtt_s=0.02, bandwidth_bytes_s=1e6)
    assert m.one_way_s(1000) == pytest.approx(0.01 + (1000 + FRAMING_BYTES) / 1e6)
    with pytest.raises(ValueError):
        NetworkModel("bad", rtt_s=-1.0, bandwidth_bytes_s=1.0)


def test_the_shipped_networks_are_the_documented_ones():
    assert network_model("none") is None
    wan, lan = NETWORKS["vastai-wan"], NETWORKS["vastai-cluster"]
    assert (wan.rtt_s, wan.bandwidth_bytes_s) == (0.0216, 500e6 / 8)
    assert (lan.rtt_s, lan.bandwidth_bytes_s) == (0.0005, 1000e6 / 8)
    with pytest.raises(UnknownNameError, match="unknown network 'carrier-pigeon'"):
        network_model("carrier-pigeon")


def test_a_call_takes_both_one_way_trips_and_the_engine_sees_the_later_arrival():
    clock = VirtualClock()
    model = NetworkModel("t", rtt_s=0.1, bandwidth_bytes_s=1e4)
    engine = ZeroEngine(clock)
    client = NetworkClient(LocalEngineClient(engine), model, clock)
    prompt = "x" * 500

    async def main():
        await engine.start()
        t0 = clock.now()
        result = await client.generate(GenerateRequest("r", prompt, 16, replay_text="hello"))
        return t0, clock.now(), result

    t0, t1, result = clock.run(main())
    up, down = model.one_way_s(500), model.one_way_s(len(result.text.encode()))
    assert result.arrived_at - t0 == pytest.approx(up)
    assert t1 - t0 == pytest.approx(up + down)
    assert client.network_s == pytest.approx(up + down)
    assert client.engine_id == engine.engine_id


def test_load_and_abort_cross_the_network_too():
    clock = VirtualClock()
    model = NetworkModel("t", rtt_s=0.2, bandwidth_bytes_s=1e9)
    engine = ZeroEngine(clock)
    client = NetworkClient(LocalEngineClient(engine), model, clock)

    async def main():
        await engine.start()
        t0 = clock.now()
        await client.load()
        t1 = clock.now()
        await client.abort("nobody")
        return t1 - t0, clock.now() - t1

    load_s, abort_s = clock.run(main())
    assert load_s == pytest.approx(2 * model.one_way_s(0))
    assert abort_s == pytest.approx(model.one_way_s(0))


class _Named:
    """An engine client as :func:`with_network` sees it: its id."""

    def __init__(self, engine_id: str) -> None:
        self.engine_id = engine_id


def test_with_network_wraps_every_role_and_none_leaves_them():
    clients = {"target": [_Named("a"), _Named("b")], "drafter": [_Named("c")]}
    clock = VirtualClock()
    assert with_network(clients, "none", clock) is clients
    for name in set(NETWORKS) - {"none"}:
        wrapped = with_network(clients, name, clock)
        assert list(wrapped) == list(clients)
        for role, cs in clients.items():
            assert [type(w) for w in wrapped[role]] == [NetworkClient] * len(cs)
            assert [w.inner for w in wrapped[role]] == cs
            assert [w.engine_id for w in wrapped[role]] == [c.engine_id for c in cs]
            assert all(w.model == network_model(name) for w in wrapped[role])


def _replay(tmp_path: Path, network: str):
    cfg = ReplayConfig(
        workload="routing",
        arm="floor",
        engine="zero",
        backend="local",
        clock="virtual",
        requests=6,
        rate=2.0,
        seed=1,
        workers=2,
        out=tmp_path / network,
        progress=False,
        network=network,
        workload_options={"root": str(FIXTURE)},
    )
    return run_replay(prepare(cfg, progress=lambda _m: None))


def test_a_replay_on_separate_nodes_charges_every_llm_call_an_rtt(tmp_path):
    near, far = _replay(tmp_path, "none"), _replay(tmp_path, "vastai-wan")
    assert far.summary["network"] == "vastai-wan"
    stages = pd.read_parquet(tmp_path / "vastai-wan" / "stages.parquet")
    llm = stages[stages["kind"] == "llm"]
    assert len(llm) > 0 and (llm["duration"] >= NETWORKS["vastai-wan"].rtt_s - 1e-9).all()
    base = pd.read_parquet(tmp_path / "none" / "stages.parquet")
    assert (base.loc[base["kind"] == "llm", "duration"] == 0).all()  # the zero engine
    assert far.summary["mean_latency_s"] > near.summary["mean_latency_s"]


def test_an_unknown_network_is_refused_before_the_run(tmp_path):
    cfg = ReplayConfig(
        workload="routing",
        backend="local",
        clock="virtual",
        requests=2,
        out=tmp_path / "x",
        progress=False,
        network="dialup",
        workload_options={"root": str(FIXTURE)},
    )
    with pytest.raises(UnknownNameError, match="unknown network 'dialup'"):
        prepare(cfg, progress=lambda _m: None)
    assert not (tmp_path / "x").exists()
