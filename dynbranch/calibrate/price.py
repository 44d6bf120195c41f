"""Checking C3's contention price against the sim engine it is derived from.

:class:`~dynbranch.gate.ContentionModel` prices a fill as the delay it adds to the canonical
sequences it shares steps with over its whole life (its prefill chunks and every decode
step). This check measures exactly that on the real
:class:`~dynbranch.engines.sim.SimEngine` on a :class:`~dynbranch.clock.VirtualClock`
(deterministic, seconds of wall time): the latency of one canonical request while ``k``
fills run inside it, for Fig. 5b's fill counts (:data:`FILL_COUNTS`), the p50 of the
latency increase over several entry phases, and fits the model's one ``scale`` factor by
least squares. It is not the Fig. 5b calibration of the sim profile against the paper
(:mod:`~dynbranch.calibrate.contention`): there the fills outlive the request and are
aborted with it, here each fill's whole life nests inside the request, as the price assumes.

Geometry: the canonical request is submitted first; after it has streamed ``phase`` tokens
the fills enter one after another (each is submitted once the previous one has its first
token), so every fill's prefill and all its decode steps fall inside the canonical
request's decode. The run checks that nesting and refuses a shape that breaks it.

NOTE: this module drives the (asyncio) engine only through ``await`` on its streams, so
it needs no event-loop API of its own; the gate proper (:mod:`dynbranch.gate`) never
imports it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from dynbranch.calibrate.contention import FIG5B_TARGETS, FIXED_CONTEXT_WORDS
from dynbranch.calibrate.filler import FillerText
from dynbranch.clock import VirtualClock
from dynbranch.engines.profile import Profile
from dynbranch.engines.protocol import SPECULATIVE, GenerateChunk
from dynbranch.engines.sim import SimEngine
from dynbranch.gate.load import LoadBudget, LoadView
from dynbranch.gate.price import ContentionModel, FillShape

FILL_COUNTS = (0, 1, 2, 3, 6, 12, 24, 48)
"""Co-resident fill counts of the paper's Fig. 5b."""
DEFAULT_FILL = FillShape(prompt_tokens=256, output_tokens=32)
DEFAULT_PHASES = (1, 9, 17)
SEED = 0
"""Seed of the filler text (only token counts matter to the sim, not the words)."""


@dataclass(frozen=True)
class PricePoint:
    """One co-resident fill count: the engine's measured p50 increase and the model's."""

    fills: int
    baseline_ms: float  # p50 canonical latency with no fills
    measured_ms: float  # p50 latency increase the engine produced
    predicted_ms: float  # the model's increase at scale 1
    fitted_ms: float  # the model's increase at the fitted scale

    @property
    def error_ms(self) -> float:
        """The fitted model's increase minus the measured one."""
        return self.fitted_ms - self.measured_ms

    @property
    def rel_error(self) -> float:
        """:attr:`error_ms` as a fraction of the measured increase (0 when none was)."""
        return self.error_ms / self.measured_ms if self.measured_ms else 0.0

    @property
    def increase_pct(self) -> float:
        """The measured increase in percent of the baseline latency."""
        return 100.0 * self.measured_ms / self.baseline_ms


@dataclass(frozen=True)
class PriceCalibration:
    """The fitted scale and the per-point fit."""

    profile: str
    canonical: FillShape
    fill: FillShape
    scale: float
    points: tuple[PricePoint, ...]

    @property
    def rms_rel_error(self) -> float:
        """Root mean square of the points' relative errors (fill counts above zero)."""
        errs = [p.rel_error for p in self.points if p.fills > 0]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0

    @property
    def max_abs_rel_error(self) -> float:
        """The largest absolute relative error (fill counts above zero)."""
        return max((abs(p.rel_error) for p in self.points if p.fills > 0), default=0.0)

    def table(self) -> str:
        """A plain-text report, with the paper's Fig. 5b fill-count points beside ours.

        NOTE: the paper's points have a fixed context of :data:`FIXED_CONTEXT_WORDS` words
        per fill; they show the scale of the effect, not a target of this check.
        """
        paper = {
            t.fills: t.increase for t in FIG5B_TARGETS if t.context_words == FIXED_CONTEXT_WORDS
        }
        lines = [
            f"calibration of {self.profile}: canonical {_shape(self.canonical)}, "
            f"fill {_shape(self.fill)}",
            f"fitted scale {self.scale:.4f}; rms rel error {100 * self.rms_rel_error:.2f} %, "
            f"max {100 * self.max_abs_rel_error:.2f} %",
            "  fills  baseline_ms  measured_ms  model_ms(s=1)  fitted_ms  err_%  increase_%  paper_%",
        ]
        for p in self.points:
            shown = f"+{100 * paper[p.fills]:g}" if p.fills in paper else ""
            lines.append(
                f"  {p.fills:>5}  {p.baseline_ms:>11.1f}  {p.measured_ms:>11.2f}  "
                f"{p.predicted_ms:>13.2f}  {p.fitted_ms:>9.2f}  {100 * p.rel_error:>5.2f}  "
                f"{p.increase_pct:>10.2f}  {shown:>7}"
            )
        return "\n".join(lines)


def _shape(s: FillShape) -> str:
    ctx = f" + {s.context_tokens} cached" if s.context_tokens else ""
    return f"{s.prompt_tokens} prompt{ctx} / {s.output_tokens} output tokens"


def canonical_output_for(fill: FillShape, fills: int, phase: int, profile: Profile) -> int:
    """Output tokens a canonical request needs for ``fills`` fills to nest inside it."""
    chunks = math.ceil(fill.prompt_tokens / profile.scheduler.max_num_batched_tokens)
    # NOTE: a fill submitted while a step runs is scheduled in the step after: up to
    # 1 + chunks steps per entry.
    return phase + fills * (1 + chunks) + fill.output_tokens + 8


async def _last(stream: AsyncIterator[GenerateChunk]) -> GenerateChunk:
    chunk = None
    async for chunk in stream:  # noqa: B007 - the last one is the point
        pass
    assert chunk is not None and chunk.result is not None
    return chunk


async def _canonical_latency(
    engine: SimEngine, canonical: FillShape, fill: FillShape, k: int, phase: int
) -> float:
    """Latency (s) of one canonical request with ``k`` fills entering after ``phase`` tokens."""
    filler = FillerText(random.Random(SEED))
    await engine.start()
    prefix = filler.text(fill.context_tokens) if fill.context_tokens else ""
    if prefix:  # warm the prefix cache: the fills' context is then read, not recomputed
        await engine.generate(filler.request("warm", prefix, 1))
    prompt = filler.text(canonical.prompt_tokens)
    canon = engine.generate_stream(filler.request("canonical", prompt, canonical.output_tokens))
    for _ in range(phase):
        await anext(canon)
    streams = []
    for j in range(k):
        prompt = prefix + filler.text(fill.prompt_tokens)
        stream = engine.generate_stream(
            filler.request(f"fill{j}", prompt, fill.output_tokens, SPECULATIVE)
        )
        await anext(stream)
        streams.append(stream)
    result = (await _last(canon)).result
    load = engine.load()
    for stream in streams:
        await stream.aclose()  # aborts nothing: every fill has finished (checked below)
    await engine.shutdown()
    if load.spec_running or load.spec_waiting:
        raise ValueError(
            f"{k} fills of {_shape(fill)} outlive a canonical request of "
            f"{canonical.output_tokens} output tokens; make it longer"
        )
    assert result is not None
    return result.finished_at - result.arrived_at


def measure_latency(
    profile: Profile, canonical: FillShape, fill: FillShape, k: int, phase: int
) -> float:
    """One deterministic sim run: the canonical request's latency in seconds."""
    clock = VirtualClock()
    engine = SimEngine(profile, clock, "calibrate")
    return clock.run(_canonical_latency(engine, canonical, fill, k, phase))


def predicted_increase_ms(model: ContentionModel, fill: FillShape, k: int) -> float:
    """The model's delay to one canonical sequence from ``k`` fills entering one by one.

    Fill ``j`` is priced at the load it actually joins: the one canonical sequence and the
    earlier fills still decoding. Entries are ``1 + chunks`` steps apart (see
    :func:`canonical_output_for`), so about ``output_tokens / (1 + chunks)`` earlier fills
    are still resident.
    """
    budget = model.budget
    one = 1.0 / budget.max_num_seqs  # rho of a single canonical sequence
    blocks = fill.kv_blocks(budget.block_size)
    chunks = math.ceil(fill.prompt_tokens / model.max_num_batched_tokens)
    resident_max = math.ceil(fill.output_tokens / (1 + chunks))
    total = 0.0
    for j in range(k):
        resident = min(j, resident_max)
        view = LoadView(
            o_fill=min(1.0, resident / budget.fill_slots),
            o_kv=min(1.0, resident * blocks / budget.spec_kv_blocks),
            rho=one,
        )
        total += model.delay_per_canonical_ms(fill, view)
    return total


def fit_scale(predicted: Sequence[float], measured: Sequence[float]) -> float:
    """Least-squares ``s`` minimising ``sum (s * predicted - measured)^2``."""
    den = sum(x * x for x in predicted)
    if den == 0.0:
        raise ValueError("nothing to fit: the model predicts no increase at any point")
    return sum(x * y for x, y in zip(predicted, measured, strict=True)) / den


def calibrate_price(
    profile: Profile,
    *,
    canonical: FillShape | None = None,
    fill: FillShape = DEFAULT_FILL,
    fills: Sequence[int] = FILL_COUNTS,
    phases: Sequence[int] = DEFAULT_PHASES,
    budget: LoadBudget | None = None,
) -> PriceCalibration:
    """Measure the nested-fill curve on the sim engine and fit the price's ``scale`` to it.

    ``canonical`` defaults to a 512-token prompt whose output is just long enough for the
    largest fill count to nest inside it. Apply the result with
    ``ContentionModel.from_profile(profile).with_scale(result.scale)``.
    """
    if canonical is None:
        out = canonical_output_for(fill, max(fills), max(phases), profile)
        canonical = FillShape(prompt_tokens=512, output_tokens=out)
    if canonical.context_tokens:
        raise ValueError("the canonical request of a calibration has no cached context")
    model = ContentionModel.from_profile(
        profile, budget, canonical_context=canonical.prompt_tokens + canonical.output_tokens // 2
    )
    base = [measure_latency(profile, canonical, fill, 0, ph) for ph in phases]
    measured, predicted = [], []
    for k in fills:
        runs = [measure_latency(profile, canonical, fill, k, ph) for ph in phases] if k else base
        measured.append(1e3 * statistics.median(r - b for r, b in zip(runs, base, strict=True)))
        predicted.append(predicted_increase_ms(model, fill, k))
    scale = fit_scale(predicted, measured)
    baseline_ms = 1e3 * statistics.median(base)
    points = tuple(
        PricePoint(k, baseline_ms, y, x, scale * x)
        for k, x, y in zip(fills, predicted, measured, strict=True)
    )
    return PriceCalibration(profile.name, canonical, fill, scale, points)
