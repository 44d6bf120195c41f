"""C1's store on Ray: store actors holding Arrow records in the object store, and their client.

The same semantics as the local store, through :class:`RayStoreClient` over two shards:
hits, collisions, shadows and promotion, joins, write-cascade invalidation across shards,
eviction releasing objects, and lost objects reading as misses; then the ``c1`` arm end to
end through the driver on the Ray backend.
"""

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import pytest

from dynbranch.backend import EngineSpec
from dynbranch.clock import RealClock
from dynbranch.errors import TicketError
from dynbranch.reuse import (
    Hit,
    JoinInFlight,
    Miss,
    MissReason,
    Provenance,
    PutOutcome,
    Record,
    RecordState,
    ReuseKey,
    ShadowMatch,
    Ticket,
)

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from dynbranch.cluster import RayBackend, RayStoreClient, StoreActor  # noqa: E402
from dynbranch.cluster.store import make_shards, shard_of  # noqa: E402
from dynbranch.cluster.store_reads import hold  # noqa: E402

BIG = 1 << 30
SHARDS = 2
DOOMED_BYTES = 256 << 10
"""Large enough to live in the shared object store, not inlined in a reply."""


# -- a probe-able shard ------------------------------------------------------------------------


class _Owner:
    """Owns one object, then dies with it."""

    async def hold(self, data: bytes) -> list:
        return [ray.put(data)]


class ProbedStoreActor(StoreActor):
    """A shard whose objects a test can lose or corrupt, and whose reference table it reads."""

    def vanish(self, name: str, timeout: float = 20.0) -> None:
        """Replace ``name``'s bytes by an object whose owner has died (an unreadable ref).

        NOTE: a plain method (it blocks while Ray notices the owner's death): the shards
        run as threaded actors, whose coroutine methods must not suspend."""
        owner = ray.remote(num_cpus=0)(_Owner).remote()
        (ref,) = ray.get(owner.hold.remote(b"\0" * DOOMED_BYTES))
        ray.kill(owner)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:  # until Ray knows the owner is gone
            try:
                ray.get(ref)
            except ray.exceptions.RayError:
                # NOTE: the view a small record is served from inline goes too: the bytes
                # are lost wherever the shard would have read them.
                self._objects[name].ref, self._objects[name].view = ref, None
                return
            time.sleep(0.05)
        raise TimeoutError("the dead owner's object stayed readable")

    async def corrupt(self, name: str) -> None:
        """Replace ``name``'s bytes by bytes that are no record."""
        held = hold(b"not an arrow stream")
        self._objects[name].ref, self._objects[name].view = held.ref, held.view

    async def tracked(self, object_id: str) -> bool:
        """Whether this actor's reference table still counts ``object_id``."""
        counts = ray._private.worker.global_worker.core_worker.get_all_reference_counts()
        return object_id.encode() in counts or object_id in counts


@pytest.fixture
def store(local_ray):
    """A factory of clients over fresh probe-able shards; checks nothing leaked at teardown."""
    made: list[RayStoreClient] = []

    def make(capacity_bytes: int = BIG) -> RayStoreClient:
        client = RayStoreClient(make_shards(capacity_bytes, "lru", SHARDS,
                                            actor_cls=ProbedStoreActor))
        made.append(client)
        return client

    yield make
    for client in made:
        stats = run(client.stats())
        assert stats["objects_held"] == stats["records_held"]
        assert stats["in_flight"] == 0 and stats["writes_open"] == 0
        for actor in client._shards:
            ray.kill(actor)


def run(coro):
    return asyncio.run(coro)


# -- records -------------------------------------------------------------------------------------


def key(i: int, tenant: str = "t") -> ReuseKey:
    return ReuseKey("fp", {"i": i}, "m", "r", {}, None, tenant)


def rec(i: int, *, reads=None, upstream=(), shadow=False, value=None, pad=0) -> Record:
    return Record.create(
        key(i), value if value is not None else f"v{i}" + "x" * pad, read_set=reads or {},
        provenance=Provenance(f"req-{i}", 0.0, "e0", "c1", tuple(upstream)),
        state=RecordState.SHADOW if shadow else RecordState.COMMITTED)


def on_shard(shard: int, start: int = 0) -> int:
    """The first ``i >= start`` whose record's name lives on ``shard``."""
    i = start
    while shard_of(rec(i).name, SHARDS) != shard:
        i += 1
    return i


async def look(client: RayStoreClient, r: Record, **kw):
    return await client.lookup(r.name, r.key_bytes, 1.0, **kw)


# -- reading -------------------------------------------------------------------------------------


def test_a_put_record_is_served_equal_and_a_collision_misses(store):
    client = store()
    r = rec(1, value={"answer": [1, 2]}, reads={"res": "0"})

    async def main():
        put = await client.put(r, 0.0)
        first, second = await look(client, r), await look(client, r)
        collision = await client.lookup(r.name, b"another key", 1.0)
        absent = await look(client, rec(2))
        return put, first, second, collision, absent, await client.stats()

    put, first, second, collision, absent, stats = run(main())
    assert put.outcome is PutOutcome.STORED
    assert isinstance(first, Hit) and first.record == replace(r, hits=1)
    assert first.record.value == {"answer": [1, 2]} and first.record.size == r.size
    assert isinstance(second, Hit) and second.record.hits == 2
    assert collision == Miss(MissReason.COLLISION) and absent == Miss(MissReason.ABSENT)
    assert stats["shards"] == SHARDS and stats["hits"] == 2 and stats["collisions"] == 1
    assert stats["records_held"] == stats["objects_held"] == 1
    assert stats["bytes_held"] == stats["object_bytes"] == r.size


def test_records_spread_over_the_shards(store):
    client = store()
    records = [rec(i) for i in range(16)]

    async def main():
        for r in records:
            await client.put(r, 0.0)
        return await asyncio.gather(*(a.stats.remote() for a in client._shards))

    held = [s["records_held"] for s in run(main())]
    assert sum(held) == 16 and min(held) > 0
    assert held[0] == sum(shard_of(r.name, SHARDS) == 0 for r in records)


def test_a_shadow_is_not_readable_through_a_serving_lookup_and_promotes(store):
    client = store()
    s, loser = rec(1, shadow=True, value="filled"), rec(2, shadow=True)

    async def main():
        await client.put(s, 0.0)
        await client.put(loser, 0.0)
        serving = await look(client, s)
        bookkeeping = await look(client, s, serving=False)
        wrong_key = await client.promote(s.name, b"another key", 1.0)
        promoted = await client.promote(s.name, s.key_bytes, 1.0)
        after = await look(client, s)
        dropped = await client.drop(loser.name), await client.drop(s.name)
        return serving, bookkeeping, wrong_key, promoted, after, dropped, await look(client, loser)

    serving, bookkeeping, wrong_key, promoted, after, dropped, gone = run(main())
    assert serving == ShadowMatch(s.name, None)
    assert isinstance(bookkeeping, ShadowMatch) and bookkeeping.record.value == "filled"
    assert wrong_key is None
    assert promoted.state is RecordState.COMMITTED and promoted.value == "filled"
    assert isinstance(after, Hit) and after.record.committed
    assert dropped == (True, False)  # the loser's shadow goes; a committed record stays
    assert gone == Miss(MissReason.DROPPED)


def test_join_ticket_ids_are_unique_across_shards_and_finish_records(store):
    client = store()
    a, b = rec(on_shard(0)), rec(on_shard(1))

    async def main():
        ta, tb = await client.begin(a.name, a.key_bytes, "r1"), await client.begin(
            b.name, b.key_bytes, "r2")
        join = await client.begin(a.name, a.key_bytes, "r3")
        seen = await look(client, a)
        put = await client.finish(ta, a, 2.0)
        abandoned = await client.finish(tb, None, 2.0)
        return ta, tb, join, seen, put, abandoned, await look(client, a), await look(client, b)

    ta, tb, join, seen, put, abandoned, hit, miss = run(main())
    assert isinstance(ta, Ticket) and isinstance(tb, Ticket) and ta.ticket_id != tb.ticket_id
    assert {ta.ticket_id % SHARDS, tb.ticket_id % SHARDS} == {0, 1}
    assert join == JoinInFlight(ta.ticket_id, a.name, "r1") and seen == join
    assert put.outcome is PutOutcome.STORED and abandoned is None
    assert isinstance(hit, Hit) and miss == Miss(MissReason.ABSENT)
    with pytest.raises(TicketError):
        run(client.finish(ta, a, 3.0))


# -- versions, invalidation, eviction -------------------------------------------------------------


def test_a_write_cascades_across_shards(store):
    client = store()
    ia, ib = on_shard(0), on_shard(1)
    a = rec(ia, reads={"res": "0"})
    b = rec(ib, upstream=[a.name])  # rendered from a, on the other shard
    c = rec(on_shard(0, ia + 1), upstream=[b.name])  # and from b, back on a's shard
    d = rec(on_shard(1, ib + 1))

    async def main():
        for r in (a, b, c, d):
            assert (await client.put(r, 0.0)).stored
        inv = await client.write("res", "1", 1.0)
        looks = [await look(client, r) for r in (a, b, c, d)]
        late = await client.put(rec(1000, reads={"res": "0"}), 2.0)
        return inv, looks, late, await client.stats()

    inv, looks, late, stats = run(main())
    assert inv.changed and inv.levels == ((a.name,), (b.name,), (c.name,))
    assert (inv.direct, inv.cascade) == (1, 2)
    assert looks[:3] == [Miss(MissReason.INVALIDATED)] * 3 and isinstance(looks[3], Hit)
    assert late.outcome is PutOutcome.STALE
    assert stats["invalidated_direct"] == 1 and stats["invalidated_cascade"] == 2
    assert stats["records_held"] == stats["objects_held"] == 1


def test_every_shard_agrees_on_first_seen_versions(store):
    client = store()
    first = rec(on_shard(0), reads={"fresh": "a"})
    other = rec(on_shard(1), reads={"fresh": "b"})  # a version the store never heard of

    async def main():
        return (await client.put(first, 0.0), await client.put(other, 0.0),
                await client.observe_reads({"fresh": "b"}))

    p1, p2, stale = run(main())
    assert p1.outcome is PutOutcome.STORED and p2.outcome is PutOutcome.STALE
    assert stale == {"fresh": ("b", "a")}


def test_eviction_by_capacity_releases_the_objects(store):
    i0 = on_shard(0)
    i1 = on_shard(0, i0 + 1)
    records = [rec(i, pad=64) for i in (i0, i1, on_shard(0, i1 + 1))]
    per_shard = records[0].size + records[1].size + records[2].size // 2
    client = store(capacity_bytes=per_shard * SHARDS)
    actor = client._shards[0]

    async def main():
        ids = []
        for t, r in enumerate(records):
            await client.put(r, float(t))
            ids.append((await actor.held_objects.remote())[r.name])
        deadline = time.monotonic() + 20.0
        while await actor.tracked.remote(ids[0]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        tracked = [await actor.tracked.remote(i) for i in ids]
        return (ids, await actor.held_objects.remote(), await look(client, records[0]),
                tracked, await client.stats())

    ids, held, evicted, tracked, stats = run(main())
    assert held == {r.name: i for r, i in zip(records[1:], ids[1:], strict=True)}
    assert evicted == Miss(MissReason.EVICTED)
    assert tracked == [False, True, True]  # the shard let go of the evicted record's object
    assert stats["evictions"] == 1 and stats["object_bytes"] == stats["bytes_held"]


# -- lost objects ----------------------------------------------------------------------------------


def test_a_lost_object_reads_as_a_miss_never_an_error(store):
    client = store()
    ir = on_shard(0)
    r, s, c = rec(ir), rec(on_shard(1), shadow=True), rec(on_shard(0, ir + 1))

    async def main():
        for x in (r, s, c):
            await client.put(x, 0.0)
        await asyncio.gather(client._shards[0].vanish.remote(r.name),
                             client._shards[1].vanish.remote(s.name),
                             client._shards[0].corrupt.remote(c.name))
        return (await look(client, r), await look(client, r),
                await client.promote(s.name, s.key_bytes, 1.0), await look(client, c),
                await client.stats())

    lost, again, promoted, corrupt, stats = run(main())
    assert lost == again == corrupt == Miss(MissReason.LOST)
    assert promoted is None
    assert stats["lost"] == 3 and stats["records_held"] == stats["objects_held"] == 0


# -- the backend and the driver ---------------------------------------------------------------------


def test_the_backend_makes_store_actors_and_kills_them_at_shutdown(local_ray):
    clock = RealClock()
    backend = RayBackend(clock, {"target": EngineSpec("sim", "qwen3-0.6b@h200", 1)})
    r = rec(1)

    async def main():
        await backend.start()
        try:
            client = backend.make_store(1 << 20)
            await client.put(r, 0.0)
            actors = list(backend._store_actors)
            return client, await look(client, r), await client.stats(), actors
        finally:
            await backend.shutdown()

    client, hit, stats, actors = clock.run(main())
    assert isinstance(client, RayStoreClient) and client.shards == 2 and len(actors) == 2
    assert isinstance(hit, Hit) and stats["records_held"] == 1
    assert all(_dies(actor) for actor in actors)


def _dies(actor, timeout: float = 20.0) -> bool:
    """Whether ``actor`` stops answering within ``timeout`` (``ray.kill`` is asynchronous)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            ray.get(actor.stats.remote(), timeout=timeout)
        except ray.exceptions.RayActorError:
            return True
        time.sleep(0.1)
    return False


def test_the_c1_arm_serves_repeats_from_the_ray_store_through_the_driver(local_ray, tmp_path):
    import pandas as pd

    from dynbranch.driver import ReplayConfig, prepare, run_replay

    fixture = Path(__file__).parent / "fixtures" / "bfcl"
    # NOTE: at 1 request/s the repeats (requests 5-7 repeat 0 and 2) arrive seconds after
    # their first execution ended, so they are served from records, not joined.
    cfg = ReplayConfig(workload="routing", arm="c1", backend="ray", clock="real",
                       requests=8, rate=1.0, workers=2, profile="qwen3-0.6b@h200",
                       out=tmp_path / "run", progress=False,
                       workload_options={"root": str(fixture), "categories": (
                           "multi_turn_base", "multiple", "parallel_multiple")})
    result = run_replay(prepare(cfg, progress=lambda _m: None))
    summary = result.summary
    assert summary["backend"] == "ray" and summary["completed"] == 8
    assert summary["accuracy"] == 1.0 and summary["unsafe_splices"] == 0
    stages = pd.read_parquet(tmp_path / "run" / "stages.parquet")
    assert (stages["served_from"] == "cache").sum() > 0
    store_stats = summary["reuse"]["store"]
    assert store_stats["shards"] == 2 and store_stats["records_held"] > 0
    assert store_stats["objects_held"] == store_stats["records_held"]
    assert store_stats["in_flight"] == 0 and summary["reuse"]["open_tickets"] == 0
