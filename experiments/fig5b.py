"""Fig. 5b: how co-resident fills slow a fixed-shape canonical request.

p50 latency of one canonical request on the sim engine with the ``qwen3-32b@h200`` profile
(virtual clock, the engine driven directly, no replay) against (a) the number of co-resident
fills at a fixed context and (b) 24 fills whose contexts grow from none to 4,500 words, with
the fills' share of the KV pool. Run twice: with the profile's uncalibrated prior, and with a profile
that :func:`dynbranch.calibrate.fit_contention` fitted to two of the paper's five points
(48 fills; 24 fills × 4,500 words). Every point is reported against the paper; the
measurement's shapes and offsets are :class:`~dynbranch.calibrate.ContentionShape`'s.

Optionally (when torch is installed) the same curve on the ``hf`` engine serving the tiny
model on this CPU, on the real clock: "any real engine at hand", not the paper's setting.
"""

from __future__ import annotations

import dataclasses
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dynbranch.calibrate import (
    FIG5B_FIT,
    FIG5B_TARGETS,
    FIXED_CONTEXT_WORDS,
    ContentionCurve,
    ContentionSample,
    ContentionShape,
    fit_contention,
    measure_contention,
    sim_contention,
    write_profile,
)
from dynbranch.clock import Stopwatch
from dynbranch.engines.profile import Profile, load_profile
from experiments.common import ROW_FIELDS, Experiment
from experiments.fig5b_report import (
    CONTEXT_FILLS,
    CONTEXTS,
    COUNTS,
    HF_CONTEXT_FILLS,
    HF_CONTEXTS,
    HF_COUNTS,
    HF_SHAPE,
    PAPER_KV_SHARE,
    PROFILE,
    QUICK_CONTEXTS,
    QUICK_COUNTS,
    plot,
    report,
)
from experiments.pairing import no_oracle

NAME = "fig5b"


def points(quick: bool) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(the fill-count sweep, the context sweep) as (fills, context words) points."""
    counts, contexts = (QUICK_COUNTS, QUICK_CONTEXTS) if quick else (COUNTS, CONTEXTS)
    return ([(n, FIXED_CONTEXT_WORDS) for n in counts], [(CONTEXT_FILLS, w) for w in contexts])


def measure(profile: Profile, quick: bool, shape: ContentionShape) -> ContentionCurve:
    """Both sweeps on the sim engine with ``profile`` (each distinct point measured once)."""
    count_sweep, context_sweep = points(quick)
    return sim_contention(profile, list(dict.fromkeys(count_sweep + context_sweep)), shape)


def curve_rows(
    curve: ContentionCurve,
    variant: str,
    engine: str,
    profile: str,
    shape: ContentionShape,
    fitted: Sequence[tuple[int, int]] = (),
    count_context: int = FIXED_CONTEXT_WORDS,
    context_fills: int = CONTEXT_FILLS,
) -> list[dict[str, Any]]:
    """One row per sweep point, the request alone first (increase 0)."""
    paper = {t.point: t.increase for t in FIG5B_TARGETS} if engine == "sim" else {}
    rows = []
    for sample in [curve.base, *curve.samples]:
        point = (sample.fills, sample.context_words)
        sweeps = ["fills"] if sample.fills == 0 else []
        sweeps += ["fills"] * (sample.context_words == count_context and sample.fills > 0)
        sweeps += ["context"] * (sample.fills == context_fills)
        for sweep in sweeps:
            rows.append(
                _row(
                    curve,
                    sample,
                    variant,
                    engine,
                    profile,
                    shape,
                    sweep,
                    paper.get(point),
                    point in fitted,
                )
            )
    return rows


def _row(
    curve: ContentionCurve,
    s: ContentionSample,
    variant: str,
    engine: str,
    profile: str,
    shape: ContentionShape,
    sweep: str,
    paper: float | None,
    fitted: bool,
) -> dict[str, Any]:
    """One point as a row. The measurement's own fills are issued and all discarded
    (aborted when the request ends); nothing is reused, spliced or scored."""
    lat = np.array(s.latencies_s)
    issued = s.fills * len(lat)
    row: dict[str, Any] = dict.fromkeys(ROW_FIELDS)
    row.update(
        workload="canonical-request",
        arm="floor",
        variant=variant,
        rate=None,
        requests=len(lat),
        seed=shape.seed,
        engine=engine,
        profile=profile,
        sweep=sweep,
        fills=s.fills,
        context_words=s.context_words,
        context_tokens=s.context_tokens,
        fill_prompt_tokens=s.fill_prompt_tokens,
        mean_latency_s=float(lat.mean()),
        p50_latency_s=s.p50_s,
        p99_latency_s=float(np.percentile(lat, 99)),
        base_p50_s=curve.base.p50_s,
        increase=curve.increase(s),
        paper_increase=paper,
        fitted=fitted,
        kv_share=s.kv_share,
        paper_kv_share=PAPER_KV_SHARE.get(s.context_words)
        if (engine == "sim" and s.fills == CONTEXT_FILLS and sweep == "context")
        else None,
        fills_ended_early=s.fills_ended_early,
        completed=len(lat),
        failed=0,
        unsafe_splices=0,
        fills_issued=issued,
        fills_consumed=0,
        fills_discarded=issued,
    )
    return row


def hf_curve(quick: bool) -> tuple[ContentionCurve | None, str]:
    """The tiny model on the hf engine (real clock); ``None`` and why when it cannot run."""
    try:
        import torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        return None, f"skipped: {e}"
    from dynbranch.clock import RealClock
    from dynbranch.engines.hf import HFEngine
    from dynbranch.models.tiny import SUPPRESS_BIAS, make_tiny

    counts = HF_COUNTS[::2] + HF_COUNTS[-1:] if quick else HF_COUNTS
    shape = dataclasses.replace(HF_SHAPE, repetitions=3) if quick else HF_SHAPE
    sweep = [(n, 100) for n in counts] + [(HF_CONTEXT_FILLS, w) for w in HF_CONTEXTS]
    with tempfile.TemporaryDirectory() as tmp:
        # NOTE: EOS suppressed, so the canonical request always decodes its full output and
        # the fills keep running until they are aborted: fixed shapes, as on the sim.
        model = make_tiny(Path(tmp) / "tiny-endless", eos_bias=-SUPPRESS_BIAS)
        clock = RealClock()
        curve = measure_contention(
            lambda: HFEngine(model, clock, "fig5b-hf", max_batch=64),
            clock,
            list(dict.fromkeys(sweep)),
            shape,
        )
    return curve, f"ran, {shape.repetitions} repetitions"


# -- the experiment --------------------------------------------------------------------------


PRIOR = {"mfu": 0.5, "seq_overhead_us": 15.0}
"""The profile's knobs before calibration (datasheet-based assumptions; see its TOML)."""


def run(
    quick: bool, out: Path, hf: bool = True, shape: ContentionShape | None = None
) -> Experiment:
    """Fig. 5b: prior (uncalibrated) and calibrated sim profiles, every point against the paper.

    Also writes the calibrated profile (``qwen3-32b@h200-fig5b.toml``) into ``out``. ``hf``
    adds the hf-engine curve when torch is installed; ``shape`` replaces the measurement's
    shapes (tests use a small one).
    """
    shape = shape or ContentionShape(repetitions=3 if quick else 7)
    # NOTE: the shipped profile already carries this fit; start from its datasheet-only prior
    # so the report shows the curve before and after calibration.
    shipped = load_profile(PROFILE).with_calibration(**PRIOR)
    timings: dict[str, float] = {}
    with Stopwatch() as sw:
        prior_curve = measure(shipped, quick, shape)
    timings["prior curve"] = sw.elapsed_s
    with Stopwatch() as sw:
        calibrated, fit = fit_contention(shipped, FIG5B_FIT, shape=shape)
    timings["calibration"] = sw.elapsed_s
    with Stopwatch() as sw:
        calibrated_curve = measure(calibrated, quick, shape)
    timings["calibrated curve"] = sw.elapsed_s
    fitted = [t.point for t in FIG5B_FIT]
    rows = curve_rows(prior_curve, "prior", "sim", PROFILE, shape)
    rows += curve_rows(calibrated_curve, "calibrated", "sim", f"{PROFILE}-fig5b", shape, fitted)
    hf_status = "disabled"
    if hf:
        with Stopwatch() as sw:
            curve, hf_status = hf_curve(quick)
        timings["hf curve"] = sw.elapsed_s
        if curve is not None:
            rows += curve_rows(
                curve,
                "hf-tiny-cpu",
                "hf",
                "tiny (hf, CPU)",
                HF_SHAPE,
                count_context=100,
                context_fills=HF_CONTEXT_FILLS,
            )
    out.mkdir(parents=True, exist_ok=True)
    write_profile(
        calibrated,
        out / f"{PROFILE}-fig5b.toml",
        [f"{PROFILE} calibrated to paper Fig. 5b by experiments/fig5b", *fit.lines()],
    )
    paper = {
        "fills_at_fixed_context": {"1-3": [0.04, 0.06], "48": 0.53},
        "context_words_at_24_fills": {"0": 0.11, "4500": 1.45},
        "kv_share_at_24_fills": {str(k): v for k, v in PAPER_KV_SHARE.items()},
        "fit": fit.to_dict(),
        "shape": dataclasses.asdict(shape),
    }
    plots = {"fig5b.png": plot(rows, "sim")}
    if any(r["engine"] == "hf" for r in rows):
        plots["fig5b_hf.png"] = plot(rows, "hf")
    text = report(rows, fit, shape, quick, hf_status, timings)
    no_oracle(rows, "the engine driven directly: no replay, no oracle pair")
    return Experiment(NAME, rows, paper, text, plots)


__all__ = ["curve_rows", "hf_curve", "measure", "points", "run"]
