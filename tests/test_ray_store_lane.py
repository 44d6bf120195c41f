"""C1 lookups over the store shards' stream lanes answer exactly what actor calls answer.

First the rows without Ray (every kind of answer through msgpack and back); then the same
store history on a local Ray instance twice, once with the lookups as actor calls and once over
the lanes: every answer equal, small and large records, shadows, stale records, joins.
"""

import asyncio

import msgpack
import numpy as np
import pytest

from dynbranch.cluster.store_lane import decode_lookup, encode_lookup
from dynbranch.cluster.store_reads import Located
from dynbranch.reuse import Hit, Miss, MissReason
from dynbranch.reuse.lookups import JoinInFlight, LookupKind, ShadowMatch, Stale
from dynbranch.reuse.record import RecordState

ray = pytest.importorskip("ray")

from dynbranch.cluster.shard_set import ShardSet  # noqa: E402
from dynbranch.cluster.store import RayStoreClient  # noqa: E402
from dynbranch.cluster.store_faults import make_restartable_shards  # noqa: E402
from tests.test_ray_store import SHARDS, look, rec  # noqa: E402


def _wire(row):
    return msgpack.unpackb(msgpack.packb(row), raw=False)


def test_every_answer_travels_as_a_row_and_back():
    answers = [Miss(MissReason.ABSENT),
               Stale("n1", {"res": ("v1", "v2"), "gone": ("v0", None)}, ("n1", "n2")),
               ShadowMatch("n3", None),
               JoinInFlight(7, "n4", "req-9")]
    for got in answers:
        assert decode_lookup(_wire(encode_lookup(got))) == got
    view = np.frombuffer(b"arrow bytes", dtype=np.uint8)
    small = Located(LookupKind.HIT, "n5", RecordState.COMMITTED, 3, (), "obj", view)
    back = decode_lookup(_wire(encode_lookup(small)))
    assert back == Located(LookupKind.HIT, "n5", RecordState.COMMITTED, 3, (), "obj",
                           b"arrow bytes")
    # NOTE: a large record's answer carries a ref, not bytes: the shard reads them for the row
    large = Located(LookupKind.SHADOW, "n6", RecordState.SHADOW, 0, ("a ref",), "obj2")
    assert decode_lookup(_wire(encode_lookup(large, b"big"))).data == b"big"
    with pytest.raises(ValueError, match="no bytes"):
        encode_lookup(large)


async def _history(stream: bool) -> tuple[list, dict]:
    shards = ShardSet(make_restartable_shards(1 << 30, "lru", SHARDS), stream=stream)
    client = RayStoreClient(shards.handles)
    small, large = rec(1, value={"a": [1, 2]}), rec(2, pad=300_000)
    shadow, read = rec(3, shadow=True), rec(4, reads={"res": "v1"})
    try:
        for r in (small, large, shadow, read):
            assert (await client.put(r, 0.0)).stored
        answers = [await look(client, r) for r in (small, large, shadow, read, rec(5))]
        answers.append(await look(client, shadow, serving=False))
        answers += await asyncio.gather(*(look(client, r) for r in (small, large, rec(6))))
        await client.write("res", "v2", 1.0)
        answers.append(await look(client, read))
        ticket = await client.begin(rec(7).name, rec(7).key_bytes, "req-7")
        answers.append(await look(client, rec(7)))
        await client.finish(ticket, None, 2.0)
        return answers, dict(shards.counts)
    finally:
        shards.close_lanes()
        for actor in shards.actors:
            ray.kill(actor)


@pytest.mark.ray
def test_lookups_over_the_lanes_answer_as_actor_calls(local_ray):
    by_call, call_counts = asyncio.run(_history(stream=False))
    by_lane, lane_counts = asyncio.run(_history(stream=True))
    assert by_lane == by_call
    kinds = [type(a).__name__ for a in by_lane]
    assert kinds == ["Hit", "Hit", "ShadowMatch", "Hit", "Miss", "ShadowMatch", "Hit", "Hit",
                     "Miss", "Miss", "JoinInFlight"]
    assert isinstance(by_lane[1], Hit) and len(by_lane[1].record.value) > 300_000
    assert by_lane[5].record is not None and by_lane[2].record is None
    assert call_counts["stream_lookups"] == 0
    assert lane_counts["stream_lookups"] == 11 and lane_counts["stream_broken"] == 0


def test_a_lookup_batch_a_stalled_shard_does_not_answer_times_out_and_drops_the_lane():
    # NOTE: no cluster: a lane to a listener whose shard never answers, on this loop
    from dynbranch.cluster.shard_set import ShardRetry, _Failure
    from dynbranch.cluster.stream import Lane, LaneServer

    stalled = asyncio.Event()

    async def never(_method, _arg):
        await stalled.wait()

    async def main():
        server = LaneServer(never)
        host, port = await server.start("127.0.0.1")
        server.allow(b"t" * 16)
        lane = await Lane.connect("shard 0", host, port, b"t" * 16,
                                  lambda _r, row: RuntimeError(row["message"]))
        shards = ShardSet([object()], ShardRetry(lookup_timeout_s=0.2), stream=True)
        shards._lanes[0] = lane
        loop = asyncio.get_running_loop()
        t = loop.time()
        try:
            got = await shards._on_lane(0, lane, "lookup", ("name", b"key", 0.0, True))
        finally:
            stalled.set()
            server.close()
        return got, loop.time() - t, lane.broken, dict(shards.counts), shards._lanes

    got, took, broken, counts, lanes = asyncio.run(main())
    assert isinstance(got, _Failure) and "TimeoutError" in got.why
    assert 0.15 < took < 2.0 and broken == "closed" and not lanes
    assert counts["stream_broken"] == 1


def test_only_reads_are_awaited_in_the_callers_task():
    shards = ShardSet([object()])
    with pytest.raises(ValueError, match="not a read"):
        asyncio.run(shards.handles[0].read_now("put", "record"))
