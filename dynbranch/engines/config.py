"""How a real engine (``hf``, ``vllm``) is sized and tuned: one validated, picklable object.

:class:`EngineConfig` holds the knobs an operator turns to fit a model on a GPU — maximum
model length, GPU memory utilisation, tensor parallelism, dtype, quantization, KV cache dtype,
eager mode, batch size — plus any other vLLM engine argument under ``engine_args``. It comes
from a TOML file (:meth:`EngineConfig.from_toml`), CLI flags on top of it
(:meth:`EngineConfig.merged`), or both, and travels unchanged from the CLI through
:class:`~dynbranch.backend.EngineSpec` into each engine, in process or in a Ray actor.

A TOML file names the same fields at top level, and extra vLLM arguments in a table::

    max_model_len = 16384
    gpu_memory_utilization = 0.92
    dtype = "bfloat16"

    [engine_args]
    max_num_batched_tokens = 4096

``None`` means "the engine's default" (vLLM's, or the model's context length). The check that
the KV cache fits before vLLM starts lives in :mod:`dynbranch.engines.kv_fit`; resolving a
model directory or Hugging Face id in :mod:`dynbranch.engines.model_ref`.
"""

from __future__ import annotations

import dataclasses
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynbranch.errors import ConfigError

DTYPES = ("auto", "float32", "bfloat16", "float16")
"""Weight and activation dtypes (``auto``: vLLM's choice for the checkpoint; hf: float32)."""
KV_CACHE_DTYPES = ("auto", "bfloat16", "float16", "fp8", "fp8_e4m3", "fp8_e5m2")
"""KV cache dtypes the fit check can size (``auto``: the model's dtype)."""
KV_RESERVE_GIB = 2.42
"""GiB per GPU the fit check keeps for activations and non-torch memory (CUDA context, NCCL).

NOTE: measured, not guessed: vLLM's memory profile of an 8B model (Llama-3.1-8B, bf16) on a
24 GiB card reports a peak torch memory 2.07 GiB above the weights and 0.35 GiB of non-torch
memory (vllm-project/vllm#10517). A larger batch budget (``max_num_batched_tokens``) needs
more; ``kv_reserve_gib`` overrides it.
"""
RESERVED_ENGINE_ARGS = frozenset(
    {
        "model",
        "dtype",
        "seed",
        "max_model_len",
        "gpu_memory_utilization",
        "tensor_parallel_size",
        "quantization",
        "kv_cache_dtype",
        "enforce_eager",
        "max_num_seqs",
        "kv_cache_memory_bytes",
        "revision",
        "enable_prefix_caching",
        "scheduling_policy",
    }
)
"""vLLM arguments that have a field here (or that DynBranch sets): not in ``engine_args``."""


class EngineConfigError(ConfigError, ValueError):
    """An engine setting out of range or of the wrong type (names the field and the value)."""


@dataclass(frozen=True)
class EngineConfig:
    """The settings of one real engine; every field is checked on construction.

    ``max_model_len`` (≥ 1 tokens; default: the model's context), ``gpu_memory_utilization``
    (in (0, 1]; default vLLM's), ``tensor_parallel_size`` (≥ 1 GPUs per engine), ``dtype``
    (:data:`DTYPES`), ``quantization`` (a vLLM method name, e.g. ``awq``, ``fp8``),
    ``kv_cache_dtype`` (:data:`KV_CACHE_DTYPES`), ``enforce_eager`` (no CUDA graphs or
    compilation: fast start, slower steps), ``max_num_seqs`` (≥ 1 sequences per step),
    ``kv_cache_memory_bytes`` (≥ 1: the KV pool's size instead of a utilisation share),
    ``revision`` (a hub revision for a model id), ``download`` (fetch a hub id missing from
    the node's Hugging Face cache), ``check_kv`` / ``kv_reserve_gib`` (≥ 0) /
    ``device_memory_gib`` (> 0; default: the device's own) tune the fit check, and
    ``engine_args`` adds any other ``AsyncEngineArgs`` field.
    """

    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    tensor_parallel_size: int = 1
    dtype: str = "auto"
    quantization: str | None = None
    kv_cache_dtype: str = "auto"
    enforce_eager: bool = False
    max_num_seqs: int | None = None
    kv_cache_memory_bytes: int | None = None
    revision: str | None = None
    download: bool = True
    check_kv: bool = True
    kv_reserve_gib: float = KV_RESERVE_GIB
    device_memory_gib: float | None = None
    engine_args: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _check_types(self)
        for name in ("max_model_len", "max_num_seqs", "kv_cache_memory_bytes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise EngineConfigError(f"{name} must be >= 1, got {value}")
        if self.tensor_parallel_size < 1:
            raise EngineConfigError(
                f"tensor_parallel_size must be >= 1, got {self.tensor_parallel_size}"
            )
        util = self.gpu_memory_utilization
        if util is not None and not 0 < util <= 1:
            raise EngineConfigError(f"gpu_memory_utilization must be in (0, 1], got {util}")
        if self.dtype not in DTYPES:
            raise EngineConfigError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise EngineConfigError(
                f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}"
            )
        if self.quantization is not None and not self.quantization.strip():
            raise EngineConfigError("quantization must name a method (e.g. 'awq'), got ''")
        if self.kv_reserve_gib < 0:
            raise EngineConfigError(f"kv_reserve_gib must be >= 0, got {self.kv_reserve_gib}")
        if self.device_memory_gib is not None and self.device_memory_gib <= 0:
            raise EngineConfigError(f"device_memory_gib must be > 0, got {self.device_memory_gib}")
        clash = sorted(RESERVED_ENGINE_ARGS & set(self.engine_args))
        if clash:
            raise EngineConfigError(
                f"engine_args {clash} have fields of their own (or are "
                f"set by DynBranch); set them as fields instead"
            )
        # NOTE: a private copy, so the frozen config cannot change through the caller's dict.
        object.__setattr__(self, "engine_args", dict(self.engine_args))

    @classmethod
    def from_toml(cls, path: str | Path) -> EngineConfig:
        """The config a TOML file describes (see the module doc); unknown keys are errors."""
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise EngineConfigError(f"engine config {path} does not exist") from None
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise EngineConfigError(f"engine config {path}: {e}") from None
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EngineConfigError(
                f"engine config {path}: unknown keys {unknown}; known: {', '.join(sorted(known))}"
            )
        try:
            return cls(**data)
        except EngineConfigError as e:
            raise EngineConfigError(f"engine config {path}: {e}") from None

    def merged(self, **overrides: Any) -> EngineConfig:
        """This config with every override that is not ``None`` applied (flags over a file)."""
        known = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(overrides) - known)
        if unknown:
            raise TypeError(f"EngineConfig has no fields {unknown}")
        given = {k: v for k, v in overrides.items() if v is not None}
        return dataclasses.replace(self, **given) if given else self

    def vllm_args(self) -> dict[str, Any]:
        """The ``AsyncEngineArgs`` fields this config sets (defaults left to vLLM)."""
        args: dict[str, Any] = {
            "dtype": self.dtype,
            "tensor_parallel_size": self.tensor_parallel_size,
            "kv_cache_dtype": self.kv_cache_dtype,
            "enforce_eager": self.enforce_eager,
        }
        optional = {
            "max_model_len": self.max_model_len,
            "gpu_memory_utilization": self.gpu_memory_utilization,
            "quantization": self.quantization,
            "max_num_seqs": self.max_num_seqs,
            "kv_cache_memory_bytes": self.kv_cache_memory_bytes,
            "revision": self.revision,
        }
        args.update({k: v for k, v in optional.items() if v is not None})
        if self.tensor_parallel_size > 1:
            # NOTE: inside a Ray actor that holds the GPUs, vLLM's own workers are processes
            # on those GPUs; its Ray executor would ask the cluster for a placement of its own.
            args.setdefault("distributed_executor_backend", "mp")
        return {**args, **self.engine_args}

    def gpus(self, kind: str) -> int:
        """GPUs one engine of ``kind`` needs (0 for engines that run on CPU)."""
        return self.tensor_parallel_size if kind == "vllm" else 0


_TYPES: dict[str, tuple[type, ...]] = {
    "max_model_len": (int,),
    "gpu_memory_utilization": (float, int),
    "tensor_parallel_size": (int,),
    "dtype": (str,),
    "quantization": (str,),
    "kv_cache_dtype": (str,),
    "enforce_eager": (bool,),
    "max_num_seqs": (int,),
    "kv_cache_memory_bytes": (int,),
    "revision": (str,),
    "download": (bool,),
    "check_kv": (bool,),
    "kv_reserve_gib": (float, int),
    "device_memory_gib": (float, int),
    "engine_args": (Mapping,),
}


def _check_types(config: EngineConfig) -> None:
    """Each field has its type (``None`` where optional); a bool is not a number here."""
    for name, types in _TYPES.items():
        value = getattr(config, name)
        default = next(f.default for f in dataclasses.fields(config) if f.name == name)
        if value is None and default is None:
            continue
        numeric = bool not in types
        if not isinstance(value, types) or (numeric and isinstance(value, bool)):
            raise EngineConfigError(
                f"{name} must be {' or '.join(t.__name__ for t in types)}, got {value!r}"
            )


def check_engine_config(kind: str, config: EngineConfig | None) -> None:
    """Refuse settings the engine ``kind`` cannot honour, before anything starts."""
    if config is None or config == EngineConfig():
        return
    if kind not in ("hf", "vllm"):
        raise ConfigError(
            f"engine settings (--engine-config, --max-model-len, ...) are for "
            f"--engine hf|vllm; --engine {kind} is sized by its --profile"
        )
    if kind == "hf":
        unsupported = [
            name
            for name, value in (
                ("tensor_parallel_size", config.tensor_parallel_size != 1),
                ("quantization", config.quantization is not None),
                ("kv_cache_dtype", config.kv_cache_dtype != "auto"),
                ("engine_args", bool(config.engine_args)),
            )
            if value
        ]
        if unsupported:
            raise ConfigError(
                f"--engine hf does not support {', '.join(unsupported)} "
                f"(they are vLLM's); use --engine vllm"
            )


def engine_config_from(path: str | Path | None, **flags: Any) -> EngineConfig | None:
    """The config of ``--engine-config FILE`` with the flags that were given on top of it
    (``None``: neither a file nor a flag, so every engine keeps its defaults)."""
    given = {k: v for k, v in flags.items() if v is not None}
    if path is None and not given:
        return None
    base = EngineConfig.from_toml(path) if path is not None else EngineConfig()
    return base.merged(**given)


__all__ = [
    "DTYPES",
    "KV_CACHE_DTYPES",
    "KV_RESERVE_GIB",
    "EngineConfig",
    "EngineConfigError",
    "check_engine_config",
    "engine_config_from",
]
