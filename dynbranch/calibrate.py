"""``dynbranch calibrate``: fit a profile's ``[calibration]`` knobs to measurements.

A profile's facts (model shapes, datasheet) are public; its four step-time knobs
(``bandwidth_efficiency``, ``mfu``, ``step_overhead_ms``, ``seq_overhead_us``) are what a fit
sets. Two sources of measurements, one solver:

* **Contention (paper Fig. 5b).** :func:`measure_contention` times a fixed-shape canonical
  request among co-resident fills on any engine; :func:`fit_contention` runs it on the sim
  engine (virtual clock) and fits knobs so the sim reproduces at most two of the paper's
  points (DESIGN.md §5), then reports every point.
* **A real engine.** :func:`measure_engine` times a real engine's prefill against prompt
  length and its decode step against batch size and context; :func:`fit_profile` fits the
  knobs so :meth:`Profile.step_cost` reproduces each measured step. For a local transformers
  model no shipped profile matches, so :func:`profile_from_hf` derives one from the model's
  config and a CPU "datasheet" measured by :func:`measure_cpu`.

:func:`write_profile` writes the result as a profile TOML file and proves it parses back.
The solver is a small Levenberg–Marquardt in log-knob space with bounds (no SciPy here).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import math
import random
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dynbranch.clock import Clock, Stopwatch, VirtualClock
from dynbranch.engines.profile import (
    GIB,
    PROFILE_SCHEMA_VERSION,
    Calibration,
    GpuSpec,
    ModelSpec,
    Profile,
    SchedulerLimits,
    SeqWork,
    kv_blocks_for,
    parse_profile,
)
from dynbranch.engines.protocol import SPECULATIVE, Engine, GenerateRequest, GenerateResult

STEP_KNOBS = ("bandwidth_efficiency", "mfu", "step_overhead_ms", "seq_overhead_us")
"""The calibration knobs that enter a step's time (``non_kv_memory_gib`` sizes the pool)."""
KNOB_BOUNDS = {
    "bandwidth_efficiency": (1e-4, 1.0),
    "mfu": (1e-4, 1.0),
    "step_overhead_ms": (1e-4, 1e4),
    "seq_overhead_us": (1e-3, 1e6),
}
CONTENTION_KNOBS = ("seq_overhead_us", "mfu")
"""What the contention fit moves by default (see :func:`fit_contention` for why)."""
MAX_CONTENTION_TARGETS = 2
"""DESIGN.md §5: fit on at most two of the paper's Fig. 5b points, report all."""


# -- the solver ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LsqResult:
    """Where :func:`least_squares` stopped."""

    x: tuple[float, ...]
    residuals: tuple[float, ...]
    evaluations: int
    iterations: int
    converged: bool


def least_squares(
    fun: Callable[[Sequence[float]], Sequence[float]],
    x0: Sequence[float],
    bounds: Sequence[tuple[float, float]],
    *,
    rel_step: float = 0.05,
    max_iter: int = 20,
    xtol: float = 2e-3,
    ftol: float = 1e-8,
) -> LsqResult:
    """Minimise ``sum(fun(x)**2)`` over positive ``x`` within ``bounds`` (Levenberg–Marquardt).

    NOTE: steps are taken in ``log x``: knobs span decades (µs to ms, 1e-3 to 1) and must stay
    positive. The Jacobian is a forward difference of ``rel_step`` (backward at an upper
    bound): coarse on purpose, since a simulated p50 is only piecewise smooth in the knobs.
    """
    lo, hi = np.log([b[0] for b in bounds]), np.log([b[1] for b in bounds])
    y = np.clip(np.log(np.asarray(x0, dtype=float)), lo, hi)
    evaluations = 0

    def residuals(at: np.ndarray) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        return np.asarray(fun(tuple(map(float, np.exp(at)))), dtype=float)

    r, lam, converged, iterations = residuals(y), 1e-2, False, 0
    h = math.log1p(rel_step)
    while iterations < max_iter:
        iterations += 1
        if float(r @ r) < ftol:
            converged = True
            break
        jac = np.empty((r.size, y.size))
        for j in range(y.size):
            step = h if y[j] + h <= hi[j] else -h
            probe = y.copy()
            probe[j] += step
            jac[:, j] = (residuals(probe) - r) / step
        a, g = jac.T @ jac, jac.T @ r
        for _ in range(6):
            dy = np.linalg.solve(a + lam * np.diag(np.diag(a)) + 1e-12 * np.eye(y.size), -g)
            trial = np.clip(y + dy, lo, hi)
            r_trial = residuals(trial)
            if float(r_trial @ r_trial) < float(r @ r):
                moved = float(np.max(np.abs(trial - y)))
                y, r, lam = trial, r_trial, max(lam / 3, 1e-6)
                break
            lam *= 4
        else:
            converged = True  # no direction lowers the cost: a (bounded) minimum
            break
        if moved < xtol:
            converged = True
            break
    return LsqResult(
        tuple(map(float, np.exp(y))), tuple(map(float, r)), evaluations, iterations, converged
    )


def _knob_values(profile: Profile, knobs: Sequence[str]) -> list[float]:
    unknown = [k for k in knobs if k not in KNOB_BOUNDS]
    if unknown:
        raise ValueError(f"unknown calibration knob {unknown[0]!r}; fit one of {STEP_KNOBS}")
    return [getattr(profile.calibration, k) for k in knobs]


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


_LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _vocabulary(rng: random.Random, size: int = 4096) -> list[str]:
    """Words of 1–6 letters: each, with its leading space, is one stand-in token."""
    return [" " + "".join(rng.choices(_LETTERS, k=rng.randint(1, 6))) for _ in range(size)]


def filler_text(tokens: int, rng: random.Random, vocabulary: Sequence[str]) -> str:
    """Random text of exactly ``tokens`` stand-in tokens (distinct texts share no prefix)."""
    return "".join(rng.choices(vocabulary, k=tokens))


async def _repetition(
    engine: Engine,
    clock: Clock,
    shape: ContentionShape,
    fills: int,
    context: int,
    window_s: float,
    rep: int,
    rng: random.Random,
    vocabulary: Sequence[str],
) -> tuple[float, float, list[GenerateResult]]:
    """One arrival of the canonical request: (latency, mean fill KV share, fill results)."""
    t0, u = clock.now(), (rep + 0.5) / shape.repetitions
    tag = f"r{rep}-n{fills}-c{context}"

    async def fill(i: int) -> GenerateResult:
        await clock.sleep_until(t0 + (i + u) * window_s / fills)
        prompt = filler_text(shape.fill_instruction + context, rng, vocabulary)
        request = GenerateRequest(
            f"fill-{tag}-{i}",
            prompt,
            max_tokens=shape.fill_max_tokens,
            replay_text=filler_text(shape.fill_max_tokens, rng, vocabulary),
            priority=SPECULATIVE,
        )
        return await engine.generate(request)

    tasks = [asyncio.create_task(fill(i)) for i in range(fills)]
    await clock.sleep_until(t0 + (window_s if fills else 0.0))
    canonical = GenerateRequest(
        f"canonical-{tag}",
        filler_text(shape.canonical_prompt, rng, vocabulary),
        max_tokens=shape.canonical_output,
        replay_text=filler_text(shape.canonical_output, rng, vocabulary),
    )
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
    rng = random.Random(f"{shape.seed}-{fills}-{words}")
    vocabulary = _vocabulary(rng)
    context = shape.context_tokens(words)
    latencies, shares, results = [], [], []
    for rep in range(shape.repetitions):
        latency, share, fill_results = await _repetition(
            engine, clock, shape, fills, context, window_s, rep, rng, vocabulary
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


# -- measuring a real engine ---------------------------------------------------------------


@dataclass(frozen=True)
class StepMeasurement:
    """A measured engine step (mean over ``steps``) and the sequences it ran.

    ``kind`` is ``prefill`` (one prompt alone; its first step) or ``decode`` (a batch whose
    prompts were prefilled together; the mean step from first token to last).
    """

    kind: str
    prompt_tokens: tuple[int, ...]
    output_tokens: tuple[int, ...]
    seconds: float

    @property
    def batch(self) -> int:
        return len(self.prompt_tokens)

    @property
    def context(self) -> int:
        return round(statistics.fmean(self.prompt_tokens))

    def predicted(self, profile: Profile) -> float:
        """What :meth:`Profile.step_cost` says this measurement should take."""
        if self.kind == "prefill":
            budget, left, total = profile.scheduler.max_num_batched_tokens, 0, 0.0
            while left < self.prompt_tokens[0]:  # chunked as the sim would run it
                n = min(budget, self.prompt_tokens[0] - left)
                total += profile.step_cost([SeqWork(left, n)]).total_s
                left += n
            return total
        steps = max(self.output_tokens) - 1
        costs = [
            profile.step_cost(
                [
                    SeqWork(p + k - 1, 1)
                    for p, o in zip(self.prompt_tokens, self.output_tokens, strict=True)
                    if o > k
                ]
            ).total_s
            for k in range(1, steps + 1)
        ]
        return statistics.fmean(costs)


async def _tokens_per_word(engine: Engine, rng: random.Random, vocabulary: Sequence[str]) -> float:
    probe = GenerateRequest(
        "calibrate-probe", filler_text(256, rng, vocabulary), max_tokens=1, replay_text=" x"
    )
    return (await engine.generate(probe)).prompt_tokens / 256


async def _batch(
    engine: Engine,
    tag: str,
    prompts: Sequence[str],
    max_tokens: int,
    rng: random.Random,
    vocabulary: Sequence[str],
) -> list[GenerateResult]:
    requests = [
        GenerateRequest(
            f"calibrate-{tag}-{i}",
            p,
            max_tokens=max_tokens,
            replay_text=filler_text(max_tokens, rng, vocabulary),
        )
        for i, p in enumerate(prompts)
    ]
    # NOTE: tasks created together submit before the engine's next step, so one step
    # prefills the whole batch and every later step decodes all of it.
    return list(await asyncio.gather(*(engine.generate(r) for r in requests)))


def measure_engine(
    engine_factory: Callable[[], Engine],
    clock: Clock,
    batch_sizes: Sequence[int],
    context_lengths: Sequence[int],
    *,
    decode_tokens: int = 16,
    repeats: int = 3,
    seed: int = 0,
) -> list[StepMeasurement]:
    """Prefill time for each of ``context_lengths`` (tokens, alone) and the decode step for
    each batch size × context. Each is the median of ``repeats`` runs after a warm-up.

    Prompt lengths are approximate (random words, scaled by the engine's own token count
    of a probe); every measurement carries the token counts the engine reported.
    """

    async def main() -> list[StepMeasurement]:
        rng = random.Random(seed)
        vocabulary = _vocabulary(rng)
        engine = engine_factory()
        await engine.start()
        try:
            ratio = await _tokens_per_word(engine, rng, vocabulary)
            out = []
            for kind, batch, context in [("prefill", 1, c) for c in context_lengths] + [
                ("decode", b, c) for b in batch_sizes for c in context_lengths
            ]:
                words = max(1, round(context / ratio))
                max_tokens = 1 if kind == "prefill" else decode_tokens + 1
                runs = []
                for rep in range(repeats + 1):  # the first run warms caches and allocators
                    prompts = [filler_text(words, rng, vocabulary) for _ in range(batch)]
                    results = await _batch(
                        engine,
                        f"{kind}{batch}x{context}r{rep}",
                        prompts,
                        max_tokens,
                        rng,
                        vocabulary,
                    )
                    runs.append(_step_seconds(kind, results))
                out.append(
                    StepMeasurement(
                        kind,
                        tuple(r.prompt_tokens for r in results),
                        tuple(r.output_tokens for r in results),
                        statistics.median(runs[1:]),
                    )
                )
            return out
        finally:
            await engine.shutdown()

    return clock.run(main())


def _step_seconds(kind: str, results: Sequence[GenerateResult]) -> float:
    if kind == "prefill":
        return results[0].first_token_at - results[0].first_scheduled_at
    steps = max(r.output_tokens for r in results) - 1
    return (max(r.finished_at for r in results) - min(r.first_token_at for r in results)) / max(
        1, steps
    )


@dataclass(frozen=True)
class ProfileFit:
    """What :func:`fit_profile` did: knobs and each measured point's error."""

    knobs: dict[str, tuple[float, float]]  # name → (start, fitted)
    points: tuple[dict[str, Any], ...]  # kind, batch, context, measured_s, predicted_s, error
    mape_before: float
    mape_after: float
    evaluations: int
    converged: bool

    def lines(self) -> list[str]:
        knobs = ", ".join(f"{k} {a:.4g} → {b:.4g}" for k, (a, b) in self.knobs.items())
        out = [
            f"knobs: {knobs}",
            f"mean absolute error {self.mape_before:.1%} → {self.mape_after:.1%} over "
            f"{len(self.points)} measured points",
        ]
        out += [
            f"{p['kind']:7} batch {p['batch']:3} context {p['context']:5}: measured "
            f"{p['measured_s'] * 1e3:8.3f} ms, sim {p['predicted_s'] * 1e3:8.3f} ms "
            f"({p['error']:+.1%})"
            for p in self.points
        ]
        return out


def _errors(profile: Profile, measurements: Sequence[StepMeasurement]) -> list[float]:
    return [m.predicted(profile) / m.seconds - 1 for m in measurements]


def fit_profile(
    base: Profile, measurements: Sequence[StepMeasurement], knobs: Sequence[str] = STEP_KNOBS
) -> tuple[Profile, ProfileFit]:
    """Fit ``knobs`` so the step model reproduces every measured step (relative least squares).

    The error of a point is sim ÷ measured − 1; the report gives each and their mean
    absolute value before and after.
    """
    if not measurements:
        raise ValueError("fit_profile needs at least one measurement")
    start = _knob_values(base, knobs)

    def residuals(x: Sequence[float]) -> list[float]:
        return _errors(base.with_calibration(**dict(zip(knobs, x, strict=True))), measurements)

    # NOTE: evaluations are cheap (no simulation), so iterate to a tight stop.
    bounds = [KNOB_BOUNDS[k] for k in knobs]
    result = least_squares(
        residuals, start, bounds, rel_step=1e-3, max_iter=100, xtol=1e-7, ftol=1e-20
    )
    fitted = base.with_calibration(**dict(zip(knobs, result.x, strict=True)))
    before, after = _errors(base, measurements), _errors(fitted, measurements)
    points = tuple(
        {
            "kind": m.kind,
            "batch": m.batch,
            "context": m.context,
            "measured_s": m.seconds,
            "predicted_s": m.predicted(fitted),
            "error": e,
        }
        for m, e in zip(measurements, after, strict=True)
    )
    report = ProfileFit(
        {k: (a, b) for k, a, b in zip(knobs, start, result.x, strict=True)},
        points,
        statistics.fmean(map(abs, before)),
        statistics.fmean(map(abs, after)),
        result.evaluations,
        result.converged,
    )
    return fitted, report


# -- a profile for a local transformers model on the CPU -----------------------------------


def measure_cpu(size: int = 768, copy_mib: int = 256) -> GpuSpec:
    """A CPU's "datasheet", measured: numpy float32 matmul FLOP/s and large-copy bandwidth.

    NOTE: these stand in for the datasheet peaks a GPU profile cites. The matmul uses every
    BLAS thread while the hf engine's worker uses one, and ``mfu`` absorbs the difference;
    the copy counts bytes read plus written. ``memory_gib`` is set later, from the KV budget.
    """
    a = np.random.default_rng(0).standard_normal((size, size), dtype=np.float32)
    src = np.ones(copy_mib * 2**20 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    flops, moved = [], []
    for _ in range(5):
        with Stopwatch() as sw:
            _ = a @ a
        flops.append(2 * size**3 / sw.elapsed_s)
        with Stopwatch() as sw:
            np.copyto(dst, src)
        moved.append(2 * src.nbytes / sw.elapsed_s)
    return GpuSpec(
        "CPU (measured: numpy float32 matmul and copy)",
        1.0,
        round(max(moved) / 1e9, 3),
        round(max(flops) / 1e12, 6),
    )


def _safetensors_params(model_dir: Path) -> int:
    """Parameters in the directory's safetensors files, read from their JSON headers."""
    total = 0
    for path in sorted(model_dir.glob("*.safetensors")):
        with open(path, "rb") as f:
            header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
        total += sum(math.prod(t["shape"]) for k, t in header.items() if k != "__metadata__")
    return total


def profile_from_hf(
    model_dir: str | Path,
    device: GpuSpec,
    *,
    max_batch: int = 8,
    dtype_bytes: int = 4,
    start: Calibration | None = None,
) -> Profile:
    """A profile for a local transformers model as the hf engine serves it.

    Shapes from ``config.json``; parameters counted from the safetensors headers; the
    hf engine's defaults as scheduler limits (``max_batch`` sequences, whole prompts in one
    step, a KV budget of ``max_batch`` full contexts); ``device`` from :func:`measure_cpu`,
    its memory sized so the KV pool equals that budget. ``start`` seeds the fit.
    """
    model_dir = Path(model_dir)
    cfg = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
    heads = cfg["num_attention_heads"]
    model = ModelSpec(
        name=str(model_dir.name),
        num_layers=cfg["num_hidden_layers"],
        hidden_size=cfg["hidden_size"],
        num_attention_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads", heads),
        head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        intermediate_size=cfg["intermediate_size"],
        vocab_size=cfg["vocab_size"],
        tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
        num_params=float(_safetensors_params(model_dir)),
        bytes_per_param=dtype_bytes,
        kv_bytes_per_elem=dtype_bytes,
        max_model_len=cfg["max_position_embeddings"],
    )
    scheduler = SchedulerLimits(16, 0.9, max_batch, max_batch * model.max_model_len)
    calibration = start or Calibration(0.5, 0.5, 1.0, 50.0, 0.0)
    draft = Profile(
        f"{model.name}@cpu",
        PROFILE_SCHEMA_VERSION,
        model,
        device,
        scheduler,
        calibration,
        source=str(model_dir),
    )
    pool = max_batch * kv_blocks_for(model.max_model_len, 16) * 16 * draft.kv_bytes_per_token
    # NOTE: half a block of slack so the floor in kv_pool_blocks lands on the budget.
    need = draft.weight_bytes + pool + draft.kv_bytes_per_token * 8
    memory = need / scheduler.gpu_memory_utilization / GIB
    return Profile(
        draft.name,
        draft.version,
        model,
        GpuSpec(device.name, memory, device.bandwidth_gb_s, device.peak_bf16_tflops),
        scheduler,
        calibration,
        source=str(model_dir),
    )


# -- writing a profile ---------------------------------------------------------------------


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(str(value), ensure_ascii=False)


def profile_toml(profile: Profile, header: Sequence[str] = ()) -> str:
    """``profile`` in the schema of ``dynbranch/engines/profiles/*.toml``."""
    lines = [f"# {h}".rstrip() for h in header]
    lines += ["", f"version = {profile.version}"]
    for section in ("model", "gpu", "scheduler", "calibration"):
        lines += ["", f"[{section}]"]
        lines += [f"{k} = {_toml_value(v)}" for k, v in asdict(getattr(profile, section)).items()]
    return "\n".join(lines).lstrip("\n") + "\n"


def write_profile(profile: Profile, path: str | Path, header: Sequence[str] = ()) -> Profile:
    """Write ``profile`` as TOML to ``path`` and return it parsed back (a round-trip check)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    text = profile_toml(profile, header)
    back = parse_profile(path.stem, text, str(path))
    for section in ("model", "gpu", "scheduler", "calibration"):
        if getattr(back, section) != getattr(profile, section):
            raise AssertionError(f"profile [{section}] does not survive a TOML round trip")
    path.write_text(text, encoding="utf-8")
    return back


# -- the command line ----------------------------------------------------------------------


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The ``dynbranch calibrate`` flags."""
    p.add_argument(
        "--engine",
        default="hf",
        choices=["hf", "vllm"],
        help="real engine to measure (ignored with --contention)",
    )
    p.add_argument("--model", default=None, help="model directory (hf) or model (vllm)")
    p.add_argument(
        "--base-profile",
        default=None,
        help="profile to start from (hf: derived from the model when omitted)",
    )
    p.add_argument(
        "--contention",
        action="store_true",
        help="fit the sim profile to the paper's Fig. 5b points instead",
    )
    p.add_argument("--profile", default="qwen3-32b@h200", help="sim profile (--contention)")
    p.add_argument(
        "--batch-sizes", type=_ints, default=None, help="decode batch sizes, e.g. 1,2,4,8"
    )
    p.add_argument(
        "--contexts", type=_ints, default=None, help="prompt lengths in tokens, e.g. 32,128,512"
    )
    p.add_argument("--quick", action="store_true", help="fewer repetitions and points")
    p.add_argument("--out", required=True, help="profile TOML file to write")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x.strip())


GRIDS = {
    # (batch sizes, prompt lengths): the tiny model on a CPU; a served model on a GPU.
    "hf": ((1, 2, 4, 8), (32, 128, 512)),
    "vllm": ((1, 8, 32, 128), (256, 1024, 4096)),
}
QUICK_GRIDS = {"hf": ((1, 4), (32, 256)), "vllm": ((1, 32), (256, 2048))}


def main(args: argparse.Namespace) -> int:
    """Run ``dynbranch calibrate`` with parsed ``args``; prints the fit report."""
    if args.contention:
        return _contention_main(args)
    return _engine_main(args)


def _write(
    profile: Profile, out: str, title: str, report_lines: Sequence[str], report: Mapping[str, Any]
) -> None:
    path = Path(out)
    write_profile(profile, path, [title, *report_lines])
    path.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    print("\n".join(report_lines))
    print(f"profile written to {path} (fit report: {path.with_suffix('.json')})")


def _contention_main(args: argparse.Namespace) -> int:
    from dynbranch.engines.profile import load_profile

    shape = ContentionShape(repetitions=3 if args.quick else 5)
    fitted, report = fit_contention(load_profile(args.profile), shape=shape)
    _write(
        fitted,
        args.out,
        f"{args.profile} calibrated to paper Fig. 5b (dynbranch calibrate --contention)",
        report.lines(),
        report.to_dict(),
    )
    return 0


def _engine_main(args: argparse.Namespace) -> int:
    from dynbranch.clock import RealClock
    from dynbranch.engines import make_engine
    from dynbranch.engines.profile import load_profile, load_profile_file
    from dynbranch.errors import ConfigError

    if args.model is None:
        raise ConfigError("dynbranch calibrate --engine needs --model")
    clock = RealClock()
    if args.base_profile is not None and args.base_profile.endswith(".toml"):
        base = load_profile_file(args.base_profile)
    elif args.base_profile is not None:
        base = load_profile(args.base_profile)
    elif args.engine == "hf":
        base = profile_from_hf(args.model, measure_cpu())
    else:
        raise ConfigError("dynbranch calibrate --engine vllm needs --base-profile")

    def factory() -> Engine:
        return make_engine(args.engine, profile=args.model, clock=clock, engine_id="calibrate")

    batches, contexts = (QUICK_GRIDS if args.quick else GRIDS)[args.engine]
    batches = getattr(args, "batch_sizes", None) or batches
    contexts = getattr(args, "contexts", None) or contexts
    fitted, report = fit_profile(base, measure_engine(factory, clock, batches, contexts))
    _write(
        fitted,
        args.out,
        f"{base.name} calibrated against the {args.engine} engine "
        f"serving {args.model} (dynbranch calibrate)",
        report.lines(),
        asdict(report),
    )
    return 0


__all__ = [
    "FIG5B_FIT",
    "FIG5B_TARGETS",
    "ContentionCurve",
    "ContentionFit",
    "ContentionSample",
    "ContentionShape",
    "ContentionTarget",
    "ProfileFit",
    "StepMeasurement",
    "add_arguments",
    "fit_contention",
    "fit_profile",
    "least_squares",
    "main",
    "measure_contention",
    "measure_cpu",
    "measure_engine",
    "profile_from_hf",
    "profile_toml",
    "sim_contention",
    "write_profile",
]
