"""One engine inside one Ray actor.

A plain class (made remote by :class:`~dynbranch.cluster.backend.RayBackend` where it is
created) so it can be unit-tested without Ray. Its methods are ``async``: Ray runs them
on the actor's event loop, which is also the loop the engine's step task runs on, so many
generate calls overlap in one actor exactly as they do in process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from dynbranch.clock import RealClock
from dynbranch.engines.config import EngineConfig
from dynbranch.engines.protocol import (
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)


class EngineActor:
    """Hosts one engine; the engine's clock is the actor's real clock.

    ``profile`` is a sim profile, or a real engine's model directory or hub id (resolved on
    the actor's node, into that node's Hugging Face cache); ``config`` tunes a real engine.
    """

    def __init__(
        self, kind: str, profile: str, engine_id: str, config: EngineConfig | None = None
    ) -> None:
        self.kind, self.profile, self.engine_id = kind, profile, engine_id
        self.config = config
        self._engine = None

    async def start(self) -> str:
        """Build and start the engine inside the actor's loop; returns its id."""
        from dynbranch.engines import make_engine

        self._engine = make_engine(
            self.kind,
            profile=self.profile,
            clock=RealClock(),
            engine_id=self.engine_id,
            config=self.config,
        )
        await self._engine.start()
        return self.engine_id

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self._engine.generate(request)

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        async for chunk in self._engine.generate_stream(request):
            yield chunk

    async def abort(self, request_id: str) -> bool:
        return await self._engine.abort(request_id)

    async def load(self) -> LoadSnapshot:
        return self._engine.load()

    async def health(self) -> bool:
        return self._engine is not None and await self._engine.health()

    async def shutdown(self) -> None:
        if self._engine is not None:
            await self._engine.shutdown()
