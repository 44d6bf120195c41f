"""Table 2 — early fill alone (C1 off) against the shared no-reuse floor, every workload.

Arms ``c2`` (DynBranch's early fill with the load-priced gate, fills promoted within their
own request), ``dsp`` and ``spagent`` (the speculation baselines in their native admission),
each paired with the floor on the same schedule, on two- and four-engine deployments; plus,
on Routing, ``c1`` and ``full`` for the paper's "Routing C2 over C1-only" figure.

Paper (32B/H200): C2 lowers mean latency by 8.5–47.7 % against the floor across the four
workloads on both deployments and beats DSP and SPAgent throughout; on Routing, C2 over
C1-only gains 8.6 %.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import Cell, Experiment, markdown_table, run_cells

WORKLOADS = ("routing", "react", "subagent", "hci")
ARMS = ("floor", "c2", "dsp", "spagent")
PAPER = {"c2_reduction_range": [0.085, 0.477], "routing_c2_over_c1": 0.086}


def cells(quick: bool) -> list[Cell]:
    workers, seeds, n = ((4,), (0,), 300) if quick else ((2, 4), (0, 1), 400)
    out = []
    for w in workers:
        for s in seeds:
            for wl in WORKLOADS:
                replay = {"workers": w, "tool_time": "modelled"}
                for arm in ARMS:
                    out.append(Cell(wl, arm, f"{w}gpu", rate=1.0, requests=n, seed=s,
                                    replay=replay))
                if wl == "routing":
                    out += [Cell(wl, a, f"{w}gpu", rate=1.0, requests=n, seed=s,
                                 replay=replay) for a in ("c1", "full")]
    return out


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["workload"], r["variant"], r["arm"])].append(r)
    table = []
    for (wl, variant, arm), rs in sorted(groups.items()):
        n = sum(r["requests"] for r in rs)
        table.append({
            "workload": wl, "deployment": variant, "arm": arm,
            "mean_latency_s": float(np.mean([r["mean_latency_s"] for r in rs])),
            "reduction": float(np.mean([r["reduction_vs_floor"] for r in rs])),
            "p99_latency_s": float(np.mean([r["p99_latency_s"] for r in rs])),
            "fills_issued": int(sum(r["fills_issued"] for r in rs)),
            "fills_consumed": int(sum(r["fills_consumed"] for r in rs)),
            "fills_discarded": int(sum(r["fills_discarded"] for r in rs)),
            "fills_per_request": sum(r["fills_issued"] for r in rs) / max(1, n),
            "accuracy": float(np.mean([r["accuracy"] or 0.0 for r in rs])),
            "unsafe_splices": int(sum(r["unsafe_splices"] for r in rs)),
        })
    return table


def routing_c2_over_c1(table: list[dict[str, Any]]) -> dict[str, float]:
    out = {}
    for t in table:
        if t["workload"] == "routing" and t["arm"] == "full":
            c1 = next(x for x in table if x["workload"] == "routing"
                      and x["deployment"] == t["deployment"] and x["arm"] == "c1")
            out[t["deployment"]] = 1.0 - t["mean_latency_s"] / c1["mean_latency_s"]
    return out


def plot(table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    deployments = sorted({t["deployment"] for t in table})
    fig, axes = plt.subplots(1, len(deployments), figsize=(6 * len(deployments), 4),
                             squeeze=False)
    for ax, dep in zip(axes[0], deployments, strict=True):
        x = np.arange(len(WORKLOADS))
        for i, arm in enumerate(("c2", "dsp", "spagent")):
            vals = [next((100 * t["reduction"] for t in table if t["workload"] == wl
                          and t["arm"] == arm and t["deployment"] == dep), np.nan)
                    for wl in WORKLOADS]
            ax.bar(x + (i - 1) * 0.27, vals, 0.27, label=arm)
        ax.axhspan(8.5, 47.7, color="grey", alpha=0.15, label="paper C2 range")
        ax.axhline(0, color="k", lw=0.5)
        ax.set_xticks(x, WORKLOADS)
        ax.set_ylabel("mean-latency reduction vs floor (%)")
        ax.set_title(f"early fill alone, {dep}", fontsize=9)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(table: list[dict[str, Any]], quick: bool) -> str:
    cols = ["workload", "deployment", "arm", "mean_latency_s", "reduction", "p99_latency_s",
            "fills_issued", "fills_consumed", "fills_discarded", "accuracy", "unsafe_splices"]
    over = routing_c2_over_c1(table)
    return "\n".join([
        "# Table 2 — early fill alone" + (" (quick)" if quick else ""), "",
        "Paper: C2 −8.5 … −47.7 % vs floor on every workload, beating DSP and SPAgent; "
        "Routing C2 over C1-only −8.6 %.", "",
        markdown_table(table, cols), "",
        "Routing, full over c1 (C2's gain on top of C1): "
        + ", ".join(f"{dep} {v:+.1%}" for dep, v in over.items()), "",
        "Why ours differ: the replayed LLM outputs are the traces' short recorded texts "
        "(BFCL calls, MuSiQue answers, SGD utterances), so the downstream work a fill can "
        "hide is small beside the paper's 32B generations; Sub-Agent's plan branch is open "
        "vocabulary and our recall predictor only proposes sub-topics seen before; HCI's "
        "think time hides everything its predictor covers.",
    ])


def run(quick: bool, out: Path) -> Experiment:
    rows = run_cells(cells(quick), out,
                     extra=lambda c, r: {"deployment": c.variant})
    table = summarize(rows)
    paper = {**PAPER, "ours_routing_c2_over_c1": routing_c2_over_c1(table)}
    return Experiment("table2", rows, paper, report(table, quick),
                      {"table2.png": lambda p: plot(table, p)})
