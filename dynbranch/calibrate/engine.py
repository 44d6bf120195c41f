"""Measuring a real engine's steps and fitting a profile to them; a CPU profile for
local transformers models."""

from __future__ import annotations

import asyncio
import json
import math
import random
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dynbranch.calibrate.filler import FillerText
from dynbranch.calibrate.solver import (
    KNOB_BOUNDS,
    STEP_KNOBS,
    _knob_values,
    least_squares,
)
from dynbranch.clock import Clock, Stopwatch
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
)
from dynbranch.engines.protocol import Engine, GenerateRequest, GenerateResult

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


async def _tokens_per_word(engine: Engine, filler: FillerText) -> float:
    # NOTE: a fixed one-token replay, not a filler request: the probe must not draw from
    # the generator beyond its prompt.
    probe = GenerateRequest("calibrate-probe", filler.text(256), max_tokens=1, replay_text=" x")
    return (await engine.generate(probe)).prompt_tokens / 256


async def _batch(
    engine: Engine,
    tag: str,
    prompts: Sequence[str],
    max_tokens: int,
    filler: FillerText,
) -> list[GenerateResult]:
    requests = [
        filler.request(f"calibrate-{tag}-{i}", p, max_tokens) for i, p in enumerate(prompts)
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
        filler = FillerText(random.Random(seed))
        engine = engine_factory()
        await engine.start()
        try:
            ratio = await _tokens_per_word(engine, filler)
            out = []
            for kind, batch, context in [("prefill", 1, c) for c in context_lengths] + [
                ("decode", b, c) for b in batch_sizes for c in context_lengths
            ]:
                words = max(1, round(context / ratio))
                max_tokens = 1 if kind == "prefill" else decode_tokens + 1
                runs = []
                for rep in range(repeats + 1):  # the first run warms caches and allocators
                    prompts = [filler.text(words) for _ in range(batch)]
                    results = await _batch(
                        engine,
                        f"{kind}{batch}x{context}r{rep}",
                        prompts,
                        max_tokens,
                        filler,
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


