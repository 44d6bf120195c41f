"""Fig. 8's summary, comparison lines, report and plots (the cells are in :mod:`fig8`).

Latency *changes* are printed as the paper prints them: negative is faster (a change of
−20 % is a reduction of 20 %).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import WORKLOAD_NAMES, WORKLOADS
from experiments.plots import pyplot, save
from experiments.report import (
    Line,
    as_change,
    facts_why,
    first,
    gap_pct,
    mean_rows,
    page,
    paper_pct,
    rows_table,
    spread_of,
)
from experiments.stats import Spread, pct, pct_spread

SD_OF = (
    "reduction_vs_floor",
    "p99_reduction_vs_floor",
    "c2_over_c1",
    "vs_best_baseline",
    "mean_latency_s",
    "p99_latency_s",
    "captured",
)
TABLE_COLUMNS = (
    "deployment",
    "load",
    "rate",
    "workload",
    "arm",
    "seeds",
    "mean_latency_s",
    "p99_latency_s",
    "reduction_vs_floor",
    "p99_reduction_vs_floor",
    "oracle_reduction",
    "captured",
    "accuracy_vs_floor",
    "fills_issued",
    "fills_consumed",
    "f_discarded_share",
    "failed",
    "unsafe_splices",
)


def summarize(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Mean (± s.d.) over seeds per (deployment, load, workload, arm)."""
    return mean_rows(rows, ("deployment", "load", "workload", "arm"), SD_OF)


def change(row: Mapping[str, Any] | None, key: str) -> Spread:
    """A reduction column as a latency change (negated)."""
    return as_change(spread_of(row, key))


def _p99_lines(table: list[dict[str, Any]], paper: Mapping[str, Any]) -> list[Line]:
    out = []
    for load, key in (("at-load", "p99_change_at_load"), ("low", "p99_change_low")):
        for wl in measured(table):
            full = first(table, deployment="32b-h200", load=load, workload=wl, arm="full")
            floor = first(table, deployment="32b-h200", load=load, workload=wl, arm="floor")
            target = paper["hci_p99_change"] if wl == "hci" else paper[key]
            ours = change(full, "p99_reduction_vs_floor")
            out.append(
                Line(
                    f"32B/H200 {load}, {WORKLOAD_NAMES[wl]}: p99, full vs floor",
                    pct_spread(ours),
                    "= floor" if wl == "hci" else paper_pct(target),
                    f"{gap_pct(ours, target)}; {facts_why(floor, full)}",
                )
            )
    return out


def measured(table: Sequence[Mapping[str, Any]]) -> list[str]:
    """The workloads the table has rows of, in the figure's order (``python -m
    experiments.fig8 --workload`` runs some of them)."""
    have = {t["workload"] for t in table}
    return [w for w in WORKLOADS if w in have]


def _c2_lines(table: list[dict[str, Any]], paper: Mapping[str, Any]) -> list[Line]:
    out = []
    for load, key in (("at-load", "c2_over_c1_at_load"), ("low", "c2_over_c1_low")):
        for wl, target in paper[key].items():
            if wl not in measured(table):
                continue
            full = first(table, deployment="32b-h200", load=load, workload=wl, arm="full")
            c1 = first(table, deployment="32b-h200", load=load, workload=wl, arm="c1")
            ours = spread_of(full, "c2_over_c1")
            why = facts_why(None, full)
            if c1 and c1.get("reuse_hits") is not None:
                why += f"; c1 served {c1['reuse_hits']:.0f} stages from C1"
            out.append(
                Line(
                    f"32B/H200 {load}, {WORKLOAD_NAMES[wl]}: C2 over C1-only (full vs c1)",
                    pct_spread(ours),
                    pct(target),
                    f"{gap_pct(ours, target)}; {why}",
                )
            )
    for load in ("low", "at-load") if "react" in measured(table) else ():
        full = first(table, deployment="32b-h200", load=load, workload="react", arm="full")
        ours = spread_of(full, "f_discarded_share")
        out.append(
            Line(
                f"32B/H200 {load}, ReAct: share of issued fills discarded",
                f"{100 * ours.mean:.0f} %" if ours.mean is not None else "no fills",
                "53–55 %",
                f"{gap_pct(ours, paper['react_discarded_share'])}; " + facts_why(None, full),
            )
        )
    return out


def _commodity_lines(table: list[dict[str, Any]], paper: Mapping[str, Any]) -> list[Line]:
    out = []
    for load in ("at-load", "low"):
        for wl in measured(table):
            full = first(table, deployment="8b-4090", load=load, workload=wl, arm="full")
            floor = first(table, deployment="8b-4090", load=load, workload=wl, arm="floor")
            cell = f"8B/4090 + WAN {load}, {WORKLOAD_NAMES[wl]}"
            ours = change(full, "reduction_vs_floor")
            out.append(
                Line(
                    f"{cell}: mean, full vs floor",
                    pct_spread(ours),
                    paper_pct(paper["commodity_vs_floor"]),
                    f"{gap_pct(ours, paper['commodity_vs_floor'])}; {facts_why(floor, full)}",
                )
            )
            best = spread_of(full, "vs_best_baseline")
            out.append(
                Line(
                    f"{cell}: mean, full vs strongest baseline "
                    f"({full.get('best_baseline') if full else '?'})",
                    pct_spread(best),
                    paper_pct(paper["commodity_vs_best_baseline"]),
                    gap_pct(best, paper["commodity_vs_best_baseline"]),
                )
            )
            c2 = spread_of(full, "c2_over_c1")
            better = c2.mean is not None and c2.mean < 0
            out.append(
                Line(
                    f"{cell}: C2 over C1-only",
                    pct_spread(c2),
                    "< 0 (every cell)",
                    "C2 better, as in the paper"
                    if better
                    else "C2 not better here; " + facts_why(None, full),
                )
            )
    return out


def lines(table: list[dict[str, Any]], paper: Mapping[str, Any]) -> list[Line]:
    """The comparison, claim by claim."""
    failed = sum(int(t.get("failed") or 0) * int(t.get("seeds", 1)) for t in table)
    done = Line(
        "every arm, every cell: failed requests",
        str(failed),
        "0",
        "as the paper" if failed == 0 else "see the rows' errors",
    )
    return [
        *_p99_lines(table, paper),
        *_c2_lines(table, paper),
        *_commodity_lines(table, paper),
        done,
    ]


def report(
    table: list[dict[str, Any]],
    paper: Mapping[str, Any],
    quick: bool,
    rates: Mapping[tuple[str, str, str], float],
    llm_s: Mapping[tuple[str, str], float],
    seeds: int,
    n: int,
    routing_share: float,
) -> str:
    """Fig. 8's ``report.md``."""
    rate_lines = "\n".join(
        f"- {d} {WORKLOAD_NAMES[w]}: T_llm {llm_s[(d, w)]:.2f} s/request → low "
        f"{rates[(d, w, 'low')]:g} req/s, at load {rates[(d, w, 'at-load')]:g} req/s"
        for (d, w) in llm_s
    )
    setup = (
        f"Four workloads × arms floor, c1, c2, full and the five baselines (plus the oracle "
        f"bound in each pair), {n} requests per cell, virtual clock, four engines. Routing's "
        f"streams repeat an earlier request byte for byte at a share of {routing_share:g} "
        "(Fig. 14's mix; a plain stream from its 3,163 test records repeats none, and the "
        "paper states no mix); the other workloads' streams are drawn plain. "
        "Deployments: `32b-h200` (Qwen3-32B on H200 NVL, one box) and `8b-4090` (Qwen3-8B "
        "on RTX 4090, separate nodes, every engine call across the modelled `vastai-wan` "
        "network: 21.6 ms RTT, 500 Mbit/s). Rates from each pilot's canonical LLM seconds "
        "per request T_llm: low = 0.1 and at load = 2.0 canonical LLM calls in flight per "
        "engine (λ = ρ·4/T_llm; the paper does not state its rates):\n\n" + rate_lines
    )
    body = rows_table(table, TABLE_COLUMNS)
    return page(
        "Fig. 8 — main results (four workloads, two loads, two deployments)",
        quick,
        setup,
        lines(table, paper),
        [("Every cell (mean over seeds)", body)],
        seeds=seeds,
    )


def plot(table: list[dict[str, Any]], path: Path, key: str, what: str) -> None:
    """2 × 2 panels (deployment × load): per workload, every arm's latency change."""
    plt = pyplot()
    arms = [a for a in dict.fromkeys(t["arm"] for t in table) if a not in ("floor", "oracle")]
    arms += ["oracle"] if any(t["arm"] == "oracle" for t in table) else []
    fig, axes = plt.subplots(2, 2, figsize=(15, 8), sharey=False)
    panels = [
        ("32b-h200", "at-load", "(a)"),
        ("32b-h200", "low", "(b)"),
        ("8b-4090", "at-load", "(c)"),
        ("8b-4090", "low", "(d)"),
    ]
    width = 0.8 / max(1, len(arms))
    for ax, (dep, load, tag) in zip(axes.flat, panels, strict=True):
        x = np.arange(len(measured(table)))
        for i, arm in enumerate(arms):
            found = [
                first(table, deployment=dep, load=load, workload=w, arm=arm)
                for w in measured(table)
            ]
            s = [change(f, key) for f in found]
            means = [100 * v.mean if v.mean is not None else np.nan for v in s]
            errs = [100 * v.sd if v.sd is not None else 0.0 for v in s]
            bound = arm == "oracle"  # NOTE: a bound, not a system: drawn unfilled
            ax.bar(
                x + (i - len(arms) / 2 + 0.5) * width,
                means,
                width,
                label="oracle (bound)" if bound else arm,
                yerr=errs if any(v.sd for v in s) else None,
                capsize=2,
                fill=not bound,
                hatch="//" if bound else None,
                edgecolor="black" if bound else None,
            )
        if what == "p99" and dep == "32b-h200":
            band = (-36, -19) if load == "low" else (-33, -11)
            ax.axhspan(
                *band,
                xmax=0.75,
                color="grey",
                alpha=0.15,
                label="paper (Routing, ReAct, Sub-Agent)",
            )
        if what == "mean" and dep == "8b-4090":
            ax.axhspan(-54.6, -29.6, color="grey", alpha=0.15, label="paper full vs floor")
        ax.axhline(0, color="black", lw=0.5)
        ax.set_xticks(x, [WORKLOAD_NAMES[w] for w in measured(table)])
        ax.set_ylabel(f"{what} latency change vs floor (%)")
        ax.set_title(f"{tag} {dep}, {load}", fontsize=9)
    for ax in axes.flat:
        ax.legend(fontsize=6, ncol=4)
    fig.suptitle(f"Fig. 8 — {what} latency relative to the paired floor (negative = faster)")
    save(fig, path)
