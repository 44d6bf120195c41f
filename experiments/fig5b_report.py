"""Fig. 5b's fixed points, its report and its plots (the measurement is :mod:`fig5b`).

The report leads with the paper's five points as ours | paper | difference and why
(:func:`experiments.report.page`); then the calibration, the reasons, both sweeps and the
hf-engine curve.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynbranch.calibrate import (
    FIG5B_FIT,
    FIG5B_TARGETS,
    FIXED_CONTEXT_WORDS,
    ContentionFit,
    ContentionShape,
)
from dynbranch.engines.profile import load_profile
from experiments.common import markdown_table
from experiments.report import Line, comparison

PROFILE = "qwen3-32b@h200"
COUNTS = (1, 2, 3, 6, 12, 24, 48)
CONTEXTS = (0, 500, 1000, 2000, 3000, 4500)
QUICK_COUNTS = (1, 3, 12, 48)
QUICK_CONTEXTS = (0, 1000, 3000, 4500)
CONTEXT_FILLS = 24
PAPER_KV_SHARE = {0: 0.03, 4500: 0.24}
"""The fills' share of the KV pool at 24 fills, none and 4,500 words of context."""
HF_SHAPE = ContentionShape(
    canonical_prompt=64,
    canonical_output=128,
    fill_instruction=16,
    fill_max_tokens=1024,
    tokens_per_word=1.0,
    repetitions=5,
)
"""The hf run: a tiny model on a CPU, so a short request and contexts in stand-in words."""
HF_COUNTS, HF_CONTEXTS, HF_CONTEXT_FILLS = (1, 4, 16, 48), (0, 100, 400), 16


def _five_points(rows: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for t in FIG5B_TARGETS:
        found = {
            r["variant"]: r
            for r in rows
            if r["engine"] == "sim" and (r["fills"], r["context_words"]) == t.point
        }
        shipped, calibrated = found.get("prior"), found.get("calibrated")
        out.append(
            {
                "point": t.label,
                "paper": f"{t.increase:+.0%}",
                "prior": f"{shipped['increase']:+.1%}" if shipped else "",
                "calibrated": f"{calibrated['increase']:+.1%}" if calibrated else "",
                "error (points)": f"{round((calibrated['increase'] - t.increase) * 100, 1) + 0.0:+.1f}"
                if calibrated
                else "",
                "fitted": "yes" if t in FIG5B_FIT else "",
                "KV share (ours)": f"{calibrated['kv_share']:.1%}" if calibrated else "",
            }
        )
    return out


def central(rows: Sequence[dict[str, Any]]) -> list[Line]:
    """The paper's five points and its two KV shares, calibrated profile against the paper."""
    out = []
    for t in FIG5B_TARGETS:
        found = {
            r["variant"]: r
            for r in rows
            if r["engine"] == "sim" and (r["fills"], r["context_words"]) == t.point
        }
        cal, prior = found.get("calibrated"), found.get("prior")
        if cal is None:
            continue
        gap = 100 * (cal["increase"] - t.increase)
        role = "fitted point" if t in FIG5B_FIT else "predicted (fitted on the other two)"
        out.append(
            Line(
                f"p50 increase, {t.label}",
                f"{cal['increase']:+.1%}",
                f"{t.increase:+.0%}",
                f"{gap:+.1f} pts; {role}; uncalibrated prior {prior['increase']:+.1%}"
                if prior
                else f"{gap:+.1f} pts; {role}",
            )
        )
    for words, paper in PAPER_KV_SHARE.items():
        r = next(
            (
                r
                for r in rows
                if r["engine"] == "sim"
                and r["variant"] == "calibrated"
                and r["sweep"] == "context"
                and r["context_words"] == words
            ),
            None,
        )
        if r is not None:
            out.append(
                Line(
                    f"fills' KV share, {CONTEXT_FILLS} fills × {words:,} words",
                    f"{r['kv_share']:.1%}",
                    f"{paper:.0%}",
                    f"{100 * (r['kv_share'] - paper):+.1f} pts; our pool is bf16 KV "
                    f"in {load_profile(PROFILE).kv_pool_tokens:,} tokens",
                )
            )
    return out


def _sweep_table(rows: Sequence[dict[str, Any]], sweep: str, engine: str = "sim") -> str:
    picked = [r for r in rows if r["sweep"] == sweep and r["engine"] == engine]
    keys = sorted({(r["fills"], r["context_words"]) for r in picked})
    table = []
    for key in keys:
        at = {r["variant"]: r for r in picked if (r["fills"], r["context_words"]) == key}
        any_row = next(iter(at.values()))
        line = {
            "fills": key[0],
            "context words": key[1],
            "fill prompt tokens": f"{any_row['fill_prompt_tokens']:.0f}",
            "paper": f"{any_row['paper_increase']:+.0%}"
            if any_row["paper_increase"] is not None
            else "",
        }
        for variant, r in at.items():
            line[f"{variant} p50 s"] = f"{r['p50_latency_s']:.2f}"
            line[f"{variant} increase"] = f"{r['increase']:+.1%}"
            line[f"{variant} KV share"] = f"{r['kv_share']:.1%}"
        table.append(line)
    columns = list(dict.fromkeys(k for line in table for k in line))
    return markdown_table(table, columns)


def report(
    rows: Sequence[dict[str, Any]],
    fit: ContentionFit,
    shape: ContentionShape,
    quick: bool,
    hf_status: str,
    timings: dict[str, float],
) -> str:
    """Fig. 5b's ``report.md``: the central table, then calibration, reasons and sweeps."""
    knobs = ", ".join(f"`{k}` {a:.4g} → **{b:.4g}**" for k, (a, b) in fit.knobs.items())
    pool = load_profile(PROFILE).kv_pool_tokens
    kv_top = next(
        (
            r["kv_share"]
            for r in rows
            if r["engine"] == "sim" and r["sweep"] == "context" and r["context_words"] == 4500
        ),
        float("nan"),
    )
    sens = [
        {"knob": k, **{label: f"{v:+.3f}" for label, v in per.items()}}
        for k, per in fit.sensitivity.items()
    ]
    lines = [
        "# Fig. 5b — co-resident fills slow a fixed-shape request",
        "",
        f"Sim engine, `{PROFILE}` profile, virtual clock, driven directly (no replay). "
        f"{'Quick run: fewer points and repetitions.' if quick else 'Full run.'}",
        "",
        "**Setup (every choice ours; the paper states none of them):** the canonical request "
        f"has a {shape.canonical_prompt:,}-token prompt and {shape.canonical_output} output "
        f"tokens (≈{_base(rows):.1f} s alone). A fill's prompt is a {shape.fill_instruction}-"
        f"token instruction plus its context (words × {shape.tokens_per_word} tokens/word, "
        "the ratio of English prose under Qwen's tokenizer; generated text counted with the "
        "stand-in tokenizer); it runs at speculative priority and may decode "
        f"{shape.fill_max_tokens:,} tokens, more than it reaches, so it stays resident until "
        "the request ends and is then aborted (no fill ended early: "
        f"{sum(r['fills_ended_early'] for r in rows if r['engine'] == 'sim')}). The fills "
        "arrive evenly staggered over one execution window H (the request's uncontended "
        "latency) before the request, fill i at (i + u)·H/n with u = (rep + ½)/reps, so the "
        "request meets fills in every phase, some still prefilling. p50 over "
        f"{shape.repetitions} repetitions. The fill-count sweep uses {FIXED_CONTEXT_WORDS:,} "
        'words of context (the paper says only "a fixed context length"). KV share: the '
        "fills' blocks over the pool, averaged over the request's output steps. No replay "
        "runs here, so no row has an oracle pair (`oracle_reduction`, `captured` empty).",
        "",
        "## Ours | paper | difference and why",
        "",
        comparison(central(rows)),
        "",
        "## The paper's five points",
        "",
        markdown_table(
            _five_points(rows),
            [
                "point",
                "paper",
                "prior",
                "calibrated",
                "error (points)",
                "fitted",
                "KV share (ours)",
            ],
        ),
        "",
        f"Calibration (`dynbranch.calibrate.fit_contention`, least squares on p50 ratios, "
        f"{fit.evaluations} sim evaluations, {'converged' if fit.converged else 'NOT converged'}"
        f"): {knobs}. Fitted on two points, the other three are predictions.",
        "",
        "Why these knobs: d increase / d ln knob at the prior profile, at the fitted points:",
        "",
        markdown_table(sens, ["knob", *[t.label for t in FIG5B_FIT]]),
        "",
        "`mfu`, `bandwidth_efficiency` and `step_overhead_ms` move the two points in nearly "
        "the same proportion (about 1 : 2.5, the price of a fill's prefill against a decode "
        "step), so only one of them can be fitted; `mfu` is kept because "
        "`bandwidth_efficiency` and `step_overhead_ms` also set the request's own decode "
        f"speed (the fit moves the request's uncontended p50 by {_base_shift(rows):+.2%}). "
        "`seq_overhead_us` moves "
        "them about 2 : 1: the one knob that prices fill *count* apart from fill context.",
        "",
        "## Why ours differ from the paper",
        "",
        "- 1–3 fills: a fill of 1,000 words costs the request at most one prefill and a "
        "little KV read per step; the paper's +4 % for a single fill suggests costs the "
        "roofline lacks (e.g. attention kernels and scheduling that change with batch size).",
        "- 24 fills, no context: after the fit, each resident sequence costs "
        f"{fit.knobs['seq_overhead_us'][1]:.0f} µs of host work per step; that fits 48 fills "
        "but overprices 24 short fills, whose cost in vLLM is more sub-linear in count.",
        f"- KV share: ours is the fills' share of the profile's {pool:,}-token pool (bf16 KV, "
        f"0.9 memory utilisation); 24 fills × 4,500 words ≈ {24 * shape.context_tokens(4500):,}"
        f" tokens of context, so {kv_top:.0%} where the paper reports 24 % — its fills' "
        "contexts must be shorter in tokens or its pool larger (e.g. an FP8 KV cache).",
        "- The jump between 2,000 and 3,000 words: once the fills' prefill backlog exceeds the "
        "window H, the rest is prefilled while the request decodes; every chunked-prefill step "
        "(~1.2 s for 8,192 tokens) stalls its decode.",
        "",
        "## Fill-count sweep",
        "",
        _sweep_table(rows, "fills"),
        "",
        f"## Context sweep ({CONTEXT_FILLS} fills)",
        "",
        _sweep_table(rows, "context"),
        "",
        "## Any real engine at hand: hf engine, tiny model, this CPU (real clock)",
        "",
    ]
    if any(r["engine"] == "hf" for r in rows):
        lines += [
            f"Not the paper's setting: a 2-layer, 64-wide Qwen3 model with random weights "
            f"(EOS suppressed), request {HF_SHAPE.canonical_prompt}+{HF_SHAPE.canonical_output}"
            f" tokens (stand-in count; the tiny tokenizer's own counts are in the tables), "
            f"{hf_status.removeprefix('ran, ')}, on a shared 2-core machine: noisy. It shows "
            "the same mechanism on a real engine, nothing about the H200.",
            "",
            _sweep_table(rows, "fills", "hf"),
            "",
            _sweep_table(rows, "context", "hf"),
        ]
    else:
        lines.append(f"Not run ({hf_status}).")
    lines += ["", "## Timings", "", ", ".join(f"{k}: {v:.0f} s" for k, v in timings.items())]
    return "\n".join(lines)


def _base(rows: Sequence[dict[str, Any]], variant: str = "prior") -> float:
    return next(r["base_p50_s"] for r in rows if r["engine"] == "sim" and r["variant"] == variant)


def _base_shift(rows: Sequence[dict[str, Any]]) -> float:
    return _base(rows, "calibrated") / _base(rows) - 1


def plot(rows: Sequence[dict[str, Any]], engine: str):
    """A writer of one engine's three panels (count sweep, context sweep, KV share)."""

    def draw(path: Path) -> None:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, axes = plt.subplots(1, 3, figsize=(16, 4.8))
        picked = [r for r in rows if r["engine"] == engine]
        variants = list(dict.fromkeys(r["variant"] for r in picked))
        for variant, color in zip(variants, ("C0", "C3", "C2"), strict=False):
            mine = [r for r in picked if r["variant"] == variant]
            _series(axes[0], mine, "fills", "fills", "increase", color, variant)
            _series(axes[1], mine, "context", "context_words", "increase", color, variant)
            _series(axes[2], mine, "context", "context_words", "kv_share", color, variant)
        if engine == "sim":
            _paper_points(axes)
        context_fills = CONTEXT_FILLS if engine == "sim" else HF_CONTEXT_FILLS
        count_context = FIXED_CONTEXT_WORDS if engine == "sim" else 100
        axes[0].set(
            xlabel="co-resident fills",
            ylabel="p50 increase over the request alone (%)",
            title=f"(a) fills with {count_context:,} words of context",
        )
        axes[1].set(
            xlabel="context per fill (words)",
            ylabel="p50 increase (%)",
            title=f"(b) {context_fills} fills, growing context",
        )
        axes[2].set(
            xlabel="context per fill (words)",
            ylabel="fills' share of the KV pool (%)",
            title=f"(c) KV held by the {context_fills} fills",
        )
        for ax in axes:
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
        title = (
            "Fig. 5b — sim qwen3-32b@h200: prior (uncalibrated) and calibrated profile vs the paper"
            if engine == "sim"
            else "Fig. 5b shape on the hf engine (tiny model, CPU, real clock) — not the "
            "paper's setting"
        )
        fig.suptitle(title)
        fig.tight_layout()
        fig.savefig(path, dpi=130)
        plt.close(fig)

    return draw


def _series(
    ax: Any, rows: Sequence[dict[str, Any]], sweep: str, x: str, y: str, color: str, label: str
) -> None:
    picked = sorted((r for r in rows if r["sweep"] == sweep), key=lambda r: r[x])
    ax.plot(
        [r[x] for r in picked],
        [r[y] * 100 for r in picked],
        "o-",
        color=color,
        label=f"ours, {label}",
    )
    fitted = [r for r in picked if r["fitted"] and y == "increase"]
    if fitted:
        ax.plot(
            [r[x] for r in fitted],
            [r[y] * 100 for r in fitted],
            "o",
            ms=14,
            mfc="none",
            color=color,
            label="fitted point",
        )


def _paper_points(axes: Sequence[Any]) -> None:
    t = {t.label: t for t in FIG5B_TARGETS}
    axes[0].plot([1, 3, 48], [4, 6, 53], "k*", ms=13, label="paper")
    axes[0].add_patch(_box(1, 4, 2, 2))
    axes[1].plot(
        [0, 4500],
        [t["24 fills, no context"].increase * 100, t["24 fills, 4,500 words"].increase * 100],
        "k*",
        ms=13,
        label="paper",
    )
    axes[2].plot(
        list(PAPER_KV_SHARE), [v * 100 for v in PAPER_KV_SHARE.values()], "k*", ms=13, label="paper"
    )


def _box(x: float, y: float, w: float, h: float) -> Any:
    from matplotlib.patches import Rectangle

    return Rectangle((x, y), w, h, color="k", alpha=0.15, label="paper: 1–3 fills, +4–6 %")
