"""Depth — ReAct with 1, 2 and 3 run-ahead cycles (the paper's §5 "Depth").

Arm ``c2`` (early fill alone, as the paper's depth study speculates along the hop chain)
with fills that run one, two or three cycles ahead (:mod:`experiments.runahead`: a deeper
cycle follows the fill's own next ``think``), against the floor and the oracle of the same
arrival schedule, at low load (ρ = 0.1, :mod:`experiments.rates`: the hop chain, not
contention, is what this measures). Reported per depth: median session wall time
(request latency) against the floor, the arrivals served from fills (requests with at least
one canonical stage served from a fill), and results consumed per cycle.

Paper: one cycle lowers median session wall time by 11.8 % and serves 60 of 96 arrivals;
two or three cycles reach the further hops but consume nothing from them, and change latency
by at most 0.7 %, within the 2–5 % run-to-run spread.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.common import Cell, Experiment, run_cells
from experiments.facts import frames, with_facts
from experiments.pairing import add_relative
from experiments.plots import pyplot, save
from experiments.rates import LOADS, canonical_llm_s, rate_for
from experiments.report import Line, as_change, facts_why, first, mean_rows, page, rows_table
from experiments.report import spread_of as sof
from experiments.runahead import STAGES_PER_CYCLE, consumed_by_cycle, run_ahead
from experiments.stats import pct, pct_spread
from experiments.streams import shaped

NAME = "depth"
WORKLOAD = "react"
CYCLES = (1, 2, 3)
WORKERS = 4
PAIR = ("workload", "rate", "seed", "requests")
PAPER = {
    "median_change_one_cycle": -0.118,
    "arrivals_served_from_fills": [60, 96],
    "deeper_cycles_within": 0.007,
    "run_to_run_spread": [0.02, 0.05],
    "consumed_from_deeper_cycles": 0,
}
COLUMNS = (
    "variant",
    "seeds",
    "p50_latency_s",
    "median_reduction_vs_floor",
    "median_reduction_vs_floor_sd",
    "reduction_vs_floor",
    "oracle_reduction",
    "captured",
    "f_requests_served_from_fills",
    "requests",
    "consumed_cycle_1",
    "consumed_cycle_2",
    "consumed_cycle_3",
    "fills_issued",
    "fills_consumed",
)


def settings(quick: bool) -> tuple[tuple[int, ...], int]:
    """(seeds, requests per cell): the paper's 96 arrivals, three seeds for its spread."""
    return ((0,), 48) if quick else ((0, 1, 2), 96)


def cells(quick: bool, rate: float) -> list[Cell]:
    """Per seed: the floor, the oracle (one cycle, the workload's own fill) and ``c2`` at
    each depth (the fill depth allows every stage of its cycles)."""
    seeds, n = settings(quick)
    base = {"workers": WORKERS, "tool_time": "modelled"}
    out = []
    for s in seeds:
        out += [
            Cell(WORKLOAD, "floor", "floor", rate, n, s, base),
            Cell(WORKLOAD, "oracle", "oracle", rate, n, s, base),
        ]
        out += [
            Cell(WORKLOAD, "c2", f"cycles={c}", rate, n, s, {**base, "depth": STAGES_PER_CYCLE * c})
            for c in CYCLES
        ]
    return out


def _cycles(cell: Cell) -> int | None:
    return int(cell.variant.split("=")[1]) if cell.variant.startswith("cycles=") else None


def customize(cell: Cell, prepared: Any) -> Any:
    """Wrap the ReAct requests of a depth cell so their fills run its cycles."""
    c = _cycles(cell)
    return prepared if c is None else shaped(prepared, run_ahead(c), cell.variant)


def _consumed(cell: Cell, result: Any) -> dict[str, Any]:
    c = _cycles(cell)
    counts = consumed_by_cycle(frames(result).stages, max(CYCLES))
    row: dict[str, Any] = {"cycles": c}
    row.update({f"consumed_cycle_{k + 1}": v for k, v in enumerate(counts)})
    return row


def lines(table: list[dict[str, Any]], floor: dict[str, Any] | None, n: int) -> list[Line]:
    """Depth by depth against the paper."""
    one = first(table, variant="cycles=1")
    ours = as_change(sof(one, "median_reduction_vs_floor"))
    served = one.get("f_requests_served_from_fills") if one else None
    out = [
        Line(
            "1 cycle: median session wall time vs floor",
            pct_spread(ours),
            "−11.8 %",
            facts_why(floor, one),
        ),
        Line(
            "1 cycle: arrivals served from fills",
            f"{served:.0f} of {n}" if served else "0",
            f"60 of 96 ({60 / 96:.0%})",
            f"{served / n:.0%} of ours" if served else "no request served from a fill",
        ),
    ]
    for c in CYCLES[1:]:
        t = first(table, variant=f"cycles={c}")
        delta = (t["p50_latency_s"] / one["p50_latency_s"] - 1) if t and one else None
        deeper = [t.get(f"consumed_cycle_{k}", 0) for k in range(2, c + 1)] if t else []
        out.append(
            Line(
                f"{c} cycles: median vs 1 cycle",
                pct(delta) if delta is not None else "—",
                "within ±0.7 % (spread 2–5 %)",
                f"results consumed from cycles 2…{c}: {sum(deeper):.0f} "
                f"(paper: none); per cycle: "
                + ", ".join(f"{t.get(f'consumed_cycle_{k}', 0):.0f}" for k in range(1, c + 1)),
            )
        )
    return out


def plot(table: list[dict[str, Any]], path: Path) -> None:
    """Median change vs floor per depth, and results consumed per cycle."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    ts = [first(table, variant=f"cycles={c}") for c in CYCLES]
    s = [sof(t, "median_reduction_vs_floor") for t in ts]
    a.bar(
        [c - 0.2 for c in CYCLES],
        [-100 * (x.mean or 0) for x in s],
        0.4,
        yerr=[100 * x.sd for x in s] if all(x.sd for x in s) else None,
        capsize=3,
        label="ours (ReAct)",
    )
    a.bar([0.8 + 0.4], [-11.8], 0.4, color="0.6", label="paper, 1 cycle")
    a.axhline(0, color="black", lw=0.5)
    a.set(
        xlabel="run-ahead cycles",
        ylabel="median wall time change vs floor (%)",
        title="(a) median session wall time",
        xticks=list(CYCLES),
    )
    a.legend(fontsize=8)
    width = 0.25
    for k in range(1, max(CYCLES) + 1):
        b.bar(
            [c + (k - 2) * width for c in CYCLES],
            [t.get(f"consumed_cycle_{k}", 0) if t else 0 for t in ts],
            width,
            label=f"from cycle {k}",
        )
    b.set(
        xlabel="run-ahead cycles",
        ylabel="canonical stages served from fills",
        title="(b) results consumed per cycle",
        xticks=list(CYCLES),
    )
    b.legend(fontsize=8)
    save(fig, path)


def run(quick: bool, out: Path) -> Experiment:
    """The depth experiment on ReAct."""
    base = {"workers": WORKERS, "tool_time": "modelled"}
    rate = rate_for(LOADS["low"], WORKERS, canonical_llm_s(WORKLOAD, base, out / "pilot"))
    rows = run_cells(cells(quick, rate), out, extra=with_facts(_consumed), customize=customize)
    from experiments.pairing import pair_rows

    pair_rows(rows, PAIR)
    add_relative(rows, "p50_latency_s", "median_reduction_vs_floor", PAIR)
    table = mean_rows(
        [r for r in rows if r["arm"] == "c2"], ("variant",), ("median_reduction_vs_floor",)
    )
    seeds, n = settings(quick)
    floor = next((r for r in rows if r["arm"] == "floor"), None)
    setup = (
        f"ReAct, {n} requests per cell ({len(seeds)} seed(s)), four workers, low load "
        f"λ = {rate:g} req/s (ρ = {LOADS['low']:g}); arm `c2` with 1–3 run-ahead "
        "cycles (a deeper cycle follows the fill's own next think: the stages the "
        "canonical path renders if every decision was the predicted one), floor and "
        "oracle (one cycle) on the same schedule. Results consumed per cycle count "
        "canonical stages served from a fill's stage of that cycle (cycle k: the k-th "
        "retrieve ahead, its read, and the think after it)."
    )
    report = page(
        "Depth — run-ahead cycles (ReAct)",
        quick,
        setup,
        lines(table, floor, n),
        [("Every depth (mean over seeds)", rows_table(table, COLUMNS))],
        seeds=len(seeds),
    )
    paper = {**PAPER, "ours_rate": rate}
    return Experiment(NAME, rows, paper, report, {"depth.png": lambda p: plot(table, p)})
