"""The orchestrator's handle on one engine, wherever it runs.

The ``local`` backend hands out :class:`LocalEngineClient` objects over engines in the
caller's own event loop; the Ray backend (``dynbranch.cluster``) hands out clients of engine
actors with the same coroutines, so everything above runs unchanged on both.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from dataclasses import dataclass

from dynbranch.engines.protocol import Engine, GenerateRequest, GenerateResult, LoadSnapshot

SATURATED = 1 << 20
"""Sequences a :class:`DownSnapshot` reports running and waiting: more than any engine holds."""


@dataclass(frozen=True)
class DownSnapshot(LoadSnapshot):
    """The load snapshot of an engine that is down (dead, restarting, not answering).

    Explicit, never silently idle: the load view leaves a down engine out of the capacity it
    normalises by (by this type), and any other reader sees it saturated (every sequence
    slot and KV block taken, always busy), so nothing is placed or priced onto it.
    """

    reason: str = ""

    @classmethod
    def of(cls, engine_id: str, time: float, reason: str) -> DownSnapshot:
        """The snapshot of down engine ``engine_id`` at ``time``."""
        return cls(engine_id, time, running=SATURATED, waiting=SATURATED, kv_blocks_used=1,
                   kv_blocks_total=1, busy=1.0, reason=reason)


class EngineClient(ABC):
    """The orchestrator's handle on one engine.

    ``remote`` is true for an engine in another process: it can die or hang without raising
    here, so the pool races its calls against its health (see
    :class:`~dynbranch.runtime.pool.EnginePool`). ``load_at_once`` is true when :meth:`load`
    answers without suspending (an engine in this event loop, nothing in between), so the
    pool may read many loads without a task each.
    """

    engine_id: str
    remote: bool = False
    load_at_once: bool = False

    @abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one call to completion."""

    @abstractmethod
    async def abort(self, request_id: str) -> bool:
        """Cancel a call by id."""

    @abstractmethod
    async def load(self) -> LoadSnapshot:
        """The engine's load snapshot."""

    async def promote(self, request_id: str) -> bool:
        """Serve a speculative call as canonical from now on (see
        :meth:`~dynbranch.engines.protocol.Engine.promote`); the default moves nothing."""
        return False

    async def health(self) -> bool:
        """Whether the engine answers and is serving (its health probe); never raises."""
        return True

    def start(self, request: GenerateRequest) -> asyncio.Future | None:
        """Send ``request`` to a remote engine now, within the caller's step, and return the
        future of its answer, which :meth:`finish` reads; ``None`` when this client cannot
        (the pool then runs :meth:`generate` as a task of its own)."""
        return None

    def finish(self, started: asyncio.Future, request: GenerateRequest) -> GenerateResult:
        """The result of the call :meth:`start` sent, whose future ``started`` is done;
        raises what :meth:`generate` would have."""
        raise NotImplementedError(f"{type(self).__name__} starts no calls")


class LocalEngineClient(EngineClient):
    """A client for an engine running in the caller's own event loop."""

    load_at_once = True

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.engine_id = engine.engine_id

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self.engine.generate(request)

    async def abort(self, request_id: str) -> bool:
        return await self.engine.abort(request_id)

    async def promote(self, request_id: str) -> bool:
        return await self.engine.promote(request_id)

    async def load(self) -> LoadSnapshot:
        return self.engine.load()

    async def health(self) -> bool:
        try:
            return await self.engine.health()
        except Exception:  # NOTE: a probe reports; it never fails its caller
            return False
