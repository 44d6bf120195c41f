"""Micro-benchmark of the C1 subgraph store (pure Python, one core).

Reports lookup latency p50/p99 in microseconds on a store holding 10k records (hit path,
absent-miss path, collision-miss path), the cost of naming and recording a stage, and
put+evict throughput on a store full to capacity. Numbers go into notes, not assertions.

    python scripts/bench_store.py [--records 10000] [--lookups 100000] [--seed 0]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable

from dynbranch.reuse import (
    Provenance,
    Record,
    RecordState,
    ReuseKey,
    SubgraphStore,
    reuse_name,
)
from dynbranch.workflow import SamplingParams

SAMPLING = SamplingParams(max_tokens=128)


def make_key(i: int, tenant: str = "bench") -> ReuseKey:
    fields = {"call": f"ls(a=True, path='dir{i}')", "history": [f"turn {j}" for j in range(4)]}
    return ReuseKey("f" * 64, fields, "qwen3-32b", "main", SAMPLING, "1", tenant)


def make_record(i: int) -> Record:
    value = {"result": [f"file{i}-{j}.txt" for j in range(8)], "ok": True}
    return Record.create(
        make_key(i), value, read_set={f"routing-{i % 500:05d}/GorillaFileSystem": "0"},
        provenance=Provenance(f"req-{i}", float(i), "engine-0", "c1"),
        state=RecordState.COMMITTED, cost_ms=float(10 + i % 90))


def percentiles_us(samples_ns: list[int]) -> tuple[float, float]:
    cuts = statistics.quantiles(samples_ns, n=100, method="inclusive")
    return cuts[49] / 1e3, cuts[98] / 1e3


def time_calls(call: Callable[[int], object], n: int) -> list[int]:
    out = []
    clock = time.perf_counter_ns
    for i in range(n):
        t0 = clock()
        call(i)
        out.append(clock() - t0)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--records", type=int, default=10_000)
    ap.add_argument("--lookups", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rnd = random.Random(args.seed)

    t0 = time.perf_counter()
    records = [make_record(i) for i in range(args.records)]
    create_us = (time.perf_counter() - t0) / args.records * 1e6
    size = statistics.mean(r.size for r in records)
    print(f"records: {args.records}, mean serialised size {size:.0f} B, "
          f"Record.create (name + Arrow) {create_us:.1f} us/record")

    store = SubgraphStore(capacity_bytes=sum(r.size for r in records) + 1)
    for i, r in enumerate(records):
        store.put(r, float(i))
    assert store.records_held == args.records

    hit_idx = [rnd.randrange(args.records) for _ in range(args.lookups)]
    keys = [(records[j].name, records[j].key_bytes) for j in hit_idx]
    hit = time_calls(lambda i: store.lookup(*keys[i], 1e6 + i), args.lookups)

    absent = [make_key(args.records + i) for i in range(min(args.lookups, 20_000))]
    absent_nk = [(reuse_name(k), k.key_bytes()) for k in absent]
    miss = time_calls(lambda i: store.lookup(*absent_nk[i % len(absent_nk)], 2e6),
                      args.lookups)

    other = [make_key(j, tenant="other").key_bytes() for j in hit_idx[:20_000]]
    coll = time_calls(lambda i: store.lookup(keys[i % len(other)][0], other[i % len(other)],
                                             3e6), args.lookups)

    name_ns = time_calls(lambda i: reuse_name(make_key(i)), 20_000)

    print(f"{'path':<28}{'p50 us':>10}{'p99 us':>10}")
    for label, samples in (("lookup hit", hit), ("lookup miss (absent)", miss),
                           ("lookup miss (collision)", coll),
                           ("key + reuse_name", name_ns)):
        p50, p99 = percentiles_us(samples)
        print(f"{label:<28}{p50:>10.2f}{p99:>10.2f}")
    assert store.stats.hits == args.lookups

    for policy in ("lru", "cost"):
        full = SubgraphStore(capacity_bytes=sum(r.size for r in records[: args.records // 2]),
                             policy=policy)
        for i, r in enumerate(records[: args.records // 2]):
            full.put(r, float(i))
        fresh = [make_record(args.records + i) for i in range(args.records)]
        t0 = time.perf_counter()
        for i, r in enumerate(fresh):
            full.put(r, 1e7 + i)
        elapsed = time.perf_counter() - t0
        print(f"put+evict ({policy}, full store of {args.records // 2}): "
              f"{len(fresh) / elapsed:,.0f} puts/s, {full.stats.evictions} evictions, "
              f"{elapsed / len(fresh) * 1e6:.1f} us/put")


if __name__ == "__main__":
    main()
