"""Fig. 5b: a canonical request among co-resident fills, measured and fitted."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from dynbranch.calibrate.filler import FillerText
from dynbranch.calibrate.solver import (
    CONTENTION_KNOBS,
    KNOB_BOUNDS,
    MAX_CONTENTION_TARGETS,
    STEP_KNOBS,
    _knob_values,
    least_squares,
)
from dynbranch.clock import Clock, VirtualClock
from dynbranch.engines.profile import (
    Profile,
)
from dynbranch.engines.protocol import SPECULATIVE, Engine, GenerateResult

# -- Fig. 5b: a canonical request among co-resident fills ------------------------------------


@dataclass(frozen=True)
class ContentionShape:
    """The fixed shapes of the Fig. 5b measurement (every choice is stated here).

    The canonical request has ``canonical_prompt`` prompt and ``canonical_output`` output
    tokens. A fill's prompt is ``fill_instruction`` tokens plus its context (words ×
    ``tokens_per_word``, the ratio of English prose under Qwen's tokenizer); it may decode
    ``fill_max_tokens`` tokens, more than it can reach while the canonical request runs, so
    every fill stays resident for the whole request and is aborted when the request ends.
    Fills run at speculative priority, as DynBranch submits them.

    Offsets: the fills of one repetition arrive evenly staggered over the *execution window*
    ``H`` before the canonical request (H = its uncontended latency, the window DESIGN §3
    uses to estimate co-residency), fill ``i`` at ``(i + u) H / n``, with ``u = (rep + ½) /
    repetitions``. So a request meets fills in every phase: long resident and decoding, or
    still prefilling. The p50 is over ``repetitions`` such arrivals.
    """

    canonical_prompt: int = 1024
    canonical_output: int = 512
    fill_instruction: int = 128
    fill_max_tokens: int = 2048
    tokens_per_word: float = 1.33
    repetitions: int = 5
    seed: int = 0

    def context_tokens(self, words: int) -> int:
        return round(words * self.tokens_per_word)


@dataclass(frozen=True)
class ContentionSample:
    """One point of Fig. 5b: the canonical request's latencies among ``fills`` fills."""

    fills: int
    context_words: int
    context_tokens: int  # stand-in tokens asked for; the engine's own count is below
    latencies_s: tuple[float, ...]
    kv_share: float  # the fills' mean share of the KV pool while the request ran
    fill_prompt_tokens: float  # a fill's prompt as the engine counted it (mean)
    fills_ended_early: int  # fills that finished before the request did (should be 0)

    @property
    def p50_s(self) -> float:
        return statistics.median(self.latencies_s)


@dataclass(frozen=True)
class ContentionCurve:
    """Samples of one engine, each against the same uncontended baseline."""

    base: ContentionSample
    samples: tuple[ContentionSample, ...]

    def increase(self, sample: ContentionSample) -> float:
        """The fractional p50 increase over the request alone."""
        return sample.p50_s / self.base.p50_s - 1.0


async def _repetition(
    engine: Engine,
    clock: Clock,
    shape: ContentionShape,
    fills: int,
    context: int,
    window_s: float,
    rep: int,
    filler: FillerText,
) -> tuple[float, float, list[GenerateResult]]:
    """One arrival of the canonical request: (latency, mean fill KV share, fill results)."""
    t0, u = clock.now(), (rep + 0.5) / shape.repetitions
    tag = f"r{rep}-n{fills}-c{context}"

    async def fill(i: int) -> GenerateResult:
        await clock.sleep_until(t0 + (i + u) * window_s / fills)
        prompt = filler.text(shape.fill_instruction + context)
        request = filler.request(f"fill-{tag}-{i}", prompt, shape.fill_max_tokens, SPECULATIVE)
        return await engine.generate(request)

    tasks = [asyncio.create_task(fill(i)) for i in range(fills)]
    await clock.sleep_until(t0 + (window_s if fills else 0.0))
    prompt = filler.text(shape.canonical_prompt)
    canonical = filler.request(f"canonical-{tag}", prompt, shape.canonical_output)
    start, shares, result = clock.now(), [], None
    async for chunk in engine.generate_stream(canonical):
        snap = engine.load()
        shares.append(snap.spec_kv_blocks / snap.kv_blocks_total if snap.kv_blocks_total else 0)
        result = chunk.result
    assert result is not None
    for i in range(fills):
        await engine.abort(f"fill-{tag}-{i}")
    fill_results = list(await asyncio.gather(*tasks))
    return result.finished_at - start, statistics.fmean(shares), fill_results


async def _sample(
    engine: Engine, clock: Clock, shape: ContentionShape, fills: int, words: int, window_s: float
) -> ContentionSample:
    filler = FillerText(random.Random(f"{shape.seed}-{fills}-{words}"))
    context = shape.context_tokens(words)
    latencies, shares, results = [], [], []
    for rep in range(shape.repetitions):
        latency, share, fill_results = await _repetition(
            engine, clock, shape, fills, context, window_s, rep, filler
        )
        latencies.append(latency)
        shares.append(share)
        results += fill_results
    return ContentionSample(
        fills,
        words,
        context,
        tuple(latencies),
        statistics.fmean(shares),
        statistics.fmean(r.prompt_tokens for r in results) if results else 0.0,
        sum(r.finish_reason != "abort" for r in results),
    )


def measure_contention(
    engine_factory: Callable[[], Engine],
    clock: Clock,
    points: Iterable[tuple[int, int]],
    shape: ContentionShape = ContentionShape(),
) -> ContentionCurve:
    """Fig. 5b on any engine: the request alone, then among (fills, context words) ``points``.

    ``engine_factory`` makes a fresh engine bound to ``clock``; one engine serves every
    repetition (each ends with every fill aborted, so the engine is idle again).
    """

    async def main() -> ContentionCurve:
        engine = engine_factory()
        await engine.start()
        try:
            # NOTE: one unmeasured request first: a real engine's first steps pay one-off
            # costs (allocations, kernel selection) that would inflate the baseline.
            warm_up = dataclasses.replace(shape, repetitions=1, seed=shape.seed + 7919)
            await _sample(engine, clock, warm_up, 0, 0, 0.0)
            base = await _sample(engine, clock, shape, 0, 0, 0.0)
            samples = [await _sample(engine, clock, shape, n, w, base.p50_s) for n, w in points]
        finally:
            await engine.shutdown()
        return ContentionCurve(base, tuple(samples))

    return clock.run(main())


def sim_contention(
    profile: Profile, points: Iterable[tuple[int, int]], shape: ContentionShape = ContentionShape()
) -> ContentionCurve:
    """:func:`measure_contention` on the sim engine with ``profile``, on a virtual clock."""
    from dynbranch.engines.sim import SimEngine

    clock = VirtualClock()
    return measure_contention(lambda: SimEngine(profile, clock, "calibrate"), clock, points, shape)


# -- fitting the sim to the paper's Fig. 5b ------------------------------------------------


@dataclass(frozen=True)
class ContentionTarget:
    """One of the paper's Fig. 5b points: ``fills`` fills of ``context_words`` → increase."""

    label: str
    fills: int
    context_words: int
    increase: float

    @property
    def point(self) -> tuple[int, int]:
        return (self.fills, self.context_words)


FIXED_CONTEXT_WORDS = 1000
"""The context of the fill-count sweep. NOTE: the paper says only "a fixed context length";
1,000 words (~1,330 tokens) is a ReAct observation of a few passages, mid-range of its
context sweep."""
FIG5B_TARGETS = (
    ContentionTarget("1 fill", 1, FIXED_CONTEXT_WORDS, 0.04),
    ContentionTarget("3 fills", 3, FIXED_CONTEXT_WORDS, 0.06),
    ContentionTarget("48 fills", 48, FIXED_CONTEXT_WORDS, 0.53),
    ContentionTarget("24 fills, no context", 24, 0, 0.11),
    ContentionTarget("24 fills, 4,500 words", 24, 4500, 1.45),
)
"""The paper's five Fig. 5b latency points (DESIGN.md §5); "1–3 fills +4–6 %" read as its
two ends. The fills' KV share (3 % → 24 %) is reported beside them, not fitted."""
FIG5B_FIT = (FIG5B_TARGETS[2], FIG5B_TARGETS[4])
"""The two points fitted by default: one dominated by fill count, one by fill context."""


@dataclass(frozen=True)
class PointError:
    """A target against the sim, before and after the fit."""

    label: str
    fills: int
    context_words: int
    target: float
    before: float
    after: float
    kv_share: float
    fitted: bool

    @property
    def error(self) -> float:
        """After the fit: our increase − the paper's, in fractions (0.10 = 10 points)."""
        return self.after - self.target

    @property
    def latency_error(self) -> float:
        """After the fit: our p50 ÷ the paper's implied p50 − 1."""
        return (1 + self.after) / (1 + self.target) - 1


@dataclass(frozen=True)
class ContentionFit:
    """What :func:`fit_contention` did: knobs, every point's error, why these knobs."""

    knobs: dict[str, tuple[float, float]]  # name → (start, fitted)
    points: tuple[PointError, ...]
    sensitivity: dict[str, dict[str, float]]  # knob → target label → d increase / d ln knob
    evaluations: int
    converged: bool

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        for p, row in zip(self.points, out["points"], strict=True):
            row.update(error=p.error, latency_error=p.latency_error)
        return out

    def lines(self) -> list[str]:
        knobs = ", ".join(f"{k} {a:.4g} → {b:.4g}" for k, (a, b) in self.knobs.items())
        out = [
            f"knobs: {knobs} ({self.evaluations} sim evaluations, "
            f"{'converged' if self.converged else 'not converged'})"
        ]
        out += [
            f"{p.label}: paper {p.target:+.0%}, sim {p.before:+.1%} → {p.after:+.1%} "
            f"(error {round(p.error * 100, 1) + 0.0:+.1f} points{', fitted' if p.fitted else ''})"
            for p in self.points
        ]
        return out


def _increases(
    profile: Profile, targets: Sequence[ContentionTarget], shape: ContentionShape
) -> tuple[list[float], list[float]]:
    curve = sim_contention(profile, [t.point for t in targets], shape)
    return [curve.increase(s) for s in curve.samples], [s.kv_share for s in curve.samples]


def fit_contention(
    profile: Profile,
    targets: Sequence[ContentionTarget] = FIG5B_FIT,
    *,
    knobs: Sequence[str] = CONTENTION_KNOBS,
    report_on: Sequence[ContentionTarget] = FIG5B_TARGETS,
    shape: ContentionShape = ContentionShape(),
    sensitivity: bool = True,
) -> tuple[Profile, ContentionFit]:
    """Fit ``knobs`` so the sim reproduces ``targets`` (≤ 2 paper points); report ``report_on``.

    Residual of a point: our p50 ÷ the paper's implied p50 − 1, i.e. ``(1 + ours) / (1 +
    paper) − 1``.

    Why ``seq_overhead_us`` and ``mfu`` by default: in the step model a co-resident fill costs
    the canonical request in two ways only — every decode step carries it (its KV read, its
    per-sequence host work), and its prefill chunks share steps with the request's decodes.
    The ``sensitivity`` table (d increase / d ln knob at the start, every step knob) shows two
    directions. ``mfu`` and ``bandwidth_efficiency`` pull one lever with opposite signs: the
    price of a compute-bound prefill chunk against a memory-bound decode step (the KV read
    scales with the same bandwidth as the weight read, so it cancels in a relative increase).
    Their columns are nearly collinear, so only one can be fitted; ``mfu`` is kept because
    ``bandwidth_efficiency`` also sets the request's own decode speed. ``seq_overhead_us`` is
    the knob that prices fill *count* apart from context; ``step_overhead_ms`` moves every
    point alike.
    """
    if not 0 < len(targets) <= MAX_CONTENTION_TARGETS:
        raise ValueError(
            f"fit on 1 to {MAX_CONTENTION_TARGETS} Fig. 5b points (DESIGN.md §5), "
            f"got {len(targets)}"
        )
    start = _knob_values(profile, knobs)
    everything = list(dict.fromkeys([*targets, *report_on]))
    before, _ = _increases(profile, everything, shape)
    table: dict[str, dict[str, float]] = {}
    if sensitivity:
        for knob in STEP_KNOBS:
            value = getattr(profile.calibration, knob)
            moved, _ = _increases(profile.with_calibration(**{knob: value * 1.1}), targets, shape)
            table[knob] = {
                t.label: (m - b) / math.log(1.1)
                for t, m, b in zip(targets, moved, before, strict=False)
            }

    def residuals(x: Sequence[float]) -> list[float]:
        ours, _ = _increases(
            profile.with_calibration(**dict(zip(knobs, x, strict=True))), targets, shape
        )
        return [(1 + o) / (1 + t.increase) - 1 for o, t in zip(ours, targets, strict=True)]

    result = least_squares(residuals, start, [KNOB_BOUNDS[k] for k in knobs])
    fitted = profile.with_calibration(**dict(zip(knobs, result.x, strict=True)))
    after, shares = _increases(fitted, everything, shape)
    points = tuple(
        PointError(t.label, t.fills, t.context_words, t.increase, b, a, s, t in targets)
        for t, b, a, s in zip(everything, before, after, shares, strict=True)
    )
    report = ContentionFit(
        {k: (a, b) for k, a, b in zip(knobs, start, result.x, strict=True)},
        points,
        table,
        result.evaluations,
        result.converged,
    )
    return fitted, report


