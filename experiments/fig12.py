"""Fig. 12 — the case study: one paired Routing request, floor against ``full``, as a
per-stage timeline.

The floor, ``full`` and the oracle replay one Routing schedule at low load (ρ = 0.1,
:mod:`experiments.rates`). The request shown is chosen by a rule, not by hand: among the
requests for which ``full`` served at least one stage from a fill, the one with the most
stages served from fills, ties broken by the largest end-to-end saving. It is drawn with
:mod:`dynbranch.timeline` (the ``dynbranch timeline`` command draws the same picture for
any request of any run): engine lanes, canonical stages solid, fills hatched, served-from
marks, branch windows; the floor's stages that ``full`` served from fills are outlined.

Paper: early fill removes four downstream stages from the critical path of the request,
saving 5.75 s end to end; two fills overlap router decoding on other workers, each
completing a handler and its executor before demand (served at zero engine time); the floor
runs all four after the decisions that gate them, 6.50 s in total.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd

from dynbranch.timeline import compare, describe, draw, load_request
from experiments.common import Cell, Experiment, run_cells
from experiments.facts import with_facts
from experiments.rates import LOADS, canonical_llm_s, rate_for
from experiments.report import Line, facts_why, first, page, rows_table

NAME = "fig12"
WORKLOAD = "routing"
WORKERS = 4
PAPER = {"saving_s": 5.75, "downstream_s": 6.50, "stages_removed": 4, "fills": 2}


def settings(quick: bool) -> int:
    """Requests in the paired run the case is chosen from."""
    return 40 if quick else 150


def cells(n: int, rate: float) -> list[Cell]:
    """The floor, ``full`` and the oracle on one schedule."""
    base = {"workers": WORKERS, "tool_time": "modelled"}
    return [Cell(WORKLOAD, arm, "case", rate, n, 0, base) for arm in ("floor", "full", "oracle")]


def choose(floor_dir: Path, full_dir: Path) -> tuple[str, pd.DataFrame]:
    """The case's request id (the rule in the module docstring) and every candidate's
    numbers (stages served from fills, saving)."""
    s = pd.read_parquet(full_dir / "stages.parquet")
    served = s[s["served_from"].isin(["shadow", "join"]) & ~s["speculative"]]
    counts = served.groupby("request_id").size().rename("served_from_fills")
    lat = {
        d: pd.read_parquet(d / "requests.parquet").set_index("request_id")["latency"]
        for d in (floor_dir, full_dir)
    }
    table = counts.to_frame()
    table["saving_s"] = (lat[floor_dir] - lat[full_dir]).reindex(table.index)
    if table.empty:
        raise ValueError("full served no stage from a fill: there is no case to show")
    table = table.sort_values(["served_from_fills", "saving_s"], ascending=False)
    return str(table.index[0]), table


def lines(
    c: Any, timelines: list[Any], floor_row: dict[str, Any] | None, full_row: dict[str, Any] | None
) -> list[Line]:
    """The case against the paper's."""
    served = timelines[1].stages
    shadow = int(((served["served_from"] == "shadow") & ~served["speculative"]).sum())
    join = int(((served["served_from"] == "join") & ~served["speculative"]).sum())
    return [
        Line(
            "end-to-end saving (floor − full)",
            f"{c.saving_s:.2f} s",
            "5.75 s",
            f"floor {timelines[0].latency:.2f} s → full {timelines[1].latency:.2f} s; "
            + _decode(timelines[0].stages),
        ),
        Line(
            "downstream execution the floor ran for the stages full served from fills",
            f"{c.downstream_s:.2f} s",
            "6.50 s",
            "saving / downstream = "
            + (f"{c.saving_s / c.downstream_s:.2f}" if c.downstream_s else "—")
            + " (paper 0.88)",
        ),
        Line(
            "stages removed from the critical path",
            str(c.served_from_fills),
            "4",
            f"{shadow} served from a finished fill (zero engine time), {join} joined a fill "
            "still running",
        ),
        Line(
            "fills in the request (their speculative stage executions)",
            f"{_fills(served)} ({c.fills})",
            "2 (4: a handler and its executor each)",
            facts_why(floor_row, full_row),
        ),
    ]


def _decode(stages: pd.DataFrame) -> str:
    """What the request's canonical LLM stages decoded in the floor run (measured)."""
    llm = stages[(stages["kind"] == "llm") & ~stages["speculative"].astype(bool)]
    if llm.empty:
        return "no LLM stage"
    return (
        f"its {len(llm)} LLM stages decode {llm['output_tokens'].mean():.0f} tokens "
        f"({(llm['end'] - llm['start']).mean():.2f} s) on average"
    )


def _fills(stages: pd.DataFrame) -> int:
    """Distinct fills among a request's stage rows: a fill is one (branch, candidate)."""
    spec = stages[stages["speculative"].astype(bool)]
    return int(spec[["coordinate", "fill"]].drop_duplicates().shape[0])


def run(quick: bool, out: Path) -> Experiment:
    """The case study: paired run, the rule's request, its timeline."""
    base = {"workers": WORKERS, "tool_time": "modelled"}
    rate = rate_for(LOADS["low"], WORKERS, canonical_llm_s(WORKLOAD, base, out / "pilot"))
    run_cells_ = cells(settings(quick), rate)
    rows = run_cells(run_cells_, out, extra=with_facts())
    dirs = {c.arm: out / "replays" / c.slug() for c in run_cells_}
    request, candidates = choose(dirs["floor"], dirs["full"])
    timelines = [load_request(dirs["floor"], request), load_request(dirs["full"], request)]
    c = compare(*timelines)
    for r in rows:
        r.update(
            case_request=request,
            case_saving_s=c.saving_s,
            case_downstream_s=c.downstream_s,
            case_served_from_fills=c.served_from_fills,
        )
    setup = (
        f"Routing, {settings(quick)} requests at low load (λ = {rate:g} req/s, ρ = "
        f"{LOADS['low']:g}), four workers; floor, `full` and the oracle on one schedule. "
        f"Case: `{request}`, chosen by the rule above (most stages served from fills, "
        "then the largest saving). Redraw it, or any other request, with "
        f"`dynbranch timeline {dirs['floor']} --request {request} --vs {dirs['full']}`."
    )
    top = candidates.head(8).reset_index().to_dict("records")
    report = page(
        "Fig. 12 — case study (one paired Routing request)",
        quick,
        setup,
        lines(c, timelines, first(rows, arm="floor"), first(rows, arm="full")),
        [
            ("The request in each run", "```\n" + describe(timelines) + "\n```"),
            (
                "Candidates by the rule (top 8)",
                rows_table(top, ("request_id", "served_from_fills", "saving_s")),
            ),
            ("The paired run", rows_table(rows)),
        ],
        seeds=None,
    )
    title = f"Fig. 12 — {request}: floor vs full (Routing, λ = {rate:g}/s)"
    return Experiment(
        NAME,
        rows,
        {**PAPER, "ours_rate": rate},
        report,
        {"fig12.png": lambda p: draw(timelines, p, title)},
    )
