"""C1's subgraph store on Ray: shard actors whose records' Arrow bytes live in the object store.

* :class:`StoreActor` — one shard, a plain class made remote where it is created (see
  :meth:`~dynbranch.cluster.backend.RayBackend.make_store`). Its metadata is a
  :class:`~dynbranch.reuse.store.SubgraphStore` holding each record *without* its payload
  (input fields and output value); the record's full :func:`~dynbranch.reuse.record.to_arrow`
  bytes are ``ray.put`` by the actor itself, so the actor owns them and a caller that dies
  cannot take them along. Freshness, promotion, eviction, invalidation and in-flight joins
  are therefore SubgraphStore's own code, not a copy of it.
* :class:`RayStoreClient` — the orchestrator's :class:`~dynbranch.reuse.client.StoreClient`
  over N shards, sharded by reuse name. A hit comes back as an :class:`ObjectRef` that the
  client fetches and decodes; a lost object reads as ``Miss(LOST)``, never as an error.

Writes are broadcast and cascade across shards: a record on one shard whose provenance names
a record removed on another is removed too (see :meth:`RayStoreClient.write`). A write in
progress is marked on every shard, until its cascade reached all (:meth:`RayStoreClient.commit`).
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from dynbranch.cluster.store_lane import encode_lookup
from dynbranch.cluster.store_reads import Held, Located, LookupBatcher, hold, read_located
from dynbranch.cluster.stream import Handler, LaneServer, listen
from dynbranch.errors import CorruptRecordError, TicketError
from dynbranch.reuse.client import StoreClient
from dynbranch.reuse.eviction import EvictionPolicy
from dynbranch.reuse.lookups import (
    Hit,
    Invalidation,
    JoinInFlight,
    Lookup,
    LookupKind,
    Miss,
    MissReason,
    PutResult,
    ShadowMatch,
    Ticket,
    WriteReceipt,
)
from dynbranch.reuse.record import Record, to_arrow
from dynbranch.reuse.store import SubgraphStore
from dynbranch.reuse.versions import StaleReads

if TYPE_CHECKING:
    from ray.actor import ActorHandle

DEFAULT_SHARDS = 2
"""Store actors per run unless the backend is told otherwise."""


# -- what crosses the wire ---------------------------------------------------------------------


def strip(record: Record) -> Record:
    """``record`` without its payload (input fields and value): what a shard's index keeps.

    ``size`` is kept, so capacity and eviction count the full serialised bytes.
    """
    return replace(record, fields_bytes=b"", value_bytes=b"")


# -- one shard ---------------------------------------------------------------------------------


class _ShardStore(SubgraphStore):
    """A :class:`SubgraphStore` that reports every removal and takes remote upstreams.

    NOTE: this subclass leans on two internals of SubgraphStore. Every way a record leaves
    it (eviction, invalidation, the freshness guard, drop, lose, replacement) goes through
    ``_remove``, so hooking it keeps the object refs in lockstep with the metadata; and
    ``_cascade``/``_dependents`` let a shard remove the records rendered from records that
    another shard removed, level by level, exactly as a local write would.
    """

    def __init__(self, capacity_bytes: int, policy: EvictionPolicy | str,
                 on_remove: Callable[[str], None], *, tombstones: int = 4096) -> None:
        super().__init__(capacity_bytes, policy, tombstones=tombstones)
        self._on_remove = on_remove

    def _remove(self, name: str, reason: MissReason | None) -> None:
        super()._remove(name, reason)
        self._on_remove(name)

    def invalidate_upstream(self, gone: Mapping[str, int]) -> dict[str, int]:
        """Remove the records rendered from ``gone`` (names removed elsewhere, with their
        depth in the write's cascade) and, in cascade, what was rendered from those.

        Returns each removed name with its depth: one more than the upstream that reached it
        first, plus its level in this shard's cascade.
        """
        roots: dict[str, int] = {}
        for upstream, depth in gone.items():
            for name in self._dependents.get(upstream, ()):
                if name in self._records:
                    roots[name] = min(roots.get(name, depth + 1), depth + 1)
        removed: dict[str, int] = {}
        for depth in sorted(set(roots.values())):
            group = [n for n, d in roots.items() if d == depth and n in self._records]
            for offset, level in enumerate(self._cascade(group)):
                removed.update((n, depth + offset) for n in level)
            # NOTE: ``_cascade`` counts its roots as direct invalidations; here they were
            # reached through another shard's removal, so they are cascade like the rest.
            direct = len(group)
            self.stats.invalidated_direct -= direct
            self.stats.invalidated_cascade += direct
        return removed


class StoreActor:
    """One shard of the subgraph store: metadata in a SubgraphStore, bytes in Ray's object store.

    A plain class; :meth:`~dynbranch.cluster.backend.RayBackend.make_store` makes it remote
    as a :func:`~dynbranch.cluster.threaded.threaded` actor. Its methods are ``async`` with
    nothing inside that suspends, so each runs to completion: one operation at a time, as
    the store requires.
    """

    def __init__(self, capacity_bytes: int, policy: str = "lru", shard: int = 0, *,
                 tombstones: int = 4096) -> None:
        self.shard = shard
        # NOTE: taken by every call (see threaded()): a stream lane's lookups run on a
        # thread of their own, beside Ray's calls
        self._call_lock = threading.RLock()
        self._stream: LaneServer | None = None
        self._objects: dict[str, Held] = {}
        self._object_bytes = 0
        self._store = _ShardStore(capacity_bytes, policy, self._release, tombstones=tombstones)

    # -- reading ---------------------------------------------------------------------------

    async def lookup(self, name: str, key_bytes: bytes, now: float,
                     serving: bool = True) -> Lookup | Located:
        """:meth:`SubgraphStore.lookup`, with a record's bytes as a ref (:class:`Located`)."""
        return self._lookup(name, key_bytes, now, serving)

    def _lookup(self, name: str, key_bytes: bytes, now: float,
                serving: bool) -> Lookup | Located:
        got = self._store.lookup(name, key_bytes, now, serving=serving)
        if isinstance(got, Hit):
            return self._locate(got.record, LookupKind.HIT)
        if isinstance(got, ShadowMatch) and got.record is not None:
            return self._locate(got.record, LookupKind.SHADOW)
        return got

    async def lookup_many(self, queries: Sequence[tuple[str, bytes, float, bool]]
                          ) -> list[Lookup | Located]:
        """Each ``(name, key_bytes, now, serving)`` answered as :meth:`lookup` would, in
        order (one call for all the lookups a client batched for this shard)."""
        return [self._lookup(*query) for query in queries]

    async def open_stream(self, token: bytes) -> list:
        """Listen for a stream lane (:mod:`dynbranch.cluster.store_lane`) on this node, once,
        on a thread of its own, and let a connection that first sends ``token`` in; returns
        the listener's address. Its one call is ``lookup_many``."""
        if self._stream is None:
            self._stream = LaneServer(self._lane_handler())
        return await listen(self._stream, token, in_thread=True)

    def _lane_handler(self) -> Handler:
        async def handle(method: str, arg: list) -> list:
            if method != "lookup_many":
                raise ValueError(f"{method!r} does not go through the store lane")
            # NOTE: this instance's own ``lookup_many`` (under threaded(), a plain method
            # that takes the call lock; a guarded one on a restartable shard)
            got: Any = self.lookup_many([tuple(query) for query in arg])
            if inspect.isawaitable(got):
                got = await got
            return [encode_lookup(g, self._bytes_of(g)) for g in got]

        return handle

    def _bytes_of(self, got: Any) -> Any:
        """A located large record's bytes, read from this node's object store."""
        if not isinstance(got, Located) or got.data is not None:
            return None
        import ray

        return ray.get(got.refs[0])

    async def promote(self, name: str, key_bytes: bytes, now: float) -> Located | Miss | None:
        """:meth:`SubgraphStore.promote`; the committed record comes back as a ref."""
        record = self._store.promote(name, key_bytes, now)
        return None if record is None else self._locate(record, LookupKind.HIT)

    # -- writing ---------------------------------------------------------------------------

    async def put(self, meta: Record, data: bytes, now: float) -> PutResult:
        """Store ``meta`` (a :func:`strip`-ped record) whose full Arrow bytes are ``data``."""
        return self._stored(meta, data, lambda: self._store.put(meta, now))

    async def finish(self, ticket: Ticket, meta: Record | None, data: bytes | None,
                     now: float) -> PutResult | None:
        """:meth:`SubgraphStore.finish` with a stripped record and its bytes (or nothing)."""
        if meta is None or data is None:
            return self._store.finish(ticket, None, now)
        return self._stored(meta, data, lambda: self._store.finish(ticket, meta, now))

    async def drop(self, name: str) -> bool:
        return self._store.drop(name)

    async def lose(self, name: str, object_id: str) -> bool:
        """The bytes ``object_id`` of ``name`` could not be read: forget the record.

        Only if ``name`` still holds that object (a newer record under the name stays).
        """
        held = self._objects.get(name)
        if held is None or held.ref.hex() != object_id:
            return False
        return self._store.lose(name)

    # -- in flight, versions, invalidation -------------------------------------------------

    async def begin(self, name: str, key_bytes: bytes, request_id: str) -> Ticket | JoinInFlight:
        return self._store.begin(name, key_bytes, request_id)

    async def observe_reads(self, read_set: Mapping[str, str]) -> StaleReads:
        return self._store.observe_reads(read_set)

    async def write(self, resource: str, new_version: str | None, now: float,
                    under: WriteReceipt | None = None) -> Invalidation:
        return self._store.write(resource, new_version, now, under=under)

    async def announce(self, resources: frozenset[str] | None, request_id: str) -> WriteReceipt:
        return self._store.announce(resources, request_id)

    async def resolve(self, receipt: WriteReceipt, writes: dict | None) -> dict[str, str | None]:
        return self._store.resolve(receipt, writes)

    async def release(self, receipt: WriteReceipt) -> None:
        self._store.release(receipt)

    async def invalidate_upstream(self, gone: Mapping[str, int]) -> dict[str, int]:
        """See :meth:`_ShardStore.invalidate_upstream`."""
        return self._store.invalidate_upstream(gone)

    # -- inspection ------------------------------------------------------------------------

    async def stats(self) -> dict[str, int]:
        """The store's counters and holdings, plus the objects this shard owns."""
        return {**self._store.snapshot(), "objects_held": len(self._objects),
                "object_bytes": self._object_bytes}

    async def held_objects(self) -> dict[str, str]:
        """Object id (hex) of each record's bytes, by name."""
        return {name: held.ref.hex() for name, held in self._objects.items()}

    # -- internals -------------------------------------------------------------------------

    def _hold(self, data: bytes) -> Held:
        """Put ``data`` in the object store, owned by this actor (see :func:`hold`)."""
        return hold(data)

    def _stored(self, meta: Record, data: bytes,
                store: Callable[[], PutResult | None]) -> PutResult | None:
        # NOTE: the bytes go in first: if the object store refuses them, the metadata is
        # untouched. A refused put only leaves an object nobody references, freed at once.
        held = self._hold(data)
        result = store()
        if result is not None and result.stored:
            self._objects[meta.name] = held
            self._object_bytes += len(data)
        return result

    def _release(self, name: str) -> None:
        """The record ``name`` left the store: drop its ref so Ray can free the bytes."""
        held = self._objects.pop(name, None)
        if held is not None:
            self._object_bytes -= held.nbytes

    def _locate(self, record: Record, kind: LookupKind) -> Located | Miss:
        held = self._objects.get(record.name)
        if held is None:  # cannot happen while _release mirrors _remove; never serve blind
            self._store.lose(record.name)
            return Miss(MissReason.LOST)
        refs = () if held.view is not None else (held.ref,)
        return Located(kind, record.name, record.state, record.hits, refs, held.ref.hex(),
                       held.view)


# -- the client ----------------------------------------------------------------------------------


def shard_of(name: str, shards: int) -> int:
    """The shard holding reuse name ``name``: stable across processes and runs.

    Names are hex digests, so their first 32 bits are uniform; any other name (an injected
    hash function) falls back to CRC-32.
    """
    try:
        bits = int(name[:8], 16)
    except ValueError:
        bits = zlib.crc32(name.encode())
    return bits % shards


class RayStoreClient(StoreClient):
    """A :class:`StoreClient` over :class:`StoreActor` shards, sharded by reuse name.

    The client holds no records and owns no actors (the backend kills them at shutdown).

    NOTE: ticket ids are made unique across shards as ``local_id * shards + shard``, so
    :class:`~dynbranch.reuse.joins.Waiters` can key on them; :meth:`finish` routes by the id.

    NOTE: each shard keeps its own version table, fed every observation and write: writes
    and :meth:`observe_reads` go to every shard, and a record's first read of a resource is
    broadcast before its put. Versions change only by a write, which every shard applies and
    whose cascade crosses shards, so a shard's freshness guard need not see other shards.
    """

    def __init__(self, shards: Sequence[ActorHandle]) -> None:
        if not shards:
            raise ValueError("a RayStoreClient needs at least one shard")
        self._shards = list(shards)
        self._known: set[str] = set()  # resources every shard has been told of
        self._receipt_ids = itertools.count(1)
        self.batcher = LookupBatcher(self._send_lookups)

    @property
    def shards(self) -> int:
        return len(self._shards)

    def shard_of(self, name: str) -> int:
        return shard_of(name, len(self._shards))

    # -- reading ---------------------------------------------------------------------------

    async def lookup(self, name: str, key_bytes: bytes, now: float, *,
                     serving: bool = True) -> Lookup:
        shard = self.shard_of(name)
        got = await self.batcher.lookup(shard, name, key_bytes, now, serving)
        if isinstance(got, Located):
            record = await self._fetch(shard, got, key_bytes)
            if record is None:
                return Miss(MissReason.LOST)
            return Hit(record) if got.kind is LookupKind.HIT else ShadowMatch(name, record)
        if isinstance(got, JoinInFlight):
            return replace(got, ticket_id=self._global_id(shard, got.ticket_id))
        return got

    async def promote(self, name: str, key_bytes: bytes, now: float) -> Record | None:
        shard = self.shard_of(name)
        got = await self._shards[shard].promote.remote(name, key_bytes, now)
        return await self._fetch(shard, got, key_bytes) if isinstance(got, Located) else None

    # -- writing ---------------------------------------------------------------------------

    async def put(self, record: Record, now: float) -> PutResult:
        await self._learn(record.read_set)
        actor = self._shards[self.shard_of(record.name)]
        return await actor.put.remote(strip(record), to_arrow(record), now)

    async def drop(self, name: str) -> bool:
        return await self._shards[self.shard_of(name)].drop.remote(name)

    async def begin(self, name: str, key_bytes: bytes, request_id: str) -> Ticket | JoinInFlight:
        shard = self.shard_of(name)
        got = await self._shards[shard].begin.remote(name, key_bytes, request_id)
        return replace(got, ticket_id=self._global_id(shard, got.ticket_id))

    async def finish(self, ticket: Ticket, record: Record | None, now: float) -> PutResult | None:
        local_id, shard = divmod(ticket.ticket_id, len(self._shards))
        local = replace(ticket, ticket_id=local_id)
        if record is None:
            return await self._shards[shard].finish.remote(local, None, None, now)
        await self._learn(record.read_set)
        return await self._shards[shard].finish.remote(local, strip(record), to_arrow(record),
                                                       now)

    # -- versions and invalidation ---------------------------------------------------------

    async def observe_reads(self, read_set: Mapping[str, str]) -> StaleReads:
        self._known.update(read_set)
        replies = await self._broadcast("observe_reads", dict(read_set))
        stale: StaleReads = {}
        for reply in replies:  # identical on every shard; merged in case one disagrees
            for resource, pair in reply.items():
                stale.setdefault(resource, pair)
        return stale

    async def write(self, resource: str, new_version: str | None, now: float) -> Invalidation:
        """Apply the write on every shard, then chase its cascade across shards.

        Each round tells every shard which names were just removed elsewhere; a shard
        removes the records rendered from them (and their local cascade). The rounds stop
        when one removes nothing. Levels merge by depth; a record reached along several
        cross-shard paths gets the depth of the path that reached it first, so the removed
        set is exact and the depths are upper bounds of the shortest paths.
        """
        return await self._write(resource, new_version, now, ())

    async def announce(self, resources: Iterable[str] | None, request_id: str) -> WriteReceipt:
        """Mark ``resources`` as being written on every shard; returns once all hold it."""
        names = None if resources is None else frozenset(resources)
        pending = asyncio.gather(*(a.announce.remote(names, request_id) for a in self._shards))
        try:
            parts = await asyncio.shield(pending)
        except asyncio.CancelledError:
            # NOTE: the shards hold the marks anyway: lift them, or lookups would miss for good
            await self._broadcast("release", parts=await pending)
            raise
        return WriteReceipt(next(self._receipt_ids), names, request_id, tuple(parts))

    async def commit(self, receipt: WriteReceipt, writes: Mapping[str, str | None] | None,
                     now: float) -> tuple[Invalidation, ...]:
        """Apply each write on every shard (each checks its part of ``receipt`` is open; shard
        0 resolves contended writes, so all apply one version) with its cross-shard cascade,
        then lift the marks on every shard. NOTE: the marks go last, so no shard serves a
        record reading the old version while another has yet to apply the write or its
        cascade; a cancelled caller still waits for the commit to end."""
        work = asyncio.ensure_future(self._commit(receipt, writes, now))
        try:
            return await asyncio.shield(work)
        except asyncio.CancelledError:
            await work
            raise

    async def _commit(self, receipt: WriteReceipt, writes: Mapping[str, str | None] | None,
                      now: float) -> tuple[Invalidation, ...]:
        if len(receipt.parts) != len(self._shards):
            raise TicketError(f"write receipt {receipt.receipt_id}: not of these shards")
        writes = await self._shards[0].resolve.remote(receipt.parts[0], writes and dict(writes))
        invalidations = tuple([await self._write(resource, version, now, receipt.parts)
                               for resource, version in writes.items()])
        await self._broadcast("release", parts=receipt.parts)
        return invalidations

    async def _write(self, resource: str, new_version: str | None, now: float,
                     parts: tuple[WriteReceipt, ...]) -> Invalidation:
        self._known.add(resource)
        invs = await self._broadcast("write", resource, new_version, now, parts=parts)
        depth = {n: d for inv in invs for d, level in enumerate(inv.levels) for n in level}
        fresh = dict(depth)
        while fresh:
            replies = await self._broadcast("invalidate_upstream", fresh)
            fresh = {n: d for reply in replies for n, d in reply.items() if n not in depth}
            depth.update(fresh)
        return Invalidation(resource, any(inv.changed for inv in invs), _levels(depth))

    # -- inspection ------------------------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """Every shard's counters and holdings, summed; ``shards`` says how many."""
        totals: dict[str, Any] = {}
        for reply in await self._broadcast("stats"):
            for k, v in reply.items():
                totals[k] = totals.get(k, 0) + v
        return {**totals, "shards": len(self._shards)}

    # -- internals -------------------------------------------------------------------------

    async def _send_lookups(self, shard: int, queries: Sequence[tuple]) -> list[Any]:
        """One batch of lookups to ``shard``: a plain ``lookup`` when it is alone."""
        handle = self._shards[shard]
        # NOTE: a shard set's handle (shard_set.ShardHandle, which imports this module) reads
        # in this task, not one of its own; a bare actor handle has no read_now
        read = (handle.read_now if hasattr(type(handle), "read_now")
                else lambda method, *args: getattr(handle, method).remote(*args))
        if len(queries) == 1:
            return [await read("lookup", *queries[0])]
        return await read("lookup_many", list(queries))

    def _global_id(self, shard: int, local_id: int) -> int:
        return local_id * len(self._shards) + shard

    async def _broadcast(self, method: str, *args: Any,
                         parts: Sequence[Any] = ()) -> list[Any]:
        """Call ``method`` with ``args`` (and ``parts``: each shard's own last argument) on
        every shard at once; replies in shard order."""
        last = [(p,) for p in parts] if parts else [()] * len(self._shards)
        return list(await asyncio.gather(*(getattr(a, method).remote(*args, *x)
                                           for a, x in zip(self._shards, last, strict=True))))

    async def _learn(self, read_set: Mapping[str, str]) -> None:
        """Tell every shard of resources first read here, before the record is put.

        NOTE: a version table adopts the first version it hears of a resource; sending it to
        every shard (in one order, from this one client) keeps the tables equal, so a put is
        refused as stale on its shard exactly when it would be by a single store.
        """
        new = {r: v for r, v in read_set.items() if r not in self._known}
        if new:
            await self.observe_reads(new)

    async def _fetch(self, shard: int, located: Located, key_bytes: bytes) -> Record | None:
        """The record ``located`` points at, or ``None`` (after telling the shard) if its
        bytes are lost or do not decode to the record looked up."""
        from ray.exceptions import RayError

        try:
            record = await read_located(located, key_bytes)
        except (RayError, CorruptRecordError):
            await self._shards[shard].lose.remote(located.name, located.object_id)
            return None
        return replace(record, state=located.state, hits=located.hits)


def _levels(depth: Mapping[str, int]) -> tuple[tuple[str, ...], ...]:
    by_depth: dict[int, list[str]] = {}
    for name, d in depth.items():
        by_depth.setdefault(d, []).append(name)
    return tuple(tuple(sorted(by_depth[d])) for d in sorted(by_depth))


def make_shards(capacity_bytes: int, policy: str, shards: int,
                actor_cls: type[StoreActor] = StoreActor) -> list[ActorHandle]:
    """Start ``shards`` store actors splitting ``capacity_bytes`` evenly (``actor_cls``: a
    subclass, for tests).

    NOTE: they take no CPU (``num_cpus=0``: a shard is bookkeeping between RPCs, and must
    not compete with engines for a placement bundle) and need no placement group. They are
    anonymous and owned by the driver, so they die with it even if nobody kills them; they
    run on the driver's node where Ray can put them there (:func:`beside_driver`).
    """
    import ray

    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    from dynbranch.cluster.threaded import threaded

    remote_cls = ray.remote(threaded(actor_cls))
    per_shard = capacity_bytes // shards
    return [remote_cls.options(num_cpus=0, scheduling_strategy=beside_driver())
            .remote(per_shard, policy, i) for i in range(shards)]


def beside_driver():
    """A scheduling strategy for an actor every stage calls: the driver's node, if it can.

    NOTE: the orchestrator runs in the driver, so a shard there answers without a network
    hop and its objects are read from the driver's own shared memory; soft, because a node
    that cannot host it (a driver outside the cluster) must not keep the run from starting.
    It also keeps the shards off worker nodes that may be removed mid-run.
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=True)
