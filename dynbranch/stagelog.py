"""Reading a run's stage log: what each stage decoded and took, and what early fill could hide.

A replay writes ``stages.parquet``, ``branches.parquet`` and ``requests.parquet``
(:mod:`dynbranch.results`). Before a number from a run is trusted, its stage log says what
the run simulated: :func:`stage_durations` gives, per stage, its decode (prompt and output
tokens) and its seconds; :func:`overlap_bound` computes the paper's Eq. 2 bound from a
floor run — at each branch ``k`` of a request, early fill can hide at most
``min(T_gen_k, T_exec_k)``, where ``T_gen_k`` is the branch's resolution window (open →
resolved) and ``T_exec_k`` the canonical execution a fill of the chosen candidate could
have run instead: the reusable stages that carry the branch's coordinate and ran after it
resolved, up to the fill depth. Summed over a request it bounds that request's saving;
summed over the run and divided by the summed latency it is the run's *overlap share*.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd


@dataclass(frozen=True)
class RunLogFrames:
    """The three tables of one run."""

    stages: pd.DataFrame
    branches: pd.DataFrame
    requests: pd.DataFrame

    @classmethod
    def read(cls, run_dir: str | Path) -> RunLogFrames:
        d = Path(run_dir)
        return cls(pd.read_parquet(d / "stages.parquet"), pd.read_parquet(d / "branches.parquet"),
                   pd.read_parquet(d / "requests.parquet"))


def stage_durations(stages: pd.DataFrame) -> pd.DataFrame:
    """Per stage (name and kind): executions, mean prompt / output tokens, mean and p50
    seconds of its canonical executions (speculative and served rows left out)."""
    canon = stages[(stages["served_from"] == "exec") & ~stages["speculative"]
                   & (stages["error"] == "")]
    grouped = canon.groupby(["stage", "kind"], sort=False)
    out = pd.DataFrame({
        "executions": grouped.size(),
        "prompt_tokens": grouped["prompt_tokens"].mean(),
        "output_tokens": grouped["output_tokens"].mean(),
        "mean_s": grouped["duration"].mean(),
        "p50_s": grouped["duration"].median(),
    })
    return out.reset_index()


def branch_windows(branches: pd.DataFrame) -> pd.DataFrame:
    """Per branch coordinate stage (``workflow/stage``): entries and the mean resolution
    window in seconds."""
    b = branches.dropna(subset=["resolved_at"]).copy()
    b["stage"] = b["coordinate"].str.rsplit("/", n=1).str[0]
    b["window_s"] = b["resolved_at"] - b["opened_at"]
    grouped = b.groupby("stage", sort=False)["window_s"]
    return pd.DataFrame({"entries": grouped.size(), "mean_window_s": grouped.mean()}).reset_index()


@dataclass(frozen=True)
class OverlapBound:
    """Eq. 2 over one run: per request its latency and the bound, and the overlap share."""

    per_request: pd.DataFrame  # request_id, latency, bound_s
    share: float  # Σ bound / Σ latency over completed requests


def overlap_bound(run: RunLogFrames, depth: int = 2,
                  unfillable: frozenset[str] = frozenset()) -> OverlapBound:
    """The most perfect prediction could hide in ``run`` (a floor run), with fills of at
    most ``depth`` stages (see the module docstring), a fill ending before the first stage
    named in ``unfillable`` (the workload's
    :attr:`~dynbranch.workload.Workload.unfillable_stages`)."""
    canon = run.stages[(run.stages["served_from"] == "exec") & ~run.stages["speculative"]]
    canon = canon[canon["reusable"]] if "reusable" in canon else canon
    by_request = {rid: g for rid, g in canon.groupby("request_id")}
    bound: dict[str, float] = {}
    for b in run.branches.dropna(subset=["resolved_at"]).itertuples():
        stages = by_request.get(b.request_id)
        if stages is None:
            continue
        after = stages[(stages["coordinate"] == b.coordinate)
                       & (stages["start"] >= b.resolved_at - 1e-9)].sort_values("start")
        after = after.head(depth)
        if unfillable:
            blocked = after["stage"].isin(unfillable).to_numpy()
            after = after.iloc[:int(blocked.argmax())] if blocked.any() else after
        t_exec = float(after["duration"].sum())
        t_gen = float(b.resolved_at - b.opened_at)
        bound[b.request_id] = bound.get(b.request_id, 0.0) + min(t_gen, t_exec)
    done = run.requests[run.requests["status"] == "completed"]
    per = pd.DataFrame({"request_id": done["request_id"], "latency": done["latency"],
                        "bound_s": [bound.get(r, 0.0) for r in done["request_id"]]})
    total = float(per["latency"].sum())
    return OverlapBound(per, float(per["bound_s"].sum()) / total if total > 0 else 0.0)


def report(run_dir: str | Path, depth: int = 2,
           unfillable: frozenset[str] = frozenset()) -> str:
    """The stage table, the branch windows and the overlap bound of one run, as text
    (``unfillable``: see :func:`overlap_bound`)."""
    run = RunLogFrames.read(run_dir)
    bound = overlap_bound(run, depth, unfillable)
    lines = [f"run: {run_dir}", "", "stages (canonical executions):",
             stage_durations(run.stages).to_string(index=False, float_format="%.3f"), "",
             "branch windows:",
             branch_windows(run.branches).to_string(index=False, float_format="%.3f"), "",
             f"Eq. 2 overlap share (fill depth {depth}): {bound.share:.1%} "
             f"(mean bound {bound.per_request['bound_s'].mean():.3f} s per request, "
             f"mean latency {bound.per_request['latency'].mean():.3f} s)"]
    return "\n".join(lines)
