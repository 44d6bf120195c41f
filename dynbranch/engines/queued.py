"""What engines with a step loop share: one chunk queue per request, and aborting it.

An engine whose step loop pushes each request's chunks into its own queue (``seq.chunks``,
``None`` when the loop failed) and ends requests through ``_end(seq, reason)`` gets
streaming and abort from :class:`QueuedEngine`; the sim and hf engines are two such.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import AsyncIterator
from typing import Any

from dynbranch.engines.protocol import Engine, GenerateChunk, GenerateRequest
from dynbranch.errors import EngineError

WAITING, RUNNING, DONE = "waiting", "running", "done"
"""A request's states inside a queued engine."""


class QueuedEngine(Engine):
    """``generate_stream`` and ``abort`` over per-request chunk queues.

    Subclasses provide ``_submit(request) -> seq`` (with ``seq.chunks`` and ``seq.state``),
    ``_end(seq, reason)``, the ``_seqs`` map of live requests by id and ``_failure``.
    """

    _seqs: dict[str, Any]
    _failure: BaseException | None

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        seq = self._submit(request)
        try:
            while True:
                chunk = await seq.chunks.get()
                if chunk is None:
                    raise EngineError(
                        f"engine {self.engine_id}: step loop failed: {self._failure!r}"
                    ) from self._failure
                yield chunk
                if chunk.finished:
                    return
        finally:
            # NOTE: a consumer that is cancelled or stops iterating must not leave its
            # request running (holding a batch slot and KV) inside the engine.
            if seq.state != DONE:
                self._end(seq, "abort")

    async def abort(self, request_id: str) -> bool:
        seq = self._seqs.get(request_id)
        if seq is None:
            return False
        # NOTE: a step in flight may include it; whatever it computes for it is dropped.
        self._end(seq, "abort")
        return True

    @abstractmethod
    def _submit(self, request: GenerateRequest) -> Any:
        """Queue ``request``; returns its sequence (with ``chunks`` and ``state``)."""

    @abstractmethod
    def _end(self, seq: Any, reason: str, delta: str = "") -> None:
        """End ``seq`` with ``reason``, free what it holds and close its stream."""
