"""Roofline profiles: what one model on one GPU costs per engine step.

A profile is a versioned TOML file under ``dynbranch/engines/profiles/`` named
``<model>@<gpu>.toml``. It holds public facts (the model's ``config.json`` shapes, the GPU's
datasheet), the serving engine's scheduler limits (vLLM's defaults), and a ``[calibration]``
table of efficiency factors that ``dynbranch calibrate`` may overwrite. Everything else is
derived here: weight bytes, KV bytes per token, the KV pool size and the time of one step.

The step model is a roofline (as in Vidur and the LLM-Viewer / "LLM inference unveiled"
analyses): a step costs ``max(compute, memory) + overheads``, where compute is the step's
FLOPs over the achieved peak and memory is the bytes it moves (all weights once, every
scheduled sequence's KV context, the KV it writes) over the achieved HBM bandwidth. Pure
functions only: no clock, no engine state.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import dataclass, replace
from functools import cached_property
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path
from typing import Any

from dynbranch.errors import MalformedProfileError, UnknownNameError

GIB = 2**30
PROFILE_SCHEMA_VERSION = 1
"""The ``version`` every shipped profile file carries; bumped when a field changes meaning."""


@dataclass(frozen=True)
class ModelSpec:
    """A dense decoder-only transformer's shapes, as its ``config.json`` states them."""

    name: str
    num_layers: int
    hidden_size: int
    num_attention_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool
    num_params: float  # as the model card states it; cross-checked against the shapes
    bytes_per_param: int  # 2 for bf16 weights
    kv_bytes_per_elem: int  # 2 for a bf16 KV cache (vLLM's "auto" = model dtype)
    max_model_len: int


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator's datasheet numbers."""

    name: str
    memory_gib: float
    bandwidth_gb_s: float  # HBM / GDDR bandwidth, 1e9 bytes per second
    peak_bf16_tflops: float  # dense (no sparsity), 1e12 FLOP per second


@dataclass(frozen=True)
class SchedulerLimits:
    """The serving engine's per-step limits (vLLM's names and defaults)."""

    block_size: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int


@dataclass(frozen=True)
class Calibration:
    """Efficiency factors that turn datasheet peaks into achieved times (the fitted knobs)."""

    bandwidth_efficiency: float  # fraction of datasheet bandwidth a decode step achieves
    mfu: float  # fraction of dense peak FLOPs a compute-bound step achieves
    step_overhead_ms: float  # fixed host-side cost of one step (schedule, launch, sample)
    seq_overhead_us: float  # host-side cost per scheduled sequence per step
    non_kv_memory_gib: float  # activations, CUDA graphs, workspaces: memory not for KV


@dataclass(frozen=True)
class SeqWork:
    """One scheduled sequence's share of a step: KV it reads and tokens it computes."""

    context_tokens: int  # tokens already in the KV cache before this step
    new_tokens: int  # tokens computed (and KV written) in this step


@dataclass(frozen=True)
class StepCost:
    """The roofline time of one step, by term, in seconds."""

    compute_s: float
    memory_s: float
    overhead_s: float

    @property
    def total_s(self) -> float:
        return max(self.compute_s, self.memory_s) + self.overhead_s

    @property
    def bound(self) -> str:
        """``"compute"`` or ``"memory"``: which roof the step hits."""
        return "compute" if self.compute_s > self.memory_s else "memory"


@dataclass(frozen=True)
class _StepConstants:
    """What every step's roofline reuses, computed once per profile."""

    flops_per_token: int
    lm_head_flops: int
    attention_flops: int
    weight_read_bytes: int
    kv_bytes_per_token: int
    flops_s: float  # achieved FLOP/s
    bytes_s: float  # achieved bytes/s
    step_overhead_s: float
    seq_overhead_us: float


def attention_pairs(context_tokens: int, new_tokens: int) -> int:
    """(query, key) pairs of one sequence's step: token i of the chunk attends to the
    context and to chunk tokens 0..i."""
    return new_tokens * context_tokens + new_tokens * (new_tokens + 1) // 2


@dataclass(frozen=True)
class Profile:
    """One model served on one GPU: facts, limits, calibration and what follows from them."""

    name: str
    version: int
    model: ModelSpec
    gpu: GpuSpec
    scheduler: SchedulerLimits
    calibration: Calibration
    source: str = ""

    # -- model size ---------------------------------------------------------------------

    @property
    def layer_matmul_params(self) -> int:
        """Weights of the transformer layers' matrix multiplies (attention and MLP)."""
        m = self.model
        q_width = m.num_attention_heads * m.head_dim
        kv_width = m.num_kv_heads * m.head_dim
        attention = 2 * m.hidden_size * q_width + 2 * m.hidden_size * kv_width
        mlp = 3 * m.hidden_size * m.intermediate_size  # gate, up, down (SwiGLU)
        return m.num_layers * (attention + mlp)

    @property
    def embedding_params(self) -> int:
        return self.model.vocab_size * self.model.hidden_size

    @property
    def param_count(self) -> int:
        """All parameters, from the shapes (norms included, a tied LM head counted once)."""
        m = self.model
        norms = m.num_layers * (2 * m.hidden_size + 2 * m.head_dim) + m.hidden_size
        heads = 1 if m.tie_word_embeddings else 2
        return self.layer_matmul_params + norms + heads * self.embedding_params

    @property
    def weight_bytes(self) -> int:
        """Memory the weights occupy on the GPU."""
        return self.param_count * self.model.bytes_per_param

    @property
    def weight_read_bytes(self) -> int:
        """Weight bytes one forward step reads: all but an untied input embedding.

        NOTE: the input embedding is a gather of a few rows, not a full read; a tied
        embedding is read in full as the LM head.
        """
        unread = 0 if self.model.tie_word_embeddings else self.embedding_params
        return (self.param_count - unread) * self.model.bytes_per_param

    # -- KV cache -----------------------------------------------------------------------

    @property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        m = self.model
        return 2 * m.num_layers * m.num_kv_heads * m.head_dim * m.kv_bytes_per_elem

    @property
    def kv_pool_bytes(self) -> float:
        """What vLLM leaves for the KV cache: budgeted memory less weights and the rest."""
        budget = self.gpu.memory_gib * GIB * self.scheduler.gpu_memory_utilization
        return budget - self.weight_bytes - self.calibration.non_kv_memory_gib * GIB

    @property
    def kv_pool_blocks(self) -> int:
        return int(self.kv_pool_bytes // (self.kv_bytes_per_token * self.scheduler.block_size))

    @property
    def kv_pool_tokens(self) -> int:
        return self.kv_pool_blocks * self.scheduler.block_size

    # -- compute ------------------------------------------------------------------------

    @property
    def flops_per_token(self) -> int:
        """Matrix-multiply FLOPs of one token through the layers (2 per weight)."""
        return 2 * self.layer_matmul_params

    @property
    def lm_head_flops(self) -> int:
        """FLOPs of one sequence's logits (computed for its last scheduled token only)."""
        return 2 * self.embedding_params

    @property
    def attention_flops_per_pair(self) -> int:
        """FLOPs of one (query token, key position) pair over all layers: QK^T and AV."""
        m = self.model
        return 4 * m.num_layers * m.num_attention_heads * m.head_dim

    @property
    def peak_flops(self) -> float:
        return self.gpu.peak_bf16_tflops * 1e12

    @property
    def bandwidth_bytes_s(self) -> float:
        return self.gpu.bandwidth_gb_s * 1e9

    def step_cost(self, work: Iterable[SeqWork]) -> StepCost:
        """The roofline time of one step that runs ``work`` (one entry per sequence)."""
        seqs = tokens = kv_read = pairs = 0
        for w in work:
            seqs += 1
            tokens += w.new_tokens
            kv_read += w.context_tokens
            pairs += attention_pairs(w.context_tokens, w.new_tokens)
        if seqs == 0:
            return StepCost(0.0, 0.0, 0.0)
        return StepCost(*self._step_terms(seqs, tokens, kv_read, pairs))

    def step_time(self, seqs: int, tokens: int, kv_read: int, pairs: int) -> float:
        """``step_cost(work).total_s`` from the step's totals, without building ``work``.

        ``seqs`` sequences compute ``tokens`` tokens, read ``kv_read`` context tokens and
        form ``pairs`` attention pairs (:func:`attention_pairs` summed). The result is the
        same float as :meth:`step_cost` gives (the same operations in the same order), so a
        simulator may use either and stay bit-identical.
        """
        if seqs == 0:
            return 0.0
        compute, memory, overhead = self._step_terms(seqs, tokens, kv_read, pairs)
        return max(compute, memory) + overhead

    def _step_terms(
        self, seqs: int, tokens: int, kv_read: int, pairs: int
    ) -> tuple[float, float, float]:
        k = self._step_constants
        flops = k.flops_per_token * tokens + k.lm_head_flops * seqs + k.attention_flops * pairs
        moved = k.weight_read_bytes + k.kv_bytes_per_token * (kv_read + tokens)
        # NOTE: ``seqs * seq_overhead_us * 1e-6`` keeps the association it always had.
        return (
            flops / k.flops_s,
            moved / k.bytes_s,
            k.step_overhead_s + seqs * k.seq_overhead_us * 1e-6,
        )

    @cached_property
    def _step_constants(self) -> _StepConstants:
        cal = self.calibration
        return _StepConstants(
            flops_per_token=self.flops_per_token,
            lm_head_flops=self.lm_head_flops,
            attention_flops=self.attention_flops_per_pair,
            weight_read_bytes=self.weight_read_bytes,
            kv_bytes_per_token=self.kv_bytes_per_token,
            flops_s=self.peak_flops * cal.mfu,
            bytes_s=self.bandwidth_bytes_s * cal.bandwidth_efficiency,
            step_overhead_s=cal.step_overhead_ms * 1e-3,
            seq_overhead_us=cal.seq_overhead_us,
        )

    def with_calibration(self, **values: float) -> Profile:
        """This profile with some calibration knobs replaced (what a fit produces)."""
        return replace(self, calibration=replace(self.calibration, **values))


# -- loading --------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Field:
    kind: type
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False


_POS = _Field(float, 0.0, lo_open=True)
_FRACTION = _Field(float, 0.0, 1.0, lo_open=True)
_COUNT = _Field(int, 1)
_SCHEMA: dict[str, tuple[type, dict[str, _Field]]] = {
    "model": (
        ModelSpec,
        {
            "name": _Field(str),
            "num_layers": _COUNT,
            "hidden_size": _COUNT,
            "num_attention_heads": _COUNT,
            "num_kv_heads": _COUNT,
            "head_dim": _COUNT,
            "intermediate_size": _COUNT,
            "vocab_size": _COUNT,
            "tie_word_embeddings": _Field(bool),
            "num_params": _POS,
            "bytes_per_param": _Field(int, 1, 8),
            "kv_bytes_per_elem": _Field(int, 1, 8),
            "max_model_len": _COUNT,
        },
    ),
    "gpu": (
        GpuSpec,
        {
            "name": _Field(str),
            "memory_gib": _POS,
            "bandwidth_gb_s": _POS,
            "peak_bf16_tflops": _POS,
        },
    ),
    "scheduler": (
        SchedulerLimits,
        {
            "block_size": _COUNT,
            "gpu_memory_utilization": _FRACTION,
            "max_num_seqs": _COUNT,
            "max_num_batched_tokens": _COUNT,
        },
    ),
    "calibration": (
        Calibration,
        {
            "bandwidth_efficiency": _FRACTION,
            "mfu": _FRACTION,
            "step_overhead_ms": _Field(float, 0.0),
            "seq_overhead_us": _Field(float, 0.0),
            "non_kv_memory_gib": _Field(float, 0.0),
        },
    ),
}
_PARAM_TOLERANCE = 0.03
"""How far the shape-derived parameter count may be from the stated one (a typo guard)."""


def _check_value(path: str, name: str, spec: _Field, value: Any) -> Any:
    kinds = (int, float) if spec.kind is float else (spec.kind,)
    # NOTE: bool is an int in Python; a TOML `true` must not pass as a layer count.
    if isinstance(value, bool) is not (spec.kind is bool) or not isinstance(value, kinds):
        raise MalformedProfileError(path, name, f"expected {spec.kind.__name__}, got {value!r}")
    below = spec.lo is not None and (value <= spec.lo if spec.lo_open else value < spec.lo)
    if below or (spec.hi is not None and value > spec.hi):
        low = "(" if spec.lo_open else "["
        raise MalformedProfileError(path, name, f"{value!r} is outside {low}{spec.lo}, {spec.hi}]")
    return float(value) if spec.kind is float else value


def _read_section(path: str, data: dict[str, Any], section: str) -> Any:
    cls, schema = _SCHEMA[section]
    table = data.get(section)
    if not isinstance(table, dict):
        raise MalformedProfileError(path, f"[{section}]", "missing table")
    unknown = sorted(set(table) - set(schema))
    if unknown:
        raise MalformedProfileError(path, f"[{section}].{unknown[0]}", "unknown field")
    values = {}
    for name, spec in schema.items():
        label = f"[{section}].{name}"
        if name not in table:
            raise MalformedProfileError(path, label, "missing")
        values[name] = _check_value(path, label, spec, table[name])
    return cls(**values)


def _validate(profile: Profile) -> None:
    path = profile.source
    stated = profile.model.num_params
    if abs(profile.param_count - stated) > _PARAM_TOLERANCE * stated:
        raise MalformedProfileError(
            path,
            "[model].num_params",
            f"{stated:.4g} disagrees with {profile.param_count:.4g} from the shapes",
        )
    if profile.kv_pool_blocks < 1:
        raise MalformedProfileError(
            path,
            "[gpu].memory_gib",
            f"no room for a KV cache: {profile.weight_bytes / GIB:.1f} GiB of weights "
            f"in {profile.gpu.memory_gib} GiB x {profile.scheduler.gpu_memory_utilization}",
        )


def parse_profile(name: str, text: str, source: str) -> Profile:
    """A validated profile from TOML ``text``; errors name ``source`` and the field."""
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise MalformedProfileError(source, "(syntax)", str(exc)) from exc
    unknown = sorted(set(data) - set(_SCHEMA) - {"version"})
    if unknown:
        raise MalformedProfileError(source, unknown[0], "unknown field or table")
    version = data.get("version")
    if version != PROFILE_SCHEMA_VERSION or isinstance(version, bool):
        raise MalformedProfileError(
            source, "version", f"expected {PROFILE_SCHEMA_VERSION}, got {version!r}"
        )
    sections = {s: _read_section(source, data, s) for s in _SCHEMA}
    profile = Profile(name=name, version=version, source=source, **sections)
    _validate(profile)
    return profile


def load_profile_file(path: str | Path) -> Profile:
    """Load a profile from any TOML file; its name is the file's stem."""
    path = Path(path)
    return parse_profile(path.stem, path.read_text(encoding="utf-8"), str(path))


def _profiles_dir() -> Traversable:
    return resources.files("dynbranch.engines").joinpath("profiles")


def known_profiles() -> list[str]:
    """Names of the profiles shipped with the package."""
    names = (p.name for p in _profiles_dir().iterdir())
    return sorted(n[: -len(".toml")] for n in names if n.endswith(".toml"))


def load_profile(name: str) -> Profile:
    """The shipped profile ``name`` (e.g. ``qwen3-32b@h200``)."""
    known = known_profiles()
    if name not in known:
        raise UnknownNameError("profile", name, known)
    resource = _profiles_dir().joinpath(f"{name}.toml")
    return parse_profile(name, resource.read_text(encoding="utf-8"), str(resource))


def kv_blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed to hold ``tokens`` tokens of KV."""
    return -(-tokens // block_size)
