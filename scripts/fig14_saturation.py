"""``full`` against ``c1`` at Fig. 14's saturated rates, over more seeds and placement weights.

``dynbranch experiment fig14`` runs two seeds per rate. At 12 and 16 req/s (mean latency
40-45 s on its Routing mix) the difference between ``full`` and ``c1`` is smaller than what one
seed's trajectory moves it by, so two seeds cannot tell its sign. This script runs the same
cells (``experiments.fig14``'s mix, 1,200 requests) for more seeds: ``c1`` once per rate and
seed, ``full`` once per placement weight (``dynbranch.runtime.pool.FILL_LOAD``, what an open
fill weighs when a canonical call is placed; ``c1`` runs no fills, so the weight does not move
it), and reports ``full``'s mean latency less ``c1``'s per seed, its mean and standard error.

    python scripts/fig14_saturation.py [--rates 12 16] [--seeds 8] [--weights 0.5 1]
                                       [--requests 1200] [--out DIR]

Writes ``saturation.md`` (the table), ``saturation.json`` (every cell) and ``saturation.png``
(each seed's difference per rate and weight) under ``--out``. 2 cores, 8 seeds, two rates and
two weights: about 8 minutes.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # NOTE: measure this tree's code, not an installed copy
    sys.path.insert(0, str(ROOT))

import dynbranch.runtime.pool as pool  # noqa: E402
from experiments import fig14  # noqa: E402
from experiments.common import Cell, run_cells  # noqa: E402


def cells(arm: str, rates: list[float], seeds: range, requests: int) -> list[Cell]:
    return [Cell("routing", arm, fig14.variant(fig14.SHARE), rate=r, requests=requests, seed=s)
            for s in seeds for r in rates]


def run(arm: str, weight: float | None, rates: list[float], seeds: range, requests: int,
        out: Path, jobs: int) -> dict[tuple[float, int], dict[str, Any]]:
    """One row per (rate, seed) of ``arm`` with an open fill weighed at ``weight``."""
    before = pool.FILL_LOAD
    if weight is not None:
        # NOTE: the pool reads its default weight when it is built, in each forked cell
        pool.FILL_LOAD = weight
    try:
        rows = run_cells(cells(arm, rates, seeds, requests), out, jobs=jobs,
                         customize=fig14.customize)
    finally:
        pool.FILL_LOAD = before
    return {(r["rate"], r["seed"]): r for r in rows if r["arm"] == arm}


def summarise(c1: dict, full: dict[float, dict], rates: list[float],
              seeds: range) -> list[dict[str, Any]]:
    table = []
    for rate in rates:
        base = [c1[(rate, s)]["mean_latency_s"] for s in seeds]
        table.append({"rate": rate, "arm": "c1", "weight": None,
                      "mean_s": statistics.fmean(base), "per_seed_s": base})
        for weight, rows in full.items():
            mine = [rows[(rate, s)]["mean_latency_s"] for s in seeds]
            diffs = [m - b for m, b in zip(mine, base, strict=True)]
            se = statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("nan")
            table.append({
                "rate": rate, "arm": "full", "weight": weight, "mean_s": statistics.fmean(mine),
                "p99_s": statistics.fmean(rows[(rate, s)]["p99_latency_s"] for s in seeds),
                "fills": statistics.fmean(rows[(rate, s)]["fills_issued"] for s in seeds),
                "minus_c1_s": statistics.fmean(diffs), "se_s": se, "per_seed_minus_c1_s": diffs,
            })
    return table


def markdown(table: list[dict[str, Any]], seeds: range, requests: int) -> str:
    lines = [f"`full` against `c1` on Fig. 14's mix, {len(seeds)} seeds ({seeds.start}-"
             f"{seeds.stop - 1}), {requests:,} requests per cell; mean latency over seeds, and "
             "`full` less `c1` per seed (mean, standard error).", "",
             "| rate (req/s) | arm | fill weight | mean latency (s) | full − c1 (s) | ± se | "
             "fills per cell |", "|---|---|---|---|---|---|---|"]
    for t in table:
        if t["arm"] == "c1":
            lines.append(f"| {t['rate']:g} | c1 | — | {t['mean_s']:.2f} | | | 0 |")
        else:
            lines.append(f"| {t['rate']:g} | full | {t['weight']:g} | {t['mean_s']:.2f} | "
                         f"{t['minus_c1_s']:+.2f} | {t['se_s']:.2f} | {t['fills']:.0f} |")
    return "\n".join(lines) + "\n"


def plot(table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [t for t in table if t["arm"] == "full"]
    fig, ax = plt.subplots(figsize=(6.5, 3.6))
    for i, t in enumerate(rows):
        d = t["per_seed_minus_c1_s"]
        ax.plot([i] * len(d), d, "o", alpha=0.5, color="tab:blue")
        ax.errorbar(i + 0.15, t["minus_c1_s"], yerr=t["se_s"], fmt="s", color="k", capsize=3)
    ax.axhline(0.0, color="grey", lw=0.8)
    ax.set_xticks(range(len(rows)), [f"{t['rate']:g} req/s\nweight {t['weight']:g}"
                                     for t in rows], fontsize=8)
    ax.set_ylabel("full − c1, mean latency (s)")
    ax.set_title("C2's further saving at saturation (below 0: full ahead)", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rates", type=float, nargs="+", default=[12.0, 16.0])
    ap.add_argument("--seeds", type=int, default=8, help="seeds 0 .. N-1")
    ap.add_argument("--weights", type=float, nargs="+", default=[0.5, 1.0])
    ap.add_argument("--requests", type=int, default=fig14.FULL_REQUESTS)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("runs/fig14-saturation"))
    args = ap.parse_args(argv)
    if args.seeds < 2 or args.requests < 1 or any(not w >= 0 for w in args.weights):
        ap.error("need --seeds >= 2, --requests >= 1 and weights >= 0")
    seeds = range(args.seeds)
    args.out.mkdir(parents=True, exist_ok=True)
    c1 = run("c1", None, args.rates, seeds, args.requests, args.out / "c1", args.jobs)
    full = {w: run("full", w, args.rates, seeds, args.requests, args.out / f"full-w{w:g}",
                   args.jobs) for w in args.weights}
    table = summarise(c1, full, args.rates, seeds)
    text = markdown(table, seeds, args.requests)
    (args.out / "saturation.md").write_text(text)
    (args.out / "saturation.json").write_text(json.dumps(table, indent=1))
    plot(table, args.out / "saturation.png")
    print(text)


if __name__ == "__main__":
    main()
