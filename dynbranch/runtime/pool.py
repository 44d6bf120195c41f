"""The engines of each model role, and where each call goes."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence

from dynbranch.engines.client import EngineClient
from dynbranch.engines.protocol import GenerateRequest, GenerateResult, LoadSnapshot
from dynbranch.runtime.placement import PlacementPolicy

TARGET_ROLE = "target"
"""The model role whose engines serve the workflow's LLM stages and their fills."""
DRAFTER_ROLE = "drafter"
"""The model role of the engines predictors draft on (never serves a stage, never priced)."""


class EnginePool:
    """The engines of each model role, with the open-call counts placement decides on."""

    def __init__(self, clients: Mapping[str, Sequence[EngineClient]],
                 placement: Callable[[], PlacementPolicy]) -> None:
        self._clients = {role: list(cs) for role, cs in clients.items()}
        self._open = {role: [0] * len(cs) for role, cs in self._clients.items()}
        self._placement = {role: placement() for role in self._clients}

    def roles(self) -> list[str]:
        return list(self._clients)

    @property
    def drafts(self) -> bool:
        """Whether the pool has drafter engines for predictors to draft on."""
        return DRAFTER_ROLE in self._clients

    async def generate(self, role: str, request: GenerateRequest
                       ) -> tuple[EngineClient, GenerateResult]:
        """Place ``request`` on an engine of ``role`` and run it."""
        clients = self._clients.get(role)
        if not clients:
            raise KeyError(f"no engines for model role {role!r}; roles: {self.roles()}")
        i = self._placement[role].choose(self._open[role], request)
        self._open[role][i] += 1
        try:
            return clients[i], await clients[i].generate(request)
        except asyncio.CancelledError:
            # NOTE: a cancelled caller (a losing fill) must not leave the call running on a
            # remote engine; in-process engines abort on cancellation already (no-op then).
            await asyncio.shield(clients[i].abort(request.request_id))
            raise
        finally:
            self._open[role][i] -= 1

    async def draft(self, request: GenerateRequest) -> GenerateResult:
        """One prediction call on the drafter engines."""
        _client, result = await self.generate(DRAFTER_ROLE, request)
        return result

    async def serving_loads(self) -> list[LoadSnapshot]:
        """The loads C3 prices against: engines that serve stages and fills.

        NOTE: drafter engines serve neither; their snapshots would also break the load
        view's one-snapshot-per-priced-engine check.
        """
        return list(await asyncio.gather(
            *(c.load() for role, clients in self._clients.items() if role != DRAFTER_ROLE
              for c in clients)))
