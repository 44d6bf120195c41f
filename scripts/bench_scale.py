"""How replay cost grows: wall time and peak memory against requests, engines and arrival rate.

    python scripts/bench_scale.py [--quick] [--out runs/bench_scale] [--ray]

Each point is one replay of Routing (arm ``full`` by default, realistic decode lengths) in its
own subprocess, so its peak resident memory is its own (``ru_maxrss`` of the child). Three
sweeps, each varying one factor from a base point (4 engines, 4 req/s):

* requests: 1,000 → 10,000 → 50,000 (``--quick``: 250 → 1,000 → 4,000);
* engines: 4 → 16 → 64 simulated engines, arrival rate scaled with them (so each engine sees
  the base load);
* arrival rate: 1 → 4 → 16 req/s at 4 engines.

On the local backend every point runs on the virtual clock. With ``--ray`` the engine sweep
also runs on the Ray backend (real clock) with engines spread over several simulated nodes
(``ray.cluster_utils.Cluster``), for wall time only. It writes ``points.json``, a plot
(``scale.png``) and prints each sweep's fitted growth exponent: ``wall ∝ x^b`` by least
squares on the logs.
"""

from __future__ import annotations

import argparse
import json
import math
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SWEEPS = {
    "requests": {"full": [1_000, 10_000, 50_000], "quick": [250, 1_000, 4_000]},
    "engines": {"full": [4, 16, 64], "quick": [4, 16, 64]},
    "rate": {"full": [1.0, 4.0, 16.0], "quick": [1.0, 4.0, 16.0]},
}
BASE = {"requests": 1_000, "engines": 4, "rate": 4.0}
QUICK_BASE = {"requests": 500, "engines": 4, "rate": 4.0}

CHILD = """
import json, resource, sys, time
from pathlib import Path
from dynbranch.driver import ReplayConfig, prepare, run_replay
args = json.loads(sys.argv[1])
cfg = ReplayConfig(workload="routing", arm=args["arm"], backend=args["backend"],
                   clock=args["clock"], requests=args["requests"], rate=args["rate"],
                   workers=args["engines"], out=Path(args["out"]), progress=False,
                   address=args.get("address"))
t0 = time.perf_counter()
s = run_replay(prepare(cfg, progress=lambda _m: None)).summary
print(json.dumps({"wall_s": time.perf_counter() - t0, "simulated_s": s["simulated_s"],
                  "completed": s["completed"], "failed": s["failed"],
                  "mean_latency_s": s["mean_latency_s"],
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def run_point(arm: str, requests: int, engines: int, rate: float, *, backend: str = "local",
              address: str | None = None) -> dict:
    """One replay in a fresh interpreter; its wall time, simulated time and peak memory."""
    with tempfile.TemporaryDirectory() as tmp:
        args = {"arm": arm, "requests": requests, "engines": engines, "rate": rate,
                "backend": backend, "clock": "virtual" if backend == "local" else "real",
                "out": str(Path(tmp) / "run"), "address": address}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)],
                              capture_output=True, text=True, check=True)
        point = json.loads(done.stdout.strip().splitlines()[-1])
    point.update(args | {"process_s": time.perf_counter() - t0})
    point.pop("out")
    point["sim_s_per_wall_s"] = point["simulated_s"] / point["wall_s"]
    return point


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """``b`` of ``y ≈ a x^b`` by least squares on (log x, log y)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / den if den else 0.0


def sweep(name: str, values: list, base: dict, arm: str) -> list[dict]:
    points = []
    for v in values:
        p = dict(base)
        p[name] = v
        if name == "engines":
            p["rate"] = base["rate"] * v / base["engines"]
        point = run_point(arm, p["requests"], p["engines"], p["rate"])
        point["sweep"] = name
        points.append(point)
        print(f"  {name}={v}: wall {point['wall_s']:.1f} s, {point['sim_s_per_wall_s']:.0f} "
              f"sim s / wall s, peak {point['maxrss_mb']:.0f} MB", flush=True)
    return points


def ray_engine_sweep(values: list, base: dict, arm: str, nodes: int = 4) -> list[dict]:
    """The engine sweep on Ray, engines spread over ``nodes`` simulated nodes."""
    from ray.cluster_utils import Cluster

    points = []
    for engines in values:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
        per_node = math.ceil(engines / nodes)
        for _ in range(nodes):
            cluster.add_node(num_cpus=1, resources={"dynbranch_engine": per_node})
        try:
            point = run_point(arm, base["requests"], engines,
                              base["rate"] * engines / base["engines"], backend="ray",
                              address=cluster.address)
        finally:
            cluster.shutdown()
        point["sweep"] = "engines-ray"
        points.append(point)
        print(f"  ray engines={engines}: wall {point['wall_s']:.1f} s", flush=True)
    return points


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweeps = [s for s in ("requests", "engines", "rate", "engines-ray")
              if any(p["sweep"] == s for p in points)]
    fig, axes = plt.subplots(2, len(sweeps), figsize=(4 * len(sweeps), 6), squeeze=False)
    for j, s in enumerate(sweeps):
        ps = [p for p in points if p["sweep"] == s]
        key = "engines" if s.startswith("engines") else s
        xs = [p[key] for p in ps]
        axes[0][j].loglog(xs, [p["wall_s"] for p in ps], "o-")
        axes[0][j].set_title(f"{s}: wall ∝ x^{fit_exponent(xs, [p['wall_s'] for p in ps]):.2f}")
        axes[0][j].set_ylabel("wall s")
        axes[1][j].semilogx(xs, [p["maxrss_mb"] for p in ps], "o-")
        axes[1][j].set_ylabel("peak RSS (MB)")
        axes[1][j].set_xlabel(key)
        for a in axes[:, j]:
            a.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--arm", default="full")
    ap.add_argument("--ray", action="store_true", help="also the engine sweep on Ray")
    ap.add_argument("--out", default="runs/bench_scale")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = "quick" if args.quick else "full"
    base = QUICK_BASE if args.quick else BASE
    points = []
    for name, values in SWEEPS.items():
        print(f"sweep {name}:", flush=True)
        points += sweep(name, values[size], base, args.arm)
    if args.ray:
        points += ray_engine_sweep(SWEEPS["engines"][size], base, args.arm)
    fits = {}
    for s in sorted({p["sweep"] for p in points}):
        ps = [p for p in points if p["sweep"] == s]
        key = "engines" if s.startswith("engines") else s
        fits[s] = {"wall_exponent": fit_exponent([p[key] for p in ps], [p["wall_s"] for p in ps]),
                   "memory_exponent": fit_exponent([p[key] for p in ps],
                                                   [p["maxrss_mb"] for p in ps])}
        print(f"{s}: wall ∝ x^{fits[s]['wall_exponent']:.2f}, "
              f"memory ∝ x^{fits[s]['memory_exponent']:.2f}")
    (out / "points.json").write_text(json.dumps({"points": points, "fits": fits}, indent=2))
    plot(points, out / "scale.png")
    print(f"wrote {out}/points.json and {out}/scale.png; this process's peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")


if __name__ == "__main__":
    main()
