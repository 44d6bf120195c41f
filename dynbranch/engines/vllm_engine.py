"""The vLLM engine: one ``AsyncLLM`` (vLLM v1) behind DynBranch's engine protocol.

vLLM runs its engine core (scheduler, KV cache, model) in a process of its own; ``AsyncLLM``
is the asyncio front end that tokenizes, submits and streams. This class adds only what the
protocol asks for, and reads vLLM solely through :mod:`dynbranch.engines.vllm_adapter`,
because vLLM's Python API moves between releases:

* **Generation.** Each call becomes a ``TextPrompt`` (with ``cache_salt`` = the request's
  tenant scope, so prefix-cache blocks are shared only within a tenant) and ``SamplingParams``
  with ``RequestOutputKind.DELTA`` (greedy when ``temperature`` is 0; ``max_tokens``, ``top_p``
  and ``seed`` passed through). Every delta vLLM streams becomes one :class:`GenerateChunk`
  (under load vLLM merges deltas a slow consumer has not read, so a chunk may hold several
  tokens); the last carries the :class:`GenerateResult`. Token counts and cached prompt
  tokens are vLLM's; times are on the injected clock, taken when outputs arrive here
  (``first_scheduled_at`` is placed before the first token by the engine-side interval vLLM
  reports, when it reports one).
* **Priority.** The engine asks for vLLM's ``priority`` scheduling policy; canonical work
  (priority 0) is then scheduled before fills (1), and a fill is preempted first when KV runs
  out. A vLLM whose scheduler is not in that policy gets every call at priority 0 (ignored).
* **Prefix caching** is on: a branch's fills share their prompt prefix with the canonical
  stage, which the C3 pricing counts on.
* **Abort** by id ends the call with ``finish_reason == "abort"`` (vLLM sends a final output).
  A consumer that is cancelled, or stops iterating, aborts its call inside vLLM too.
* **Load** comes from vLLM's scheduler stats, which vLLM hands a stat logger after every step
  (see :meth:`VLLMEngine.load` for how they are bounded by this front end's own calls).

vLLM is imported by :meth:`VLLMEngine.start` (through the adapter), never at module import.
"""

from __future__ import annotations

import math
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynbranch.clock import Clock
from dynbranch.engines import vllm_adapter as vllm
from dynbranch.engines.config import DTYPES, EngineConfig, EngineConfigError
from dynbranch.engines.kv_fit import KVPlan, check_kv_fits
from dynbranch.engines.model_ref import resolve_model
from dynbranch.engines.protocol import (
    CANONICAL,
    SPECULATIVE,
    Engine,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)
from dynbranch.errors import EngineError, PromptTooLongError

__all__ = ["DTYPES", "VLLMEngine", "make_vllm_engine"]


@dataclass(eq=False)
class _Call:
    """One call in flight: what its deltas have added up to so far."""

    request: GenerateRequest
    arrived_at: float
    text: str = ""
    output_tokens: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0
    preemptions: int = 0
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    aborted: bool = False
    done: bool = False

    @property
    def speculative(self) -> bool:
        return self.request.priority >= SPECULATIVE

    @property
    def started(self) -> bool:
        """Whether vLLM has streamed anything for it (so it has been scheduled)."""
        return self.first_token_at is not None

    def add(self, delta: vllm.Delta, now: float) -> None:
        """Fold one streamed delta into the call."""
        self.text += delta.text
        self.output_tokens += delta.tokens
        if delta.prompt_tokens is not None:
            self.prompt_tokens = delta.prompt_tokens
        if delta.cached_prompt_tokens is not None:
            self.cached_prompt_tokens = min(delta.cached_prompt_tokens, self.prompt_tokens)
        if delta.preemptions is not None:
            self.preemptions = delta.preemptions
        if self.first_token_at is None and delta.tokens:
            self.first_token_at = now
            lead = delta.scheduled_to_first_token_s
            # NOTE: vLLM's timestamps are on its own clock; only the interval is carried over.
            self.first_scheduled_at = now if lead is None else max(self.arrived_at, now - lead)

    def result(self, finish_reason: str, now: float, engine_id: str) -> GenerateResult:
        # NOTE: a call that ended before its first token reports its end for those instants,
        # so every field stays a number on the engine clock (as the hf engine does).
        return GenerateResult(
            request_id=self.request.request_id,
            text=self.text,
            prompt_tokens=self.prompt_tokens,
            output_tokens=self.output_tokens,
            cached_prompt_tokens=self.cached_prompt_tokens,
            finish_reason=finish_reason,
            arrived_at=self.arrived_at,
            first_scheduled_at=now if self.first_scheduled_at is None else self.first_scheduled_at,
            first_token_at=now if self.first_token_at is None else self.first_token_at,
            finished_at=now,
            preemptions=self.preemptions,
            engine_id=engine_id,
        )


class _StepStats:
    """The scheduler stats of vLLM's last step, and preemptions counted over all steps."""

    def __init__(self) -> None:
        self.latest: Any = None
        self.preemptions = 0

    def record(self, scheduler_stats: Any, iteration_stats: Any) -> None:
        if scheduler_stats is not None:
            self.latest = scheduler_stats
        if iteration_stats is not None:
            self.preemptions += vllm.num_preempted(iteration_stats)


class VLLMEngine(Engine):
    """A model served by vLLM's ``AsyncLLM`` (see the module doc).

    ``model`` is a local model directory or a Hugging Face id (resolved into the node's
    cache when the engine starts; :mod:`dynbranch.engines.model_ref`). ``config`` holds the
    engine's settings (:class:`~dynbranch.engines.config.EngineConfig`: ``max_model_len``,
    ``gpu_memory_utilization``, ``tensor_parallel_size``, ``dtype``, ``quantization``, KV
    dtype and pool size, ``enforce_eager``, ``max_num_seqs``, other vLLM arguments), each
    left to vLLM's default when unset; keyword ``overrides`` replace single fields of it.
    ``dtype`` ``auto`` casts a float32 checkpoint to the platform's half type (pass
    ``float32`` where outputs must equal the hf engine's); ``enforce_eager`` skips
    compilation and CUDA graphs (fast start, for tests). Before vLLM starts, the engine checks
    that the weights and one ``max_model_len`` sequence of KV fit the device
    (:mod:`dynbranch.engines.kv_fit`). :meth:`promote` is the protocol's default: vLLM sets
    a request's priority when it is added and offers no call to change it, so a fill a
    canonical stage joins keeps its speculative priority on this engine.
    """

    def __init__(
        self,
        model_path: str | Path,
        clock: Clock,
        engine_id: str = "vllm-0",
        config: EngineConfig | None = None,
        *,
        seed: int = 0,
        engine_args: Mapping[str, Any] | None = None,
        **overrides: Any,
    ) -> None:
        try:
            self.config = (config or EngineConfig()).merged(**overrides)
            if engine_args:
                self.config = self.config.merged(
                    engine_args={**self.config.engine_args, **engine_args}
                )
        except EngineConfigError as e:
            raise EngineConfigError(f"engine {engine_id}: {e}") from None
        self.model_ref, self.clock = str(model_path), clock
        self.model_path = Path(model_path)
        self.engine_id, self.model = engine_id, self.model_path.name
        self.engine_args: dict[str, Any] = {
            "model": self.model_ref,
            "seed": seed,
            "enable_prefix_caching": True,
            "scheduling_policy": "priority",
            **self.config.vllm_args(),
        }
        self.kv_plan: KVPlan | None = None
        self._llm: Any = None
        self._stats = _StepStats()
        self._calls: dict[str, _Call] = {}
        self._priorities = False
        self._kv_blocks_total = 0
        self._block_size = 1
        self._closed = False

    # -- the protocol ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise EngineError(f"engine {self.engine_id} was shut down")
        if self._llm is not None:
            return
        # NOTE: a hub id is downloaded into this node's cache once (minutes, the first time);
        # the fit check then reads the resolved config and weight files.
        self.model_path = resolve_model(
            self.model_ref, revision=self.config.revision, download=self.config.download
        )
        self.engine_args["model"] = str(self.model_path)
        self.kv_plan = check_kv_fits(self.engine_id, self.model_path, self.config, self.model_ref)
        # NOTE: building the engine blocks this loop while vLLM's engine core loads the model
        # and sizes its KV pool (seconds to minutes); engines start before any request runs.
        self._llm = vllm.build_engine(self.engine_args, self._stats.record)
        self._priorities = vllm.priority_scheduling(self._llm)
        self._kv_blocks_total = vllm.kv_blocks_total(self._llm)
        self._block_size = vllm.kv_block_size(self._llm)

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        prompt = vllm.text_prompt(request.prompt, request.cache_salt)
        params = vllm.sampling_params(
            max_tokens=request.max_tokens,
            temperature=request.temperature,
            top_p=request.top_p,
            seed=request.seed,
        )
        call = self._submit(request)
        stream = self._llm.generate(
            prompt,
            params,
            request.request_id,
            priority=request.priority if self._priorities else CANONICAL,
        )
        last: vllm.Delta | None = None
        try:
            async for output in stream:
                last = vllm.read_delta(output)
                call.add(last, self.clock.now())
                # NOTE: an abort that reached vLLM before the call did (it was still being
                # tokenized) is applied at the call's first output.
                if last.finished or call.aborted:
                    break
                yield GenerateChunk(request.request_id, last.text)
            else:
                raise EngineError(
                    f"engine {self.engine_id}: vLLM ended request "
                    f"{request.request_id} without a final output"
                )
        except EngineError:
            raise
        except Exception as e:
            kind = PromptTooLongError if vllm.rejected_as_too_long(e) else EngineError
            raise kind(
                f"engine {self.engine_id}: vLLM refused or failed request "
                f"{request.request_id}: {type(e).__name__}: {e}"
            ) from e
        finally:
            self._calls.pop(request.request_id, None)
            if last is not None and last.finished:
                await anext(stream, None)  # vLLM's stream ends by itself after its last output
            else:
                # NOTE: closing vLLM's stream before its end (our consumer was cancelled or
                # stopped iterating, or an early abort) makes vLLM abort the request.
                await stream.aclose()
        assert last is not None
        call.done = True
        reason = "abort" if call.aborted else (last.finish_reason or "stop")
        yield GenerateChunk(
            request.request_id, last.text, call.result(reason, self.clock.now(), self.engine_id)
        )

    async def abort(self, request_id: str) -> bool:
        call = self._calls.get(request_id)
        if call is None or call.done:
            return False
        call.aborted = True
        if self._llm is not None:  # NOTE: after shutdown, vLLM has already sent its abort
            await self._llm.abort(request_id)
        return True

    def load(self) -> LoadSnapshot:
        """The engine's load, from the scheduler stats of vLLM's last step.

        NOTE: vLLM reports stats only when it steps, so an engine that went idle (say, after
        its last call was aborted) keeps reporting its last busy step. The scheduler's counts
        are therefore bounded by the calls in flight here: none in flight means an idle
        engine (prefix-cached blocks of finished calls are free, as vLLM counts them). A call
        on its way to the engine core is counted from the next step on. vLLM does not split
        its counts by priority, so the speculative shares are this front end's: fills that
        have streamed output are running, the others waiting, and a fill's KV is estimated
        from its tokens so far (at most the blocks in use).
        """
        calls = list(self._calls.values())
        stats = self._stats.latest if calls else None
        running = waiting = used = 0
        if stats is not None:
            running = min(vllm.num_running(stats), len(calls))
            waiting = min(vllm.num_waiting(stats), len(calls) - running)
            used = round(vllm.kv_cache_usage(stats) * self._kv_blocks_total)
        spec = [c for c in calls if c.speculative]
        started = [c for c in spec if c.started]
        spec_blocks = sum(
            math.ceil((c.prompt_tokens + c.output_tokens) / self._block_size) for c in started
        )
        return LoadSnapshot(
            engine_id=self.engine_id,
            time=self.clock.now(),
            running=running,
            waiting=waiting,
            kv_blocks_used=used,
            kv_blocks_total=self._kv_blocks_total,
            spec_running=min(len(started), running),
            spec_waiting=min(len(spec) - len(started), waiting),
            spec_kv_blocks=min(spec_blocks, used),
            preemptions_total=self._stats.preemptions,
        )

    async def health(self) -> bool:
        return self._llm is not None and not self._closed and not vllm.engine_errored(self._llm)

    async def shutdown(self) -> None:
        self._closed = True
        llm, self._llm = self._llm, None
        if llm is None:
            return
        live = [c for c in self._calls.values() if not c.done]
        # NOTE: vLLM queues each call in flight a final "abort" output, which its consumer
        # still reads after the engine core below has stopped.
        for call in live:
            call.aborted = True
            await llm.abort(call.request.request_id)
        llm.shutdown()

    # -- arrival --------------------------------------------------------------------------

    def _submit(self, request: GenerateRequest) -> _Call:
        if self._llm is None or self._closed:
            raise EngineError(f"engine {self.engine_id} is not running (start() it first)")
        if request.request_id in self._calls:
            raise EngineError(f"engine {self.engine_id}: request {request.request_id} is in flight")
        call = _Call(request, arrived_at=self.clock.now())
        self._calls[request.request_id] = call
        return call


def make_vllm_engine(
    *, model_path: str, clock: Clock, engine_id: str, config: EngineConfig | None = None
) -> VLLMEngine:
    """The registry's vLLM engine for ``model_path`` (a directory or hub id) under ``config``
    (vLLM's defaults where it sets nothing)."""
    return VLLMEngine(model_path, clock, engine_id, config)
