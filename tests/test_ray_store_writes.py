"""C1's write protocol on the Ray store: records reading one resource sit on several shards, so
an announced write is marked on every shard, and lifted only once its versions and cascade
reached all of them; then both write windows through the orchestrator on the real clock."""

import asyncio

import pytest

from dynbranch.errors import TicketError
from dynbranch.reuse import Hit, Miss, MissReason, PutOutcome

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

from tests.test_ray_store import SHARDS, look, on_shard, rec, run, store  # noqa: E402

__all__ = ["store"]  # a fixture, imported for pytest (local_ray is in conftest.py)


def test_an_announced_write_is_marked_on_every_shard_until_its_commit(store):
    client = store()
    ia, ib = on_shard(0), on_shard(1)
    a, b = rec(ia, reads={"res": "0"}), rec(ib, reads={"res": "0"})
    down = rec(on_shard(1, ib + 1), upstream=[a.name])  # rendered from a, on the other shard
    other = rec(on_shard(0, ia + 1), reads={"db": "0"})

    async def main():
        for r in (a, b, down, other):
            assert (await client.put(r, 0.0)).stored
        receipt = await client.announce(["res"], "w")
        during = [await look(client, r) for r in (a, b, other)]
        refused = [await client.put(rec(2000 + s, reads={"res": "0"}), 1.0) for s in range(SHARDS)]
        held = (await client.stats())["writes_open"]
        invs = await client.commit(receipt, {"res": "1"}, 2.0)
        after = [await look(client, r) for r in (a, b, down, other)]
        return receipt, during, refused, held, invs, after, await client.stats()

    receipt, during, refused, held, invs, after, stats = run(main())
    assert len(receipt.parts) == SHARDS and held == SHARDS  # one mark per shard
    assert during[:2] == [Miss(MissReason.WRITING)] * 2 and isinstance(during[2], Hit)
    assert [p.outcome for p in refused] == [PutOutcome.WRITING] * SHARDS
    (inv,) = invs
    assert inv.levels == (tuple(sorted([a.name, b.name])), (down.name,))
    assert after[:3] == [Miss(MissReason.INVALIDATED)] * 3 and isinstance(after[3], Hit)
    assert stats["writes_open"] == 0 and stats["writes_committed"] == SHARDS


def test_a_withdrawn_write_serves_again_and_a_failed_one_invalidates_every_shard(store):
    client = store()
    a, b = rec(on_shard(0), reads={"res": "0"}), rec(on_shard(1), reads={"db": "0"})

    async def main():
        await client.put(a, 0.0)
        await client.put(b, 0.0)
        receipt = await client.announce(None, "w")  # may write anything
        missed = await look(client, a)
        await client.commit(receipt, {}, 1.0)  # it changed nothing
        hit = await look(client, a)
        failed = await client.announce(None, "w2")
        invs = await client.commit(failed, None, 2.0)  # it raised: anything may have changed
        return receipt, missed, hit, invs, [await look(client, r) for r in (a, b)]

    receipt, missed, hit, invs, after = run(main())
    assert missed == Miss(MissReason.WRITING) and isinstance(hit, Hit)
    assert sorted(inv.resource for inv in invs) == ["db", "res"]
    assert after == [Miss(MissReason.INVALIDATED)] * 2
    with pytest.raises(TicketError):
        run(client.commit(receipt, {"res": "2"}, 3.0))


def test_overlapping_writes_commit_one_unknown_version_on_every_shard(store):
    client = store()

    async def main():
        await client.observe_reads({"res": "0"})
        w1 = await client.announce(["res"], "w1")
        w2 = await client.announce(["res"], "w2")
        await client.commit(w2, {"res": "2"}, 1.0)
        await client.commit(w1, {"res": "1"}, 2.0)  # an older version, committed last
        puts = [
            await client.put(rec(on_shard(s), reads={"res": v}), 3.0)
            for s in range(SHARDS)
            for v in ("1", "2")
        ]
        tables = await asyncio.gather(
            *(a.observe_reads.remote({"res": "2"}) for a in client._shards)
        )
        return puts, tables

    puts, tables = run(main())
    assert [p.outcome for p in puts] == [PutOutcome.STALE] * (2 * SHARDS)
    currents = {table["res"][1] for table in tables}
    assert len(currents) == 1 and next(iter(currents)).startswith("\x00unknown:")


def test_a_caller_cancelled_mid_announce_or_mid_commit_leaves_no_mark(store):
    client = store()

    async def main():
        announcing = asyncio.ensure_future(client.announce(["res"], "w"))
        await asyncio.sleep(0)  # the shards have been asked
        announcing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await announcing
        receipt = await client.announce(["res"], "w2")
        committing = asyncio.ensure_future(client.commit(receipt, {"res": "1"}, 1.0))
        await asyncio.sleep(0)
        committing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await committing
        return await client.stats()

    stats = run(main())
    assert stats["writes_open"] == 0 and stats["writes_announced"] == 2 * SHARDS


def test_both_write_windows_serve_no_stale_value_through_the_ray_store(local_ray):
    from dynbranch.arms.registry import get_arm
    from dynbranch.audit import unsafe_splices
    from dynbranch.clock import RealClock
    from dynbranch.cluster import RayStoreClient
    from dynbranch.cluster.store import make_shards
    from dynbranch.orchestrator import Orchestrator
    from dynbranch.runtime.run import RunContext
    from tests.shared_kv import LookupRequest, SharedKV, WriteRequest

    clock = RealClock()
    kv = SharedKV({"colour": "blue", "size": "small"})
    # NOTE: margins of 0.2 s or more, as the real clock runs on a loaded machine
    schedule = [
        (0.0, LookupRequest("a", kv, "colour")),  # recorded before the write
        (0.4, LookupRequest("b", kv, "size", lookup_s=0.4)),  # reads, stores at 0.8
        (0.6, WriteRequest("w", kv, "colour", "red", write_s=1.0)),  # 0.6 -> 1.6
        (1.0, LookupRequest("c", kv, "colour")),  # during the write: not a's record
        (1.2, LookupRequest("d", kv, "size")),
    ]  # during it: b's was refused
    shards = make_shards(1 << 24, "lru", SHARDS)

    async def main():
        client = RayStoreClient(shards)
        await client.stats()  # the shards are up before the schedule starts
        ctx = RunContext(clock=clock, arm="c1", make_store=lambda: client)
        orch = Orchestrator(clock, {}, get_arm("c1"), run=ctx)
        t0 = orch.start_run()

        async def one(at, req):
            await clock.sleep_until(t0 + at)
            return await orch.run_request(req, at)

        records = await asyncio.gather(*(one(at, r) for at, r in schedule))
        await orch.finish_run()
        return records, orch

    try:
        records, orch = clock.run(main())
    finally:
        for actor in shards:
            ray.kill(actor)
    assert [r.status for r in records] == ["completed"] * 5
    served = {s.request_id: s.served_from for s in orch.log.stages}
    assert served == {"a": "exec", "b": "exec", "w": "exec", "c": "exec", "d": "exec"}
    assert [r.seen[2] for _, r in schedule if r.request_id in "cd"] == ["red", "small"]
    assert unsafe_splices(orch.log.stages) == []
    store_stats = orch.mechanism_stats["reuse"]["store"]
    assert store_stats["writes_open"] == 0 and store_stats["in_flight"] == 0
    assert store_stats["writing"] == 1  # c found a's record withheld (b's was never stored)
