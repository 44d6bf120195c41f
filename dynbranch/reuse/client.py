"""The store as the orchestrator's hooks see it: async, wherever the store lives.

:class:`StoreClient` mirrors :class:`~dynbranch.reuse.store.SubgraphStore`'s operations as
coroutines, so C1's hook runs unchanged against the in-process store
(:class:`LocalStoreClient`, the ``local`` backend) and against store actors holding records
in Ray's object store (``dynbranch.cluster``, the ``ray`` backend).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Mapping
from typing import Any

from dynbranch.reuse.lookups import (
    Invalidation,
    JoinInFlight,
    Lookup,
    PutResult,
    Ticket,
    WriteReceipt,
)
from dynbranch.reuse.record import Record
from dynbranch.reuse.store import SubgraphStore
from dynbranch.reuse.versions import StaleReads


class StoreClient(ABC):
    """Async access to a subgraph store (see :class:`SubgraphStore` for the semantics)."""

    @abstractmethod
    async def lookup(self, name: str, key_bytes: bytes, now: float, *,
                     serving: bool = True) -> Lookup: ...

    @abstractmethod
    async def put(self, record: Record, now: float) -> PutResult: ...

    @abstractmethod
    async def promote(self, name: str, key_bytes: bytes, now: float) -> Record | None: ...

    @abstractmethod
    async def drop(self, name: str) -> bool: ...

    @abstractmethod
    async def begin(self, name: str, key_bytes: bytes,
                    request_id: str) -> Ticket | JoinInFlight: ...

    @abstractmethod
    async def finish(self, ticket: Ticket, record: Record | None,
                     now: float) -> PutResult | None: ...

    @abstractmethod
    async def observe_reads(self, read_set: Mapping[str, str]) -> StaleReads: ...

    @abstractmethod
    async def write(self, resource: str, new_version: str | None,
                    now: float) -> Invalidation: ...

    @abstractmethod
    async def announce(self, resources: Iterable[str] | None,
                       request_id: str) -> WriteReceipt:
        """Mark ``resources`` (``None``: all) as being written, wherever records reading
        them are held, before the write can be observed."""

    @abstractmethod
    async def commit(self, receipt: WriteReceipt, writes: Mapping[str, str | None] | None,
                     now: float) -> tuple[Invalidation, ...]:
        """Apply the announced write's new versions everywhere, then lift its marks
        (consumes ``receipt``; empty ``writes``: it changed nothing; ``None``: it failed,
        see :meth:`SubgraphStore.commit`)."""

    @abstractmethod
    async def stats(self) -> dict[str, Any]:
        """Counters and holdings (records, bytes) of the whole store."""

    async def close(self) -> None:
        """Release what the client holds (default: nothing)."""


class LocalStoreClient(StoreClient):
    """A :class:`SubgraphStore` in the caller's own process."""

    def __init__(self, store: SubgraphStore) -> None:
        self.store = store

    async def lookup(self, name: str, key_bytes: bytes, now: float, *,
                     serving: bool = True) -> Lookup:
        return self.store.lookup(name, key_bytes, now, serving=serving)

    async def put(self, record: Record, now: float) -> PutResult:
        return self.store.put(record, now)

    async def promote(self, name: str, key_bytes: bytes, now: float) -> Record | None:
        return self.store.promote(name, key_bytes, now)

    async def drop(self, name: str) -> bool:
        return self.store.drop(name)

    async def begin(self, name: str, key_bytes: bytes, request_id: str) -> Ticket | JoinInFlight:
        return self.store.begin(name, key_bytes, request_id)

    async def finish(self, ticket: Ticket, record: Record | None, now: float) -> PutResult | None:
        return self.store.finish(ticket, record, now)

    async def observe_reads(self, read_set: Mapping[str, str]) -> StaleReads:
        return self.store.observe_reads(read_set)

    async def write(self, resource: str, new_version: str | None, now: float) -> Invalidation:
        return self.store.write(resource, new_version, now)

    async def announce(self, resources: Iterable[str] | None,
                       request_id: str) -> WriteReceipt:
        return self.store.announce(resources, request_id)

    async def commit(self, receipt: WriteReceipt, writes: Mapping[str, str | None] | None,
                     now: float) -> tuple[Invalidation, ...]:
        return self.store.commit(receipt, writes, now)

    async def stats(self) -> dict[str, Any]:
        return self.store.snapshot()
