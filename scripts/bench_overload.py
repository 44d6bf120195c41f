"""Overload at 3x capacity with and without admission control (``--max-inflight``).

Routing, arm ``floor`` (or ``--arm``), four simulated Qwen3-32B/H200 engines, the local
backend on the virtual clock. First the capacity: the highest offered rate of a sweep at
which the run is stable, i.e. its median latency does not grow (by more than 5 %) as the run
grows from 300 to 1,000 requests (a queue that grows with the run is the sign of a rate above
capacity). Then open loop at 3x that rate, for 300 and 1,000 requests, without a bound and with each
``--max-inflight`` given: p50/p99 of the completed requests (from their scheduled arrival),
how many completed and how many were rejected.

    python scripts/bench_overload.py --out runs/bench-overload [--capacity 2]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dynbranch.driver import ReplayConfig, prepare, run_replay


def replay(out: Path, **kw) -> dict:
    cfg = ReplayConfig(
        workload="routing", backend="local", clock="virtual", progress=False, out=out, **kw
    )
    return run_replay(prepare(cfg, progress=lambda _m: None)).summary


GROWTH = 0.05
"""Most growth of the median latency from the smallest run to the largest at a stable rate.

NOTE: not the p99: Routing's latency is heavy-tailed (multi-turn requests), so the p99 of a
larger sample is higher with no queue at all (98 -> 101 s at 1 req/s, 300 -> 1,000 requests);
the median moves only when a queue builds."""


def capacity(out: Path, arm: str, seed: int, rates: list[float], sizes: list[int]) -> float:
    """The highest of ``rates`` whose median latency grows by at most :data:`GROWTH` from
    the first size to the last."""
    stable = []
    for rate in rates:
        runs = [
            replay(out / f"sweep-r{rate:g}-n{n}", arm=arm, rate=rate, requests=n, seed=seed)
            for n in sizes
        ]
        p50 = [s["p50_latency_s"] for s in runs]
        print(json.dumps({"sweep_rate": rate,
                          "p50_s": dict(zip(sizes, p50, strict=True)),
                          "p99_s": dict(zip(sizes, [s["p99_latency_s"] for s in runs],
                                            strict=True)),
                          "throughput_rps": runs[-1]["throughput_rps"]}))
        if p50[-1] <= p50[0] * (1.0 + GROWTH):
            stable.append(rate)
    if not stable:
        raise SystemExit(f"no swept rate was stable: sweep lower than {rates}")
    return max(stable)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path("runs/bench-overload"))
    p.add_argument("--arm", default="floor")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--factor", type=float, default=3.0, help="load over capacity")
    p.add_argument("--max-inflight", type=int, nargs="+", default=[32, 64])
    p.add_argument("--sizes", type=int, nargs="+", default=[300, 1000])
    p.add_argument(
        "--capacity", type=float, default=None, help="skip the sweep: the capacity in req/s"
    )
    p.add_argument(
        "--sweep-rates", type=float, nargs="+", default=[1.0, 2.0, 3.0, 4.0]
    )
    args = p.parse_args()
    cap = args.capacity or capacity(args.out, args.arm, args.seed, args.sweep_rates, args.sizes)
    rate = round(args.factor * cap, 2)
    print(f"capacity {cap:.2f} req/s; offered {rate} req/s ({args.factor:g}x)")
    rows = []
    for bound in [None, *args.max_inflight]:
        for n in args.sizes:
            s = replay(
                args.out / f"n{n}-m{bound}",
                arm=args.arm,
                rate=rate,
                requests=n,
                seed=args.seed,
                max_inflight=bound,
            )
            row = {
                "max_inflight": bound,
                "requests": n,
                "completed": s["completed"],
                "rejected": s["rejected"],
                "p50_s": s["p50_latency_s"],
                "p99_s": s["p99_latency_s"],
                "throughput_rps": s["throughput_rps"],
                "peak_inflight": s["launch"]["peak_inflight"],
            }
            rows.append(row)
            print(json.dumps(row))
    (args.out / "overload.json").write_text(
        json.dumps({"capacity_rps": cap, "rate": rate, "arm": args.arm, "rows": rows}, indent=2)
        + "\n"
    )


if __name__ == "__main__":
    main()
