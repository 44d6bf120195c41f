"""Micro-benchmark of C1's store on Ray against the in-process store, through the async clients.

Fills a :class:`~dynbranch.cluster.RayStoreClient` (store actors on a local Ray instance,
records' Arrow bytes in the object store) and a :class:`~dynbranch.reuse.client.LocalStoreClient`
with the same records, then times one awaited call at a time: a lookup hit (for Ray: the
shard's answer, fetching the object and decoding it), a lookup miss, a put, and a stage group's
:data:`GROUP` hits started together (on Ray, one call per shard). The Ray store is timed
twice: as actor calls to plain shards, and as the Ray backend runs it (restartable shards
behind their :class:`~dynbranch.cluster.shard_set.ShardSet`, lookups over stream lanes,
:mod:`dynbranch.cluster.store_lane`). Prints p50/p99 in microseconds, every path from the
same run, and the ratios to the in-process store. Numbers go into notes, not assertions.

    python scripts/bench_store_ray.py [--records 2000] [--lookups 2000] [--shards 2]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # NOTE: measure this tree's code, not an installed copy
    sys.path.insert(0, str(ROOT))

from dynbranch.reuse import Hit, Miss, Provenance, Record, RecordState, ReuseKey, SubgraphStore  # noqa: E402
from dynbranch.reuse.client import LocalStoreClient, StoreClient  # noqa: E402
from dynbranch.workflow import SamplingParams  # noqa: E402

SAMPLING = SamplingParams(max_tokens=128)
GROUP = 8
"""Lookups one stage group starts together (the batched row)."""
CAPACITY = 1 << 30


def make_key(i: int) -> ReuseKey:
    fields = {"call": f"ls(a=True, path='dir{i}')", "history": [f"turn {j}" for j in range(4)]}
    return ReuseKey("f" * 64, fields, "qwen3-32b", "main", SAMPLING, "1", "bench")


def make_record(i: int) -> Record:
    value = {"result": [f"file{i}-{j}.txt" for j in range(8)], "ok": True}
    return Record.create(
        make_key(i), value, read_set={f"routing-{i % 500:05d}/GorillaFileSystem": "0"},
        provenance=Provenance(f"req-{i}", float(i), "engine-0", "c1"),
        state=RecordState.COMMITTED, cost_ms=float(10 + i % 90))


def percentiles_us(samples_ns: list[int]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return cuts[49] / 1e3, cuts[98] / 1e3


async def time_calls(call: Callable[[int], Awaitable[object]], n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        await call(i)
        out.append(clock() - t0)
    return out


async def bench(client: StoreClient, records: list[Record], lookups: int,
                rnd: random.Random) -> dict[str, list[int]]:
    """Put every record (timed), then time ``lookups`` hits and misses."""
    puts = await time_calls(lambda i: client.put(records[i], float(i)), len(records))
    picks = [records[rnd.randrange(len(records))] for _ in range(lookups)]

    async def hit(i: int) -> None:
        got = await client.lookup(picks[i].name, picks[i].key_bytes, 1e6 + i)
        assert isinstance(got, Hit) and got.record.value == picks[i].value

    absent = [make_record(len(records) + i) for i in range(lookups)]

    async def miss(i: int) -> None:
        got = await client.lookup(absent[i].name, absent[i].key_bytes, 2e6 + i)
        assert isinstance(got, Miss)

    async def group(i: int) -> None:
        """A stage group's lookups: GROUP hits started together (one call per shard)."""
        got = await asyncio.gather(*(client.lookup(picks[j].name, picks[j].key_bytes, 3e6 + i)
                                     for j in range(i, i + GROUP)))
        assert all(isinstance(g, Hit) for g in got)

    await hit(0)  # warm the path (first fetch of a borrowed ref, imports)
    grouped = await time_calls(group, lookups - GROUP)
    return {"lookup hit (+ fetch, decode)": await time_calls(hit, lookups),
            "lookup miss (absent)": await time_calls(miss, lookups), "put": puts,
            f"{GROUP} hits gathered, whole group": grouped}


async def run(args: argparse.Namespace) -> None:
    import ray

    from dynbranch.cluster import RayStoreClient
    from dynbranch.cluster.shard_set import ShardSet
    from dynbranch.cluster.store import make_shards
    from dynbranch.cluster.store_faults import make_restartable_shards

    records = [make_record(i) for i in range(args.records)]
    print(f"records: {args.records}, mean serialised size "
          f"{statistics.mean(r.size for r in records):.0f} B, shards: {args.shards}, "
          f"lookups: {args.lookups}")
    shards = make_shards(CAPACITY, "lru", args.shards)
    laned = ShardSet(make_restartable_shards(CAPACITY, "lru", args.shards), stream=True)
    clients = {"ray": RayStoreClient(shards), "stream": RayStoreClient(laned.handles),
               "local": LocalStoreClient(SubgraphStore(CAPACITY))}
    results = {}
    for label, client in clients.items():
        results[label] = await bench(client, records, args.lookups, random.Random(args.seed))
    for label in ("ray", "stream"):
        stats = await clients[label].stats()
        b = clients[label].batcher.counts
        print(f"{label} store: {stats['records_held']} records, {stats['objects_held']} "
              f"objects, {stats['object_bytes']:,} object bytes over {stats['shards']} shards; "
              f"{b['lookups']:,} lookups in {b['calls']:,} shard calls")
    print(f"stream lanes: {laned.counts['stream_lookups']:,} lookups over them, "
          f"{laned.counts['stream_broken']} broken, {laned.counts['stream_unopened']} unopened")
    print("ray: actor calls to plain shards; stream: the Ray backend's shards (restartable, "
          "behind their shard set) with lookups over stream lanes; p50 / p99 in us, and the "
          "ratio to local")
    print(f"{'path':<32}{'ray':>18}{'stream':>18}{'local':>16}{'ray / local':>14}"
          f"{'stream / local':>16}")
    for path in results["ray"]:
        cut = {label: percentiles_us(results[label][path]) for label in results}
        (r50, r99), (s50, s99), (l50, l99) = cut["ray"], cut["stream"], cut["local"]
        print(f"{path:<32}{r50:>9.1f}{r99:>9.1f}{s50:>9.1f}{s99:>9.1f}{l50:>8.1f}{l99:>8.1f}"
              f"{r50 / l50:>7.0f}{r99 / l99:>7.0f}{s50 / l50:>8.0f}{s99 / l99:>8.0f}")
    laned.close_lanes()
    for actor in shards + laned.actors:
        ray.kill(actor)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=2_000)
    ap.add_argument("--lookups", type=int, default=2_000)
    ap.add_argument("--shards", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    import ray

    ray.init(address="local", include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        asyncio.run(run(args))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
