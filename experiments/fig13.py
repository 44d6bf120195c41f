"""Fig. 13 — two-level attribution of C3: what each gate level controls.

(a) Routing at λ = 0.8 (arm ``full``): both levels priced against each level switched to its
unpriced baseline — Action 0 off (the predictor runs at every branch) and/or Action 1 a fixed
threshold p* — reporting fills per request, candidate-generation openings per request and
latency. Paper: pricing both levels issues 8.3× fewer fills than Action 0 off + fixed Action
1, at indistinguishable latency; Action 0 cuts openings from 1.53 to 0.35 per request with
Action 1 priced (1.42 → 0.50 with it fixed).

(b) ReAct with C1 disabled (arm ``c2``): Action 0 off and fixed thresholds p* from 0.999 down
to 0.1, against both levels priced, reporting fills and drafting time per request and
latency against p* = 0.999. Paper: fills per request vary 55× (0.09–4.99) while drafting
stays 2.5–2.6 s per request; the priced gate lowers latency 4.5 % while drafting 0.89 s,
2.8× less; accuracy 0.305–0.328.

Cells in each batch run in one order and, in the next batch (seed), in reverse, as the
paper pairs them. Each panel's batch shares one floor and one oracle (the pair is the
panel's schedule; the variant is the gate).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from experiments.common import Cell, Experiment, run_cells
from experiments.facts import cell_latencies, with_facts
from experiments.pairing import pair_rows, with_oracle
from experiments.plots import pyplot, save
from experiments.report import Line, first, mean_rows, page, rows_table
from experiments.stats import pct, welch

GATES_A = (
    ("priced", 0.2),
    ("priced-a1-only", 0.2),
    ("priced-a0-fixed", 0.2),
    ("fixed-threshold", 0.2),
)
"""p* = 0.2 for panel (a): a fixed threshold must admit for the comparison to mean anything
(with uniform priors p~ starts at 0.5 · 0.5, so p* >= 0.5 never admits and never learns)."""
THRESHOLDS_B = (0.999, 0.9, 0.7, 0.5, 0.3, 0.1)
DRAFT_THINK_TOKENS_B = 256
"""Tokens each of panel (b)'s draft calls reasons before it answers. NOTE: the paper's drafter
drafts 2.5–2.6 s per request, which only a reasoning drafter costs: one that answers at once
drafts 0.048 s per request here (8 calls of a few tokens on the 0.6B, 3.4 entries per
request), too little for Action 0 to have anything to save; with 256 tokens it drafts
1.92 s per request (``dynbranch replay --workload react --arm c2 --backend local --clock
virtual --rate 0.12 --requests 100 --predictor drafter --drafter-think-tokens 256``), and
the think stage it races decodes about 7 s, so drafts still finish before the decision."""
RATE_A = 0.8  # Routing, req/s
RATE_B = 0.12  # ReAct, req/s
PAIR = ("workload", "rate", "seed", "requests")
PAPER = {
    "a_fill_ratio_fixed_over_priced": 8.3,
    "a_openings_priced": [0.35, 1.53],
    "a_openings_fixed": [0.50, 1.42],
    "b_fills_per_request": [0.09, 4.99],
    "b_drafting_s": [2.5, 2.6],
    "b_priced_reduction_vs_p0999": 0.045,
    "b_priced_drafting_s": 0.89,
    "b_accuracy": [0.305, 0.328],
}
COLUMNS = (
    "panel",
    "variant",
    "workload",
    "seeds",
    "mean_latency_s",
    "fills_per_request",
    "openings_per_request",
    "drafting_s_per_request",
    "reduction_vs_p0999",
    "reduction_vs_floor",
    "oracle_reduction",
    "captured",
    "accuracy",
    "unsafe_splices",
)


def _variant(gate: str, p: float) -> str:
    return gate if gate in ("priced", "priced-a1-only") else f"{gate}(p*={p:g})"


def cells(quick: bool, predictor_b: str) -> list[Cell]:
    """Per seed, both panels' batches (a floor each, then every gate), order reversed on
    odd seeds; the oracle joins each panel's floor."""
    seeds = (0,) if quick else (0, 1, 2)
    n_a, n_b = (150, 100) if quick else (300, 200)
    out = []
    for i, seed in enumerate(seeds):
        a = [
            Cell(
                "routing",
                "full",
                "a:" + _variant(g, p),
                rate=RATE_A,
                requests=n_a,
                seed=seed,
                replay={"gate": g, "p_star": p},
            )
            for g, p in GATES_A
        ]
        b = [
            Cell(
                "react",
                "c2",
                f"b:fixed-threshold(p*={p:g})",
                rate=RATE_B,
                requests=n_b,
                seed=seed,
                replay={
                    "gate": "fixed-threshold",
                    "p_star": p,
                    "predictor": predictor_b,
                    "drafter_think_tokens": DRAFT_THINK_TOKENS_B,
                    "tool_time": "modelled",
                },
            )
            for p in THRESHOLDS_B
        ]
        b.append(
            Cell(
                "react",
                "c2",
                "b:priced",
                rate=RATE_B,
                requests=n_b,
                seed=seed,
                replay={"gate": "priced", "predictor": predictor_b,
                        "drafter_think_tokens": DRAFT_THINK_TOKENS_B, "tool_time": "modelled"},
            )
        )
        floors = [
            Cell(
                c.workload,
                "floor",
                c.variant.split(":")[0] + ":floor",
                c.rate,
                c.requests,
                c.seed,
                {k: v for k, v in c.replay.items() if k == "tool_time"},
            )
            for c in (a[0], b[0])
        ]
        batch = floors + a + b
        out += batch if i % 2 == 0 else batch[::-1]
    return with_oracle(out, PAIR)


def _gate_stats(cell: Cell, result: Any) -> dict[str, Any]:
    spec = result.summary.get("speculation", {})
    n = max(1, result.summary["requests"])
    return {
        "gate": cell.replay.get("gate", "none"),
        "p_star": cell.replay.get("p_star"),
        "fills_per_request": result.summary["fills_issued"] / n,
        "openings_per_request": spec.get("generated", 0) / n,
        "drafting_s_per_request": spec.get("drafting", {}).get("drafting_s", 0.0) / n,
    }


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over seeds per gate variant; panel (b) against p* = 0.999."""
    pair_rows(rows, PAIR)
    gated = [r for r in rows if r["arm"] not in ("floor", "oracle")]
    table = mean_rows(gated, ("variant",), ("mean_latency_s",))
    for t in table:
        t["panel"], t["variant"] = t["variant"].split(":", 1)
    base = first(table, variant="fixed-threshold(p*=0.999)")
    for t in table:
        if t["panel"] == "b" and base:
            t["reduction_vs_p0999"] = 1.0 - t["mean_latency_s"] / base["mean_latency_s"]
    return table


def _latency_test(out: Path, all_cells: list[Cell], a: str, b: str) -> str:
    test = welch(
        [x for c in all_cells if c.variant == a for x in cell_latencies(out, c)],
        [x for c in all_cells if c.variant == b for x in cell_latencies(out, c)],
    )
    return "—" if test.p is None else f"Welch p = {test.p:.2g}"


def lines(table: list[dict[str, Any]], latency_test: str) -> list[Line]:
    """Panel (a)'s ratios and openings, panel (b)'s spans and the priced gate's gain."""
    pa = {t["variant"]: t for t in table if t["panel"] == "a"}
    pb = [t for t in table if t["panel"] == "b"]
    priced, fixed = pa["priced"], pa["fixed-threshold(p*=0.2)"]
    ratio = fixed["fills_per_request"] / max(priced["fills_per_request"], 1e-9)
    fills = [t["fills_per_request"] for t in pb if t["variant"] != "priced"]
    drafting = [t["drafting_s_per_request"] for t in pb if t["variant"] != "priced"]
    bp = next(t for t in pb if t["variant"] == "priced")
    span = f"{max(fills) / min(fills):.0f}×" if min(fills) > 0 else "the strictest issued none"
    fixed_draft = float(np.mean(drafting)) if drafting else 0.0
    return [
        Line(
            "(a) fills/request, Action 0 off + fixed Action 1 over both priced",
            f"{ratio:.1f}×",
            "8.3×",
            f"priced {priced['fills_per_request']:.2f}, fixed "
            f"{fixed['fills_per_request']:.2f} fills/request; latency "
            f"{priced['mean_latency_s']:.2f} vs {fixed['mean_latency_s']:.2f} s ({latency_test})",
        ),
        Line(
            "(a) openings/request, Action 0 priced vs off (Action 1 priced)",
            f"{priced['openings_per_request']:.2f} vs "
            f"{pa['priced-a1-only']['openings_per_request']:.2f}",
            "0.35 vs 1.53",
            f"openings = branch entries where the predictor ran, of "
            f"{priced['f_branches_per_request']:.2f} entries per request here",
        ),
        Line(
            "(a) openings/request, Action 0 priced vs off (Action 1 fixed)",
            f"{pa['priced-a0-fixed(p*=0.2)']['openings_per_request']:.2f} vs "
            f"{fixed['openings_per_request']:.2f}",
            "0.50 vs 1.42",
            "as above",
        ),
        Line(
            "(b) fills/request across fixed thresholds",
            f"{min(fills):.2f}–{max(fills):.2f} ({span})",
            "0.09–4.99 (55×)",
            "the thresholds' own range of admission",
        ),
        Line(
            "(b) drafting s/request across fixed thresholds",
            f"{min(drafting):.3f}–{max(drafting):.3f}",
            "2.5–2.6",
            "flat across thresholds, as the paper's; per request: "
            f"{bp['f_branches_per_request']:.2f} branch entries, each drafted by N = 8 calls",
        ),
        Line(
            "(b) priced gate: latency vs p* = 0.999",
            pct(-bp.get("reduction_vs_p0999", 0.0)),
            "−4.5 %",
            f"fills {bp['fills_per_request']:.2f}/request",
        ),
        Line(
            "(b) priced gate: drafting s/request (and fixed over priced)",
            f"{bp['drafting_s_per_request']:.3f} "
            f"({fixed_draft / max(bp['drafting_s_per_request'], 1e-9):.1f}× less)",
            "0.89 (2.8× less)",
            f"Action 0 opened the drafter at {bp['openings_per_request']:.2f} of "
            f"{bp['f_branches_per_request']:.2f} branch entries per request: it closes it only "
            "where the entry's measured return does not pay for the draft",
        ),
        Line(
            "(b) accuracy across the sweep",
            f"{min(t['accuracy'] for t in pb):.3f}–{max(t['accuracy'] for t in pb):.3f}",
            "0.305–0.328",
            "replayed decisions: the same answers under every gate",
        ),
    ]


def plot(table: list[dict[str, Any]], path: Path) -> None:
    """(a) fills and openings per request per gate, with latency; (b) latency against fills."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    pa = [t for t in table if t["panel"] == "a"]
    x = np.arange(len(pa))
    a.bar(x - 0.2, [t["fills_per_request"] for t in pa], 0.4, label="fills / request")
    a.bar(x + 0.2, [t["openings_per_request"] for t in pa], 0.4, label="openings / request")
    a2 = a.twinx()
    a2.plot(x, [t["mean_latency_s"] for t in pa], "ko-", label="mean latency (s)")
    a2.set_ylabel("mean latency (s)")
    a.set_xticks(x, [t["variant"] for t in pa], rotation=15, fontsize=7)
    a.legend(fontsize=7, loc="upper left")
    a.set_title(f"(a) Routing λ={RATE_A:g}: each level's cost", fontsize=9)
    pb = [t for t in table if t["panel"] == "b"]
    b.scatter(
        [t["fills_per_request"] for t in pb], [100 * t.get("reduction_vs_p0999", 0.0) for t in pb]
    )
    for t in pb:
        b.annotate(
            t["variant"].replace("fixed-threshold", ""),
            (t["fills_per_request"], 100 * t.get("reduction_vs_p0999", 0.0)),
            fontsize=7,
        )
    b.axhline(4.5, color="grey", ls="--", lw=0.8, label="paper: priced −4.5 %")
    b.set_xlabel("fills per request")
    b.set_ylabel("latency reduction vs p*=0.999 (%)")
    b.set_title("(b) ReAct, C1 off: thresholds vs priced", fontsize=9)
    b.legend(fontsize=7)
    save(fig, path)


def run(quick: bool, out: Path) -> Experiment:
    """Fig. 13: both panels, order-balanced batches."""
    from dynbranch.predictors import PREDICTORS

    predictor_b = "drafter" if "drafter" in PREDICTORS else "entity"
    all_cells = cells(quick, predictor_b)
    rows = run_cells(all_cells, out, extra=with_facts(_gate_stats))
    table = summarize(rows)
    test = _latency_test(out, all_cells, "a:priced", "a:fixed-threshold(p*=0.2)")
    setup = (
        f"(a) Routing at {RATE_A:g} req/s, arm `full`, four gate settings (p* = 0.2); (b) ReAct "
        f"at {RATE_B:g} req/s, arm `c2` with the `{predictor_b}` predictor (each draft call "
        f"reasons {DRAFT_THINK_TOKENS_B} tokens, as the paper's drafter), Action 0 off and "
        "fixed thresholds against both levels priced. Each panel's batch shares one "
        "floor and one oracle; batches alternate their order across seeds."
    )
    report = page(
        "Fig. 13 — two-level attribution",
        quick,
        setup,
        lines(table, test),
        [("Every gate setting (mean over seeds)", rows_table(table, COLUMNS))],
        seeds=1 if quick else 3,
    )
    return Experiment("fig13", rows, PAPER, report, {"fig13.png": lambda p: plot(table, p)})
