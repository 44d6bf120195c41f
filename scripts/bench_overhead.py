"""Orchestration overhead per stage, measured with the zero-duration engine.

The zero engine returns as soon as it has its text, so an LLM stage's duration as the
orchestrator logs it (render → place → engine call → record) is orchestration overhead plus
the little the engine does itself: cutting the replayed text and counting the prompt's
tokens, about 0.1-2 ms for a Routing prompt of 30,000-40,000 characters (more in an engine
actor, whose encoder has seen only the prompts placed on it). The engine reports that work
as the call's ``engine_s``, so each backend is given twice: the stage's whole duration, and
its overhead net of the engine's own work (duration less ``engine_s``), which is what the
orchestrator and, on the Ray backend, the actor round trip add. Routing requests (real BFCL
prompts, ~6k tokens for multi-turn routers) are replayed at a rate that keeps several
requests in flight.

    python scripts/bench_overhead.py [--requests 200] [--rate 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # NOTE: measure this tree's code, not an installed copy
    sys.path.insert(0, str(ROOT))

from dynbranch.driver import ReplayConfig, prepare, run_replay  # noqa: E402

QUANTILES = ("p50", "p90", "p99", "mean")


def _stats(d: np.ndarray) -> dict[str, float]:
    return {"p50": float(np.percentile(d, 50)), "p90": float(np.percentile(d, 90)),
            "p99": float(np.percentile(d, 99)), "mean": float(d.mean())}


def measure(backend: str, requests: int, rate: float, out: Path) -> dict:
    cfg = ReplayConfig(workload="routing", arm="floor", engine="zero", backend=backend,
                       clock="real", requests=requests, rate=rate, workers=4, seed=1,
                       out=out / backend, progress=False)
    result = run_replay(prepare(cfg, progress=lambda _m: None))
    llm = [s for s in result.orchestrator.log.stages if s.kind == "llm"]
    whole = np.array([s.duration for s in llm]) * 1e3
    engine = np.array([s.engine_s for s in llm]) * 1e3
    return {"stages": len(llm), "failed": result.summary["failed"], "whole": _stats(whole),
            "net": _stats(whole - engine), "engine": _stats(engine)}


def _line(label: str, q: dict[str, float]) -> str:
    return f"{label}: " + ", ".join(f"{k} {q[k]:.3f} ms" for k in QUANTILES)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0)
    args = ap.parse_args()
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("local", "ray"):
            r = got[backend] = measure(backend, args.requests, args.rate, Path(tmp))
            print(f"{backend:>5}: {r['stages']} LLM stages (failed requests: {r['failed']})")
            print("   " + _line("stage duration       ", r["whole"]))
            print("   " + _line("overhead (less engine)", r["net"]))
            print("   " + _line("engine's own work    ", r["engine"]))
    local, ray_ = got["local"], got["ray"]
    for part, label in (("whole", "stage duration"), ("net", "overhead less engine")):
        print(f"ratio ray / local, {label} (this run): " + ", ".join(
            f"{q} {ray_[part][q] / local[part][q]:.1f}x" for q in QUANTILES))


if __name__ == "__main__":
    main()
