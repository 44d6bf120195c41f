"""``dynbranch experiment all [--quick]``: every experiment, then one index page.

Each experiment of :data:`experiments.ALL` runs into ``OUT/<name>/`` and writes its own
files there, as ``dynbranch experiment <name>`` would; its wall time is measured. The index
(``OUT/index.md``, also the ``report.md`` of ``all``) links every report and quotes each
one's central table (ours | paper | difference and why), so one page holds the whole
comparison. An experiment that raises is recorded with its error type and message, the
others still run, and the index says which failed.
"""

from __future__ import annotations

import sys
import traceback
from pathlib import Path
from typing import Any

from dynbranch.clock import Stopwatch
from experiments.common import Experiment, markdown_table, write_experiment

CENTRAL = "## Ours | paper | difference and why"


def central_table(report: str) -> str:
    """The central comparison of one ``report.md`` (or, for a report that has none, its
    first table)."""
    if CENTRAL in report:
        body = report.split(CENTRAL, 1)[1].split("\n## ", 1)[0]
        return body.strip()
    lines = report.splitlines()
    start = next((i for i, x in enumerate(lines) if x.startswith("|")), None)
    if start is None:
        return "(no table)"
    end = next((i for i in range(start, len(lines)) if not lines[i].startswith("|")), len(lines))
    return "\n".join(lines[start:end])


def run_one(name: str, quick: bool, out: Path) -> tuple[dict[str, Any], str]:
    """Run and write one experiment; (its index row, its report or the error)."""
    from experiments import get_experiment

    row: dict[str, Any] = {"experiment": name, "report": f"{name}/report.md"}
    with Stopwatch() as sw:
        try:
            exp = get_experiment(name)(quick=quick, out=out / name)
            write_experiment(exp, out / name)
            row.update(status="ok", rows=len(exp.rows), plots=", ".join(exp.plots))
            text = exp.report
        except Exception as e:  # NOTE: one failing experiment must not lose the others
            traceback.print_exc(file=sys.stderr)
            row.update(status="failed", error_type=type(e).__name__, error=str(e)[:300])
            text = f"failed: {type(e).__name__}: {e}"
    row["wall_s"] = sw.elapsed_s
    return row, text


def index_page(rows: list[dict[str, Any]], texts: dict[str, str], quick: bool) -> str:
    """The index: one line per experiment, then each one's central table."""
    total = sum(r["wall_s"] for r in rows)
    table = [
        {
            "experiment": f"[{r['experiment']}]({r['report']})",
            "status": r["status"],
            "wall (s)": f"{r['wall_s']:.0f}",
            "plots": r.get("plots", ""),
            "error": r.get("error", ""),
        }
        for r in rows
    ]
    out = [
        f"# Every experiment{' (quick)' if quick else ''}",
        "",
        f"`dynbranch experiment all{' --quick' if quick else ''}`: "
        f"{sum(r['status'] == 'ok' for r in rows)} of {len(rows)} ran, "
        f"{total:.0f} s wall in all ({total / 60:.1f} min).",
        "",
        markdown_table(table, ["experiment", "status", "wall (s)", "plots", "error"]),
    ]
    for r in rows:
        name = r["experiment"]
        out += ["", f"## [{name}]({r['report']})", ""]
        out.append(central_table(texts[name]) if r["status"] == "ok" else texts[name])
    return "\n".join(out) + "\n"


def run(quick: bool, out: Path) -> Experiment:
    """Every experiment into ``out/<name>/``, and the index."""
    from experiments import ALL

    rows, texts = [], {}
    for name in ALL:
        row, text = run_one(name, quick, out)
        rows.append(row)
        texts[name] = text
    page = index_page(rows, texts, quick)
    out.mkdir(parents=True, exist_ok=True)
    (out / "index.md").write_text(page)
    paper = {"experiments": list(ALL), "note": "each experiment's summary.json holds its own"}
    return Experiment("all", rows, paper, page)
