"""One engine inside one Ray actor.

A plain class (made remote by :class:`~dynbranch.cluster.backend.RayBackend` where it is
created) so it can be unit-tested without Ray. Its methods are ``async``: Ray runs them
on the actor's event loop, which is also the loop the engine's step task runs on, so many
generate calls overlap in one actor exactly as they do in process.

The backend creates it with ``max_restarts``: when its process dies, Ray builds it again
with the same arguments, and the first call to reach the new instance starts its engine
(:meth:`EngineActor.ready`), so a restarted engine serves without anyone calling
:meth:`EngineActor.start` again. Its ``health`` is what the pool's probe asks.

The driver's client sends the calls a run makes all the time (``generate``, ``abort``,
``load``) over a stream lane the actor opens on its node (:meth:`EngineActor.open_lane`,
:mod:`dynbranch.cluster.engine_lane`), served on this same loop; the methods below answer
them as actor calls too, for ``--no-stream-lanes`` and while no lane is open.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator

from dynbranch.clock import RealClock
from dynbranch.cluster.engine_lane import engine_handler
from dynbranch.cluster.stream import LaneServer, listen
from dynbranch.engines.config import EngineConfig
from dynbranch.engines.protocol import (
    Engine,
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
        self._starting: asyncio.Task | None = None
        self._lane: LaneServer | None = None

    async def start(self) -> str:
        """Build and start the engine inside the actor's loop (once); returns its id."""
        await self.ready()
        return self.engine_id

    async def ready(self) -> Engine:
        """The started engine, starting it first if this instance has not yet (a restart).

        NOTE: concurrent first calls share one start.
        """
        if self._engine is None:
            if self._starting is None:
                self._starting = asyncio.get_running_loop().create_task(self._start())
            await asyncio.shield(self._starting)
        assert self._engine is not None
        return self._engine

    async def _start(self) -> None:
        from dynbranch.engines import make_engine

        engine = make_engine(
            self.kind,
            profile=self.profile,
            clock=RealClock(),
            engine_id=self.engine_id,
            config=self.config,
        )
        await engine.start()
        self._engine = engine

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        return await (await self.ready()).generate(request)

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        async for chunk in (await self.ready()).generate_stream(request):
            yield chunk

    async def abort(self, request_id: str) -> bool:
        return await (await self.ready()).abort(request_id)

    async def promote(self, request_id: str) -> bool:
        return await (await self.ready()).promote(request_id)

    async def load(self) -> LoadSnapshot:
        return (await self.ready()).load()

    async def health(self) -> bool:
        """Whether the engine serves (starting it first after a restart)."""
        return await (await self.ready()).health()

    async def open_lane(self, token: bytes) -> tuple[str, int]:
        """Listen for a direct lane (:mod:`dynbranch.cluster.engine_lane`) on this node, once,
        and let a connection that first sends ``token`` in; returns the listener's address."""
        await self.ready()
        if self._lane is None:
            self._lane = LaneServer(engine_handler(self.ready))
        return await listen(self._lane, token, in_thread=False)

    async def pid(self) -> int:
        """The actor's process id (fault injection kills it to crash the actor)."""
        return os.getpid()

    async def node(self) -> str:
        """The id of the Ray node the actor runs on (where placement put it)."""
        import ray

        return ray.get_runtime_context().get_node_id()

    async def shutdown(self) -> None:
        if self._lane is not None:
            self._lane.close()
        if self._engine is not None:
            await self._engine.shutdown()
