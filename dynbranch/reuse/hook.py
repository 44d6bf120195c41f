"""C1 in the orchestrator: the reuse hook over a subgraph store.

For every reusable stage (deterministic and effect-free, see
:class:`~dynbranch.hooks.StageCall`) the hook derives the reuse name from the stage's
fingerprint, complete rendered input, model and revision, parameters and the tenant, and:

* serves a committed record with an equal key and a fresh read-set (``cache``), promotes a
  fresh shadow a fill left (``shadow``), or waits for an equal execution in flight and is
  served its result (``join``);
* otherwise claims the name and lets the stage execute, then records its output with its
  read-set (the external reads it made) and its provenance (the records of the same request
  its input was rendered from), so a write invalidates it and, in cascade, what was
  rendered from it;
* forwards every write (resource → new version) to the store's freshness guard.

``track_reads=False`` drops the read-set and ignores writes: the Helium⁺ baseline's exact
operator cache, which can serve stale results (the independent splice checker counts them).

Fills (C2) go through :meth:`StoreReuseHook.fill_stage`: reuse what the store already holds,
else claim the name, execute at speculative priority and leave a *shadow*, which only a
canonical lookup of the same name can promote. ``cross_request=False`` (the ``c2`` arm)
scopes every name to its request and records no canonical execution: fills are promoted
within their own request, and nothing is reused across requests.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dynbranch.errors import NotSpeculable, ReuseError
from dynbranch.hooks import ReuseHook, RunContext, Served, StageCall, StageOutcome
from dynbranch.reuse.joins import Waiters
from dynbranch.reuse.names import HashFn, ReuseKey, key_for, reuse_name, sha256hex
from dynbranch.reuse.record import Provenance, Record, RecordState
from dynbranch.reuse.results import Hit, JoinInFlight, ShadowMatch, Ticket

MAX_JOIN_ROUNDS = 8
"""Re-lookups after joins before a stage simply executes (a join can end in a miss)."""


class StoreReuseHook(ReuseHook):
    """Cross-request exact reuse through a :class:`~dynbranch.reuse.client.StoreClient`."""

    name = "c1"

    def __init__(self, store, run: RunContext, *, track_reads: bool = True,
                 cross_request: bool = True, hash_fn: HashFn = sha256hex) -> None:
        self.store, self.run = store, run
        self.track_reads, self.cross_request, self.hash_fn = track_reads, cross_request, hash_fn
        self.on_served: Callable[[str, str, str], None] | None = None  # C2's consumption count
        self.waiters = Waiters()
        self._tickets: dict[tuple[str, str], Ticket] = {}
        self.counts = {"served_cache": 0, "served_shadow": 0, "served_join": 0,
                       "executed": 0, "recorded": 0, "unrecordable": 0, "writes": 0,
                       "invalidated": 0}

    # -- naming ---------------------------------------------------------------------------

    def key(self, call: StageCall) -> ReuseKey:
        spec = call.stage
        if spec.kind == "llm":
            model = self.run.models.get(spec.model)
            model_name, revision = (model.model, model.revision) if model else (spec.model, "")
        else:
            model_name, revision = f"tool:{spec.tool}", ""
        tenant = self.run.tenant if self.cross_request else f"{self.run.tenant}/{call.request_id}"
        return key_for(spec, call.fingerprint, call.rendered, model=model_name,
                       revision=revision, tenant=tenant)

    def reuse_name(self, call: StageCall) -> str:
        if not call.reusable:
            return ""
        try:
            return reuse_name(self.key(call), self.hash_fn)
        except ReuseError:
            return ""

    # -- serving --------------------------------------------------------------------------

    async def lookup(self, call: StageCall) -> Served | None:
        if not call.reusable:
            return None
        try:
            key = self.key(call)
        except ReuseError:
            return None
        name, kb, joined = reuse_name(key, self.hash_fn), key.key_bytes(), False
        for _ in range(MAX_JOIN_ROUNDS):
            now = self.run.clock.now()
            got = await self.store.lookup(name, kb, now)
            if isinstance(got, Hit):
                return self._served(call, got.record, "join" if joined else "cache")
            if isinstance(got, ShadowMatch):
                record = await self.store.promote(name, kb, now)
                if record is not None:
                    return self._served(call, record, "join" if joined else "shadow")
            elif isinstance(got, JoinInFlight):
                await self.waiters.wait(got.ticket_id)
                joined = True
                continue
            claim = await self.store.begin(name, kb, call.request_id)
            if isinstance(claim, JoinInFlight):
                await self.waiters.wait(claim.ticket_id)
                joined = True
                continue
            self._tickets[(call.request_id, name)] = claim
            break
        self.counts["executed"] += 1
        return None

    def _served(self, call: StageCall, record: Record, how: str) -> Served:
        self.counts[f"served_{how}"] += 1
        if self.on_served is not None and how in ("shadow", "join"):
            self.on_served(call.request_id, record.name, how)
        return Served(record.value, how, record.name, dict(record.read_set))

    # -- recording ------------------------------------------------------------------------

    async def record(self, call: StageCall, outcome: StageOutcome) -> None:
        ticket = self._claim(call)
        if ticket is None:
            return
        record = None
        try:
            if self.cross_request:
                record = self._make_record(call, outcome, RecordState.COMMITTED)
        finally:
            await self._finish(ticket, record)

    async def abandon(self, call: StageCall) -> None:
        ticket = self._claim(call)
        if ticket is not None:
            await self._finish(ticket, None)

    def _claim(self, call: StageCall) -> Ticket | None:
        if not call.reusable:
            return None
        return self._tickets.pop((call.request_id, self.reuse_name(call)), None)

    def _make_record(self, call: StageCall, outcome: StageOutcome,
                     state: RecordState) -> Record | None:
        # NOTE: a record's read-set is its own reads. What its input was rendered from is
        # its provenance: a write reaches it through the store's cascade, not its reads.
        reads = dict(outcome.read_set) if self.track_reads else {}
        upstream = call.upstream if self.track_reads else ()
        provenance = Provenance(call.request_id, self.run.clock.now(), outcome.engine,
                                self.run.arm, upstream)
        try:
            return Record.create(self.key(call), outcome.value, read_set=reads,
                                 provenance=provenance, state=state,
                                 cost_ms=outcome.duration_s * 1e3, hash_fn=self.hash_fn)
        except ReuseError:
            self.counts["unrecordable"] += 1
            return None

    async def _finish(self, ticket: Ticket, record: Record | None) -> None:
        try:
            result = await self.store.finish(ticket, record, self.run.clock.now())
            if result is not None and result.stored:
                self.counts["recorded"] += 1
        finally:
            self.waiters.wake(ticket.ticket_id)

    # -- fills (C2) -----------------------------------------------------------------------

    async def fill_stage(self, call: StageCall, execute: Callable[[], Awaitable[StageOutcome]],
                         claimed: Callable[[str], None]) -> Any:
        """Run one stage of a fill: reuse a record or shadow the store already holds (or an
        equal execution in flight), else claim the name, ``execute`` and leave a shadow.

        Returns the stage's value so the fill can render its next stage. Cancellation or an
        error releases the claim, so a canonical stage waiting on it executes itself.
        """
        key = self.key(call)
        name, kb = reuse_name(key, self.hash_fn), key.key_bytes()
        for _ in range(MAX_JOIN_ROUNDS):
            got = await self.store.lookup(name, kb, self.run.clock.now(), serving=False)
            if isinstance(got, (Hit, ShadowMatch)) and got.record is not None:
                return got.record.value
            if isinstance(got, JoinInFlight):
                await self.waiters.wait(got.ticket_id)
                continue
            claim = await self.store.begin(name, kb, call.request_id)
            if isinstance(claim, JoinInFlight):
                await self.waiters.wait(claim.ticket_id)
                continue
            break
        else:
            raise NotSpeculable(f"stage {call.stage.name}: still contended after joins")
        claimed(name)
        record = None
        try:
            outcome = await execute()
            record = self._make_record(call, outcome, RecordState.SHADOW)
        finally:
            await self._finish(claim, record)
        return outcome.value

    async def drop_shadow(self, name: str) -> bool:
        """Discard a fill's unconsumed shadow (the store keeps committed records)."""
        return await self.store.drop(name)

    async def writes(self, request_id: str, writes: Mapping[str, str]) -> None:
        if not self.track_reads:
            return
        for resource, version in writes.items():
            inv = await self.store.write(resource, version, self.run.clock.now())
            self.counts["writes"] += 1
            self.counts["invalidated"] += len(inv.removed)

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "open_tickets": len(self._tickets)}

    async def snapshot(self) -> dict[str, Any]:
        return {**self.stats(), "store": await self.store.stats()}
