"""Fig. 14 — load decomposition on Routing: floor, C1-only and full at five or more rates.

The three arms replay the same open-loop schedule at each rate (paired by seed), so
``Δ_C1 = floor − c1`` and ``Δ_C2 = c1 − full`` stack to the floor's mean latency. What the
figure must show (the issue's acceptance): full's p99 never worse than the floor's beyond
noise at any rate, and fills per request falling as load rises.

Paper (Routing, 32B/H200): C1 removes 40–48 % of the floor's latency at every rate; C2
removes a further 0.25–1.39 s; all requests complete; C1-only and full have identical
accuracy.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import Cell, Experiment, markdown_table, run_cells

ARMS = ("floor", "c1", "full")
RATES_QUICK = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0)
RATES_FULL = (0.5, 1.0, 2.0, 4.0, 8.0, 12.0, 16.0)
"""Light load to past saturation: the floor's mean latency grows ~4× by 16 req/s."""
PAPER = {"c1_share_of_floor": [0.40, 0.48], "c2_further_s": [0.25, 1.39]}


def cells(quick: bool) -> list[Cell]:
    rates, seeds = (RATES_QUICK, (0,)) if quick else (RATES_FULL, (0, 1))
    # NOTE: the routing test split holds 437 records; streams longer than that repeat
    # records (each pass re-shuffled), which is the request mix C1 can reuse.
    n = 600 if quick else 1200
    return [Cell("routing", arm, "default", rate=r, requests=n, seed=s)
            for s in seeds for r in rates for arm in ARMS]


def _fills_per_request(cell: Cell, result: Any) -> dict[str, Any]:
    s = result.summary
    return {"fills_per_request": s["fills_issued"] / max(1, s["requests"]),
            "promotions": s["promotions"]}


def decompose(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rate (mean over seeds): the three arms' latencies, Δ_C1, Δ_C2, p99s, fills."""
    by: dict[float, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        by[r["rate"]][r["arm"]].append(r)
    table = []
    for rate in sorted(by):
        arms = {a: by[rate][a] for a in ARMS}

        def mean(arm: str, key: str, arms: dict = arms) -> float:
            return float(np.mean([r[key] for r in arms[arm]]))

        floor, c1, full = (mean(a, "mean_latency_s") for a in ARMS)
        table.append({
            "rate": rate, "floor_s": floor, "c1_s": c1, "full_s": full,
            "delta_c1_s": floor - c1, "delta_c2_s": c1 - full,
            "c1_share": (floor - c1) / floor if floor else None,
            "p99_floor_s": mean("floor", "p99_latency_s"),
            "p99_full_s": mean("full", "p99_latency_s"),
            "p99_full_vs_floor": mean("full", "p99_latency_s") / mean("floor", "p99_latency_s") - 1,
            "fills_per_request": mean("full", "fills_per_request"),
            "accuracy_c1": mean("c1", "accuracy"), "accuracy_full": mean("full", "accuracy"),
            "unsafe_splices": int(sum(r["unsafe_splices"] for a in ARMS for r in arms[a])),
            "failed": int(sum(r["failed"] for a in ARMS for r in arms[a])),
        })
    return table


def plot(table: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rates = [t["rate"] for t in table]
    x = np.arange(len(rates))
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(13, 4))
    full = np.array([t["full_s"] for t in table])
    d2 = np.array([max(0.0, t["delta_c2_s"]) for t in table])
    d1 = np.array([max(0.0, t["delta_c1_s"]) for t in table])
    a.bar(x, full, label="full")
    a.bar(x, d2, bottom=full, label="Δ C2 (c1 − full)")
    a.bar(x, d1, bottom=full + d2, label="Δ C1 (floor − c1)")
    a.plot(x, [t["floor_s"] for t in table], "k_", markersize=20, label="floor")
    a.set_xticks(x, [f"{r:g}" for r in rates])
    a.set_xlabel("arrival rate (req/s)")
    a.set_ylabel("mean latency (s)")
    a.legend(fontsize=7)
    a.set_title("(a) decomposition", fontsize=9)
    b.plot(rates, [t["p99_floor_s"] for t in table], "o-", label="floor")
    b.plot(rates, [t["p99_full_s"] for t in table], "s-", label="full")
    b.set_xlabel("arrival rate (req/s)")
    b.set_ylabel("p99 latency (s)")
    b.legend(fontsize=8)
    b.set_title("(b) tail", fontsize=9)
    c.plot(rates, [t["fills_per_request"] for t in table], "o-")
    c.set_xlabel("arrival rate (req/s)")
    c.set_ylabel("fills issued per request (full)")
    c.set_title("(c) speculation follows load", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def report(table: list[dict[str, Any]], quick: bool) -> str:
    cols = ["rate", "floor_s", "c1_s", "full_s", "delta_c1_s", "delta_c2_s", "c1_share",
            "p99_floor_s", "p99_full_s", "p99_full_vs_floor", "fills_per_request",
            "unsafe_splices", "failed"]
    worst = max(t["p99_full_vs_floor"] for t in table)
    falling = all(a["fills_per_request"] >= b["fills_per_request"] - 0.05
                  for a, b in zip(table, table[1:], strict=False))
    return "\n".join([
        "# Fig. 14 — load decomposition (Routing)" + (" (quick)" if quick else ""), "",
        "Paper: C1 removes 40–48 % of the floor's latency at every rate; C2 a further "
        "0.25–1.39 s; all requests complete; C1-only and full have equal accuracy.", "",
        markdown_table(table, cols), "",
        f"Worst p99 of full relative to the floor's: {worst:+.1%}. Fills per request "
        f"{'fall' if falling else 'do not fall monotonically'} as load rises.", "",
        "Why ours differ: C1's share is set by how often the stream repeats a record: ours "
        "draws passes over BFCL's 437 test records (the first pass has no repeats), so its "
        "share is below the paper's 40–48 %, whose trace recurs more. Fills hide at most "
        "the router's short decode (a function name) per branch, so C2's further saving "
        "is small and, at saturation, the gate all but stops filling.",
    ])


def run(quick: bool, out: Path) -> Experiment:
    rows = run_cells(cells(quick), out, extra=_fills_per_request)
    table = decompose(rows)
    return Experiment("fig14", rows, PAPER, report(table, quick),
                      {"fig14.png": lambda p: plot(table, p)})
