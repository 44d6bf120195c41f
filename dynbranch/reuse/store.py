"""The subgraph store: C1's records and shadows, their freshness guard, invalidation, eviction.

The store is the mechanism; it owns the records, the read-set index, the provenance index,
the eviction heap and the in-flight registry. Policy (what to evict first) is a small
object from :mod:`dynbranch.reuse.eviction`. It never reads a clock: every method that
needs time takes ``now``. It is not thread-safe; one event loop (or one actor) owns it.

Invariants it keeps (the stateful test checks each):

* a serving lookup never exposes a shadow's value (it gets :class:`ShadowMatch` without it);
* a :class:`Hit` has an equal key and a fresh read-set, its own and every stored upstream's,
  none of it being written (an announced write, :meth:`announce`, not yet committed);
* a record that read a resource being written is never stored;
* after :meth:`write`, no record that read the old version remains, nor any record
  rendered (transitively, through provenance) from a removed one;
* after :meth:`put` returns, the bytes held do not exceed the capacity;
* pinned records and records of names in flight are never evicted.
"""

from __future__ import annotations

import heapq
import itertools
from collections import OrderedDict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace

from dynbranch.errors import TicketError
from dynbranch.reuse.eviction import EvictionPolicy, make_policy
from dynbranch.reuse.inflight import InFlight
from dynbranch.reuse.lookups import (
    Hit,
    Invalidation,
    JoinInFlight,
    Lookup,
    Miss,
    MissReason,
    PinReceipt,
    PutOutcome,
    PutResult,
    ShadowMatch,
    Stale,
    StoreStats,
    Ticket,
    WriteReceipt,
)
from dynbranch.reuse.pins import Pins
from dynbranch.reuse.record import Record, RecordState
from dynbranch.reuse.versions import StaleReads, VersionTable
from dynbranch.reuse.writes import WriteMarks

_SHADOW_TIER, _COMMITTED_TIER = 0, 1


@dataclass(slots=True)
class _Entry:
    record: Record
    last_used: float
    tick: int = 0

    @property
    def size(self) -> int:
        return self.record.size

    @property
    def cost_ms(self) -> float:
        return self.record.cost_ms

    @property
    def hits(self) -> int:
        return self.record.hits


class SubgraphStore:
    """Records and shadows under reuse names, within ``capacity_bytes`` of serialised size.

    ``policy`` is an eviction policy or its name (:data:`~dynbranch.reuse.eviction.POLICIES`);
    ``versions`` may be shared with resource owners (see :meth:`lookup` on freshness);
    ``tombstones`` bounds how many removed names still report why they are gone.

    NOTE: shadows are evicted before any committed record (they are speculative and most
    are never promoted). Nothing pins a shadow between the lookup that finds it and its
    :meth:`promote`: in process the two run back to back, and through the Ray shards a
    put in between may evict it; :meth:`promote` re-checks the name and key, so such a
    shadow is a miss (``None``: the stage executes, or joins a run in flight), never a
    wrong value.
    :meth:`pin` is for a caller that must keep a record across a longer wait.
    """

    def __init__(self, capacity_bytes: int, policy: EvictionPolicy | str = "lru", *,
                 versions: VersionTable | None = None, tombstones: int = 4096) -> None:
        if capacity_bytes < 0:
            raise ValueError(f"capacity_bytes {capacity_bytes} must be >= 0")
        if tombstones < 0:
            raise ValueError(f"tombstones {tombstones} must be >= 0")
        self.capacity_bytes, self.tombstones = capacity_bytes, tombstones
        self.policy = make_policy(policy) if isinstance(policy, str) else policy
        self.versions = versions if versions is not None else VersionTable()
        self.stats = StoreStats()
        self._records: dict[str, _Entry] = {}
        self._by_resource: dict[str, set[str]] = {}  # resource -> names that read it
        self._dependents: dict[str, set[str]] = {}  # upstream name -> names rendered from it
        self._heap: list[tuple[int, tuple[float, ...], int, str]] = []
        self._ticks = itertools.count(1)
        self._bytes = 0
        self._inflight = InFlight()
        self._pins = Pins()
        self._gone: OrderedDict[str, MissReason] = OrderedDict()
        self._marks = WriteMarks()

    # -- reading ---------------------------------------------------------------------------

    def lookup(self, name: str, key_bytes: bytes, now: float, *,
               serving: bool = True) -> Lookup:
        """What the store can do for the stage named ``name`` with key ``key_bytes``.

        The freshness guard: the record's reads, and those of every stored record its input
        was rendered from (provenance, transitively), must be current in :attr:`versions`.
        :meth:`write` removes stale records eagerly; the guard also catches versions an
        owner changed in a shared table behind the store's back, and then removes the
        stale records with their cascade (:class:`Stale`). ``serving=False`` is for C2's
        bookkeeping only: it alone returns a shadow's record. A fresh record that read a
        resource being written (:meth:`announce`) is kept but serves nothing
        (``Miss(WRITING)``): the write may already have changed what it read.
        """
        entry = self._records.get(name)
        if entry is not None and entry.record.key_bytes == key_bytes:
            roots = self._stale_roots(name)
            if roots:
                return self._invalidate_stale(name, roots)
            if self._being_written(name):
                self.stats.misses += 1
                self.stats.writing += 1
                return Miss(MissReason.WRITING)
            if entry.record.committed:
                self.stats.hits += 1
                entry.record = replace(entry.record, hits=entry.record.hits + 1)
                self._touch(entry, now)
                return Hit(entry.record)
            self.stats.shadow_matches += 1
            return ShadowMatch(name, None if serving else entry.record)
        ticket = self._inflight.get(name)
        if ticket is not None and ticket.key_bytes == key_bytes:
            self.stats.joins += 1
            return JoinInFlight(ticket.ticket_id, name, ticket.request_id)
        self.stats.misses += 1
        if entry is not None or ticket is not None:
            self.stats.collisions += 1
            return Miss(MissReason.COLLISION)
        return Miss(self._gone.get(name, MissReason.ABSENT))

    def peek(self, name: str) -> Record | None:
        """The record under ``name`` for inspection (no counters, no recency, no freshness
        check). Never feed its value to a served stage."""
        entry = self._records.get(name)
        return entry.record if entry is not None else None

    def names(self) -> Iterator[str]:
        return iter(list(self._records))

    def __len__(self) -> int:
        return len(self._records)

    def __contains__(self, name: object) -> bool:
        return name in self._records

    @property
    def bytes_held(self) -> int:
        return self._bytes

    @property
    def records_held(self) -> int:
        return len(self._records)

    @property
    def in_flight(self) -> int:
        """Open tickets (zero at teardown, or something leaked)."""
        return len(self._inflight)

    def snapshot(self) -> dict[str, int]:
        """Counters plus bytes and records held, for logs and summaries."""
        return {**asdict(self.stats), "bytes_held": self._bytes,
                "records_held": len(self._records), "in_flight": len(self._inflight),
                "writes_open": len(self._marks)}

    # -- writing ---------------------------------------------------------------------------

    def put(self, record: Record, now: float) -> PutResult:
        """Store a committed record or a shadow, evicting by policy to stay within capacity.

        The versions of resources read for the first time are learned first. Refused
        (nothing else changes) when the record read a version that is no longer current
        or a resource being written (its execution overlapped a write that may have changed
        what it read), is larger than the capacity, is a shadow of a key already committed,
        or only pinned/in-flight records could make room.
        """
        self.versions.learn(record.read_set)
        if self._marks.writing(record.read_set):
            return self._refuse(PutOutcome.WRITING)
        stale = self.versions.stale(record.read_set)
        if stale:
            return self._refuse(PutOutcome.STALE, stale)
        if any(self._gone.get(u) is MissReason.INVALIDATED for u in record.provenance.upstream):
            # NOTE: rendered from a record a write already invalidated: the cascade would
            # have removed this record had it been stored a moment earlier.
            return self._refuse(PutOutcome.STALE)
        if record.size > self.capacity_bytes:
            return self._refuse(PutOutcome.TOO_LARGE)
        old = self._records.get(record.name)
        if (old is not None and not record.committed and old.record.committed
                and old.record.key_bytes == record.key_bytes):
            return self._refuse(PutOutcome.KEPT_COMMITTED)
        freed = old.size if old is not None else 0
        evicted = self._make_room(record.size - freed, keep=record.name)
        if evicted is None:
            return self._refuse(PutOutcome.NO_ROOM)
        if old is not None:
            self._remove(record.name, None)
        self._insert(record, now)
        self.stats.puts += 1
        outcome = PutOutcome.STORED if old is None else PutOutcome.REPLACED
        return PutResult(outcome, evicted)

    def promote(self, name: str, key_bytes: bytes, now: float) -> Record | None:
        """Commit the shadow under ``name`` if its key equals ``key_bytes`` and it is fresh.

        Returns the committed record (also when it was committed already), else ``None``;
        a stale shadow is removed on the way, with its cascade.
        """
        entry = self._records.get(name)
        if entry is None or entry.record.key_bytes != key_bytes:
            return None
        roots = self._stale_roots(name)
        if roots:
            self._invalidate_stale(name, roots)
            return None
        if self._being_written(name):
            self.stats.writing += 1
            return None
        if not entry.record.committed:
            entry.record = replace(entry.record, state=RecordState.COMMITTED)
            self.stats.promotions += 1
        self._touch(entry, now)
        return entry.record

    def drop(self, name: str) -> bool:
        """Discard the shadow under ``name`` (a losing fill); committed records stay."""
        entry = self._records.get(name)
        if entry is None or entry.record.committed:
            return False
        self._remove(name, MissReason.DROPPED)
        self.stats.drops += 1
        return True

    def lose(self, name: str) -> bool:
        """Forget ``name`` as if its bytes were lost; later lookups read Miss(LOST)."""
        if name not in self._records:
            return False
        self._remove(name, MissReason.LOST)
        self.stats.lost += 1
        return True

    # -- versions and invalidation ------------------------------------------------------------

    def observe_reads(self, read_set: Mapping[str, str]) -> StaleReads:
        """Learn versions of resources never seen before; return the reads that are stale."""
        self.versions.learn(read_set)
        return self.versions.stale(read_set)

    def write(self, resource: str, new_version: str | None, now: float, *,
              under: WriteReceipt | None = None) -> Invalidation:
        """``resource`` moved to ``new_version`` (``None``: unknown): remove what read it.

        Removes every record that read ``resource`` at another version, then every record
        whose provenance names a removed one, level by level. ``now`` is accepted for a
        uniform, clock-free signature; invalidation does not depend on it. ``under``: the
        announced write this is part of, checked open first (see :meth:`commit`).
        """
        if under is not None:
            self._marks.check(under)
        else:
            self._marks.contend(resource)
        changed = bool(self.versions.write(resource, new_version))
        current = self.versions.current(resource)
        direct = [n for n in self._by_resource.get(resource, ())
                  if self._records[n].record.read_set[resource] != current]
        levels = self._cascade(direct)
        return Invalidation(resource, changed, levels)

    # -- writes in progress (see dynbranch.reuse.writes) ---------------------------------------

    def announce(self, resources: Iterable[str] | None, request_id: str) -> WriteReceipt:
        """Mark ``resources`` (``None``: all) as being written, before the write can be
        observed: until the commit, records that read one serve nothing and are not stored."""
        self.stats.writes_announced += 1
        return self._marks.announce(resources, request_id)

    def commit(self, receipt: WriteReceipt, writes: Mapping[str, str | None] | None,
               now: float) -> tuple[Invalidation, ...]:
        """Apply the versions the announced write left behind (a version ``None``: changed,
        version unknown; empty: it changed nothing; ``writes=None``: the call failed, so
        whatever it announced may have changed), then lift its marks, consuming ``receipt``.

        Raises :class:`TicketError` (changing nothing) if the receipt is not open. A write
        outside the announced resources is applied too; see :meth:`resolve`."""
        invalidations = tuple(self.write(r, v, now, under=receipt)
                              for r, v in self.resolve(receipt, writes).items())
        self.release(receipt)
        return invalidations

    def resolve(self, receipt: WriteReceipt,
                writes: Mapping[str, str | None] | None) -> dict[str, str | None]:
        """The versions ``receipt``'s commit applies: as reported, except an unknown version
        for each resource another write touched within its window (see
        :mod:`dynbranch.reuse.writes`); for a failed call (``None``), an unknown version of
        each announced resource (of every known one, if it may have written anything)."""
        self._marks.check(receipt)
        if writes is None:
            names = receipt.resources
            return dict.fromkeys(sorted(self.versions.resources() if names is None else names))
        return {r: None if self._marks.contended(receipt, r) else v for r, v in writes.items()}

    def release(self, receipt: WriteReceipt) -> None:
        """Lift ``receipt``'s marks, applying nothing (a sharded store applies the versions on
        every shard first); raises :class:`TicketError` if it is not open."""
        self._marks.release(receipt)
        self.stats.writes_committed += 1

    # -- in flight ----------------------------------------------------------------------------

    def begin(self, name: str, key_bytes: bytes, request_id: str) -> Ticket | JoinInFlight:
        """Claim the execution of ``name``; a second claimant of an equal key joins instead.

        Call after a lookup missed. Every :class:`Ticket` must reach :meth:`finish`.
        """
        got = self._inflight.begin(name, key_bytes, request_id)
        if isinstance(got, JoinInFlight):
            self.stats.joins += 1
        elif not got.registered:
            self.stats.collisions += 1
        return got

    def finish(self, ticket: Ticket, record: Record | None, now: float) -> PutResult | None:
        """Close ``ticket``, storing ``record`` (``None``: failed or cancelled, store nothing).

        Raises :class:`TicketError` if the ticket is not open or the record is of another key.
        """
        if record is not None and (record.name, record.key_bytes) != (ticket.name,
                                                                      ticket.key_bytes):
            raise TicketError(f"ticket {ticket.ticket_id} finished with another key's record")
        self._inflight.finish(ticket)
        return None if record is None else self.put(record, now)

    # -- pins -----------------------------------------------------------------------------------

    def pin(self, name: str) -> PinReceipt | None:
        """Protect the record under ``name`` from eviction (not from invalidation)."""
        return self._pins.pin(name) if name in self._records else None

    def unpin(self, receipt: PinReceipt) -> bool:
        """Release ``receipt``; ``False`` if it was released, or its record removed, already."""
        return self._pins.unpin(receipt)

    # -- internals ------------------------------------------------------------------------------

    def _refuse(self, outcome: PutOutcome, stale: StaleReads | None = None) -> PutResult:
        self.stats.refused += 1
        return PutResult(outcome, (), stale)

    def _insert(self, record: Record, now: float) -> None:
        entry = _Entry(record, now)
        self._records[record.name] = entry
        self._bytes += record.size
        for resource in record.read_set:
            self._by_resource.setdefault(resource, set()).add(record.name)
        for upstream in record.provenance.upstream:
            self._dependents.setdefault(upstream, set()).add(record.name)
        self._gone.pop(record.name, None)
        self._touch(entry, now)

    def _remove(self, name: str, reason: MissReason | None) -> None:
        entry = self._records.pop(name)
        self._bytes -= entry.size
        for resource in entry.record.read_set:
            _discard(self._by_resource, resource, name)
        for upstream in entry.record.provenance.upstream:
            _discard(self._dependents, upstream, name)
        self._pins.forget(name)
        if reason is not None:
            self._gone[name] = reason
            self._gone.move_to_end(name)
            while len(self._gone) > self.tombstones:
                self._gone.popitem(last=False)

    def _touch(self, entry: _Entry, now: float) -> None:
        entry.last_used, entry.tick = now, next(self._ticks)
        tier = _COMMITTED_TIER if entry.record.committed else _SHADOW_TIER
        heapq.heappush(self._heap, (tier, self.policy.priority(entry), entry.tick,
                                    entry.record.name))
        # NOTE: a touch leaves the entry's older heap items behind (skipped when popped, as
        # their tick no longer matches); rebuilding once they outnumber the live ones keeps
        # the heap O(records) and each rebuild amortised O(1) per touch.
        if len(self._heap) > 2 * len(self._records) + 1024:
            self._heap = [item for item in self._heap if self._live(item)]
            heapq.heapify(self._heap)

    def _live(self, item: tuple[int, tuple[float, ...], int, str]) -> bool:
        entry = self._records.get(item[3])
        return entry is not None and entry.tick == item[2]

    def _protected(self, name: str) -> bool:
        return name in self._pins or name in self._inflight

    def _make_room(self, extra: int, keep: str) -> tuple[str, ...] | None:
        """Evict until ``extra`` more bytes fit; ``None`` (evicting nothing) if they cannot."""
        over = self._bytes + extra - self.capacity_bytes
        if over <= 0:
            return ()
        protected = {n for n in itertools.chain(self._pins, self._inflight.names(), (keep,))
                     if n in self._records}
        evictable = self._bytes - sum(self._records[n].size for n in protected)
        if evictable < over:
            return None
        evicted: list[str] = []
        held: list[tuple[int, tuple[float, ...], int, str]] = []
        while self._bytes + extra > self.capacity_bytes:
            item = heapq.heappop(self._heap)
            if not self._live(item):
                continue
            name = item[3]
            if name == keep or self._protected(name):
                held.append(item)
                continue
            self._remove(name, MissReason.EVICTED)
            evicted.append(name)
        for item in held:
            heapq.heappush(self._heap, item)
        self.stats.evictions += len(evicted)
        return tuple(evicted)

    def _closure(self, name: str) -> Iterator[Record]:
        """The stored records ``name`` and its provenance ancestors (transitively)."""
        stack, seen = [name], {name}
        while stack:
            entry = self._records.get(stack.pop())
            if entry is None:
                continue
            yield entry.record
            for upstream in entry.record.provenance.upstream:
                if upstream not in seen:
                    seen.add(upstream)
                    stack.append(upstream)

    def _stale_roots(self, name: str) -> dict[str, StaleReads]:
        """The stored records, ``name`` and its provenance ancestors, whose reads are stale."""
        roots: dict[str, StaleReads] = {}
        for record in self._closure(name):
            stale = self.versions.stale(record.read_set)
            if stale:
                roots[record.name] = stale
        return roots

    def _being_written(self, name: str) -> bool:
        """Whether ``name`` or a stored ancestor read a resource being written."""
        return bool(self._marks) and any(self._marks.writing(r.read_set)
                                         for r in self._closure(name))

    def _invalidate_stale(self, name: str, roots: dict[str, StaleReads]) -> Stale:
        self.stats.stale += 1
        levels = self._cascade(list(roots))
        reads: StaleReads = {}
        for root in sorted(roots):
            for resource, pair in roots[root].items():
                reads.setdefault(resource, pair)
        return Stale(name, reads, tuple(n for level in levels for n in level))

    def _cascade(self, roots: list[str]) -> tuple[tuple[str, ...], ...]:
        """Remove ``roots`` and, level by level, every stored record rendered from them."""
        levels: list[tuple[str, ...]] = []
        level, seen = sorted(set(roots)), set(roots)
        while level:
            for name in level:
                self._remove(name, MissReason.INVALIDATED)
            levels.append(tuple(level))
            nxt = {d for n in level for d in self._dependents.get(n, ())
                   if d not in seen and d in self._records}
            seen |= nxt
            level = sorted(nxt)
        if levels:
            self.stats.invalidated_direct += len(levels[0])
            self.stats.invalidated_cascade += sum(len(lv) for lv in levels[1:])
        return tuple(levels)


def _discard(index: dict[str, set[str]], key: str, name: str) -> None:
    names = index.get(key)
    if names is not None:
        names.discard(name)
        if not names:
            del index[key]
