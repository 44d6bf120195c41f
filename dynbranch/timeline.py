"""One request of a run, drawn as a per-stage timeline (the paper's Fig. 12 case study).

:func:`load_request` reads one request out of a replay's result files
(``stages.parquet``, ``branches.parquet``, ``requests.parquet``, ``summary.json``);
:func:`draw` draws one panel per run, stacked on a shared time axis that starts at the
request's scheduled arrival:

* one **lane per engine** the request used (target engines, drafter, tools), canonical
  executions as solid bars, speculative executions (fills) hatched;
* a **served lane** for canonical stages that ran nowhere because they were served — from
  a fill's shadow (``shadow``), by joining a fill still running (``join``) or from a C1
  record (``cache``) — each bar marked with where it came from;
* each **branch window** (opened → resolved) shaded behind the lanes;
* the request's end and latency.

With two runs (``--vs``), :func:`compare` gives the end-to-end saving and the *downstream*
time: the canonical execution the first run spent on the stages the second served from
fills — the paper's 5.75 s saved against 6.50 s of downstream work.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from dynbranch.errors import ConfigError

SERVED_LANE = "served (no engine)"
KIND_COLOURS = {"llm": "#4C72B0", "tool": "#DD8452", "human": "#8C8C8C"}
SERVED_COLOURS = {"shadow": "#55A868", "join": "#8172B3", "cache": "#C44E52"}


@dataclass(frozen=True)
class RequestTimeline:
    """One request of one run: its stage rows and branches, times from its arrival."""

    run_dir: Path
    arm: str
    request_id: str
    latency: float
    stages: pd.DataFrame  # start/end relative to arrival
    branches: pd.DataFrame  # opened_at/resolved_at relative to arrival

    @property
    def label(self) -> str:
        return f"{self.arm} ({self.run_dir.name})"


def load_request(run_dir: str | Path, request_id: str) -> RequestTimeline:
    """``request_id`` of the run in ``run_dir``; a :class:`ConfigError` naming what is
    missing otherwise."""
    d = Path(run_dir)
    for name in ("stages.parquet", "requests.parquet", "branches.parquet"):
        if not (d / name).is_file():
            raise ConfigError(f"{d}: no {name} (a replay's --out directory?)")
    requests = pd.read_parquet(d / "requests.parquet")
    match = requests[requests["request_id"] == request_id]
    if match.empty:
        some = ", ".join(requests["request_id"].head(3))
        raise ConfigError(f"{d}: no request {request_id!r} (its requests: {some}, …)")
    req = match.iloc[0]
    summary = json.loads((d / "summary.json").read_text()) if (d / "summary.json").is_file() else {}
    t0 = float(req["arrival"])
    stages = pd.read_parquet(d / "stages.parquet")
    stages = stages[stages["request_id"] == request_id].copy()
    stages[["start", "end"]] = stages[["start", "end"]] - t0
    branches = pd.read_parquet(d / "branches.parquet")
    branches = branches[branches["request_id"] == request_id].copy()
    branches[["opened_at", "resolved_at"]] = branches[["opened_at", "resolved_at"]] - t0
    latency = float(req["latency"]) if pd.notna(req["latency"]) else float(req["end"] - t0)
    return RequestTimeline(
        d, str(summary.get("arm", "?")), request_id, latency, stages.sort_values("start"), branches
    )


@dataclass(frozen=True)
class Comparison:
    """Two runs of one request: what the second saved and what the first ran instead."""

    saving_s: float  # first latency − second latency
    served_from_fills: int  # canonical stages the second run served from fills
    downstream_s: float  # the first run's execution of those same stages
    fills: int  # speculative executions in the second run
    base_seqs: frozenset[int] = frozenset()  # those stages' positions in the request


def compare(base: RequestTimeline, other: RequestTimeline) -> Comparison:
    """``other`` against ``base`` (e.g. ``full`` against the floor), stage by stage (a stage
    is the same in both runs when its position ``seq`` in the request is)."""
    s = other.stages
    served = s[s["served_from"].isin(["shadow", "join"]) & ~s["speculative"].astype(bool)]
    b = base.stages[~base.stages["speculative"].astype(bool)]
    ran = b[b["seq"].isin(served["seq"]) & (b["served_from"] == "exec")]
    return Comparison(
        base.latency - other.latency,
        len(served),
        float((ran["end"] - ran["start"]).sum()),
        int(s["speculative"].astype(bool).sum()),
        frozenset(int(q) for q in ran["seq"]),
    )


def lanes(timelines: list[RequestTimeline]) -> list[str]:
    """The lanes of every panel: engines in a stable order, then the served lane."""
    engines: set[str] = set()
    for t in timelines:
        engines |= set(t.stages.loc[t.stages["served_from"] == "exec", "engine"])
    target = sorted(e for e in engines if "target" in e)
    rest = sorted(e for e in engines if e not in target and e)
    return [*target, *rest, SERVED_LANE]


def draw(timelines: list[RequestTimeline], path: str | Path, title: str | None = None) -> None:
    """The request's timeline in each run, one panel per run, into ``path`` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = lanes(timelines)
    layouts = [_layout(t, names) for t in timelines]
    rows = [max(y for y, _ in layout.values()) + 1 if layout else 1 for layout in layouts]
    end = max(
        max(t.latency, float(t.stages["end"].max() if len(t.stages) else 0)) for t in timelines
    )
    fig, axes = plt.subplots(
        len(timelines),
        1,
        sharex=True,
        squeeze=False,
        gridspec_kw={"height_ratios": [r + 1.5 for r in rows]},
        figsize=(13, 1.6 + 0.42 * sum(r + 1.5 for r in rows)),
    )
    marked = compare(*timelines).base_seqs if len(timelines) == 2 else set()
    for i, (ax, t) in enumerate(zip(axes[:, 0], timelines, strict=True)):
        _panel(ax, t, layouts[i], rows[i], marked if i == 0 else set(), names)
    axes[-1, 0].set_xlim(-0.02 * end, end * 1.1)
    axes[-1, 0].set_xlabel("seconds from the request's scheduled arrival")
    _legend(fig, bool(marked))
    head = title or timelines[0].request_id
    if len(timelines) == 2:
        c = compare(*timelines)
        head += (
            f"\n{timelines[1].arm} saves {c.saving_s:.2f} s end to end; it served "
            f"{c.served_from_fills} stages from fills, which cost {timelines[0].arm} "
            f"{c.downstream_s:.2f} s of execution (outlined red above)"
        )
    fig.suptitle(head, fontsize=10)
    fig.tight_layout(rect=(0, 0.04, 1, 1))
    fig.savefig(path, dpi=130)
    plt.close(fig)


def _layout(t: RequestTimeline, names: list[str]) -> dict[int, tuple[int, str]]:
    """Each stage row's (y, lane): concurrent stages on one lane (a batch on an engine,
    parallel served stages) get sub-rows of their own, so no bar hides another."""
    by_lane: dict[str, list] = {name: [] for name in names}
    for s in t.stages.itertuples():
        lane = s.engine if s.served_from == "exec" and s.engine in by_lane else SERVED_LANE
        by_lane[lane].append(s)
    out: dict[int, tuple[int, str]] = {}
    y = 0
    for name in names:
        ends: list[float] = []
        for s in sorted(by_lane[name], key=lambda r: (r.start, r.end)):
            sub = next((i for i, e in enumerate(ends) if e <= s.start + 1e-9), len(ends))
            if sub == len(ends):
                ends.append(s.end)
            ends[sub] = s.end
            out[s.Index] = (y + sub, name)
        y += max(1, len(ends))
    return out


def _panel(
    ax,
    t: RequestTimeline,
    layout: dict[int, tuple[int, str]],
    rows: int,
    marked: set[int],
    names: list[str],
) -> None:
    _branches(ax, t)
    scale = max(t.latency, 1e-9)
    span = max(scale, float(t.stages["end"].max()) if len(t.stages) else 0.0) * 1.12
    for s in t.stages.itertuples():
        y, _lane = layout[s.Index]
        width = max(s.end - s.start, 0.003 * scale)
        speculative = bool(s.speculative)
        if s.served_from == "exec":
            ax.barh(
                y,
                width,
                left=s.start,
                height=0.7,
                color=KIND_COLOURS.get(s.kind, "#999999"),
                alpha=0.45 if speculative else 0.95,
                hatch="///" if speculative else None,
                edgecolor="#C00000" if s.seq in marked else "black",
                lw=2.0 if s.seq in marked else 0.4,
            )
        else:
            colour = SERVED_COLOURS.get(s.served_from, "#999999")
            ax.barh(y, width, left=s.start, height=0.7, color="white", edgecolor=colour, lw=1.4)
            ax.plot(s.end, y, marker="v", color=colour, ms=6)
        label = _label(s, speculative, width, span)
        if label:
            ax.text(s.start + width / 2, y, label, ha="center", va="center", fontsize=6.5)
    ax.axvline(t.latency, color="black", lw=1.2, ls="--")
    ax.text(t.latency, rows - 0.4, f" end {t.latency:.2f} s", fontsize=8, va="center")
    ticks: dict[str, list[int]] = {name: [] for name in names}
    for y, lane in layout.values():
        ticks[lane].append(y)
    y0, positions = 0, []
    for name in names:  # NOTE: idle lanes keep their row, so panels line up lane by lane
        ys = ticks[name] or [y0]
        positions.append((sum(ys) / len(ys), name if ticks[name] else f"{name} (idle)"))
        y0 = max(ys) + 1
        ax.axhline(max(ys) + 0.5, color="#dddddd", lw=0.6)
    ax.set_yticks([p for p, _ in positions], [n for _, n in positions], fontsize=8)
    ax.set_ylim(-0.9, rows)
    ax.invert_yaxis()
    ax.set_title(f"{t.label}: latency {t.latency:.2f} s", fontsize=9, loc="left")
    ax.grid(axis="x", alpha=0.3)


def _branches(ax, t: RequestTimeline) -> None:
    """Shade each branch window; label the first with its coordinate, the rest with their
    entry number, alternating heights so neighbouring labels do not collide."""
    for i, b in enumerate(t.branches.dropna(subset=["resolved_at"]).itertuples()):
        ax.axvspan(b.opened_at, b.resolved_at, color="#F2D16B", alpha=0.25, lw=0)
        parts = str(b.coordinate).split("/")
        label = "/".join(parts[-2:]) if i == 0 else parts[-1]
        ax.text(
            b.opened_at,
            -0.45 if i % 2 else -0.75,
            label,
            fontsize=6.5,
            color="#8a6d00",
            va="center",
        )


CHARS_ACROSS = 250
"""About how many 6.5-pt characters fit across a panel (13-inch figure): a label is drawn
only where it fits inside its bar, so neighbouring labels never run together."""


def _label(s, speculative: bool, width: float, span: float) -> str:
    """The longest of (stage + fill or served mark, stage alone) that fits in the bar."""
    extra = f" ({_short(s.fill)})" if speculative and s.fill else ""
    extra += f" [{s.served_from}]" if s.served_from != "exec" else ""
    for text in (s.stage + extra, s.stage):
        if len(text) * span / CHARS_ACROSS < width:
            return text
    return ""


def _short(text: str, n: int = 22) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


def _legend(fig, marked: bool) -> None:
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [
        Patch(color=KIND_COLOURS["llm"], label="LLM stage (canonical)"),
        Patch(color=KIND_COLOURS["tool"], label="tool stage (canonical)"),
        Patch(facecolor="white", edgecolor="black", hatch="///", label="speculative (a fill)"),
        Patch(color="#F2D16B", alpha=0.4, label="branch window, open → resolved (by entry)"),
    ]
    handles += [
        Line2D([], [], color=c, marker="v", lw=1.4, label=f"served: {k}")
        for k, c in SERVED_COLOURS.items()
    ]
    if marked:
        handles.append(
            Patch(
                facecolor="white",
                edgecolor="#C00000",
                lw=2.0,
                label="run below served it from a fill",
            )
        )
    fig.legend(handles=handles, loc="lower center", ncol=4, fontsize=7.5, frameon=False)


def describe(timelines: list[RequestTimeline]) -> str:
    """A few lines of text: each run's latency and stages; the comparison for a pair."""
    lines = []
    for t in timelines:
        s = t.stages
        served = s[s["served_from"] != "exec"]
        lines.append(
            f"{t.label}: latency {t.latency:.3f} s, {int((~s['speculative']).sum())} "
            f"canonical stages ({len(served)} served: "
            f"{', '.join(f'{k} {v}' for k, v in served['served_from'].value_counts().items()) or 'none'}), "
            f"{int(s['speculative'].sum())} speculative"
        )
    if len(timelines) == 2:
        c = compare(*timelines)
        lines.append(
            f"saving {c.saving_s:.3f} s; downstream execution {timelines[0].arm} spent "
            f"on the {c.served_from_fills} stages {timelines[1].arm} served from "
            f"fills: {c.downstream_s:.3f} s"
        )
    return "\n".join(lines)
