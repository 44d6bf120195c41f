"""Fig. 9b — replicas: 1 … 4 workers with fanout K = W − 1 at fixed per-GPU load (Sub-Agent,
:mod:`width`).

For each W the floor, ``full`` at K = W − 1 and the oracle (fanout 3) replay one schedule at
λ = ρ · W / T_llm (ρ = 1 canonical LLM call in flight per engine), so each engine carries
the same load. Reported per W: mean latency, what each added worker saves, discarded
GPU-seconds per request, consumed work, candidates per branch and accuracy vs the floor.

Paper: mean latency 22.3 → 15.2 s from one to four workers; the fourth saves only 0.25 s
while adding 1.9 GPU-s of discarded work per request; consumed work nearly flat once the
width reaches the workload's 2.67 candidates per branch; no accuracy regression.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.common import Cell, Experiment, run_cells, sweep_settings
from experiments.facts import with_facts
from experiments.pairing import add_relative
from experiments.plots import line_with_sd, pyplot, save
from experiments.rates import canonical_llm_s, rate_for
from experiments.report import Line, facts_why, first, mean_rows, over_seeds, page, rows_table
from experiments.report import spread_of as sof
from experiments.stats import fmt
from experiments.width import ORACLE_FANOUT, RHO, WHY, WORKLOAD, plan_branch_facts, replay

NAME = "fig9b"
WORKERS = (1, 2, 3, 4)
PAPER = {
    "mean_latency_s": {1: 22.3, 4: 15.2},
    "fourth_worker_saves_s": 0.25,
    "fourth_worker_discarded_gpu_s": 1.9,
    "candidates_per_branch": 2.67,
}
COLUMNS = (
    "variant",
    "rate",
    "seeds",
    "mean_latency_s",
    "mean_latency_s_sd",
    "reduction_vs_floor",
    "oracle_reduction",
    "captured",
    "f_consumed_gpu_s_per_request",
    "f_discarded_gpu_s_per_request",
    "f_chosen_per_plan_branch",
    "accuracy_vs_floor",
    "fills_issued",
    "fills_consumed",
)


def settings(quick: bool) -> tuple[tuple[int, ...], int]:
    """(seeds, requests per cell)."""
    return sweep_settings(quick)


def cells(quick: bool, llm_s: float) -> list[Cell]:
    """Per W and seed: floor, ``full`` at K = W − 1, oracle; the rate grows with W."""
    seeds, n = settings(quick)
    out = []
    for w in WORKERS:
        rate = rate_for(RHO, w, llm_s)
        for s in seeds:
            out += [
                Cell(WORKLOAD, "floor", f"W={w}", rate, n, s, replay(w, 0)),
                Cell(WORKLOAD, "full", f"W={w}", rate, n, s, replay(w, w - 1)),
                Cell(WORKLOAD, "oracle", f"W={w}", rate, n, s, replay(w, ORACLE_FANOUT)),
            ]
    return out


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``full`` per W, mean over seeds, with accuracy relative to the floor."""
    add_relative(rows, "accuracy", "accuracy_loss_vs_floor")
    for r in rows:
        loss = r.get("accuracy_loss_vs_floor")
        r["accuracy_vs_floor"] = None if loss is None else 1.0 - loss
    return mean_rows([r for r in rows if r["arm"] == "full"], ("variant",), ("mean_latency_s",))


def lines(table: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[Line]:
    """W by W, then the fourth worker's marginal saving and cost."""
    out = []
    for w in WORKERS:
        t = first(table, variant=f"W={w}")
        floor = over_seeds(rows, arm="floor", variant=f"W={w}")
        ours, paper = sof(t, "mean_latency_s"), PAPER["mean_latency_s"].get(w)
        out.append(
            Line(
                f"W={w} (K={w - 1}): mean latency",
                fmt(ours, "{:.2f} s".format),
                f"{paper} s" if paper else "—",
                facts_why(floor, t),
            )
        )
    t3, t4 = first(table, variant="W=3"), first(table, variant="W=4")
    saves = t3["mean_latency_s"] - t4["mean_latency_s"]
    added = t4["f_discarded_gpu_s_per_request"] - t3["f_discarded_gpu_s_per_request"]
    out += [
        Line(
            "fourth worker: mean latency saved",
            f"{saves:.2f} s",
            f"{PAPER['fourth_worker_saves_s']} s",
            "W=3 → W=4 at the same per-GPU load",
        ),
        Line(
            "fourth worker: discarded GPU-s per request added",
            f"{added:+.2f}",
            f"+{PAPER['fourth_worker_discarded_gpu_s']}",
            f"discarded work at W=4: {t4['f_discarded_gpu_s_per_request']:.2f} GPU-s/request",
        ),
        Line(
            "candidates per plan branch (chosen sub-topics)",
            f"{t4['f_chosen_per_plan_branch']:.2f}" if t4.get("f_chosen_per_plan_branch") else "—",
            f"{PAPER['candidates_per_branch']}",
            "MuSiQue's 2–4-hop decompositions",
        ),
        Line(
            "accuracy vs floor (every W)",
            ", ".join(
                f"{t['accuracy_vs_floor']:.3f}"
                for t in table
                if t.get("accuracy_vs_floor") is not None
            ),
            "no regression",
            "replayed decisions: fills cannot change answers",
        ),
    ]
    return out


def plot(table: list[dict[str, Any]], path: Path) -> None:
    """Mean latency (±1 s.d.) and consumed / discarded GPU-s per request against W."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ts = [first(table, variant=f"W={w}") for w in WORKERS]
    line_with_sd(a, WORKERS, [sof(t, "mean_latency_s") for t in ts], "ours (Sub-Agent)")
    a.plot([1, 4], [22.3, 15.2], "k*", ms=12, label="paper (W=1, W=4)")
    a.set(
        xlabel="workers W (fanout K = W − 1)",
        ylabel="mean latency (s)",
        title="(a) latency vs replicas, fixed per-GPU load",
    )
    a.legend(fontsize=8)
    b.plot(WORKERS, [t["f_consumed_gpu_s_per_request"] for t in ts], "o-", label="consumed")
    b.plot(WORKERS, [t["f_discarded_gpu_s_per_request"] for t in ts], "s-", label="discarded")
    b.set(
        xlabel="workers W",
        ylabel="speculative GPU-s per request",
        title="(b) speculative work vs replicas",
    )
    b.legend(fontsize=8)
    save(fig, path)


def run(quick: bool, out: Path) -> Experiment:
    """Fig. 9b on Sub-Agent."""
    llm_s = canonical_llm_s(WORKLOAD, replay(4, 0), out / "pilot")
    rows = run_cells(cells(quick, llm_s), out, extra=with_facts(plan_branch_facts))
    table = summarize(rows)
    seeds, n = settings(quick)
    setup = (
        f"Sub-Agent ({n} requests per cell, {len(seeds)} seed(s)); W workers with "
        f"fanout K = W − 1 at λ = ρ·W/T_llm (ρ = {RHO:g}, T_llm = {llm_s:.2f} s per "
        f"request from the pilot); floor and oracle (fanout {ORACLE_FANOUT}) paired per W. " + WHY
    )
    report = page(
        "Fig. 9b — replicas (W workers, K = W − 1)",
        quick,
        setup,
        lines(table, rows),
        [("Every W (mean over seeds)", rows_table(table, COLUMNS))],
        seeds=len(seeds),
    )
    return Experiment(
        NAME,
        rows,
        {**PAPER, "ours_pilot_llm_s": llm_s},
        report,
        {"fig9b.png": lambda p: plot(table, p)},
    )
