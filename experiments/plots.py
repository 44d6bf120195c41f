"""Plot helpers every experiment shares: ours beside the paper, error bars ±1 s.d. over seeds.

A single seed draws no error bar (there is no spread to draw); the paper's value is a grey
bar beside ours, or, when the paper gives a range, a grey band from its low to its high end.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from experiments.stats import Spread

PaperValue = float | tuple[float, float] | None
OURS, PAPER = "C0", "0.6"


def pyplot() -> Any:
    """matplotlib's pyplot on the Agg backend (no display here)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def bars_vs_paper(
    ax: Any,
    labels: Sequence[str],
    ours: Sequence[Spread],
    paper: Sequence[PaperValue],
    scale: float = 100.0,
    ours_label: str = "ours",
    paper_label: str = "paper",
) -> None:
    """Our spreads (mean, ±1 s.d.) as bars beside the paper's values or ranges."""
    x = np.arange(len(labels))
    means = [scale * s.mean if s.mean is not None else np.nan for s in ours]
    errs = [scale * s.sd if s.sd is not None else 0.0 for s in ours]
    has_err = any(s.sd is not None for s in ours)
    ax.bar(
        x - 0.2,
        means,
        0.4,
        yerr=errs if has_err else None,
        capsize=3,
        color=OURS,
        label=ours_label + (" (±1 s.d.)" if has_err else ""),
    )
    drew_band = drew_bar = False
    for xi, p in zip(x, paper, strict=True):
        if p is None:
            continue
        if isinstance(p, tuple):
            lo, hi = sorted(p)
            ax.bar(
                xi + 0.2,
                scale * (hi - lo),
                0.4,
                bottom=scale * lo,
                color=PAPER,
                alpha=0.5,
                label=None if drew_band else f"{paper_label} (range)",
            )
            drew_band = True
        else:
            ax.bar(xi + 0.2, scale * p, 0.4, color=PAPER, label=None if drew_bar else paper_label)
            drew_bar = True
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xticks(x, labels, fontsize=8)
    ax.legend(fontsize=7)


def line_with_sd(
    ax: Any,
    x: Sequence[float],
    ys: Sequence[Spread],
    label: str,
    style: str = "o-",
    scale: float = 1.0,
) -> None:
    """A line of means with ±1 s.d. error bars (none for single-seed points)."""
    mean = [scale * s.mean if s.mean is not None else np.nan for s in ys]
    err = [scale * s.sd if s.sd is not None else 0.0 for s in ys]
    if any(s.sd is not None for s in ys):
        ax.errorbar(x, mean, yerr=err, fmt=style, capsize=3, label=label + " (±1 s.d.)")
    else:
        ax.plot(x, mean, style, label=label)


def save(fig: Any, path: Any, dpi: int = 120) -> None:
    """Lay out, write and close ``fig``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
