"""The engine protocol: the one seam between DynBranch and whatever runs the model.

Every engine (simulated, transformers, vLLM, the zero-duration engine used to measure
orchestration overhead) implements :class:`Engine`. Everything above this module sees only
these types, so the orchestrator, gate and store run unchanged on any of them, in process
or inside a Ray actor.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import AsyncIterator
from dataclasses import dataclass

CANONICAL = 0
"""Priority of canonical (user-visible) work; larger numbers are served later."""
SPECULATIVE = 1
"""Priority of fills: scheduled after canonical work where the engine supports priorities."""


@dataclass(frozen=True)
class GenerateRequest:
    """One generation call.

    ``replay_text`` is only for replay engines (``sim``): the recorded output the simulated
    model emits, so that its *duration* comes from the engine and its *text* from the trace.
    Real engines ignore it and generate. Nothing but an engine ever reads it.
    """

    request_id: str
    prompt: str
    max_tokens: int
    replay_text: str | None = None
    priority: int = CANONICAL
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    cache_salt: str | None = None
    session: str = ""  # the workflow request this call belongs to (placement affinity)

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"request {self.request_id}: max_tokens must be >= 1")


@dataclass(frozen=True)
class GenerateResult:
    """The finished call. Times are on the engine's clock, in seconds."""

    request_id: str
    text: str
    prompt_tokens: int
    output_tokens: int
    cached_prompt_tokens: int
    finish_reason: str  # "stop" | "length" | "abort"
    arrived_at: float
    first_scheduled_at: float
    first_token_at: float
    finished_at: float
    preemptions: int = 0
    engine_id: str = ""

    @property
    def engine_s(self) -> float:
        """Time the call spent inside the engine, queueing included."""
        return self.finished_at - self.arrived_at


@dataclass(frozen=True)
class GenerateChunk:
    """One streamed piece of output; the last chunk of a call carries its ``result``."""

    request_id: str
    text_delta: str
    result: GenerateResult | None = None

    @property
    def finished(self) -> bool:
        return self.result is not None


@dataclass(frozen=True)
class LoadSnapshot:
    """What an engine reports about its load at one instant (C3 reads these)."""

    engine_id: str
    time: float
    running: int
    waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    spec_running: int = 0
    spec_waiting: int = 0
    spec_kv_blocks: int = 0
    preemptions_total: int = 0
    busy: float = 0.0  # fraction of the recent window the engine spent executing steps
    stretch: float = 1.0  # mean recent step time over an idle engine's step (>= 1; 1: unknown)

    @property
    def kv_usage(self) -> float:
        return self.kv_blocks_used / self.kv_blocks_total if self.kv_blocks_total else 0.0


class Engine(ABC):
    """An LLM engine serving concurrent generate calls.

    Lifecycle: :meth:`start` once, then any number of concurrent :meth:`generate_stream` /
    :meth:`generate` calls, each cancellable through :meth:`abort` by its request id, then
    :meth:`shutdown`. A call whose id is aborted ends with ``finish_reason == "abort"``.
    """

    engine_id: str
    model: str

    @abstractmethod
    async def start(self) -> None:
        """Allocate what the engine needs (weights, KV pool, step loop)."""

    @abstractmethod
    def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        """Stream the output of one call; the last chunk carries the result."""

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one call to completion and return its result."""
        result = None
        async for chunk in self.generate_stream(request):
            result = chunk.result
        assert result is not None, "an engine stream must end with a result chunk"
        return result

    @abstractmethod
    async def abort(self, request_id: str) -> bool:
        """Cancel a call by id; returns whether it was still queued or running."""

    async def promote(self, request_id: str) -> bool:
        """Serve a speculative call as canonical from now on: a canonical stage now waits on
        its result (it joined a fill). Returns whether the engine holds the call and moved it;
        the default, for an engine that cannot reorder a call once sent, moves nothing."""
        return False

    @abstractmethod
    def load(self) -> LoadSnapshot:
        """The engine's load now."""

    async def health(self) -> bool:
        """Whether the engine can serve."""
        return True

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop the engine; calls still running end as aborted."""
