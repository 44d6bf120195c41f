"""Typed results at the store's seams: lookups, puts, invalidations, in-flight tickets.

The store hands its callers these objects, never its internals (its counters too:
:class:`StoreStats`). A :class:`Lookup` is one of
:class:`Hit`, :class:`Miss`, :class:`Stale`, :class:`ShadowMatch` or :class:`JoinInFlight`;
each carries its :class:`LookupKind` so callers can ``match`` on the class or switch on
``kind``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import ClassVar

from dynbranch.reuse.record import Record
from dynbranch.reuse.versions import StaleReads


class LookupKind(enum.StrEnum):
    HIT = "hit"
    MISS = "miss"
    STALE = "stale"
    SHADOW = "shadow"
    JOIN = "join"


class MissReason(enum.StrEnum):
    """Why a name served nothing; the last four say what happened to a record it had."""

    ABSENT = "absent"  # never recorded (or forgotten long ago)
    COLLISION = "collision"  # the name holds a record (or fill) of another key
    WRITING = "writing"  # the record (or one it was rendered from) read a resource being written
    EVICTED = "evicted"
    LOST = "lost"  # the record's bytes were lost (e.g. an object-store failure)
    DROPPED = "dropped"  # a losing fill's shadow, discarded
    INVALIDATED = "invalidated"  # removed by a write or the freshness guard


class Lookup:
    """Base of every lookup result."""

    __slots__ = ()
    kind: ClassVar[LookupKind]


@dataclass(frozen=True, slots=True)
class Hit(Lookup):
    """A committed record with an equal key and a fresh read-set: serve its value."""

    kind: ClassVar[LookupKind] = LookupKind.HIT
    record: Record


@dataclass(frozen=True, slots=True)
class Miss(Lookup):
    """Nothing to serve: execute the stage."""

    kind: ClassVar[LookupKind] = LookupKind.MISS
    reason: MissReason


@dataclass(frozen=True, slots=True)
class Stale(Lookup):
    """The record (or one it was rendered from) read a resource since written; now removed.

    ``removed`` lists every record the store dropped for it (the record, its stale
    ancestors and their cascade).
    """

    kind: ClassVar[LookupKind] = LookupKind.STALE
    record_name: str
    stale_reads: StaleReads
    removed: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class ShadowMatch(Lookup):
    """A fresh shadow with an equal key. ``record`` is ``None`` on serving lookups.

    NOTE: a serving lookup learns only that :meth:`SubgraphStore.promote` would succeed; the
    value becomes readable only through ``promote`` (or a ``serving=False`` lookup, which
    is for C2's bookkeeping and must never feed a served stage).
    """

    kind: ClassVar[LookupKind] = LookupKind.SHADOW
    name: str
    record: Record | None


@dataclass(frozen=True, slots=True)
class JoinInFlight(Lookup):
    """The name is being executed right now with an equal key: wait for ``ticket_id``."""

    kind: ClassVar[LookupKind] = LookupKind.JOIN
    ticket_id: int
    name: str
    owner: str  # request id of the executor


@dataclass(frozen=True, slots=True)
class Ticket:
    """The right to execute ``name``; hand it back with :meth:`SubgraphStore.finish`.

    ``registered`` is false when another key's execution holds the name (a collision): the
    ticket still records its result, but nobody can join it.
    """

    ticket_id: int
    name: str
    key_bytes: bytes
    request_id: str
    registered: bool = True


@dataclass(frozen=True, slots=True)
class WriteReceipt:
    """An announced write: until :meth:`SubgraphStore.commit` consumes it, each of
    ``resources`` (``None``: every resource) counts as being written.

    ``parts`` holds the shards' own receipts when the store is sharded (in shard order),
    so the commit reaches every shard that holds the mark.
    """

    receipt_id: int
    resources: frozenset[str] | None
    request_id: str
    parts: tuple[WriteReceipt, ...] = ()

    def covers(self, resource: str) -> bool:
        """Whether ``resource`` counts as being written under this receipt."""
        return self.resources is None or resource in self.resources


@dataclass(frozen=True, slots=True)
class PinReceipt:
    """Protection of ``name`` from eviction, released by :meth:`SubgraphStore.unpin`."""

    receipt_id: int
    name: str


class PutOutcome(enum.StrEnum):
    STORED = "stored"
    REPLACED = "replaced"  # the name held a record; this one took its place
    KEPT_COMMITTED = "kept_committed"  # a shadow of a key already committed: not stored
    STALE = "stale"  # read a version that is no longer current: not stored
    TOO_LARGE = "too_large"  # larger than the whole capacity: not stored
    NO_ROOM = "no_room"  # pinned/in-flight records leave no room: not stored
    WRITING = "writing"  # read a resource a write in progress may have changed: not stored


@dataclass(frozen=True, slots=True)
class PutResult:
    """What :meth:`SubgraphStore.put` did, and which records it evicted to make room."""

    outcome: PutOutcome
    evicted: tuple[str, ...] = ()
    stale_reads: StaleReads | None = None

    @property
    def stored(self) -> bool:
        return self.outcome in (PutOutcome.STORED, PutOutcome.REPLACED)


@dataclass(frozen=True, slots=True)
class Invalidation:
    """Records removed by one write: ``levels[0]`` read the resource, ``levels[i]`` were
    rendered from a record of ``levels[i-1]`` (write-cascade)."""

    resource: str
    changed: bool
    levels: tuple[tuple[str, ...], ...]

    @property
    def direct(self) -> int:
        return len(self.levels[0]) if self.levels else 0

    @property
    def cascade(self) -> int:
        return sum(len(level) for level in self.levels[1:])

    @property
    def removed(self) -> tuple[str, ...]:
        return tuple(n for level in self.levels for n in level)


@dataclass
class StoreStats:
    """Counters since the store was made. Every lookup counts, serving or not."""

    hits: int = 0
    misses: int = 0  # every Miss, collisions included
    collisions: int = 0  # name held by another key (lookup or begin)
    stale: int = 0  # lookups/promotes that found a stale record
    writing: int = 0  # lookups/promotes that found a record reading a resource being written
    shadow_matches: int = 0
    joins: int = 0
    puts: int = 0  # stored (new or replacing)
    refused: int = 0  # puts not stored (stale, being written, too large, no room, kept)
    promotions: int = 0
    drops: int = 0
    lost: int = 0
    evictions: int = 0
    invalidated_direct: int = 0
    invalidated_cascade: int = 0
    writes_announced: int = 0
    writes_committed: int = 0
