"""Waiting on an in-flight execution from asyncio, for callers of :meth:`SubgraphStore.begin`.

The store hands out integer ticket ids and knows nothing of asyncio. :class:`Waiters` keeps
one future per ticket id that someone waits on, created lazily in the running loop, and
wakes them when the executor finishes. A woken joiner looks the name up again (it may now
hit, promote a fill's shadow, or miss because the execution failed or went stale), so the
freshness guard stays on its path.
"""

from __future__ import annotations

import asyncio


class Waiters:
    """Futures of in-flight tickets that joiners wait on."""

    def __init__(self, remember: int = 65_536) -> None:
        self._futures: dict[int, asyncio.Future[None]] = {}
        # NOTE: tickets already woken, so a joiner that learns of a ticket only after its
        # executor finished (a store behind an RPC answers late) does not wait forever.
        self._woken: dict[int, None] = {}
        self._remember = remember

    def __len__(self) -> int:
        return len(self._futures)

    async def wait(self, ticket_id: int) -> None:
        """Wait until ticket ``ticket_id`` finishes.

        NOTE: call it right after the store answered :class:`JoinInFlight`, with no await in
        between: on one event loop the executor cannot finish in that gap, so the future
        always exists before :meth:`wake` runs.
        """
        if ticket_id in self._woken:
            return
        future = self._futures.get(ticket_id)
        if future is None:
            future = asyncio.get_running_loop().create_future()
            self._futures[ticket_id] = future
        # NOTE: shield, so one joiner's cancellation does not cancel the others' wait.
        await asyncio.shield(future)

    def wake(self, ticket_id: int) -> bool:
        """Wake every joiner of ``ticket_id``; returns whether any waited."""
        self._woken[ticket_id] = None
        if len(self._woken) > self._remember:
            del self._woken[next(iter(self._woken))]
        future = self._futures.pop(ticket_id, None)
        if future is None:
            return False
        if not future.done():
            future.set_result(None)
        return True
