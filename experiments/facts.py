"""Measured facts of one replay, the material of a report's "difference and why" column.

:func:`run_facts` reads a finished replay's stage log (in memory, the same rows
``stages.parquet`` holds) and returns what explains its latency: how long its LLM stages
decode, how much canonical LLM time a request carries (the load basis of Fig. 8's rates),
the branch windows, the paper's Eq. 2 bound (on a floor run: the most early fill could
hide, :func:`dynbranch.stagelog.overlap_bound`), how many fills the run consumed and how
many requests were served from them. Every experiment's rows carry these columns
(prefixed ``f_``), so a report quotes a measurement, not a guess.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from dynbranch.results import BRANCH_COLUMNS, requests_frame, stages_frame
from dynbranch.stagelog import RunLogFrames, overlap_bound
from workloads import unfillable_stages

Extra = Callable[[Any, Any], Mapping[str, Any]]


def frames(result: Any) -> RunLogFrames:
    """The run's stage, branch and request tables from a :class:`ReplayResult`."""
    log = result.orchestrator.log
    stages = stages_frame(log.stages)
    if stages.empty:
        stages = pd.DataFrame(
            columns=[
                "request_id",
                "stage",
                "kind",
                "served_from",
                "speculative",
                "error",
                "duration",
                "start",
                "coordinate",
                "reusable",
                "output_tokens",
                "prompt_tokens",
            ]
        )
    branches = pd.DataFrame([b.row() for b in log.branches], columns=list(BRANCH_COLUMNS))
    return RunLogFrames(stages, branches, requests_frame(result.requests))


def run_facts(cell: Any, result: Any) -> dict[str, Any]:
    """The ``f_*`` facts of one replay (see the module docstring)."""
    run = frames(result)
    s, summary = run.stages, result.summary
    done = max(1, int(summary.get("completed") or 0))
    canon = s[(s["served_from"] == "exec") & ~s["speculative"].astype(bool)]
    llm = canon[canon["kind"] == "llm"]
    served = s[s["served_from"].isin(["shadow", "join"]) & ~s["speculative"].astype(bool)]
    b = run.branches.dropna(subset=["resolved_at"])
    issued = summary.get("fills_issued") or 0
    facts: dict[str, Any] = {
        "f_llm_calls_per_request": len(llm) / done,
        "f_llm_output_tokens": _mean(llm["output_tokens"]),
        "f_llm_prompt_tokens": _mean(llm["prompt_tokens"]),
        "f_llm_stage_s": _mean(llm["duration"]),
        "f_llm_s_per_request": float(llm["duration"].sum()) / done,
        "f_tool_s_per_request": float(canon[canon["kind"] == "tool"]["duration"].sum()) / done,
        "f_branches_per_request": len(b) / done,
        "f_branch_window_s": _mean(b["resolved_at"] - b["opened_at"]) if len(b) else None,
        "f_candidates_per_branch": _mean(b["candidates"].map(len)) if len(b) else None,
        "f_chosen_per_branch": _mean(b["chosen"].map(len)) if len(b) else None,
        "f_served_from_fills": int(len(served)),
        "f_requests_served_from_fills": int(served["request_id"].nunique()),
        "f_fill_consumption": (summary.get("fills_consumed") or 0) / issued if issued else None,
        "f_discarded_share": (summary.get("fills_discarded") or 0) / issued if issued else None,
        "f_spec_gpu_s_per_request": (summary.get("spec_engine_s") or 0.0) / done,
    }
    spec = summary.get("speculation") or {}
    if spec.get("branches"):
        opened = spec.get("generated", 0)
        facts["f_openings_per_request"] = opened / done
        facts["f_ranked_per_opening"] = spec.get("candidates", 0) / opened if opened else 0.0
    facts.update(_speculative_split(s, done))
    if summary.get("arm") == "floor" and len(s):
        bound = overlap_bound(run, int(summary.get("depth") or 2),
                              unfillable_stages(summary.get("workload")))
        facts["f_eq2_bound_s"] = float(bound.per_request["bound_s"].mean())
        facts["f_eq2_share"] = bound.share
    return facts


def _speculative_split(s: pd.DataFrame, done: int) -> dict[str, float]:
    """Engine seconds per request of speculative LLM work that a canonical stage consumed
    (its reuse name served a canonical stage of the same request) and of the rest (wasted)."""
    spec = s[s["speculative"].astype(bool) & (s["kind"] == "llm")]
    if spec.empty:
        return {"f_consumed_gpu_s_per_request": 0.0, "f_discarded_gpu_s_per_request": 0.0}
    served = s[s["served_from"].isin(["shadow", "join"]) & ~s["speculative"].astype(bool)]
    used = set(zip(served["request_id"], served["reuse_name"], strict=True))
    hit = [(r, n) in used for r, n in zip(spec["request_id"], spec["reuse_name"], strict=True)]
    engine = spec["engine_s"].astype(float)
    consumed = float(engine[hit].sum())
    return {
        "f_consumed_gpu_s_per_request": consumed / done,
        "f_discarded_gpu_s_per_request": (float(engine.sum()) - consumed) / done,
    }


def with_facts(extra: Extra | None = None) -> Extra:
    """An ``extra`` callback for :func:`~experiments.common.run_cells` that adds
    :func:`run_facts` to whatever ``extra`` adds."""

    def both(cell: Any, result: Any) -> dict[str, Any]:
        row = run_facts(cell, result)
        if extra is not None:
            row.update(extra(cell, result))
        return row

    return both


def cell_latencies(out: Path, cell: Any) -> list[float]:
    """The completed requests' latencies of one cell's replay (its ``requests.parquet``
    under ``out/replays/``, where :func:`~experiments.common.run_cells` wrote it)."""
    frame = pd.read_parquet(out / "replays" / cell.slug() / "requests.parquet")
    return [float(x) for x in frame.loc[frame["status"] == "completed", "latency"]]


def _mean(series: pd.Series) -> float | None:
    return float(series.mean()) if len(series) else None
