"""The batched Ray control plane: a branch entry in one gate call, lookups batched per shard,
small records inline in a lookup's reply and large ones read from the object store.

First the gate actor as a plain class (``decide`` answers and restores exactly as
``generation`` then ``admit``; retries, abandonment); then on a local Ray instance: the
client's ``decide`` against the in-process gate, a stage group's lookups as one call per
shard with the answers one-at-a-time lookups give, and both ways a hit's bytes travel.
"""

import asyncio
import inspect
import random
import threading
import time

import pytest

from dynbranch.gate import BranchReturn, Gate, LoadView, Observation, Settlement
from dynbranch.gate.client import BranchDecision, LocalGateClient
from dynbranch.reuse import Hit, Miss, Provenance, Record, RecordState, ReuseKey
from dynbranch.reuse.record import to_arrow

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from dynbranch.cluster import GateActor, GateDeployment, RayStoreClient  # noqa: E402
from dynbranch.cluster.gate.client import _merged  # noqa: E402
from dynbranch.cluster.gate.codec import decode_reply, encode_candidate, encode_reply  # noqa: E402
from dynbranch.cluster.store import make_shards, shard_of  # noqa: E402
from dynbranch.cluster.store_reads import INLINE_MAX  # noqa: E402
from dynbranch.cluster.threaded import SuspendedError, threaded  # noqa: E402
from tests.test_ray_gate import PATIENT, candidates, gate_spec  # noqa: E402


class _DecidingClient(LocalGateClient):
    """Drives a :class:`GateActor` object's ``decide`` directly (no Ray); the rest of the
    gate's calls go to the actor too."""

    def __init__(self, actor: GateActor) -> None:
        self.actor, self.policy, self._n = actor, actor.gate.policy, 0
        self.gate = actor.gate

    def _id(self) -> str:
        self._n += 1
        return f"plain:{self._n}"

    async def decide(self, coordinate, candidates, view, now):
        rows = [encode_candidate(c) for c in candidates]
        return await self.actor.decide(self._id(), coordinate, rows, view.as_tuple(), now)

    async def release(self, reservations):
        return await self.actor.release(reservations)

    async def learn(self, observations, settlements):
        await self.actor.learn(self._id(), observations, settlements)


async def decide_run(gate, rounds: int = 30, seed: int = 3) -> list:
    """A seeded run of branch entries through ``decide`` (then learn, release); every answer."""
    rng, answers = random.Random(seed), []
    for i in range(rounds):
        coord, now = f"routing/router/{i % 3}", 0.05 * i
        cands = candidates(rng, 100 + 10 * i)
        view = LoadView(0.5 * rng.random(), 0.5 * rng.random(), rng.random())
        decision = await gate.decide(coord, cands, view, now)
        answers.append(decision)
        chosen = rng.randrange(4)
        admitted = {a.rank for a in decision.admissions if a.admitted}
        obs = (
            [
                Observation(
                    c.stage_key,
                    c.rank,
                    c.rank == chosen,
                    (rng.random() < 0.8) if c.rank == chosen and c.rank in admitted else None,
                )
                for c in cands
            ]
            if decision.generation.open
            else []
        )
        await gate.learn(
            obs,
            [
                Settlement(
                    coord,
                    BranchReturn(saved_ms=300.0 * rng.random(), fill_cost_ms=400.0 * rng.random()),
                )
            ],
        )
        answers.append(
            await gate.release([a.reservation for a in decision.admissions if a.admitted])
        )
    return answers


def test_decide_answers_and_restores_exactly_as_generation_then_admit(tmp_path):
    model, config = gate_spec(audit_rate=0.0)

    async def main():
        actor = GateActor(model, config, str(tmp_path), snapshot_every=7)
        local = LocalGateClient(Gate(model, config))
        got, want = await decide_run(_DecidingClient(actor)), await decide_run(local)
        restored = GateActor(model, config, str(tmp_path), snapshot_every=7)
        return actor, got, want, local, restored

    actor, got, want, local, restored = asyncio.run(main())
    decisions = [d for d in got if isinstance(d, BranchDecision)]
    assert got == want and len(decisions) == 30
    assert any(a.admitted for d in decisions for a in d.admissions)  # the gate did admit
    assert not all(d.generation.open for d in decisions)  # and closed some entries
    assert actor.gate.state() == local.gate.state() == restored.gate.state()
    assert asyncio.run(restored.stats())["checkpoint"]["replayed"] > 0  # decide rows replayed


def test_a_retried_decide_is_answered_once_and_an_abandoned_one_frees_its_blocks(tmp_path):
    model, config = gate_spec(audit_rate=0.0)
    actor = GateActor(model, config, str(tmp_path))
    rows = [encode_candidate(c) for c in candidates(random.Random(1))]
    view = LoadView().as_tuple()

    async def main():
        first = await actor.decide("d:1", "r", rows, view, 0.0)
        retried = await actor.decide("d:1", "r", rows, view, 0.0)
        reserved = actor.gate.reserved_blocks
        freed = await actor.abandon(["d:1", "d:2"])  # d:2 has not run yet
        late = await actor.decide("d:2", "r", rows, view, 0.1)
        return first, retried, reserved, freed, late

    first, retried, reserved, freed, late = asyncio.run(main())
    admitted = [a for a in first.admissions if a.admitted]
    assert retried == first and first.generation.open and len(admitted) == 2
    assert reserved == sum(a.reservation.blocks for a in admitted)
    assert freed == 2 and actor.gate.reserved_blocks == 0
    assert not late.generation.open and late.admissions == ()
    assert actor.gate.counters["generation_decisions"] == 1  # the abandoned id decided nothing
    assert decode_reply("decide", encode_reply("decide", first)) == first


def test_queued_releases_merge_only_when_adjacent():
    todo = [
        ("release", (["a"],)),
        ("release", (["b", "c"],)),
        ("learn", ("id", [], [])),
        ("release", (["d"],)),
        ("abandon", (["x"],)),
        ("release", (["e"],)),
    ]
    assert _merged(todo) == [
        ("release", (["a", "b", "c"],)),
        ("learn", ("id", [], [])),
        ("release", (["d"],)),
        ("abandon", (["x"],)),
        ("release", (["e"],)),
    ]


# -- on a local Ray instance ------------------------------------------------------------------


def test_the_ray_clients_decide_is_one_call_that_answers_as_the_in_process_gate(
    local_ray, tmp_path
):
    model, config = gate_spec()
    deployment = GateDeployment.start(model, config, tmp_path)
    try:
        client = deployment.client(model, config, PATIENT)

        async def main():
            return await decide_run(client), await client.stats()

        answers, stats = asyncio.run(main())
    finally:
        deployment.stop()
    assert answers == asyncio.run(decide_run(LocalGateClient(Gate(model, config))))
    assert stats["client"]["degraded_decide"] == 0
    assert stats["generation_decisions"] == 30 and 0 < stats["admit_calls"] < 30


def rec(i: int, pad: int = 0) -> Record:
    key = ReuseKey("fp", {"i": i}, "m", "r", {}, None, "t")
    return Record.create(
        key,
        f"v{i}" + "x" * pad,
        read_set={},
        provenance=Provenance(f"req-{i}", 0.0, "e0", "c1"),
        state=RecordState.COMMITTED,
    )


def test_a_stage_groups_lookups_are_one_call_per_shard_with_the_answers_of_single_ones(local_ray):
    client = RayStoreClient(make_shards(1 << 26, "lru", 2))
    records = [rec(i) for i in range(12)]
    absent = [rec(100 + i) for i in range(4)]

    async def main():
        for r in records:
            await client.put(r, 0.0)
        before = dict(client.batcher.counts)
        grouped = await asyncio.gather(
            *(client.lookup(r.name, r.key_bytes, 1.0) for r in records + absent)
        )
        after = dict(client.batcher.counts)
        single = [await client.lookup(r.name, r.key_bytes, 1.0) for r in records + absent]
        return before, grouped, after, single

    try:
        before, grouped, after, single = asyncio.run(main())
    finally:
        for actor in client._shards:
            ray.kill(actor)
    shards = {shard_of(r.name, 2) for r in records + absent}
    assert after["calls"] - before["calls"] == len(shards) == 2
    assert after["lookups"] - before["lookups"] == 16
    assert [type(g) for g in grouped] == [Hit] * 12 + [Miss] * 4
    assert [g.record.value for g in grouped[:12]] == [r.value for r in records]
    assert [(type(g), getattr(g, "reason", None)) for g in grouped] == [
        (type(s), getattr(s, "reason", None)) for s in single
    ]


def test_a_small_hit_comes_inline_and_a_large_one_from_the_object_store(local_ray):
    (shard,) = make_shards(1 << 28, "lru", 1)
    small, large = rec(1), rec(2, pad=2 * INLINE_MAX)
    client = RayStoreClient([shard])

    async def main():
        for r in (small, large):
            await client.put(r, 0.0)
        located = [
            await shard.lookup.remote(r.name, r.key_bytes, 1.0, True) for r in (small, large)
        ]
        hits = [await client.lookup(r.name, r.key_bytes, 1.0) for r in (small, large)]
        return located, hits

    try:
        located, hits = asyncio.run(main())
    finally:
        ray.kill(shard)
    assert bytes(located[0].data) == to_arrow(small)  # inline, in the lookup's reply
    assert located[1].data is None  # read through its ref, zero-copy from shared memory
    assert [h.record.value for h in hits] == [small.value, large.value]
    assert [h.record.size for h in hits] == [small.size, large.size]


async def _double(x: int) -> int:
    return 2 * x


class _Sleepy:
    async def quick(self, x: int) -> int:
        return await _double(x) + 1  # awaits, but nothing that suspends

    async def slow(self) -> None:
        await asyncio.sleep(0)

    def plain(self) -> str:
        return "plain"


def test_a_threaded_class_runs_each_coroutine_to_completion_and_refuses_one_that_suspends():
    cls = threaded(_Sleepy)
    obj = cls()
    assert not inspect.getmembers(cls, inspect.iscoroutinefunction)  # Ray sees a plain actor
    assert (obj.quick(20), obj.plain(), cls.quick.__name__) == (41, "plain", "quick")
    with pytest.raises(SuspendedError, match="_Sleepy.slow suspended"):
        obj.slow()
    assert isinstance(obj, _Sleepy)


class _Counted:
    """Records how many of its calls run at once (each holds the GIL off for a moment)."""

    def __init__(self, locked: bool) -> None:
        if locked:
            self._call_lock = threading.RLock()
        self.inside = self.most = 0

    async def step(self) -> None:
        self.inside += 1
        self.most = max(self.most, self.inside)
        time.sleep(0.0005)  # NOTE: blocks without suspending: another thread may run now
        self.inside -= 1


@pytest.mark.parametrize("locked", [False, True])
def test_a_threaded_class_with_a_call_lock_runs_its_calls_one_at_a_time(locked):
    obj = threaded(_Counted)(locked)

    def calls() -> None:
        for _ in range(200):
            obj.step()

    threads = [threading.Thread(target=calls) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    # NOTE: without the lock, calls from two threads (a lane's and Ray's) overlap, as here
    assert (obj.most == 1) is locked, obj.most
