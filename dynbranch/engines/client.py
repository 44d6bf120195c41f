"""The orchestrator's handle on one engine, wherever it runs.

The ``local`` backend hands out :class:`LocalEngineClient` objects over engines in the
caller's own event loop; the Ray backend (``dynbranch.cluster``) hands out clients of engine
actors with the same coroutines, so everything above runs unchanged on both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from dynbranch.engines.protocol import Engine, GenerateRequest, GenerateResult, LoadSnapshot


class EngineClient(ABC):
    """The orchestrator's handle on one engine."""

    engine_id: str

    @abstractmethod
    async def generate(self, request: GenerateRequest) -> GenerateResult:
        """Run one call to completion."""

    @abstractmethod
    async def abort(self, request_id: str) -> bool:
        """Cancel a call by id."""

    @abstractmethod
    async def load(self) -> LoadSnapshot:
        """The engine's load snapshot."""


class LocalEngineClient(EngineClient):
    """A client for an engine running in the caller's own event loop."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.engine_id = engine.engine_id

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await self.engine.generate(request)

    async def abort(self, request_id: str) -> bool:
        return await self.engine.abort(request_id)

    async def load(self) -> LoadSnapshot:
        return self.engine.load()
