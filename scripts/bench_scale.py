"""How replay cost grows: wall time and peak memory against requests, engines and arrival rate.

    python scripts/bench_scale.py [--quick] [--out runs/bench_scale] [--ray]
        [--requests N ...] [--engines N ...] [--rates R ...] [--sweep-requests N]
        [--ray-requests N] [--ray-engines N ...] [--store-mb MB] [--only requests,engines,...]

Each point is one replay of Routing (arm ``full`` by default, realistic decode lengths) in its
own subprocess, so its peak resident memory is its own (``ru_maxrss`` of the child). Three
sweeps, each varying one factor from a base point (4 engines, 4 req/s):

* requests: 1,000 → 10,000 → 50,000 (``--quick``: 250 → 1,000 → 4,000);
* engines: 4 → 16 → 64 simulated engines, arrival rate scaled with them (so each engine sees
  the base load);
* arrival rate: 1 → 4 → 16 req/s at 4 engines.

Each point reports wall time and the child's CPU time (user + system): on a machine shared
with other work the CPU time is the steadier measure of what the replay costs, and
``sim_s_per_cpu_s`` is the speed it would have alone on one core. Replays run as the CLI's do
(``keep_log=False``: streamed rows leave memory), so peak memory is what a user's replay
holds; the C1 store still grows up to ``--store-mb`` (its capacity) like any cache.

On the local backend every point runs on the virtual clock. With ``--ray`` the engine sweep
also runs on the Ray backend (real clock) with engines spread over several simulated nodes
(``ray.cluster_utils.Cluster``), for wall time only. It writes ``points.json``, a plot
(``scale.png``) and prints each sweep's fitted growth exponents (wall, CPU and memory):
``y ∝ x^b`` by least squares on the logs.

``points.json`` is rewritten after every point, so a run stopped part way keeps what it
measured. A point whose replay fails (a Ray cluster that cannot hold its engines, a replay
that runs out of memory) is kept there with its error (the end of the replay's stderr) and
left out of the fits and the plot; the sweep goes on, and the script exits with status 1 at
the end.
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
from collections.abc import Callable
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
                   address=args.get("address"), decode_lengths="modelled",
                   store_mb=args["store_mb"])
prepared = prepare(cfg, progress=lambda _m: None)
t0, c0 = time.perf_counter(), time.process_time()
s = run_replay(prepared, keep_log=False).summary
print(json.dumps({"wall_s": time.perf_counter() - t0, "cpu_s": time.process_time() - c0,
                  "simulated_s": s["simulated_s"], "completed": s["completed"],
                  "failed": s["failed"], "mean_latency_s": s["mean_latency_s"],
                  "stages": s["stages"],
                  "maxrss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


class PointFailed(RuntimeError):
    """A point's replay did not finish: its exit status and the end of what it printed."""


STDERR_LINES = 12
"""Lines of a failed child's stderr kept in its point (the end, where the error is)."""


def run_point(arm: str, requests: int, engines: int, rate: float, *, backend: str = "local",
              address: str | None = None, store_mb: int = 1024) -> dict:
    """One replay in a fresh interpreter; its wall and CPU time, simulated time, peak memory.

    Raises :class:`PointFailed` (with the end of the child's stderr) if it does not finish.
    """
    with tempfile.TemporaryDirectory() as tmp:
        args = {"arm": arm, "requests": requests, "engines": engines, "rate": rate,
                "backend": backend, "clock": "virtual" if backend == "local" else "real",
                "out": str(Path(tmp) / "run"), "address": address, "store_mb": store_mb}
        t0 = time.perf_counter()
        done = subprocess.run([sys.executable, "-c", CHILD, json.dumps(args)],
                              capture_output=True, text=True)
        lines = done.stdout.strip().splitlines()
        if done.returncode != 0 or not lines:
            tail = "\n".join(done.stderr.strip().splitlines()[-STDERR_LINES:])
            raise PointFailed(f"{backend} replay of {requests} requests on {engines} engines "
                              f"exited with status {done.returncode}:\n{tail}")
        point = json.loads(lines[-1])
    point.update(args | {"process_s": time.perf_counter() - t0})
    point.pop("out")
    point["sim_s_per_wall_s"] = point["simulated_s"] / point["wall_s"]
    point["sim_s_per_cpu_s"] = point["simulated_s"] / point["cpu_s"]
    return point


def fit_exponent(xs: list[float], ys: list[float]) -> float:
    """``b`` of ``y ≈ a x^b`` by least squares on (log x, log y)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    den = sum((x - mx) ** 2 for x in lx)
    return sum((x - mx) * (y - my) for x, y in zip(lx, ly, strict=True)) / den if den else 0.0


class Points:
    """The points measured so far, written to ``points.json`` after each one (with the fits
    of those that finished), so a run stopped or failing part way keeps what it measured."""

    def __init__(self, path: Path) -> None:
        self.path, self.points = path, []

    def add(self, point: dict) -> None:
        self.points.append(point)
        self.path.write_text(json.dumps({"points": self.points,
                                         "fits": fit_all(self.points, quiet=True)}, indent=2))

    def measured(self) -> list[dict]:
        return [p for p in self.points if "error" not in p]

    def failed(self) -> list[dict]:
        return [p for p in self.points if "error" in p]


def measure_point(points: Points, label: str, sweep_name: str, where: dict,
                  run: Callable[[], dict]) -> None:
    """Run one point and record it; a point whose replay fails is recorded as failed (its
    error said), and the sweep goes on."""
    try:
        point = run()
    except PointFailed as e:
        points.add({"sweep": sweep_name, **where, "error": str(e)})
        print(f"  {label}: failed: {e}", flush=True)
        return
    point["sweep"] = sweep_name
    points.add(point)
    _say(f"  {label}", point)


def sweep(points: Points, name: str, values: list, base: dict, arm: str,
          store_mb: int) -> None:
    """One point per value of ``name``, the other factors at ``base``."""
    for v in values:
        p = dict(base)
        p[name] = v
        if name == "engines":
            p["rate"] = base["rate"] * v / base["engines"]
        measure_point(points, f"{name}={v}", name, p, lambda p=p: run_point(
            arm, p["requests"], p["engines"], p["rate"], store_mb=store_mb))


def _say(label: str, point: dict) -> None:
    print(f"{label}: wall {point['wall_s']:.1f} s, cpu {point['cpu_s']:.1f} s, "
          f"{point['sim_s_per_wall_s']:.1f} sim s / wall s, "
          f"{point['sim_s_per_cpu_s']:.1f} sim s / cpu s, peak {point['maxrss_mb']:.0f} MB",
          flush=True)


def ray_engine_sweep(points: Points, values: list, base: dict, arm: str, store_mb: int,
                     nodes: int = 4) -> None:
    """The engine sweep on Ray (real clock), engines spread over ``nodes`` simulated nodes.

    NOTE: ``cpu_s`` here is the driver process's only (the actors run in other processes).
    """
    from ray.cluster_utils import Cluster

    from dynbranch.cluster.backend import CPU_PER_SIM_ENGINE

    for engines in values:
        rate = base["rate"] * engines / base["engines"]

        def run(engines: int = engines, rate: float = rate) -> dict:
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
            per_node = math.ceil(engines / nodes)
            # NOTE: logical CPUs, as a node declares them: each simulated engine asks for
            # CPU_PER_SIM_ENGINE of one (16 engines on a node of 1 CPU cannot be placed)
            cpus = max(1, math.ceil(per_node * CPU_PER_SIM_ENGINE))
            for _ in range(nodes):
                cluster.add_node(num_cpus=cpus, resources={"dynbranch_engine": per_node})
            try:
                point = run_point(arm, base["requests"], engines, rate, backend="ray",
                                  address=cluster.address, store_mb=store_mb)
            finally:
                cluster.shutdown()
            point["nodes"] = nodes
            return point

        measure_point(points, f"ray engines={engines} over {nodes} nodes", "engines-ray",
                      {"requests": base["requests"], "engines": engines, "rate": rate,
                       "nodes": nodes}, run)


def spaced(values: list[float], ratio: float = 1.15) -> list[float]:
    """``values`` in order, less each that is within ``ratio`` of the last one kept (ticks on
    a log axis whose labels would overlap)."""
    kept: list[float] = []
    for v in sorted(set(values)):
        if not kept or v >= kept[-1] * ratio:
            kept.append(v)
    return kept


def plot(points: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    sweeps = [s for s in ("requests", "engines", "rate", "engines-ray")
              if any(p["sweep"] == s for p in points)]
    fig, axes = plt.subplots(2, len(sweeps), figsize=(4 * len(sweeps), 6), squeeze=False)
    for j, s in enumerate(sweeps):
        ps = [p for p in points if p["sweep"] == s]
        key = _factor(s)
        xs = [p[key] for p in ps]
        walls, cpus = [p["wall_s"] for p in ps], [p["cpu_s"] for p in ps]
        axes[0][j].loglog(xs, walls, "o-", label=f"wall ∝ x^{fit_exponent(xs, walls):.2f}")
        axes[0][j].loglog(xs, cpus, "s--", label=f"cpu ∝ x^{fit_exponent(xs, cpus):.2f}")
        axes[0][j].set_title(s)
        axes[0][j].set_ylabel("seconds")
        axes[0][j].legend(fontsize=8)
        axes[1][j].semilogx(xs, [p["maxrss_mb"] for p in ps], "o-")
        axes[1][j].set_ylim(bottom=0)  # NOTE: from zero, so memory that is flat looks flat
        axes[1][j].set_ylabel("peak RSS (MB)")
        axes[1][j].set_xlabel(key)
        for a in axes[:, j]:
            a.grid(alpha=0.3)
            # NOTE: ticks at the measured points only, as plain numbers: a log axis spanning
            # less than two decades otherwise prints overlapping minor labels
            a.set_xticks(xs, [f"{x:g}" for x in xs])
            a.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        top = axes[0][j]  # the same for the seconds: the measured ones, one decimal
        top.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
        ticks = spaced(walls + cpus)
        top.set_yticks(ticks, [f"{t:.1f}" for t in ticks])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--arm", default="full")
    ap.add_argument("--ray", action="store_true", help="also the engine sweep on Ray")
    ap.add_argument("--out", default="runs/bench_scale")
    ap.add_argument("--requests", type=int, nargs="+", help="the requests sweep's values")
    ap.add_argument("--engines", type=int, nargs="+", help="the engines sweep's values")
    ap.add_argument("--rates", type=float, nargs="+", help="the rate sweep's values")
    ap.add_argument("--sweep-requests", type=int, help="requests at the engine and rate points")
    ap.add_argument("--ray-requests", type=int, default=300, help="requests per Ray point")
    ap.add_argument("--ray-engines", type=int, nargs="+", help="the Ray sweep's engines")
    ap.add_argument("--store-mb", type=int, default=1024, help="C1 store capacity")
    ap.add_argument("--only", default="requests,engines,rate", help="sweeps to run")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    size = "quick" if args.quick else "full"
    base = dict(QUICK_BASE if args.quick else BASE)
    if args.sweep_requests:
        base["requests"] = args.sweep_requests
    values = {name: v[size] for name, v in SWEEPS.items()}
    for name, given in (("requests", args.requests), ("engines", args.engines),
                        ("rate", args.rates)):
        if given:
            values[name] = given
    points = Points(out / "points.json")
    for name in [n for n in args.only.split(",") if n]:
        print(f"sweep {name}:", flush=True)
        sweep(points, name, values[name], base, args.arm, args.store_mb)
    if args.ray:
        print("sweep engines on Ray:", flush=True)
        ray_base = {**base, "requests": args.ray_requests}
        ray_engine_sweep(points, args.ray_engines or values["engines"], ray_base, args.arm,
                         args.store_mb)
    fit_all(points.points)  # NOTE: prints the fits; it leaves the failed points out itself
    wrote = f"{out}/points.json"
    if points.measured():
        plot(points.measured(), out / "scale.png")
        wrote += f" and {out}/scale.png"
    print(f"wrote {wrote}; this process's peak "
          f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")
    failed = points.failed()
    if failed:
        print(f"{len(failed)} of {len(points.points)} points failed (kept in points.json, "
              f"left out of the fits and the plot): "
              + ", ".join(f"{p['sweep']} {p[_factor(p['sweep'])]}" for p in failed),
              file=sys.stderr)
        sys.exit(1)


def _factor(sweep_name: str) -> str:
    """The factor a sweep varies (the Ray sweep varies the engines)."""
    return "engines" if sweep_name.startswith("engines") else sweep_name


def fit_all(points: list[dict], *, quiet: bool = False) -> dict[str, dict[str, float]]:
    """Each sweep's growth exponents of wall time, CPU time and peak memory (and says them,
    unless ``quiet``); failed points are left out."""
    fits = {}
    measured = [p for p in points if "error" not in p]
    for s in sorted({p["sweep"] for p in measured}):
        ps = [p for p in measured if p["sweep"] == s]
        if len(ps) < 2:
            continue
        xs = [p[_factor(s)] for p in ps]
        fits[s] = {f"{k}_exponent": fit_exponent(xs, [p[m] for p in ps])
                   for k, m in (("wall", "wall_s"), ("cpu", "cpu_s"), ("memory", "maxrss_mb"))}
        if not quiet:
            print(f"{s}: wall ∝ x^{fits[s]['wall_exponent']:.2f}, cpu ∝ x^"
                  f"{fits[s]['cpu_exponent']:.2f}, memory ∝ x^"
                  f"{fits[s]['memory_exponent']:.2f}")
    return fits


if __name__ == "__main__":
    main()
