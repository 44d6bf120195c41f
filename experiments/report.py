"""The report every experiment writes: ours | the paper's | the difference and why.

A ``report.md`` has one layout (:func:`page`): a title, the setup (workload, arms, rates,
seeds; for a figure whose workload the paper leaves unstated, which one and why), the
central table (:func:`comparison`) — one line per cell of the paper's figure with **our
number**, **the paper's number** and **the difference and why**, the "why" quoting measured
facts of the run (:mod:`experiments.facts`) wherever they explain it — and then every row
of the experiment with ``reduction_vs_floor``, ``oracle_reduction`` and ``captured``
(:func:`rows_table`). Numbers over seeds print as mean ± 1 s.d.; a single seed prints the
mean alone (:mod:`experiments.stats`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from experiments.common import markdown_table
from experiments.stats import Spread, fmt, pct, pct_spread, spread

COMPARISON_COLUMNS = ("cell", "ours", "paper", "difference and why")
ROW_COLUMNS = (
    "workload",
    "arm",
    "variant",
    "rate",
    "seed",
    "mean_latency_s",
    "p99_latency_s",
    "reduction_vs_floor",
    "oracle_reduction",
    "captured",
    "accuracy",
    "fills_issued",
    "fills_consumed",
    "unsafe_splices",
)


@dataclass(frozen=True)
class Line:
    """One cell of the paper's figure: what it is, ours, the paper's, and why they differ."""

    cell: str
    ours: str
    paper: str
    why: str


def comparison(lines: Iterable[Line]) -> str:
    """The central three-column table (plus the cell's name)."""
    rows = [
        {"cell": x.cell, "ours": x.ours, "paper": x.paper, "difference and why": x.why}
        for x in lines
    ]
    return markdown_table(rows, COMPARISON_COLUMNS)


def rows_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] = ROW_COLUMNS) -> str:
    """Every row of the experiment (the columns that any row has, in ``columns`` order):
    whole numbers without decimals, other numbers to three decimals, blanks for none."""
    present = [c for c in columns if any(c in r for r in rows)]
    lines = ["| " + " | ".join(present) + " |", "|" + "---|" * len(present)]
    lines += ["| " + " | ".join(_cell(r.get(c)) for c in present) + " |" for r in rows]
    return "\n".join(lines)


def _cell(v: Any) -> str:
    if v is None or (isinstance(v, float) and v != v):
        return ""
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, float):
        return f"{v:.0f}" if v == round(v) and (abs(v) >= 1 or v == 0) else f"{v:.3f}"
    return str(v)


def page(
    title: str,
    quick: bool,
    setup: str,
    lines: Iterable[Line],
    sections: Sequence[tuple[str, str]] = (),
    seeds: int | None = None,
) -> str:
    """A whole ``report.md``: title, setup, the comparison, then ``sections`` (heading, body)."""
    head = f"# {title}" + (" (quick)" if quick else "")
    note = ""
    if seeds == 1:
        note = (
            "One seed per cell, so no ± s.d. is printed; the full run has the paper's "
            "seeds and prints mean ± 1 s.d."
        )
    elif seeds:
        note = f"{seeds} seeds per cell; ± is 1 s.d. over seeds."
    out = [head, "", setup.strip()]
    if note:
        out += ["", note]
    out += ["", "## Ours | paper | difference and why", "", comparison(lines)]
    for heading, body in sections:
        out += ["", f"## {heading}", "", body.strip()]
    return "\n".join(out) + "\n"


# -- formatting a cell ----------------------------------------------------------------------


def ours_pct(values: Iterable[float | None]) -> str:
    """Fractions over seeds as a signed percentage (± s.d. when there are several)."""
    return pct_spread(spread(values))


def ours_num(values: Iterable[float | None], unit: str = "", digits: int = 2) -> str:
    """Numbers over seeds with ``unit`` (± s.d. when there are several)."""
    s = spread(values)
    text = fmt(s, f"{{:.{digits}f}}".format)
    return text if s.mean is None or not unit else f"{text} {unit}"


def gap_pct(ours: Spread | float | None, paper: float | tuple[float, float] | None) -> str:
    """Our fraction against the paper's value or range, in percentage points."""
    mean = ours.mean if isinstance(ours, Spread) else ours
    if mean is None or paper is None:
        return "no paper number" if paper is None else "not measured"
    if isinstance(paper, tuple):
        low, high = sorted(paper)
        if low <= mean <= high:
            return "within the paper's range"
        edge = low if mean < low else high
        return f"{100 * (mean - edge):+.1f} pts outside the paper's range".replace("-", "−")
    return f"{100 * (mean - paper):+.1f} pts".replace("-", "−")


def gap_ratio(
    ours: float | None, paper: float | tuple[float, float] | None, unit: str = "×"
) -> str:
    """Our value against the paper's as a ratio (``ours / paper``), or inside its range."""
    if ours is None or paper is None:
        return "no paper number" if paper is None else "not measured"
    if isinstance(paper, tuple):
        low, high = sorted(paper)
        if low <= ours <= high:
            return "within the paper's range"
        edge = low if ours < low else high
        return f"{ours / edge:.2f}{unit} the paper's {'lower' if ours < low else 'upper'} end"
    return f"{ours / paper:.2f}{unit} the paper's" if paper else "paper's value is 0"


def paper_pct(value: float | tuple[float, float] | None) -> str:
    """The paper's fraction or range as text."""
    if value is None:
        return "—"
    if isinstance(value, tuple):
        a, b = value
        return f"{pct(a)} … {pct(b)}"
    return pct(value)


def facts_why(floor: Mapping[str, Any] | None, arm: Mapping[str, Any] | None = None) -> str:
    """The measured facts that bound a cell's reduction (the floor's decode lengths, its
    Eq. 2 bound, the arm's fills and the oracle's reach), as one sentence."""
    parts = []
    if floor:
        if floor.get("f_llm_output_tokens") is not None:
            parts.append(
                f"floor LLM stages decode {floor['f_llm_output_tokens']:.0f} tokens "
                f"({floor['f_llm_stage_s']:.2f} s) on average"
            )
        if floor.get("f_eq2_share") is not None:
            parts.append(
                f"Eq. 2 bound {100 * floor['f_eq2_share']:.1f} % of floor latency "
                f"({floor['f_eq2_bound_s']:.2f} s/request)"
            )
    if arm:
        if arm.get("fills_issued"):
            parts.append(
                f"{arm['arm']} consumed {arm.get('fills_consumed') or 0:.0f} of "
                f"{arm['fills_issued']:.0f} fills"
            )
            wasted = arm.get("f_discarded_gpu_s_per_request")
            if (arm.get("reduction_vs_floor") or 0.0) < 0 and wasted:
                parts.append(
                    f"slower than the floor: its unused fills ran {wasted:.2f} GPU-s/request "
                    "beside canonical work"
                )
        elif arm.get("f_openings_per_request") is not None:
            parts.append(
                f"{arm['arm']} issued no fills: its gate opened "
                f"{arm['f_openings_per_request']:.2f} times per request and its predictor "
                f"ranked {arm.get('f_ranked_per_opening') or 0:.2f} fillable candidates per "
                "opening"
            )
        if arm.get("oracle_reduction") is not None:
            cap = arm.get("captured")
            parts.append(
                f"oracle bound {pct(-arm['oracle_reduction'])} mean latency"
                + (
                    f", {arm['arm']} captured {cap:.2f} of it"
                    if cap is not None
                    else " (too small to divide by)"
                )
            )
    return "; ".join(parts) if parts else "no stage facts (no replay)"


def find(rows: Iterable[Mapping[str, Any]], **match: Any) -> list[Mapping[str, Any]]:
    """The rows whose fields equal every ``match`` value."""
    return [r for r in rows if all(r.get(k) == v for k, v in match.items())]


def first(rows: Iterable[Mapping[str, Any]], **match: Any) -> Mapping[str, Any] | None:
    """The first row matching (``None`` when there is none)."""
    found = find(rows, **match)
    return found[0] if found else None


def over_seeds(rows: Iterable[Mapping[str, Any]], **match: Any) -> Mapping[str, Any] | None:
    """The rows matching, as one row of their means over seeds (:func:`mean_rows`; ``None``
    when none match): what a report quotes for a cell, where :func:`first` would quote only
    the first seed's row."""
    found = find(rows, **match)
    return mean_rows(found, by=list(match))[0] if found else None


def column(rows: Iterable[Mapping[str, Any]], key: str) -> list[Any]:
    """``key`` of every row (``None`` where absent)."""
    return [r.get(key) for r in rows]


def mean_rows(
    rows: Iterable[Mapping[str, Any]], by: Sequence[str], sd_of: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """One row per group of ``by`` (in first-seen order): every numeric column's mean over
    the group's rows (its seeds), ``<column>_sd`` for the columns in ``sd_of`` (``None``
    for one seed), and ``seeds``, the group's row count."""
    groups: dict[tuple, list[Mapping[str, Any]]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
    out = []
    for key, rs in groups.items():
        entry: dict[str, Any] = dict(zip(by, key, strict=True))
        numeric = {
            k
            for r in rs
            for k, v in r.items()
            if isinstance(v, int | float) and not isinstance(v, bool)
        }
        for k in sorted(numeric - set(by)):
            s = spread(r.get(k) for r in rs)
            entry[k] = s.mean
            if k in sd_of:
                entry[f"{k}_sd"] = s.sd
        for k in {k for r in rs for k, v in r.items() if isinstance(v, str)} - set(by):
            entry.setdefault(k, rs[0].get(k))
        entry["seeds"] = len(rs)
        out.append(entry)
    return out


def spread_of(row: Mapping[str, Any] | None, key: str) -> Spread:
    """The mean ± s.d. :func:`mean_rows` put in ``row`` for ``key``."""
    if row is None or row.get(key) is None:
        return Spread(None, None, 0)
    return Spread(row[key], row.get(f"{key}_sd"), int(row.get("seeds", 1)))


def as_change(s: Spread) -> Spread:
    """A spread of reductions as latency changes (negated: −20 % is 20 % faster)."""
    return Spread(-s.mean if s.mean is not None else None, s.sd, s.n)
