"""Orchestration overhead per stage, measured with the zero-duration engine.

The zero engine returns at once, so an LLM stage's duration as the orchestrator logs it
(render → place → engine call → record) is pure orchestration overhead: in process on the
local backend, plus a Ray actor round trip on the Ray backend. Routing requests (real BFCL
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


def measure(backend: str, requests: int, rate: float, out: Path) -> dict[str, float]:
    cfg = ReplayConfig(workload="routing", arm="floor", engine="zero", backend=backend,
                       clock="real", requests=requests, rate=rate, workers=4, seed=1,
                       out=out / backend, progress=False)
    result = run_replay(prepare(cfg, progress=lambda _m: None))
    llm = [s for s in result.orchestrator.log.stages if s.kind == "llm"]
    d = np.array([s.duration for s in llm]) * 1e3
    return {"stages": len(llm), "p50_ms": float(np.percentile(d, 50)),
            "p90_ms": float(np.percentile(d, 90)), "p99_ms": float(np.percentile(d, 99)),
            "mean_ms": float(d.mean()), "failed": result.summary["failed"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--rate", type=float, default=20.0)
    args = ap.parse_args()
    got = {}
    with tempfile.TemporaryDirectory() as tmp:
        for backend in ("local", "ray"):
            r = got[backend] = measure(backend, args.requests, args.rate, Path(tmp))
            print(f"{backend:>5}: {r['stages']} LLM stages, overhead per stage "
                  f"p50 {r['p50_ms']:.3f} ms, p90 {r['p90_ms']:.3f} ms, "
                  f"p99 {r['p99_ms']:.3f} ms, mean {r['mean_ms']:.3f} ms "
                  f"(failed requests: {r['failed']})")
    local, ray_ = got["local"], got["ray"]
    print("ratio (ray / local, this run): " + ", ".join(
        f"{q} {ray_[f'{q}_ms'] / local[f'{q}_ms']:.1f}x" for q in ("p50", "p90", "p99", "mean")))


if __name__ == "__main__":
    main()
