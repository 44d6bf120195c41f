"""Where C2's share of a ReAct or Sub-Agent run goes: the bound, the branches, the fills.

    python scripts/musique_breakdown.py FLOOR_DIR C2_DIR [--fanout 2]

Both directories are ``dynbranch replay --out`` runs of one workload on one schedule (the
floor and a C2 arm). Prints, from their stage logs:

* the mean latency of both and the reduction;
* the Eq. 2 bound of the floor two ways: ``dynbranch stages``' (the first ``depth`` stages
  after the branch, summed) and the *span* bound (per branch, min(window, the span from the
  first to the last reusable stage carrying its coordinate after it resolved): what perfect
  fills, running side by side as a multi-valued branch's sub-agents do, could hide);
* per branch kind (ReAct hop 0, later hops; Sub-Agent's plan, per sub-topic), how the C2
  run's branches fared: no fill issued, fills that missed every chosen candidate, a fill of
  a chosen candidate whose stages were served (shadow or join) or not;
* for ReAct, re-ranking each branch's evidence (the requests re-traced from the run's seed)
  with the shipped entity ranker: whether the chosen entity was in its top ``fanout`` at
  all, so a miss is told apart from a refused candidate.
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

import pandas as pd

from dynbranch.stagelog import RunLogFrames, overlap_bound

SERVED = ("shadow", "join")


def span_bound(run: RunLogFrames) -> float:
    """Σ min(window, span of the reusable canonical stages of the branch after it resolved)
    over the run, divided by Σ latency (the module docstring)."""
    s = run.stages
    canon = s[(s["served_from"] == "exec") & ~s["speculative"] & s["reusable"]]
    groups = {k: g for k, g in canon.groupby(["request_id", "coordinate"])}
    total = 0.0
    for b in run.branches.dropna(subset=["resolved_at"]).itertuples():
        g = groups.get((b.request_id, b.coordinate))
        if g is None:
            continue
        after = g[g["start"] >= b.resolved_at - 1e-9]
        if len(after):
            span = float(after["end"].max() - after["start"].min())
            total += min(float(b.resolved_at - b.opened_at), span)
    done = run.requests[run.requests["status"] == "completed"]
    return total / float(done["latency"].sum())


def branch_kind(coordinate: str) -> str:
    """``react/think/0`` → ``hop 0``; later hops → ``hops 1+``; else the coordinate stage."""
    workflow, stage, step = coordinate.rsplit("/", 2)
    if workflow == "react":
        return "hop 0" if step == "0" else "hops 1+"
    return f"{workflow}/{stage}"


def fates(run: RunLogFrames) -> pd.DataFrame:
    """One row per (branch, chosen candidate) of a C2 run: was it filled, and was a stage of
    that candidate's fill served to the canonical path (its reuse name, shadow or join)?"""
    s = run.stages
    spec = s[s["speculative"]]
    filled = spec.groupby(["request_id", "coordinate"])["fill"].agg(set).to_dict()
    names = spec.groupby(["request_id", "coordinate", "fill"])["reuse_name"].agg(set).to_dict()
    canon = s[~s["speculative"] & s["served_from"].isin(SERVED)]
    served = canon.groupby("request_id")["reuse_name"].agg(set).to_dict()
    rows = []
    for b in run.branches.itertuples():
        fills = filled.get((b.request_id, b.coordinate), set())
        for chosen in b.chosen:
            if chosen.startswith("<"):  # <finish>, <none>, <invalid>: nothing to fill
                continue
            if not fills:
                fate = "no fill issued"
            elif chosen not in fills:
                fate = "fills missed it"
            elif names.get((b.request_id, b.coordinate, chosen), set()) & served.get(
                b.request_id, set()
            ):
                fate = "filled, served"
            else:
                fate = "filled, not served"
            rows.append(
                {
                    "request_id": b.request_id,
                    "coordinate": b.coordinate,
                    "kind": branch_kind(b.coordinate),
                    "chosen": chosen,
                    "fate": fate,
                }
            )
    return pd.DataFrame(rows)


def react_ranker(run_dir: Path, fanout: int) -> Counter:
    """For a ReAct run: per branch kind, whether the chosen entity is in the entity ranker's
    top ``fanout`` over the branch's evidence (requests re-traced from the run's settings)."""
    from dynbranch.datasets import resolve_data_dir
    from dynbranch.predictors.entity import rank_entities
    from dynbranch.workload import DataConfig
    from workloads.analysis.trace import trace_all
    from workloads.react import ReActWorkload

    cfg = json.loads((run_dir / "summary.json").read_text())
    data = DataConfig(resolve_data_dir(cfg.get("data_dir")), Path("/nonexistent-cache"))
    workload = ReActWorkload(tool_time="modelled", decode_lengths="recorded")
    requests = workload.requests(data, cfg["requests"], cfg["seed"], cfg["split"])
    out: Counter = Counter()
    for trace in trace_all(requests):
        for point, (chosen,) in trace.branches:
            if chosen.startswith("<"):
                continue
            kind = branch_kind(str(point.coordinate))
            ranked = rank_entities(point.evidence, fanout)
            out[(kind, "in ranker top-k" if chosen in ranked else "not in top-k")] += 1
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("floor_dir", type=Path)
    ap.add_argument("c2_dir", type=Path)
    ap.add_argument("--fanout", type=int, default=2)
    args = ap.parse_args()
    floor, c2 = RunLogFrames.read(args.floor_dir), RunLogFrames.read(args.c2_dir)
    sf, sc = (json.loads((d / "summary.json").read_text()) for d in (args.floor_dir, args.c2_dir))
    depth = int(sf.get("depth") or 2)
    print(
        f"workload {sf['workload']}: floor {sf['mean_latency_s']:.3f} s, "
        f"{sc['arm']} {sc['mean_latency_s']:.3f} s, "
        f"reduction {1 - sc['mean_latency_s'] / sf['mean_latency_s']:.1%}"
    )
    print(
        f"Eq. 2 bound (floor): stages' first-{depth}-stages {overlap_bound(floor, depth).share:.1%}, "
        f"span {span_bound(floor):.1%}"
    )
    print(
        f"fills issued {sc['fills_issued']}, consumed {sc['fills_consumed']}, "
        f"discarded {sc['fills_discarded']}, unsafe splices {sc['unsafe_splices']}"
    )
    table = fates(c2)
    if len(table):
        print(table.groupby(["kind", "fate"]).size().unstack(fill_value=0).to_string())
    if sf["workload"] == "react":
        counts = react_ranker(args.c2_dir, args.fanout)
        for (kind, verdict), n in sorted(counts.items()):
            print(f"  ranker, {kind}: {verdict}: {n}")


if __name__ == "__main__":
    main()
