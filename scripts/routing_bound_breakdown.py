"""Where a C2 run's saving stops short of the Eq. 2 bound, branch by branch (stage logs only).

    python scripts/routing_bound_breakdown.py FLOOR_RUN C2_RUN [--depth 2]

For every branch of the floor run its Eq. 2 bound min(T_gen, T_exec) (as ``dynbranch
stages`` computes it) is attributed to what the paired C2 run did at the same branch
(same request, same coordinate): ``end of turn`` (the router chose no function: nothing to
fill), ``no fill`` (no fill ran at the branch: the gate stayed closed or admitted none),
``mispredicted`` (fills ran, none for the chosen function: all discarded), ``joined`` (the
chosen function's fill was still running when the canonical handler asked: only part of
its execution was hidden) and ``served`` (its fill had finished: served from the shadow).
Prints, per outcome, branches, summed bound (s) and its share of the total bound.
"""

from __future__ import annotations

import argparse

import pandas as pd

from dynbranch.stagelog import RunLogFrames


def bound_per_branch(run: RunLogFrames, depth: int) -> pd.DataFrame:
    """(request_id, coordinate) → the branch's Eq. 2 bound in the floor run."""
    canon = run.stages[(run.stages["served_from"] == "exec") & ~run.stages["speculative"]]
    canon = canon[canon["reusable"]]
    rows = []
    for b in run.branches.dropna(subset=["resolved_at"]).itertuples():
        s = canon[
            (canon["request_id"] == b.request_id)
            & (canon["coordinate"] == b.coordinate)
            & (canon["start"] >= b.resolved_at - 1e-9)
        ].sort_values("start")
        t_exec = float(s["duration"].head(depth).sum())
        rows.append(
            {
                "request_id": b.request_id,
                "coordinate": b.coordinate,
                "bound_s": min(float(b.resolved_at - b.opened_at), t_exec),
                "end": list(b.chosen) == ["<end_of_turn>"],
            }
        )
    return pd.DataFrame(rows)


def outcome_per_branch(run: RunLogFrames) -> dict[tuple[str, str], str]:
    """What the C2 run did at each branch (see the module docstring)."""
    st = run.stages
    out = {}
    for (rid, coord), g in st.groupby(["request_id", "coordinate"]):
        handlers = g[(g["stage"] == "handler") & ~g["speculative"]]
        served = set(handlers["served_from"])
        if "shadow" in served:
            out[rid, coord] = "served"
        elif "join" in served:
            out[rid, coord] = "joined"
        elif g["speculative"].any():
            out[rid, coord] = "mispredicted"
        else:
            out[rid, coord] = "no fill"
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("floor")
    ap.add_argument("c2")
    ap.add_argument("--depth", type=int, default=2)
    args = ap.parse_args()
    bounds = bound_per_branch(RunLogFrames.read(args.floor), args.depth)
    did = outcome_per_branch(RunLogFrames.read(args.c2))
    bounds["outcome"] = [
        "end of turn" if e else did.get((r, c), "no fill")
        for r, c, e in zip(bounds["request_id"], bounds["coordinate"], bounds["end"], strict=True)
    ]
    total = bounds["bound_s"].sum()
    table = bounds.groupby("outcome")["bound_s"].agg(["count", "sum"])
    table["share"] = table["sum"] / total
    print(table.to_string(float_format="%.3f"))
    print(f"total bound {total:.1f} s over {len(bounds)} branches")


if __name__ == "__main__":
    main()
