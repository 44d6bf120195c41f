"""The subgraph store against a plain-dict model, driven by Hypothesis.

Names are hashed to seven values so twelve keys (six inputs x two tenants) collide often;
versions change through the store (eager invalidation), behind its back (the guard) and
through announced writes (resources marked as being written until their commit). The model
predicts every result exactly: lookups, puts with their evictions, promotions, invalidation
levels, write marks, counters.
"""

from __future__ import annotations

from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    Bundle,
    RuleBasedStateMachine,
    consumes,
    initialize,
    invariant,
    multiple,
    precondition,
    rule,
)

from dynbranch.reuse import (
    Hit,
    JoinInFlight,
    Miss,
    MissReason,
    PinReceipt,
    Provenance,
    Record,
    RecordState,
    ShadowMatch,
    Stale,
    SubgraphStore,
    Ticket,
    WriteReceipt,
)
from tests.reuse_store_model import INDEX, KEYS, RESOURCES, M, Model, tiny_hash


class StoreMachine(RuleBasedStateMachine):
    tickets = Bundle("tickets")
    receipts = Bundle("receipts")
    writes = Bundle("writes")

    @initialize(capacity=st.sampled_from([6_000, 15_000, 60_000]),
                policy=st.sampled_from(["lru", "cost"]))
    def setup(self, capacity: int, policy: str) -> None:
        self.store = SubgraphStore(capacity, policy, tombstones=10_000)
        self.model = Model(capacity, policy)
        self.now, self.serial, self.version_serial = 0.0, 0, 0

    def tick(self) -> float:
        self.now += 1.0
        return self.now

    def make(self, k: int, shadow: bool, pad: int, cost: float, data) -> Record:
        m = self.model
        reads = {}
        for res in data.draw(st.lists(st.sampled_from(RESOURCES), unique=True, max_size=2)):
            known = m.versions.get(res)
            reads[res] = data.draw(st.sampled_from([known or "v0"] * 3 + ["old"]))
        upstream = data.draw(st.lists(st.sampled_from(sorted(m.recs) + ["n-gone"]),
                                      unique=True, max_size=2)) if m.recs else []
        self.serial += 1
        value = {"key": k, "serial": self.serial, "pad": "x" * pad}
        return Record.create(
            KEYS[k], value, read_set=reads, state=RecordState.SHADOW if shadow
            else RecordState.COMMITTED, cost_ms=cost, hash_fn=tiny_hash,
            provenance=Provenance(f"req-{self.serial}", self.now, "e0", "full",
                                  tuple(upstream)))

    def put(self, r: Record, now: float, result) -> None:
        m = self.model
        outcome, evicted = m.expect_put(r, INDEX[r.key_bytes])
        event(f"put {outcome}" + (" with eviction" if evicted else ""))
        assert (result.outcome.value, list(result.evicted)) == (outcome, evicted)
        if not result.stored:
            m.counts["refused"] += 1
            return
        for n in evicted:
            m.remove(n, MissReason.EVICTED)
        if r.name in m.recs:
            m.remove(r.name, None)
        m.counts["evictions"] += len(evicted)
        m.counts["puts"] += 1
        m.gone.pop(r.name, None)
        m.recs[r.name] = M(INDEX[r.key_bytes], r.committed, dict(r.read_set),
                           r.provenance.upstream, r.size, r.cost_ms, r.value, now)
        assert self.store.bytes_held <= self.store.capacity_bytes

    # -- rules ------------------------------------------------------------------------------

    @rule(k=st.integers(0, 11), shadow=st.booleans(), pad=st.sampled_from([0, 400, 2000]),
          cost=st.sampled_from([1.0, 10.0, 100.0]), data=st.data())
    def put_record(self, k, shadow, pad, cost, data):
        r = self.make(k, shadow, pad, cost, data)
        now = self.tick()
        self.put(r, now, self.store.put(r, now))

    @rule(ks=st.lists(st.integers(0, 11), min_size=2, max_size=4, unique=True),
          res=st.sampled_from(RESOURCES), shadow=st.booleans())
    def put_chain(self, ks, res, shadow):
        """A multi-stage result: the first reads ``res``, each next is rendered from the last."""
        m, upstream = self.model, ()
        for k in ks:
            self.serial += 1
            r = Record.create(
                KEYS[k], {"key": k, "serial": self.serial},
                read_set={res: m.versions.get(res, "v0")} if not upstream else {},
                state=RecordState.SHADOW if shadow else RecordState.COMMITTED,
                hash_fn=tiny_hash, cost_ms=10.0,
                provenance=Provenance(f"req-{self.serial}", self.now, "e0", "full", upstream))
            now = self.tick()
            self.put(r, now, self.store.put(r, now))
            upstream = (r.name,)

    @rule(k=st.integers(0, 11), serving=st.booleans())
    def lookup(self, k, serving):
        m, key, now = self.model, KEYS[k], self.tick()
        name = tiny_hash(key.key_bytes())
        got = self.store.lookup(name, key.key_bytes(), now, serving=serving)
        event(f"lookup {got.kind}" + (f" {got.reason}" if isinstance(got, Miss) else ""))
        entry = m.recs.get(name)
        if entry is not None and entry.key == k:
            roots = m.stale_roots(name)
            if roots:
                m.counts["stale"] += 1
                removed = [n for lv in m.cascade(roots) for n in lv]
                assert isinstance(got, Stale) and list(got.removed) == removed
                assert set(got.stale_reads) == {r for s in roots.values() for r in s}
            elif m.being_written(name):
                m.counts["misses"] += 1
                m.counts["writing"] += 1
                assert got == Miss(MissReason.WRITING)
            elif entry.committed:
                m.counts["hits"] += 1
                entry.hits += 1
                entry.used = now
                assert isinstance(got, Hit) and got.record.committed
                assert got.record.key_bytes == key.key_bytes()  # tenant is in the key
                assert got.record.value == entry.value and got.record.hits == entry.hits
            else:
                m.counts["shadow_matches"] += 1
                assert isinstance(got, ShadowMatch) and got.name == name
                if serving:
                    assert got.record is None  # no shadow value through a serving lookup
                else:
                    assert got.record.value == entry.value
            return
        ticket = m.inflight.get(name)
        if ticket is not None and ticket.key_bytes == key.key_bytes():
            m.counts["joins"] += 1
            assert got == JoinInFlight(ticket.ticket_id, name, ticket.request_id)
            return
        m.counts["misses"] += 1
        if entry is not None or ticket is not None:
            m.counts["collisions"] += 1
            assert got == Miss(MissReason.COLLISION)
        else:
            assert got == Miss(m.gone.get(name, MissReason.ABSENT))

    @rule(k=st.integers(0, 11))
    def promote(self, k):
        m, key, now = self.model, KEYS[k], self.tick()
        name = tiny_hash(key.key_bytes())
        got = self.store.promote(name, key.key_bytes(), now)
        entry = m.recs.get(name)
        if entry is None or entry.key != k:
            assert got is None
            return
        roots = m.stale_roots(name)
        if roots:
            m.counts["stale"] += 1
            m.cascade(roots)
            assert got is None
            return
        if m.being_written(name):
            m.counts["writing"] += 1
            assert got is None
            return
        if not entry.committed:
            entry.committed = True
            m.counts["promotions"] += 1
        entry.used = now
        assert got is not None and got.committed and got.value == entry.value

    @rule(k=st.integers(0, 11))
    def drop(self, k):
        m, name = self.model, tiny_hash(KEYS[k].key_bytes())
        expected = name in m.recs and not m.recs[name].committed
        assert self.store.drop(name) == expected
        if expected:
            m.remove(name, MissReason.DROPPED)
            m.counts["drops"] += 1

    @rule(k=st.integers(0, 11))
    def lose(self, k):
        m, name = self.model, tiny_hash(KEYS[k].key_bytes())
        expected = name in m.recs
        assert self.store.lose(name) == expected
        if expected:
            m.remove(name, MissReason.LOST)
            m.counts["lost"] += 1

    @rule(res=st.sampled_from(RESOURCES), how=st.sampled_from(["same", "new", "unknown"]))
    def write(self, res, how):
        inv = self.store.write(res, self.version_for(res, how), self.tick())
        self.model.contend(res)
        self.check_write(res, inv)

    @rule(target=writes, resources=st.tuples(
        st.integers(0, 5), st.frozensets(st.sampled_from(RESOURCES), min_size=1, max_size=2),
    ).map(lambda t: None if t[0] == 0 else t[1]))  # one in six may write anything
    @precondition(lambda self: len(self.model.writing) < 2)  # few open, so lookups still hit
    def announce(self, resources):
        receipt = self.store.announce(resources, "writer")
        assert receipt.resources == resources and receipt.receipt_id not in self.model.writing
        self.model.announce(receipt.receipt_id, resources)
        self.model.counts["writes_announced"] += 1
        event("announce " + ("anything" if resources is None else f"{len(resources)}"))
        return receipt

    @rule(receipt=consumes(writes), changed=st.none() | st.dictionaries(
        st.sampled_from(RESOURCES), st.sampled_from(["same", "new", "unknown"]), max_size=2))
    def commit(self, receipt: WriteReceipt, changed):
        """The announced write changed ``changed`` (some of what it announced, others, or
        nothing; ``None``: it failed, so all it announced may have changed): every version
        is applied, then its marks are lifted."""
        m, rid = self.model, receipt.receipt_id
        if changed is None:
            failed = sorted(m.versions if receipt.resources is None else receipt.resources)
            assert set(self.store.versions.resources()) == set(m.versions)
            event("commit failed")
        else:
            writes = {res: self.version_for(res, how) for res, how in changed.items()}
        invs = self.store.commit(receipt, None if changed is None else writes, self.tick())
        if changed is None:
            writes = dict.fromkeys(failed)
        assert len(invs) == len(writes)
        for res, inv in zip(writes, invs, strict=True):
            event("commit contended" if m.is_contended(rid, res) else "commit alone")
            current = self.store.versions.current(res)
            if writes[res] is None or m.is_contended(rid, res):  # a fresh unknown version
                assert current.startswith("\x00unknown:") and current != m.versions.get(res)
            else:
                assert current == writes[res]
            self.check_write(res, inv)
        del m.writing[rid]
        m.contended.pop(rid, None)
        m.contended_all.discard(rid)
        self.model.counts["writes_committed"] += 1

    @rule(res=st.sampled_from(RESOURCES), how=st.sampled_from(["same", "new", "unknown"]),
          ks=st.lists(st.integers(0, 11), min_size=1, max_size=4), data=st.data())
    @precondition(lambda self: not self.model.writing)
    def write_window(self, res, how, ks, data):
        """A whole write: announced, lookups and puts while it is charged, committed."""
        receipt = self.announce(frozenset({res}))
        for k in ks:
            if data.draw(st.booleans()):
                self.lookup(k, True)
            else:
                self.put_record(k, False, 0, 10.0, data)
        self.commit(receipt, {res: how})

    def version_for(self, res: str, how: str) -> str | None:
        self.version_serial += 1
        return {"same": self.model.versions.get(res, "v0"), "new": f"w{self.version_serial}",
                "unknown": None}[how]

    def check_write(self, res: str, inv) -> None:
        """The store applied a write of ``res``: check its invalidation against the model."""
        m = self.model
        current = self.store.versions.current(res)
        assert inv.changed == (m.versions.get(res) != current)
        m.versions[res], m.external[res] = current, False
        direct = [n for n, e in m.recs.items() if res in e.reads and e.reads[res] != current]
        assert inv.levels == m.cascade(direct)
        event(f"write removing {len(inv.levels)} levels")
        for e in m.recs.values():  # nothing that read the old version is left
            assert e.reads.get(res, current) == current

    @rule(res=st.sampled_from(RESOURCES))
    def owner_changes_version_behind_the_store(self, res):
        self.version_serial += 1
        self.store.versions.observe(res, f"x{self.version_serial}")
        self.model.versions[res], self.model.external[res] = f"x{self.version_serial}", True

    @rule(target=tickets, k=st.integers(0, 11), req=st.sampled_from(["q1", "q2", "q3"]))
    def begin(self, k, req):
        m, key = self.model, KEYS[k]
        name = tiny_hash(key.key_bytes())
        got = self.store.begin(name, key.key_bytes(), req)
        held = m.inflight.get(name)
        if held is not None and held.key_bytes == key.key_bytes():
            m.counts["joins"] += 1
            assert got == JoinInFlight(held.ticket_id, name, held.request_id)
            return multiple()
        assert isinstance(got, Ticket) and got.ticket_id not in m.open
        assert got.registered == (held is None)
        if held is None:
            m.inflight[name] = got
        else:
            m.counts["collisions"] += 1
        m.open.add(got.ticket_id)
        return got

    @rule(ticket=consumes(tickets), outcome=st.sampled_from(["none", "shadow", "committed"]),
          data=st.data())
    def finish(self, ticket, outcome, data):
        m = self.model
        record = None if outcome == "none" else self.make(
            INDEX[ticket.key_bytes], outcome == "shadow", 0, 10.0, data)
        now = self.tick()
        result = self.store.finish(ticket, record, now)
        m.open.discard(ticket.ticket_id)
        if ticket.registered:
            del m.inflight[ticket.name]
        if record is None:
            assert result is None
        else:
            self.put(record, now, result)

    @rule(target=receipts, k=st.integers(0, 11))
    def pin(self, k):
        m, name = self.model, tiny_hash(KEYS[k].key_bytes())
        receipt = self.store.pin(name)
        if name not in m.recs:
            assert receipt is None
            return multiple()
        m.pins.setdefault(name, set()).add(receipt.receipt_id)
        return receipt

    @rule(receipt=consumes(receipts))
    def unpin(self, receipt: PinReceipt):
        m = self.model
        expected = receipt.receipt_id in m.pins.get(receipt.name, set())
        assert self.store.unpin(receipt) == expected
        if expected:
            m.pins[receipt.name].discard(receipt.receipt_id)
            if not m.pins[receipt.name]:
                del m.pins[receipt.name]

    # -- invariants --------------------------------------------------------------------------

    @invariant()
    def contents_match_the_model(self):
        if not hasattr(self, "store"):
            return
        s, m = self.store, self.model
        assert set(s.names()) == set(m.recs)
        assert s.bytes_held == m.bytes <= s.capacity_bytes
        for name, e in m.recs.items():
            r = s.peek(name)
            assert (INDEX[r.key_bytes], r.committed, dict(r.read_set), r.value) == \
                (e.key, e.committed, e.reads, e.value)

    @invariant()
    def only_owner_changes_leave_stale_records(self):
        if not hasattr(self, "store"):
            return
        m = self.model
        for e in m.recs.values():
            for res, v in e.reads.items():
                assert m.versions[res] == v or m.external.get(res), (res, v)

    @invariant()
    def counters_match_the_model(self):
        if not hasattr(self, "store"):
            return
        snap = self.store.snapshot()
        assert {k: snap[k] for k in self.model.counts} == self.model.counts
        assert snap["records_held"] == len(self.model.recs)
        assert snap["in_flight"] == len(self.model.open)
        assert snap["writes_open"] == len(self.model.writing)


StoreMachine.TestCase.settings = settings(max_examples=300, stateful_step_count=50,
                                          deadline=None)
test_store_against_model = StoreMachine.TestCase
