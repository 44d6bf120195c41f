"""Calibrate the contention model against the sim engine it is derived from.

The experiment is Fig. 5b's: the latency of one fixed-shape canonical request while ``k``
fills are co-resident, for ``k`` in 0, 1, 2, 3, 6, 12, 24, 48. It runs the real
:class:`~dynbranch.engines.sim.SimEngine` on a :class:`~dynbranch.clock.VirtualClock`
(deterministic, seconds of wall time), takes the p50 of the latency increase over several
entry phases, and fits the model's one ``scale`` factor by least squares.

Geometry: the canonical request is submitted first; after it has streamed ``phase`` tokens
the fills enter one after another (each is submitted once the previous one has its first
token), so every fill's prefill and all its decode steps fall inside the canonical
request's decode. The run checks that nesting and refuses a shape that breaks it.

NOTE: this module drives the (asyncio) engine only through ``await`` on its streams, so
it needs no event-loop API of its own; the gate proper never imports it.
"""

from __future__ import annotations

import math
import random
import statistics
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from dynbranch.clock import VirtualClock
from dynbranch.engines.profile import Profile
from dynbranch.engines.protocol import SPECULATIVE, GenerateChunk, GenerateRequest
from dynbranch.engines.sim import SimEngine
from dynbranch.gate.load import LoadBudget, LoadView
from dynbranch.gate.price import ContentionModel, FillShape

FIG5B_FILLS = (0, 1, 2, 3, 6, 12, 24, 48)
"""Co-resident fill counts of the paper's Fig. 5b."""
FIG5B_PAPER = {1: (4.0, 6.0), 2: (4.0, 6.0), 3: (4.0, 6.0), 48: (53.0, 53.0)}
"""Paper Fig. 5b, p50 increase in percent: 1-3 fills +4-6 %, 48 fills +53 %."""
DEFAULT_FILL = FillShape(prompt_tokens=256, output_tokens=32)
DEFAULT_PHASES = (1, 9, 17)


@dataclass(frozen=True)
class CalibrationPoint:
    """One co-resident fill count: the engine's measured p50 increase and the model's."""

    fills: int
    baseline_ms: float  # p50 canonical latency with no fills
    measured_ms: float  # p50 latency increase the engine produced
    predicted_ms: float  # the model's increase at scale 1
    fitted_ms: float  # the model's increase at the fitted scale

    @property
    def error_ms(self) -> float:
        return self.fitted_ms - self.measured_ms

    @property
    def rel_error(self) -> float:
        return self.error_ms / self.measured_ms if self.measured_ms else 0.0

    @property
    def increase_pct(self) -> float:
        return 100.0 * self.measured_ms / self.baseline_ms


@dataclass(frozen=True)
class CalibrationResult:
    """The fitted scale and the per-point fit."""

    profile: str
    canonical: FillShape
    fill: FillShape
    scale: float
    points: tuple[CalibrationPoint, ...]

    @property
    def rms_rel_error(self) -> float:
        errs = [p.rel_error for p in self.points if p.fills > 0]
        return math.sqrt(sum(e * e for e in errs) / len(errs)) if errs else 0.0

    @property
    def max_abs_rel_error(self) -> float:
        return max((abs(p.rel_error) for p in self.points if p.fills > 0), default=0.0)

    def table(self) -> str:
        """A plain-text report, with the paper's Fig. 5b points beside ours."""
        lines = [
            f"calibration of {self.profile}: canonical {_shape(self.canonical)}, "
            f"fill {_shape(self.fill)}",
            f"fitted scale {self.scale:.4f}; rms rel error {100 * self.rms_rel_error:.2f} %, "
            f"max {100 * self.max_abs_rel_error:.2f} %",
            "  fills  baseline_ms  measured_ms  model_ms(s=1)  fitted_ms  err_%  increase_%  paper_%",
        ]
        for p in self.points:
            lo, hi = FIG5B_PAPER.get(p.fills, (None, None))
            paper = "" if lo is None else (f"+{lo:g}" if lo == hi else f"+{lo:g}-{hi:g}")
            lines.append(
                f"  {p.fills:>5}  {p.baseline_ms:>11.1f}  {p.measured_ms:>11.2f}  "
                f"{p.predicted_ms:>13.2f}  {p.fitted_ms:>9.2f}  {100 * p.rel_error:>5.2f}  "
                f"{p.increase_pct:>10.2f}  {paper:>7}"
            )
        return "\n".join(lines)


def _shape(s: FillShape) -> str:
    ctx = f" + {s.context_tokens} cached" if s.context_tokens else ""
    return f"{s.prompt_tokens} prompt{ctx} / {s.output_tokens} output tokens"


def words(n: int, seed: int) -> str:
    """A text of exactly ``n`` stand-in tokens (one short word each)."""
    rng = random.Random(seed)
    return "".join(
        " " + "".join(rng.choices("abcdefghijklmnopqrstuvwxyz", k=rng.randint(1, 6)))
        for _ in range(n)
    )


def _request(rid: str, prompt: str, output: int, seed: int, priority: int = 0) -> GenerateRequest:
    # NOTE: a replay text longer than max_tokens ends on "length" with exactly `output` tokens.
    return GenerateRequest(
        rid, prompt, output, replay_text=words(output + 4, seed), priority=priority
    )


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
    await engine.start()
    prefix = words(fill.context_tokens, seed=7) if fill.context_tokens else ""
    if prefix:  # warm the prefix cache: the fills' context is then read, not recomputed
        await engine.generate(_request("warm", prefix, 1, seed=8))
    canon = engine.generate_stream(
        _request("canonical", words(canonical.prompt_tokens, 1), canonical.output_tokens, 2)
    )
    for _ in range(phase):
        await anext(canon)
    streams = []
    for j in range(k):
        prompt = prefix + words(fill.prompt_tokens, seed=1000 + j)
        stream = engine.generate_stream(
            _request(f"fill{j}", prompt, fill.output_tokens, 2000 + j, SPECULATIVE)
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


def calibrate(
    profile: Profile,
    *,
    canonical: FillShape | None = None,
    fill: FillShape = DEFAULT_FILL,
    fills: Sequence[int] = FIG5B_FILLS,
    phases: Sequence[int] = DEFAULT_PHASES,
    budget: LoadBudget | None = None,
) -> CalibrationResult:
    """Measure Fig. 5b's curve on the sim engine and fit the model's ``scale`` to it.

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
        CalibrationPoint(k, baseline_ms, y, x, scale * x)
        for k, x, y in zip(fills, predicted, measured, strict=True)
    )
    return CalibrationResult(profile.name, canonical, fill, scale, points)
