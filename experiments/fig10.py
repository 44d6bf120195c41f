"""Fig. 10 — repetition and model size (Routing, ``full`` against the floor; :mod:`scaling`).

(a) **Repetition**: the exact-replay share of the stream (requests repeating an earlier
one byte for byte, :mod:`experiments.streams`) from 0.22 to 0.77 on Qwen3-32B.
(b) **Model size**: Qwen3 0.6B, 1.7B, 4B, 8B, 14B and 32B on the H200 (profiles derived
from each model's config, ``dynbranch/engines/profiles/``) at share 0.22 and one arrival
rate. Each configuration pairs the floor, ``full`` and the oracle on one schedule.

Paper: raising exact replay from 0.22 to 0.77 raises the mean-latency speedup from 1.8×
to 8.6×; across Qwen3 0.6B–32B the speedup stays at 1.75–2.06× while the saving grows from
1.6 to 8.9 s per request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from experiments.common import Cell, Experiment, run_cells, sweep_settings
from experiments.facts import with_facts
from experiments.plots import line_with_sd, pyplot, save
from experiments.report import (
    Line,
    facts_why,
    first,
    gap_ratio,
    mean_rows,
    over_seeds,
    page,
    rows_table,
)
from experiments.report import spread_of as sof
from experiments.scaling import (
    BASE_PROFILE,
    BASE_SHARE,
    RHO,
    WHY,
    add_speedup,
    base_rate,
    customize,
    replay,
    replay_share,
    trio,
    variant,
)
from experiments.stats import fmt

NAME = "fig10"
SHARES = (0.22, 0.5, 0.77)
SIZES = ("0.6b", "1.7b", "4b", "8b", "14b", "32b")
PAPER = {
    "speedup_by_share": {"0.22": 1.8, "0.77": 8.6},
    "speedup_by_size": [1.75, 2.06],
    "saving_s_by_size": {"0.6b": 1.6, "32b": 8.9},
}
COLUMNS = (
    "panel",
    "variant",
    "seeds",
    "exact_replay_share",
    "mean_latency_s",
    "speedup",
    "speedup_sd",
    "saving_s",
    "reduction_vs_floor",
    "oracle_reduction",
    "captured",
    "accuracy_delta",
    "reuse_hits",
    "fills_issued",
    "fills_consumed",
)


def settings(quick: bool) -> tuple[tuple[int, ...], int]:
    """(seeds, requests per cell); the paper states neither, three seeds as in Fig. 11."""
    return sweep_settings(quick)


def cells(quick: bool, rate: float) -> list[Cell]:
    """Panel (a) per share, panel (b) per size; each a floor / full / oracle trio."""
    seeds, n = settings(quick)
    out = []
    for s in seeds:
        for share in SHARES:
            out += trio(variant(share, panel="a"), rate, n, s, replay(BASE_PROFILE))
        for size in SIZES:
            profile = f"qwen3-{size}@h200"
            out += trio(variant(BASE_SHARE, panel="b", size=size), rate, n, s, replay(profile))
    return out


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``full`` per configuration, mean over seeds."""
    add_speedup(rows)
    for r in rows:
        r["panel"] = r["variant"].split(",")[0].split("=")[1]
    return mean_rows(
        [r for r in rows if r["arm"] == "full"], ("panel", "variant"), ("speedup", "saving_s")
    )


def lines(table: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[Line]:
    """Share by share, size by size."""
    out = []
    for share in SHARES:
        t = first(table, variant=variant(share, panel="a"))
        floor = over_seeds(rows, arm="floor", variant=variant(share, panel="a"))
        paper = PAPER["speedup_by_share"].get(f"{share:g}")
        ours = sof(t, "speedup")
        out.append(
            Line(
                f"(a) share {share:g} (measured {t['exact_replay_share']:.2f}): speedup",
                fmt(ours, "{:.2f}×".format),
                f"{paper}×" if paper else "—",
                f"{gap_ratio(ours.mean, paper)}; C1 served {t['reuse_hits']:.0f} "
                f"stages; {facts_why(floor, t)}",
            )
        )
    for size in SIZES:
        v = variant(BASE_SHARE, panel="b", size=size)
        t, floor = first(table, variant=v), over_seeds(rows, arm="floor", variant=v)
        ours = sof(t, "speedup")
        out.append(
            Line(
                f"(b) Qwen3-{size.upper()}: speedup",
                fmt(ours, "{:.2f}×".format),
                "1.75–2.06×",
                gap_ratio(ours.mean, (1.75, 2.06)),
            )
        )
        paper = PAPER["saving_s_by_size"].get(size)
        saving = sof(t, "saving_s")
        out.append(
            Line(
                f"(b) Qwen3-{size.upper()}: saving per request",
                fmt(saving, "{:.2f} s".format),
                f"{paper} s" if paper else "—",
                f"{gap_ratio(saving.mean, paper)}; {facts_why(floor, None)}",
            )
        )
    return out


def plot(table: list[dict[str, Any]], path: Path) -> None:
    """(a) speedup vs share; (b) speedup and saving vs model size; the paper's points."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    ta = [first(table, variant=variant(s, panel="a")) for s in SHARES]
    line_with_sd(
        a,
        [t["exact_replay_share"] for t in ta],
        [sof(t, "speedup") for t in ta],
        "ours (Routing, 32B)",
    )
    a.plot([0.22, 0.77], [1.8, 8.6], "k*", ms=12, label="paper")
    a.set(
        xlabel="exact-replay share",
        ylabel="mean-latency speedup over the floor (×)",
        title="(a) repetition",
    )
    a.legend(fontsize=8)
    tb = [first(table, variant=variant(BASE_SHARE, panel="b", size=s)) for s in SIZES]
    x = list(range(len(SIZES)))
    line_with_sd(b, x, [sof(t, "speedup") for t in tb], "ours: speedup (×)")
    b.axhspan(1.75, 2.06, color="grey", alpha=0.2, label="paper speedup 1.75–2.06×")
    b.set(
        xticks=x,
        xticklabels=[f"{s.upper()}" for s in SIZES],
        xlabel="Qwen3 size (H200)",
        ylabel="speedup (×)",
        title=f"(b) model size, share {BASE_SHARE}",
    )
    b2 = b.twinx()
    b2.plot(x, [t["saving_s"] for t in tb], "s--", color="C1", label="ours: saving (s)")
    b2.plot([0, len(SIZES) - 1], [1.6, 8.9], "k^", ms=9, label="paper saving (s)")
    b2.set_ylabel("saving per request (s)")
    b.legend(fontsize=7, loc="upper left")
    b2.legend(fontsize=7, loc="center right")
    save(fig, path)


def run(quick: bool, out: Path) -> Experiment:
    """Fig. 10 on Routing."""
    rate, llm_s = base_rate(out)
    rows = run_cells(cells(quick, rate), out, extra=with_facts(replay_share), customize=customize)
    table = summarize(rows)
    seeds, n = settings(quick)
    setup = (
        f"Routing, {n} requests per cell ({len(seeds)} seed(s)), four workers, one rate "
        f"for every model: λ = {rate:g} req/s (ρ = {RHO:g} on the 32B, whose pilot "
        f"T_llm is {llm_s:.2f} s/request). Arm `full` against the floor and the oracle "
        "on the same schedule. " + WHY
    )
    report = page(
        "Fig. 10 — repetition and model size",
        quick,
        setup,
        lines(table, rows),
        [("Every configuration (mean over seeds)", rows_table(table, COLUMNS))],
        seeds=len(seeds),
    )
    return Experiment(
        NAME, rows, {**PAPER, "ours_rate": rate}, report, {"fig10.png": lambda p: plot(table, p)}
    )
