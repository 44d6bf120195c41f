"""C3's central gate on Ray: a named actor that restarts without losing what it learned.

First the actor as a plain class (restore from snapshot + journal, a torn journal line,
retried call ids, abandoned admits, a foreign checkpoint); then on a local Ray instance:
decisions through the actor equal an in-process gate's, a killed actor comes back with its
posteriors, returns and reservations while calls made meanwhile degrade, the backend keeps
one gate per run and kills it at shutdown, and the ``c2`` arm runs through it end to end.
"""

import asyncio
import json
import random
import time
from pathlib import Path

import pytest

from dynbranch.engines.profile import load_profile
from dynbranch.errors import ConfigError
from dynbranch.gate import (
    BranchReturn,
    Candidate,
    ContentionModel,
    FillShape,
    Gate,
    GateConfig,
    LoadBudget,
    LoadView,
    Observation,
    Settlement,
)
from dynbranch.gate.client import GateClient, LocalGateClient

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from dynbranch.cluster import (  # noqa: E402
    UNAVAILABLE,
    GateActor,
    GateDeployment,
    RayBackend,
    RayGateClient,
    RetryPolicy,
)

PROFILE = "qwen3-0.6b@h200"
RESTART_S = 1.5
"""How long a restarted test actor takes to come back (longer than the client's deadline)."""
IMPATIENT = RetryPolicy(call_timeout_s=0.2, deadline_s=0.4, backoff_s=0.05, cooldown_s=0.3)
PATIENT = RetryPolicy(call_timeout_s=10.0, deadline_s=20.0)
"""For calls that must not degrade even on a loaded machine (the gate is up)."""


def gate_spec(**overrides) -> tuple[ContentionModel, GateConfig]:
    profile = load_profile(PROFILE)
    model = ContentionModel.from_profile(profile, LoadBudget.from_profile(profile, engines=2))
    return model, GateConfig(**{"fanout": 2, "audit_rate": 0.2, **overrides})


def candidates(rng: random.Random, prompt: int = 200) -> list[Candidate]:
    shape = FillShape(prompt, 32)
    return [Candidate(f"h{r}", r, f"routing/handler{r}", 50.0 + 400.0 * rng.random(), shape,
                      shape.kv_blocks(16)) for r in range(4)]


async def drive(gate: GateClient, rounds: int = 40, seed: int = 7) -> list:
    """A seeded run of branch entries (decide, hold receipts, learn, release); every answer."""
    rng, answers, held = random.Random(seed), [], []
    for i in range(rounds):
        coord, now = f"routing/router/{i % 3}", 0.05 * i
        opened = await gate.generation(coord, now)
        answers.append(opened)
        if not opened.open:
            continue
        cands = candidates(rng, 100 + 10 * i)
        view = LoadView(0.5 * rng.random(), 0.5 * rng.random(), rng.random())
        admissions = await gate.admit(coord, cands, view, now)
        answers.append(admissions)
        held += [a.reservation for a in admissions if a.admitted]
        chosen = rng.randrange(4)
        obs = [Observation(c.stage_key, c.rank, c.rank == chosen,
                           (rng.random() < 0.8) if c.rank == chosen and admissions[c.rank].admitted
                           else None) for c in cands]
        await gate.learn(obs, [Settlement(coord, BranchReturn(saved_ms=300.0 * rng.random(),
                                                              fill_cost_ms=150.0 * rng.random()))])
        if i % 3 == 2:
            answers.append(await gate.release(held))
            held = []
    answers.append(await gate.release(held))
    return answers


def decided_as_in_process(deployment, **lane) -> dict:
    """A new client of ``deployment`` (made with ``lane``), driven by :func:`drive` beside an
    in-process gate: the same answers, and the same gate after. Returns its counters."""
    model, config = deployment.model, deployment.config
    client = deployment.client(model, config, PATIENT, **lane)
    local = LocalGateClient(Gate(model, config))
    assert asyncio.run(drive(client)) == asyncio.run(drive(local))
    assert ray.get(deployment.actor.state.remote()) == local.gate.state()
    return asyncio.run(client.stats())["client"]


def killed_and_back(deployment, **lane) -> tuple[dict, int]:
    """A client of ``deployment`` (made with ``lane``) admits and asks, on one event loop;
    the actor is killed and restarted (what the gate learned survives); the client then asks
    and releases what it held, which must all succeed. Returns its counters and how many of
    its calls went through its lane before the kill."""
    model, config = deployment.model, deployment.config
    client = deployment.client(model, config, PATIENT, **lane)
    cands = candidates(random.Random(5))

    async def main():
        held = [a.reservation for a in await client.admit("warm", cands, LoadView(), 0.0)
                if a.admitted]
        await client.generation("warm", 0.1)
        before = client.counts["lane_calls"] + client.counts["stream_calls"]
        learned = _learned(await deployment.actor.state.remote())
        ray.kill(deployment.actor, no_restart=False)
        await asyncio.sleep(0.5)
        await asyncio.to_thread(_wait_until_up, deployment.actor)
        assert _learned(await deployment.actor.state.remote()) == learned
        opened = await client.generation("warm", 1.0)  # breaks the lane, then plainly
        freed = await client.release(held)
        stats = await client.stats()
        assert held and freed == len(held) and opened.open and stats["reserved_blocks"] == 0
        counts = stats["client"]
        assert counts["degraded_generation"] == 0 and counts["pending_release"] == 0
        if client.wants_stream:  # NOTE: a stream reopens in the background once a call answered
            for _ in range(100):
                if client._stream is not None:
                    break
                await asyncio.sleep(0.05)
            await client.generation("warm", 2.0)
            counts = {**counts, "after": client.counts["stream_calls"]}
        return counts, before

    return asyncio.run(main())


class _PlainClient(GateClient):
    """Drives a :class:`GateActor` object directly (no Ray), with call ids like the client."""

    def __init__(self, actor: GateActor) -> None:
        self.actor, self.policy, self._n = actor, actor.gate.policy, 0

    def _id(self) -> str:
        self._n += 1
        return f"plain:{self._n}"

    async def generation(self, coordinate, now):
        return await self.actor.generation(self._id(), coordinate, now)

    async def admit(self, coordinate, candidates, view, now):
        return await self.actor.admit(self._id(), coordinate, candidates, view, now)

    async def release(self, reservations):
        return await self.actor.release(reservations)

    async def learn(self, observations, settlements):
        await self.actor.learn(self._id(), observations, settlements)

    async def stats(self):
        return await self.actor.stats()


# -- the actor as a plain class ----------------------------------------------------------------


def test_a_restarted_actor_restores_exactly_the_state_it_acknowledged(tmp_path):
    model, config = gate_spec()

    async def main():
        first = GateActor(model, config, str(tmp_path), snapshot_every=7)
        answers = await drive(_PlainClient(first))
        local = LocalGateClient(Gate(model, config))
        assert answers == await drive(local)  # the actor decides as the gate does
        again = GateActor(model, config, str(tmp_path), snapshot_every=7)
        return first, again, local

    first, again, local = asyncio.run(main())
    state = asyncio.run(again.state())
    assert state == local.gate.state() == asyncio.run(first.state())
    stats = asyncio.run(again.stats())["checkpoint"]
    assert stats["restored"] and 0 < stats["replayed"] < 7  # a snapshot, then the journal
    assert stats["seq"] == asyncio.run(first.stats())["checkpoint"]["seq"]


def test_a_snapshot_joined_from_rows_packed_once_is_the_snapshot_packed_whole(tmp_path):
    import msgpack

    from dynbranch.cluster.gate.journal import Packed, pack, pack_snapshot

    model, config = gate_spec()
    actor = GateActor(model, config, str(tmp_path))
    asyncio.run(drive(_PlainClient(actor)))
    taken = asyncio.run(actor.checkpoint())
    on_disk = (tmp_path / "snapshot.msgpack").read_bytes()
    snapshot = msgpack.unpackb(on_disk, raw=False, strict_map_key=False)
    assert taken["bytes"] == len(on_disk) and snapshot["seq"] == taken["seq"]
    assert snapshot["gate"] == asyncio.run(actor.state())
    assert snapshot["gate"]["ledger"]["released"] and snapshot["calls"]
    assert msgpack.packb(snapshot, use_bin_type=True) == on_disk
    rows = snapshot["calls"]
    mixed = {"a": 1.5, "calls": Packed([pack(r) for r in rows]), "b": {"c": [1, "x"]},
             "none": Packed([])}
    assert pack_snapshot(mixed) == msgpack.packb(
        {**mixed, "calls": rows, "none": []}, use_bin_type=True)


def test_a_snapshot_that_cannot_be_written_fails_no_call_and_loses_nothing(tmp_path,
                                                                           monkeypatch):
    model, config = gate_spec()
    first = GateActor(model, config, str(tmp_path), snapshot_every=7)
    asyncio.run(drive(_PlainClient(first), rounds=10))
    taken = asyncio.run(first.stats())["checkpoint"]["snapshots"]
    assert taken > 0

    def full(self, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full)
    asyncio.run(drive(_PlainClient(first), rounds=20, seed=8))  # NOTE: no call raises
    with pytest.raises(OSError, match="No space left"):  # NOTE: asked for, it says so
        asyncio.run(first.checkpoint())
    monkeypatch.undo()
    stats = asyncio.run(first.stats())["checkpoint"]
    assert stats["snapshots"] == taken and stats["snapshot_error"].startswith("OSError")
    # NOTE: tried once per snapshot_every entries, not at every call after the first failure
    assert 0 < stats["snapshot_failures"] <= (stats["seq"] - stats["snapshot_seq"]) // 7
    again = GateActor(model, config, str(tmp_path), snapshot_every=7)
    assert asyncio.run(again.state()) == asyncio.run(first.state())
    assert asyncio.run(again.stats())["checkpoint"]["replayed"] >= 7
    asyncio.run(again.checkpoint())  # the next snapshot on disk empties the journal
    assert (tmp_path / "journal.jsonl").read_bytes() == b""
    assert asyncio.run(GateActor(model, config, str(tmp_path)).state()) == asyncio.run(
        first.state())


def test_a_json_snapshot_an_earlier_version_wrote_still_restores_the_gate(tmp_path):
    import msgpack

    model, config = gate_spec()
    first = GateActor(model, config, str(tmp_path), snapshot_every=7)
    asyncio.run(drive(_PlainClient(first)))
    packed = tmp_path / "snapshot.msgpack"
    snapshot = msgpack.unpackb(packed.read_bytes(), raw=False, strict_map_key=False)
    ledger = snapshot["gate"]["ledger"]
    assert ledger["released"]  # NOTE: rows now; the earlier version wrote dictionaries
    for part in ("outstanding", "released"):
        ledger[part] = [dict(zip(("reservation_id", "coordinate", "candidate", "blocks",
                                  "reserved_at"), row, strict=True), ledger=ledger["name"])
                        for row in ledger[part]]
    (tmp_path / "snapshot.json").write_text(json.dumps(snapshot))
    packed.unlink()
    again = GateActor(model, config, str(tmp_path), snapshot_every=7)
    assert asyncio.run(again.state()) == asyncio.run(first.state())
    asyncio.run(again.checkpoint())  # the next snapshot replaces the JSON one
    assert packed.exists() and not (tmp_path / "snapshot.json").exists()
    assert asyncio.run(GateActor(model, config, str(tmp_path)).state()) == asyncio.run(
        first.state())


def test_a_torn_journal_line_is_cut_and_later_calls_append_after_it(tmp_path):
    model, config = gate_spec()
    first = GateActor(model, config, str(tmp_path))
    asyncio.run(drive(_PlainClient(first), rounds=10))
    before = asyncio.run(first.state())
    with open(tmp_path / "journal.jsonl", "ab") as f:
        f.write(b'[999,"generation","x:1",["routing/rou')  # the process died mid-write
    second = GateActor(model, config, str(tmp_path))
    assert asyncio.run(second.state()) == before
    asyncio.run(second.generation("y:1", "routing/router/0", 9.0))
    third = GateActor(model, config, str(tmp_path))
    assert asyncio.run(third.state()) == asyncio.run(second.state())
    lines = (tmp_path / "journal.jsonl").read_bytes().splitlines()
    assert all(json.loads(line)[0] > 0 for line in lines)


def test_a_retried_call_id_is_answered_once_and_an_abandoned_admit_frees_its_blocks(tmp_path):
    model, config = gate_spec(audit_rate=0.0)
    actor = GateActor(model, config, str(tmp_path))
    cands = candidates(random.Random(1))

    async def main():
        first = await actor.admit("c:1", "r", cands, LoadView(), 0.0)
        retried = await actor.admit("c:1", "r", cands, LoadView(), 0.0)
        reserved = actor.gate.reserved_blocks
        freed = await actor.abandon(["c:1", "c:2"])  # c:2 has not run yet
        late = await actor.admit("c:2", "r", cands, LoadView(), 0.1)
        return first, retried, reserved, freed, late

    first, retried, reserved, freed, late = asyncio.run(main())
    admitted = [a for a in first if a.admitted]
    assert retried == first and len(admitted) == 2
    assert reserved == sum(a.reservation.blocks for a in admitted)
    assert freed == 2 and late == [] and actor.gate.reserved_blocks == 0
    assert asyncio.run(actor.stats())["checkpoint"]["duplicates"] == 2
    restored = GateActor(model, config, str(tmp_path))  # the log survives a restart too
    assert asyncio.run(restored.admit("c:1", "r", cands, LoadView(), 0.0)) == first
    assert restored.gate.reserved_blocks == 0


def test_a_checkpoint_of_another_gate_is_refused(tmp_path):
    model, config = gate_spec()
    actor = GateActor(model, config, str(tmp_path))
    asyncio.run(actor.generation("x:1", "r", 0.0))
    asyncio.run(actor.checkpoint())
    with pytest.raises(ConfigError, match="belongs to another gate"):
        GateActor(model, gate_spec(fanout=3)[1], str(tmp_path))


# -- on Ray -------------------------------------------------------------------------------------


def test_decisions_through_the_actor_equal_an_in_process_gate(local_ray, tmp_path):
    model, config = gate_spec()
    deployment = GateDeployment.start(model, config, tmp_path)
    try:
        client = deployment.client(model, config, PATIENT)
        local = LocalGateClient(Gate(model, config))
        remote_answers = asyncio.run(drive(client))
        assert remote_answers == asyncio.run(drive(local))
        assert ray.get(deployment.actor.state.remote()) == local.gate.state()
        stats = asyncio.run(client.stats())
        assert stats["reserved_blocks"] == 0
        assert isinstance(client, RayGateClient) and client.policy == local.policy
    finally:
        deployment.stop()


class SlowRestartGateActor(GateActor):
    """Comes back :data:`RESTART_S` late when it restarts (its directory is not empty), and
    says so with a ``restarting`` file: its predecessor is dead by then."""

    def __init__(self, model, config, directory, **kwargs):
        if any(Path(directory).iterdir()):
            (Path(directory) / "restarting").touch()
            time.sleep(RESTART_S)
        super().__init__(model, config, directory, **kwargs)


def _learned(state: dict) -> dict:
    """The learned parts of a gate state: posteriors, returns, outstanding reservations."""
    return {"sel": state["sel"], "use": state["use"],
            "returns": [[c, n, mean, m2] for c, _entries, n, mean, m2 in state["returns"]],
            "outstanding": state["ledger"]["outstanding"]}


def _wait_for(path: Path, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.01)


def _wait_until_up(actor, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            ray.get(actor.ping.remote(), timeout=2.0)
            return
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def test_a_killed_gate_comes_back_with_what_it_learned_and_degrades_meanwhile(local_ray,
                                                                             tmp_path):
    model, config = gate_spec(audit_rate=0.0, generation_audit_rate=0.0)
    deployment = GateDeployment.start(model, config, tmp_path, actor_cls=SlowRestartGateActor)
    actor, client = deployment.actor, deployment.client(model, config, PATIENT)
    impatient = deployment.client(model, config, IMPATIENT)  # the one that calls meanwhile
    cands = candidates(random.Random(3))

    async def before_kill():
        assert (await client.generation("cold", 0.0)).open  # nothing learned: open
        for i in range(4):  # the cold coordinate's fills never pay; the warm one's do
            await client.learn([Observation(c.stage_key, c.rank, c.rank == 0, True)
                                for c in cands],
                               [Settlement("cold", BranchReturn(saved_ms=0.0, fill_cost_ms=400.0)),
                                Settlement("warm", BranchReturn(saved_ms=500.0))])
            await client.generation("cold", 0.1 * i)
        held = [a.reservation for a in await client.admit("warm", cands, LoadView(), 1.0)
                if a.admitted]
        return (await client.generation("cold", 1.1)), held

    async def during_restart():
        return (await impatient.generation("warm", 2.0),
                await impatient.admit("warm", cands, LoadView(), 2.0))

    async def after_restart(held):
        cold, warm = await client.generation("cold", 3.0), await client.generation("warm", 3.0)
        freed = await client.release(held)
        await asyncio.sleep(IMPATIENT.cooldown_s)
        return cold, warm, freed, await client.stats(), await impatient.stats()

    try:
        cold, held = asyncio.run(before_kill())
        assert not cold.open and held  # learned: the cold coordinate closed; fills held
        learned = _learned(ray.get(actor.state.remote()))
        ray.kill(actor, no_restart=False)  # asynchronous: wait for the next incarnation
        _wait_for(tmp_path / "restarting")
        opened, admissions = asyncio.run(during_restart())
        assert not opened.open  # degraded: closed, not raised (warm would be open)
        assert [a.reason for a in admissions] == [UNAVAILABLE] * 4
        assert not any(a.admitted for a in admissions)
        _wait_until_up(actor)
        assert _learned(ray.get(actor.state.remote())) == learned
        cold, warm, freed, stats, meanwhile = asyncio.run(after_restart(held))
        assert not cold.open and warm.open  # decisions that depend on the returns learned
        assert freed == len(held) and stats["reserved_blocks"] == 0  # old receipts released
        assert stats["checkpoint"]["restored"] and stats["checkpoint"]["replayed"] > 0
        calls = meanwhile["client"]
        assert calls["degraded_generation"] == calls["degraded_admit"] == 1
        assert calls["pending_abandon"] == 0 and meanwhile["reserved_blocks"] == 0
    finally:
        deployment.stop()


# -- the backend and the driver -------------------------------------------------------------------


def _dies(actor, timeout: float = 20.0) -> bool:
    """Whether ``actor`` stops answering within ``timeout`` (``ray.kill`` is asynchronous)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.ping.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


def test_the_c2_arm_runs_through_the_central_gate_via_the_driver(local_ray, tmp_path,
                                                                 monkeypatch):
    import dataclasses

    from dynbranch import driver

    fixture = Path(__file__).parent / "fixtures" / "bfcl"
    cfg = driver.ReplayConfig(workload="routing", arm="c2", backend="ray", clock="real",
                              requests=8, rate=4.0, workers=2, profile=PROFILE,
                              out=tmp_path / "run", progress=False,
                              workload_options={"root": str(fixture)})
    prepared = driver.prepare(cfg, progress=lambda _m: None)
    backend = driver.make_backend(cfg, prepared.clock)
    assert isinstance(backend, RayBackend)
    made = []

    def make_gate(model, config):
        client = backend.make_gate(model, config)
        made.append(backend._gate)
        assert backend.make_gate(model, config)._actor is client._actor  # one gate per run
        with pytest.raises(ConfigError, match="one gate per run"):
            backend.make_gate(model, GateConfig(fanout=config.fanout + 1))
        return client

    # NOTE: the driver wires backend.make_gate itself; this wraps it to watch what it made.
    wired = driver.run_context
    monkeypatch.setattr(driver, "run_context", lambda prepared, backend: dataclasses.replace(
        wired(prepared, backend), make_gate=make_gate))
    summary = driver.run_replay(prepared, backend).summary
    assert summary["completed"] == 8 and summary["failed"] == 0
    assert summary["fills_issued"] > 0 and summary["unsafe_splices"] == 0
    speculation = summary["speculation"]
    assert speculation["reserved_blocks"] == 0
    gate = speculation["gate"]
    # NOTE: not equal to fills_issued on a loaded machine: an admit whose reply came too
    # late degrades, and its reservations are released by abandoning it.
    assert gate["released"] == gate["admitted"] + gate["audit"] >= summary["fills_issued"]
    assert gate["checkpoint"]["seq"] > 0
    (deployment,) = made
    assert deployment.name.startswith("dynbranch-gate-") and backend._gate is None
    assert _dies(deployment.actor) and not deployment.directory.exists()
