"""Per-request latencies of virtual-clock replays, to compare two trees of the code exactly.

    python scripts/compare_replays.py --out A.json [--requests 40] [--workloads ...] [--arms ...]
                                      [--shared-state]
    python scripts/compare_replays.py --diff A.json B.json

The first form replays every workload × arm on the local backend and the virtual clock and
writes, per cell, the summary's latency numbers and every request's latency; run it from
the root of each tree (it imports the code of the current directory). The second prints,
per cell, how many requests' latencies differ and both summaries' mean and p99.
``--shared-state`` replays routing as Table 1's write variant does (multi-turn BFCL records
sharing one workspace per scenario, drawn from a quarter as many workspaces as requests, so
requests of one scenario write what others read).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

WORKLOADS = ("routing", "react", "subagent", "hci")
ARMS = ("floor", "c1", "full", "helium")
KEEP = (
    "mean_latency_s",
    "p50_latency_s",
    "p99_latency_s",
    "reuse_hits",
    "promotions",
    "unsafe_splices",
    "unverified_splices",
    "completed",
    "failed",
    "reuse",
)


def replay(
    workload: str, arm: str, requests: int, data_dir: str | None, shared_state: bool = False
) -> dict:
    """One cell: its summary numbers and each request's latency, by request id."""
    sys.path.insert(0, str(Path.cwd()))
    from dynbranch.driver import ReplayConfig, prepare, run_replay
    from experiments.table1 import PER_WORKSPACE

    options = (
        {"shared_state": True, "categories": ("multi_turn_base",),
         "scenarios": max(1, requests // PER_WORKSPACE)}
        if shared_state and workload == "routing"
        else {}
    )
    with tempfile.TemporaryDirectory() as tmp:
        cfg = ReplayConfig(
            workload=workload,
            arm=arm,
            backend="local",
            clock="virtual",
            requests=requests,
            out=Path(tmp) / "run",
            progress=False,
            data_dir=data_dir,
            workload_options=options,
        )
        result = run_replay(prepare(cfg, progress=lambda _m: None))
    return {
        "summary": {k: result.summary.get(k) for k in KEEP},
        "latency": {
            r.request_id: round(r.latency, 9) for r in result.requests if r.status == "completed"
        },
    }


def diff(a_path: str, b_path: str) -> None:
    """Print, per cell, the requests whose latency differs between two result files."""
    a, b = json.loads(Path(a_path).read_text()), json.loads(Path(b_path).read_text())
    for cell in sorted(set(a) | set(b)):
        if cell not in a or cell not in b:
            print(f"{cell}: only in {'A' if cell in a else 'B'}")
            continue
        la, lb = a[cell]["latency"], b[cell]["latency"]
        differ = sorted(r for r in set(la) | set(lb) if la.get(r) != lb.get(r))
        sa, sb = a[cell]["summary"], b[cell]["summary"]
        print(
            f"{cell:<20} differ {len(differ):>3}/{len(la):<3} "
            f"mean {sa['mean_latency_s']:.6f} -> {sb['mean_latency_s']:.6f}  "
            f"p99 {sa['p99_latency_s']:.6f} -> {sb['p99_latency_s']:.6f}  "
            f"hits {sa['reuse_hits']} -> {sb['reuse_hits']}  "
            f"unsafe {sa['unsafe_splices']} -> {sb['unsafe_splices']}"
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out")
    ap.add_argument("--diff", nargs=2, metavar=("A", "B"))
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--workloads", nargs="+", default=list(WORKLOADS))
    ap.add_argument("--arms", nargs="+", default=list(ARMS))
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--shared-state", action="store_true")
    args = ap.parse_args()
    if args.diff:
        diff(*args.diff)
        return
    cells = {
        f"{w}/{a}": replay(w, a, args.requests, args.data_dir, args.shared_state)
        for w in args.workloads
        for a in args.arms
    }
    Path(args.out).write_text(json.dumps(cells, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    main()
