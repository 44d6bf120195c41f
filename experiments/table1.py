"""Table 1 — reuse alone (C2 off): DynBranch's C1 against InstCache and Helium⁺.

Two variants, each run for arms ``floor, instcache, helium, c1`` on cold-started stacks,
paired by request id (same requests, same arrival schedule, same seed):

* ``partial-overlap`` — Sub-Agent research over MuSiQue with the mix of
  :mod:`workloads.subagent.mix`: predictable popular questions, exact repeats, questions
  sharing research sub-topics (shared sub-DAGs) and fresh negative controls. Reported
  across the mix and per category.
* ``write`` — BFCL multi-turn routing with shared workspaces
  (``shared_state``): requests of the same scenario read and write one file system while
  they interleave. Helium⁺ keeps no read-sets, so after a write it can serve a stale read;
  the independent splice checker counts those; C1 must show none.

The paper (32B/H200): DynBranch −31 % on partial-overlap requests (−32.2 % across the mix),
Helium⁺ −30 %, InstCache −7 %, zero unsafe splices for DynBranch.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import Cell, Experiment, markdown_table, run_cells

ARMS = ("floor", "instcache", "helium", "c1")
PAPER = {"c1": 0.31, "c1_across_mix": 0.322, "helium": 0.30, "instcache": 0.07,
         "unsafe_splices_dynbranch": 0}
CATEGORIES = ("popular", "repeat", "shared", "fresh")


def cells(quick: bool) -> list[Cell]:
    seeds = (0,) if quick else (0, 1, 2)
    n_mix, n_write = (120, 120) if quick else (400, 300)
    out = []
    for seed in seeds:
        for arm in ARMS:
            out.append(Cell("subagent", arm, "partial-overlap", rate=1.0, requests=n_mix,
                            seed=seed, replay={"tool_time": "modelled"},
                            workload_options={"mix": "partial-overlap"}))
            out.append(Cell("routing", arm, "write", rate=1.0, requests=n_write, seed=seed,
                            workload_options={"shared_state": True,
                                              "categories": ("multi_turn_base",)}))
    return out


def _per_category(cell: Cell, result: Any) -> dict[str, Any]:
    by: dict[str, list[float]] = defaultdict(list)
    for r in result.requests:
        if r.status == "completed":
            by[_category(r.request_id)].append(r.latency)
    row = {f"mean_latency_{c}_s": float(np.mean(v)) for c, v in by.items() if c}
    reuse = result.summary.get("reuse", {})
    store = reuse.get("store", {})
    row.update({"invalidated": reuse.get("invalidated", 0),
                "records_held": store.get("records_held", 0),
                "bytes_held": store.get("bytes_held", 0),
                "request_cache_hits": reuse.get("request_hits", reuse.get("hits", 0))})
    return row


def _category(request_id: str) -> str:
    parts = request_id.split("-")
    return parts[2] if len(parts) > 3 and parts[2] in CATEGORIES else ""


def _add_category_reductions(rows: list[dict[str, Any]]) -> None:
    floors = {(r["variant"], r["seed"]): r for r in rows if r["arm"] == "floor"}
    for r in rows:
        floor = floors.get((r["variant"], r["seed"]))
        for c in CATEGORIES:
            key = f"mean_latency_{c}_s"
            if floor and key in r and floor.get(key):
                r[f"reduction_{c}"] = 1.0 - r[key] / floor[key]


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean ± s.d. over seeds per (variant, arm)."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        groups[(r["variant"], r["arm"])].append(r)
    table = []
    for (variant, arm), rs in sorted(groups.items()):
        red = [r["reduction_vs_floor"] for r in rs]
        entry = {"variant": variant, "arm": arm, "seeds": len(rs),
                 "mean_latency_s": float(np.mean([r["mean_latency_s"] for r in rs])),
                 "reduction": float(np.mean(red)), "reduction_sd": float(np.std(red)),
                 "unsafe_splices": int(sum(r["unsafe_splices"] for r in rs)),
                 "accuracy": float(np.mean([r["accuracy"] or 0.0 for r in rs])),
                 "reuse_hits": int(np.mean([r["reuse_hits"] for r in rs]))}
        for c in ("shared",):
            vals = [r[f"reduction_{c}"] for r in rs if f"reduction_{c}" in r]
            if vals:
                entry[f"reduction_{c}"] = float(np.mean(vals))
        table.append(entry)
    return table


def plot(table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    mix = [t for t in table if t["variant"] == "partial-overlap" and t["arm"] != "floor"]
    x = np.arange(len(mix))
    ax1.bar(x - 0.2, [100 * t["reduction"] for t in mix], 0.4,
            yerr=[100 * t["reduction_sd"] for t in mix], label="ours (across the mix)")
    ax1.bar(x + 0.2, [100 * PAPER.get(t["arm"], np.nan) for t in mix], 0.4, label="paper")
    ax1.set_xticks(x, [t["arm"] for t in mix])
    ax1.set_ylabel("mean-latency reduction vs floor (%)")
    ax1.set_title("partial-overlap mix (Sub-Agent)", fontsize=9)
    ax1.legend(fontsize=8)
    write = [t for t in table if t["variant"] == "write"]
    ax2.bar([t["arm"] for t in write], [t["unsafe_splices"] for t in write], color="tab:red")
    ax2.set_ylabel("unsafe splices (all seeds)")
    ax2.set_title("write variant (shared BFCL workspaces)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(table: list[dict[str, Any]], quick: bool) -> str:
    cols = ["variant", "arm", "seeds", "mean_latency_s", "reduction", "reduction_sd",
            "reduction_shared", "unsafe_splices", "reuse_hits", "accuracy"]
    lines = [
        "# Table 1 — reuse alone" + (" (quick)" if quick else ""), "",
        "Paper (32B/H200): DynBranch −31 % on partial-overlap requests (−32.2 % across the "
        "mix), Helium⁺ −30 %, InstCache −7 %; zero unsafe splices for DynBranch.", "",
        markdown_table(table, cols), "",
        "`reduction` is across the whole stream; `reduction_shared` on the shared-sub-DAG "
        "requests only. In the write variant accuracy against BFCL's per-record ground truth "
        "does not apply (requests share workspaces) and is not a result.",
        "",
        "Why ours differ: InstCache's gain is set by the share of predictable ('popular') "
        "questions in our mix (6 %, our choice); C1 and Helium⁺ serve the same records in the "
        "mix (no writes touch the corpus), so their gap is placement — Helium⁺ routes by "
        "prompt prefix, our C1 arm by session; the sim engine and replayed texts are shorter "
        "than the paper's 32B outputs, which shrinks absolute savings.",
    ]
    return "\n".join(lines)


def run(quick: bool, out: Path) -> Experiment:
    rows = run_cells(cells(quick), out, extra=_per_category)
    _add_category_reductions(rows)
    table = summarize(rows)
    return Experiment("table1", rows, PAPER, report(table, quick),
                      {"table1.png": lambda p: plot(table, p)})
