"""How fast the virtual clock replays: N routing requests on simulated engines, in process.

    python scripts/bench_replay_speed.py [--requests 1000] [--rate 1.0]

Prints wall seconds, simulated seconds and simulated seconds per wall second.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from dynbranch.driver import ReplayConfig, prepare, run_replay


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=1.0)
    ap.add_argument("--profile", default="qwen3-32b@h200")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ReplayConfig(workload="routing", arm="floor", backend="local", clock="virtual",
                           requests=args.requests, rate=args.rate, profile=args.profile,
                           out=Path(tmp) / "run", progress=False)
        s = run_replay(prepare(cfg, progress=lambda _m: None)).summary
    print(f"{s['requests']} routing requests at {s['rate']}/s on {args.profile}: "
          f"completed {s['completed']}, failed {s['failed']}, "
          f"wall {s['wall_s']:.1f} s, simulated {s['simulated_s']:.1f} s, "
          f"{s['sim_s_per_wall_s']:.1f} simulated s per wall s, "
          f"mean latency {s['mean_latency_s']:.3f} s, stages {s['stages']}")


if __name__ == "__main__":
    main()
