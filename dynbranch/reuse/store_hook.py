"""C1 over a subgraph store: the reuse hook of the ``c1``, ``c2`` and ``full`` arms.

For every reusable stage (deterministic and effect-free, see
:class:`~dynbranch.runtime.stage.StageCall`) the hook derives the reuse name once from the
stage's fingerprint, complete rendered input, model and revision, parameters and the
tenant, and:

* serves a committed record with an equal key and a fresh read-set (``cache``), promotes a
  fresh shadow a fill left (``shadow``), or waits for an equal execution in flight and is
  served its result (``join``);
* otherwise claims the name and hands back the :class:`~dynbranch.reuse.hook.Claim`; when
  the stage has executed, :meth:`StoreReuseHook.record` keeps its output under the claim's
  key with its read-set (the external reads it made) and its provenance (the records of the
  same request its input was rendered from), so a write invalidates it and, in cascade,
  what was rendered from it;
* runs C1's write protocol for every tool call that may write: :meth:`~StoreReuseHook.announce`
  marks its declared write set as being written in the store before the call runs, and
  :meth:`~StoreReuseHook.commit` applies the versions it left behind (invalidating, in
  cascade, what read the old ones) and lifts the marks; a write no announcement covered
  goes straight to the store's freshness guard (:meth:`~StoreReuseHook.writes`).

``track_reads=False`` drops the read-set and ignores writes, announced or not: the Helium⁺
baseline's exact operator cache, which can serve stale results (the independent splice
checker counts them).

Fills (C2) go through :meth:`StoreReuseHook.claim_fill`: reuse what the store already
holds, else claim the name, execute at speculative priority and leave a *shadow*
(:meth:`~StoreReuseHook.shadow`), which only a canonical lookup of the same name can
promote. ``cross_request=False`` (the ``c2`` arm and the request-scoped baselines) scopes
every name to its request and records no canonical execution: fills are promoted within
their own request, and nothing is reused across requests.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from dynbranch.errors import NotSpeculable, ReuseError
from dynbranch.reuse.hook import (
    EXECUTE,
    Claim,
    FillSlot,
    ReuseHook,
    Served,
    StageLookup,
    StageOutcome,
    WriteAnnouncement,
)
from dynbranch.reuse.joins import Waiters
from dynbranch.reuse.lookups import Hit, JoinInFlight, ShadowMatch, Ticket
from dynbranch.reuse.names import HashFn, ReuseKey, key_for, reuse_name, sha256hex
from dynbranch.reuse.record import Provenance, Record, RecordState
from dynbranch.runtime.run import RunContext
from dynbranch.runtime.stage import StageCall
from dynbranch.workload import WriteSet

MAX_JOIN_ROUNDS = 8
"""Re-lookups after joins before a stage simply executes (a join can end in a miss)."""


class StoreReuseHook(ReuseHook):
    """Cross-request exact reuse through a :class:`~dynbranch.reuse.client.StoreClient`."""

    name = "c1"
    keeps_shadows = True

    def __init__(self, store, run: RunContext, *, track_reads: bool = True,
                 cross_request: bool = True, hash_fn: HashFn = sha256hex,
                 name: str | None = None) -> None:
        self.store, self.run = store, run
        self.track_reads, self.cross_request, self.hash_fn = track_reads, cross_request, hash_fn
        if name is not None:
            self.name = name
        self.waiters = Waiters()
        self._on_join: dict[int, Callable[[], None]] = {}  # a fill's ticket → its when_joined
        self._open_claims = self._open_writes = 0
        self.counts = {"served_cache": 0, "served_shadow": 0, "served_join": 0,
                       "fills_joined": 0,
                       "executed": 0, "recorded": 0, "unrecordable": 0, "not_its_input": 0,
                       "writes": 0,
                       "invalidated": 0, "announced": 0, "undeclared_writes": 0}

    # -- naming ---------------------------------------------------------------------------

    def key(self, call: StageCall) -> ReuseKey:
        """The stage's reuse key (raises :class:`~dynbranch.errors.ReuseError` when its
        input cannot be encoded canonically)."""
        spec = call.stage
        if spec.kind == "llm":
            model = self.run.models.get(spec.model)
            model_name, revision = (model.model, model.revision) if model else (spec.model, "")
        else:
            model_name, revision = f"tool:{spec.tool}", ""
        # NOTE: the tenant is a key field of its own and a request scope an extra key, so no
        # tenant string can spell another tenant's (or another request's) scope.
        scope = None if self.cross_request else {"request": call.request_id}
        return key_for(spec, call.fingerprint, call.rendered, model=model_name,
                       revision=revision, tenant=call.tenant, extra=scope)

    # -- canonical stages -----------------------------------------------------------------

    async def lookup(self, call: StageCall) -> StageLookup:
        if not call.reusable:
            return EXECUTE
        try:
            key = self.key(call)
        except ReuseError:
            return EXECUTE
        name, kb, joined = reuse_name(key, self.hash_fn), key.key_bytes(), False
        claim: Claim | None = None
        for _ in range(MAX_JOIN_ROUNDS):
            now = self.run.clock.now()
            got = await self.store.lookup(name, kb, now)
            if isinstance(got, Hit):
                return StageLookup(name, self._served(got.record, "join" if joined else "cache"))
            if isinstance(got, ShadowMatch):
                record = await self.store.promote(name, kb, now)
                if record is not None:
                    return StageLookup(name, self._served(record, "join" if joined else "shadow"))
            elif isinstance(got, JoinInFlight):
                self._joined(got.ticket_id)  # NOTE: no await before the wait (Waiters.wait)
                await self.waiters.wait(got.ticket_id)
                joined = True
                continue
            ticket = await self.store.begin(name, kb, call.request_id)
            if isinstance(ticket, JoinInFlight):
                self._joined(ticket.ticket_id)
                await self.waiters.wait(ticket.ticket_id)
                joined = True
                continue
            claim = self._claim(call, name, key, ticket)
            break
        self.counts["executed"] += 1
        return StageLookup(name, None, claim, joined=joined)

    def _joined(self, ticket_id: int) -> None:
        """A canonical stage waits on execution ``ticket_id``: if a fill runs it, say so."""
        joined = self._on_join.pop(ticket_id, None)
        if joined is not None:
            self.counts["fills_joined"] += 1
            joined()

    def when_joined(self, claim: Claim, joined: Callable[[], None]) -> None:
        self._on_join[claim.ticket.ticket_id] = joined

    def _served(self, record: Record, how: str) -> Served:
        self.counts[f"served_{how}"] += 1
        return Served(record.value, how, record.name, dict(record.read_set))

    def _claim(self, call: StageCall, name: str, key: ReuseKey, ticket: Ticket) -> Claim:
        self._open_claims += 1
        return Claim(call, name, key, ticket)

    async def record(self, claim: Claim, outcome: StageOutcome) -> None:
        record = None
        try:
            if self.cross_request:
                record = self._make_record(claim, outcome, RecordState.COMMITTED)
        finally:
            await self._finish(claim, record)

    async def abandon(self, claim: Claim) -> None:
        await self._finish(claim, None)

    def _make_record(self, claim: Claim, outcome: StageOutcome,
                     state: RecordState) -> Record | None:
        if not outcome.recordable:  # NOTE: its value answers another input than its name's
            self.counts["not_its_input"] += 1
            return None
        # NOTE: a record's read-set is its own reads. What its input was rendered from is
        # its provenance: a write reaches it through the store's cascade, not its reads.
        call = claim.call
        reads = dict(outcome.read_set) if self.track_reads else {}
        upstream = call.upstream if self.track_reads else ()
        provenance = Provenance(call.request_id, self.run.clock.now(), outcome.engine,
                                self.run.arm, upstream)
        try:
            return Record.create(claim.key, outcome.value, read_set=reads,
                                 provenance=provenance, state=state,
                                 cost_ms=outcome.duration_s * 1e3, hash_fn=self.hash_fn)
        except ReuseError:
            self.counts["unrecordable"] += 1
            return None

    async def _finish(self, claim: Claim, record: Record | None) -> None:
        self._open_claims -= 1
        self._on_join.pop(claim.ticket.ticket_id, None)
        try:
            result = await self.store.finish(claim.ticket, record, self.run.clock.now())
            if result is not None and result.stored:
                self.counts["recorded"] += 1
        finally:
            self.waiters.wake(claim.ticket.ticket_id)

    # -- fills (C2) -----------------------------------------------------------------------

    async def claim_fill(self, call: StageCall) -> FillSlot:
        """Reuse a record or shadow the store already holds (or an equal execution in
        flight), else claim the name for the fill to execute.

        The caller consumes the claim with :meth:`shadow` once the stage has executed, or
        with :meth:`abandon` if it fails or is cancelled (a canonical stage waiting on it
        then executes itself).
        """
        key = self.key(call)
        name, kb = reuse_name(key, self.hash_fn), key.key_bytes()
        for _ in range(MAX_JOIN_ROUNDS):
            got = await self.store.lookup(name, kb, self.run.clock.now(), serving=False)
            if isinstance(got, (Hit, ShadowMatch)) and got.record is not None:
                return FillSlot(name, got.record.value)
            if isinstance(got, JoinInFlight):
                await self.waiters.wait(got.ticket_id)
                continue
            ticket = await self.store.begin(name, kb, call.request_id)
            if isinstance(ticket, JoinInFlight):
                await self.waiters.wait(ticket.ticket_id)
                continue
            return FillSlot(name, None, self._claim(call, name, key, ticket))
        raise NotSpeculable(f"stage {call.stage.name}: still contended after joins")

    async def shadow(self, claim: Claim, outcome: StageOutcome) -> None:
        record = None
        try:
            record = self._make_record(claim, outcome, RecordState.SHADOW)
        finally:
            await self._finish(claim, record)

    async def drop_shadow(self, name: str) -> bool:
        """Discard a fill's unconsumed shadow (the store keeps committed records)."""
        return await self.store.drop(name)

    # -- writes ---------------------------------------------------------------------------

    async def announce(self, request_id: str, write_set: WriteSet) -> WriteAnnouncement:
        """Mark ``write_set`` as being written in the store, before the call's effect can be
        observed (nothing is held for an empty set, or when reads are not tracked)."""
        if not write_set or not self.track_reads:
            return WriteAnnouncement(request_id, write_set)
        resources = None if write_set.unbounded else write_set.resources
        receipt = await self.store.announce(resources, request_id)
        self.counts["announced"] += 1
        self._open_writes += 1
        return WriteAnnouncement(request_id, write_set, receipt)

    async def commit(self, announcement: WriteAnnouncement,
                     writes: Mapping[str, str | None] | None) -> None:
        """Apply ``writes`` (what the call really changed; ``None``: it failed, and the store
        counts everything announced as changed) and lift the announcement's marks. A write
        outside the declared set is applied too, and counted: its window went unprotected
        (``undeclared_writes``)."""
        covers = announcement.write_set.covers
        if self.track_reads:
            self.counts["undeclared_writes"] += sum(not covers(r) for r in writes or ())
        if announcement.receipt is None:
            await super().commit(announcement, writes)
            return
        self._open_writes -= 1
        invalidations = await self.store.commit(announcement.receipt, writes,
                                                self.run.clock.now())
        self.counts["writes"] += len(invalidations)
        self.counts["invalidated"] += sum(len(inv.removed) for inv in invalidations)

    async def writes(self, request_id: str, writes: Mapping[str, str | None]) -> None:
        if not self.track_reads:
            return
        for resource, version in writes.items():
            inv = await self.store.write(resource, version, self.run.clock.now())
            self.counts["writes"] += 1
            self.counts["invalidated"] += len(inv.removed)

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "open_tickets": self._open_claims,
                "open_writes": self._open_writes}

    async def snapshot(self) -> dict[str, Any]:
        return {**self.stats(), "store": await self.store.stats()}
