"""Fig. 11 — backbones and drafters (Routing at exact-replay share 0.22; :mod:`scaling`).

(a) **Backbones**: four other model families on the H200 — Llama-3.1-8B-Instruct,
Mistral-Small-24B-Instruct-2501, Gemma-3-27B-it and Phi-4 (profiles from each model's
``config.json`` and the datasheet, ``dynbranch/engines/profiles/``) — ``full`` against its
paired floor, three seeds each.
(b) **Drafters**: Qwen3 0.6B, 1.7B, 4B and 8B drafting on the H200 for the 32B target
(arm ``full`` with the drafter predictor, its rows labelled ``full-sweep``). Drafting is real engine work on each size's
profile; since no drafter LM runs here its choice accuracy is an explicit sweep
(:mod:`experiments.drafter_sweep`): each of the N = 8 votes names the resolved candidate
with probability :data:`VOTE_ACCURACY` (our values, rising with size as the paper's top-1
ranking does), and every draft reasons :data:`THINK_TOKENS` tokens before it answers.
Reported per size: speedup, measured top-1 accuracy over the held-out (not yet learned)
branches, fills issued and their consumption rate, and Welch's test of each size's
per-seed speedups against the 0.6B's.

Paper: (a) 1.55–1.99× over the paired floors across three seeds each, accuracy within
0.012 of the floor. (b) 1.63–1.70× for every size, no significant difference between sizes
over three seeds; the 8B drafter has the highest top-1 accuracy over 140 held-out branches
and issues the most fills but has the lowest consumption rate, 50 % against 70 % for 1.7B.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from experiments.common import Cell, Experiment, run_cells, sweep_settings
from experiments.drafter_sweep import SWEEP_ARM, swept_arm
from experiments.facts import with_facts
from experiments.plots import bars_vs_paper, pyplot, save
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
    WHY,
    add_speedup,
    base_rate,
    replay,
    replay_share,
    tag,
    trio,
    variant,
)
from experiments.scaling import customize as share_stream
from experiments.stats import fmt, welch

NAME = "fig11"
BACKBONES = {
    "llama-3.1-8b@h200": "Llama-3.1-8B",
    "mistral-small-24b@h200": "Mistral-Small-24B",
    "gemma-3-27b@h200": "Gemma-3-27B",
    "phi-4@h200": "Phi-4",
}
DRAFTERS = ("0.6b", "1.7b", "4b", "8b")
VOTE_ACCURACY = {"0.6b": 0.05, "1.7b": 0.15, "4b": 0.25, "8b": 0.35}
"""P(a vote names the resolved candidate beyond the learned choice model), per drafter size:
a sweep, not a measurement. NOTE: on 30 Routing requests (0.6B drafting) these move top-1
from 0.44 (0.0, the choice model alone) to 0.74 (0.3), so the sizes span that range."""
THINK_TOKENS = 0
"""Tokens each draft call reasons before it answers. NOTE: 0, a distilled drafter that
answers at once: with 64, even the 0.6B's drafts finished after the router's decision on
36 of 36 opened branches (the router decodes a few dozen tokens here), so no size would fill."""
PAPER = {
    "backbone_speedup": [1.55, 1.99],
    "backbone_accuracy_within": 0.012,
    "drafter_speedup": [1.63, 1.70],
    "held_out_branches": 140,
    "consumption": {"8b": 0.50, "1.7b": 0.70},
}
COLUMNS = (
    "panel",
    "variant",
    "seeds",
    "mean_latency_s",
    "speedup",
    "speedup_sd",
    "reduction_vs_floor",
    "oracle_reduction",
    "captured",
    "accuracy_delta",
    "top1_accuracy",
    "scored_branches",
    "fills_issued",
    "consumption",
    "welch_p",
)


def settings(quick: bool) -> tuple[tuple[int, ...], int]:
    """(seeds, requests per cell): the paper's three seeds."""
    return sweep_settings(quick)


def cells(quick: bool, rate: float) -> list[Cell]:
    """(a) a trio per backbone; (b) a trio per drafter size (``full`` drafts)."""
    seeds, n = settings(quick)
    out = []
    for s in seeds:
        for profile in BACKBONES:
            out += trio(
                variant(BASE_SHARE, panel="a", profile=profile), rate, n, s, replay(profile)
            )
        for size in DRAFTERS:
            drafter = {"predictor": "drafter", "drafter_profile": f"qwen3-{size}@h200"}
            out += trio(
                variant(BASE_SHARE, panel="b", drafter=size),
                rate,
                n,
                s,
                replay(BASE_PROFILE),
                drafter,
            )
    return out


def customize(cell: Cell, prepared: Any) -> Any:
    """The share's stream; a drafter cell's ``full`` gets the swept drafter of its size."""
    prepared = share_stream(cell, prepared)
    size = tag(cell, "drafter")
    if size is None or cell.arm != "full":
        return prepared
    return dataclasses.replace(prepared, arm=swept_arm(VOTE_ACCURACY[size], THINK_TOKENS))


def _drafter_stats(cell: Cell, result: Any) -> dict[str, Any]:
    row = replay_share(cell, result)
    if tag(cell, "drafter") is not None and cell.arm == "full":
        row["arm"] = SWEEP_ARM  # NOTE: its drafter reads the trace's outcomes: not the system
    hook = result.orchestrator.branch_hook
    predictor = getattr(hook, "predictor", None)
    scored = getattr(predictor, "scored", None)
    if scored is not None and tag(cell, "drafter") is not None:
        row.update(
            scored_branches=scored,
            top1_accuracy=predictor.top1_hits / scored if scored else None,
            vote_accuracy=predictor.vote_accuracy,
        )
    issued = result.summary.get("fills_issued") or 0
    row["consumption"] = (result.summary.get("fills_consumed") or 0) / issued if issued else None
    return row


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``full`` (``full-sweep`` for a drafter) per configuration (mean over seeds); Welch of
    each drafter's per-seed speedups against the 0.6B's."""
    add_speedup(rows)
    for r in rows:
        r["panel"] = r["variant"].split(",")[0].split("=")[1]
    full = [r for r in rows if r["arm"] in ("full", SWEEP_ARM)]
    table = mean_rows(full, ("panel", "variant"), ("speedup", "top1_accuracy"))
    base = [r["speedup"] for r in full if tag(r, "drafter") == DRAFTERS[0]]
    for t in table:
        if t["panel"] == "b":
            own = [r["speedup"] for r in full if r["variant"] == t["variant"]]
            t["welch_p"] = welch(own, base).p
    return table


def lines(table: list[dict[str, Any]], rows: list[dict[str, Any]]) -> list[Line]:
    """Backbone by backbone, drafter by drafter."""
    out = []
    for profile, label in BACKBONES.items():
        v = variant(BASE_SHARE, panel="a", profile=profile)
        t, floor = first(table, variant=v), over_seeds(rows, arm="floor", variant=v)
        ours = sof(t, "speedup")
        acc = t.get("accuracy_delta")
        out.append(
            Line(
                f"(a) {label}: speedup over its floor",
                fmt(ours, "{:.2f}×".format),
                "1.55–1.99×",
                f"{gap_ratio(ours.mean, (1.55, 1.99))}; accuracy "
                f"{acc:+.3f} vs floor (paper within 0.012); {facts_why(floor, t)}",
            )
        )
    for size in DRAFTERS:
        t = first(table, variant=variant(BASE_SHARE, panel="b", drafter=size))
        ours, p = sof(t, "speedup"), t.get("welch_p")
        test = "" if p is None else f"; Welch vs 0.6B p = {p:.2g}"
        out.append(
            Line(
                f"(b) {size.upper()} drafter: speedup",
                fmt(ours, "{:.2f}×".format),
                "1.63–1.70×",
                gap_ratio(ours.mean, (1.63, 1.70)) + test,
            )
        )
        top1, paper_c = t.get("top1_accuracy"), PAPER["consumption"].get(size)
        out.append(
            Line(
                f"(b) {size.upper()} drafter: top-1 / fills / consumption",
                f"{top1:.2f} over {t.get('scored_branches', 0):.0f} branches; "
                f"{t['fills_issued']:.0f} fills; {t['consumption']:.0%} consumed"
                if top1 is not None and t.get("consumption") is not None
                else "—",
                f"consumption {paper_c:.0%}" if paper_c else "8B most accurate",
                f"vote accuracy set to {VOTE_ACCURACY[size]:.2f} (a sweep); {facts_why(None, t)}",
            )
        )
    return out


def plot(table: list[dict[str, Any]], path: Path) -> None:
    """(a) speedup per backbone vs the paper's range; (b) speedup, top-1 and consumption
    per drafter size."""
    plt = pyplot()
    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.2))
    ta = [first(table, variant=variant(BASE_SHARE, panel="a", profile=p)) for p in BACKBONES]
    bars_vs_paper(
        a,
        list(BACKBONES.values()),
        [sof(t, "speedup") for t in ta],
        [(1.55, 1.99)] * len(ta),
        scale=1.0,
    )
    a.set(ylabel="speedup over the paired floor (×)", title="(a) backbones (H200)")
    tb = [first(table, variant=variant(BASE_SHARE, panel="b", drafter=s)) for s in DRAFTERS]
    bars_vs_paper(
        b,
        [s.upper() for s in DRAFTERS],
        [sof(t, "speedup") for t in tb],
        [(1.63, 1.70)] * len(tb),
        scale=1.0,
    )
    b2 = b.twinx()
    b2.plot(
        range(len(DRAFTERS)),
        [t.get("top1_accuracy") for t in tb],
        "o-",
        color="C2",
        label="top-1 accuracy",
    )
    b2.plot(
        range(len(DRAFTERS)),
        [t.get("consumption") for t in tb],
        "s--",
        color="C3",
        label="fill consumption",
    )
    b2.plot([1, 3], [0.70, 0.50], "k^", ms=9, label="paper consumption (1.7B, 8B)")
    b2.set(ylim=(0, 1), ylabel="fraction")
    b2.legend(fontsize=7, loc="lower right")
    b.set(ylabel="speedup (×)", title="(b) drafter size (accuracy swept)")
    save(fig, path)


def run(quick: bool, out: Path) -> Experiment:
    """Fig. 11 on Routing."""
    rate, llm_s = base_rate(out)
    rows = run_cells(cells(quick, rate), out, extra=with_facts(_drafter_stats), customize=customize)
    table = summarize(rows)
    seeds, n = settings(quick)
    setup = (
        f"Routing at exact-replay share {BASE_SHARE}, {n} requests per cell "
        f"({len(seeds)} seed(s)), four workers, λ = {rate:g} req/s for every model "
        f"(the 32B pilot's T_llm {llm_s:.2f} s/request). Drafters: N = 8 votes, each "
        f"reasoning {THINK_TOKENS} tokens; vote accuracy swept per size "
        + ", ".join(f"{s.upper()} {q:.2f}" for s, q in VOTE_ACCURACY.items())
        + " (explicit values, not a measurement: no drafter LM runs here); top-1 is "
        "measured per drafted branch before the drafter learns its outcome. " + WHY
    )
    report = page(
        "Fig. 11 — backbones and drafters",
        quick,
        setup,
        lines(table, rows),
        [("Every configuration (mean over seeds)", rows_table(table, COLUMNS))],
        seeds=len(seeds),
    )
    paper = {
        **PAPER,
        "ours_rate": rate,
        "vote_accuracy": VOTE_ACCURACY,
        "think_tokens": THINK_TOKENS,
    }
    return Experiment(NAME, rows, paper, report, {"fig11.png": lambda p: plot(table, p)})
