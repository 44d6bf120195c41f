"""The subgraph store: hits, shadows and promotion, freshness and write-cascade invalidation,
eviction, in-flight joins, lost objects and tenant isolation."""

import asyncio

import pytest

from dynbranch.errors import TicketError, UnknownNameError
from dynbranch.reuse import (
    LRU,
    CostAware,
    Hit,
    JoinInFlight,
    Miss,
    MissReason,
    Provenance,
    PutOutcome,
    Record,
    RecordState,
    ReuseKey,
    ShadowMatch,
    Stale,
    SubgraphStore,
    Ticket,
    VersionTable,
    Waiters,
    key_for,
    make_policy,
    reuse_name,
)
from dynbranch.workflow import StageSpec, Template

BIG = 1 << 30


def key(i, tenant="t"):
    return ReuseKey("fp", {"i": i}, "m", "r", {}, None, tenant)


def rec(i, *, tenant="t", reads=None, upstream=(), shadow=False, value=None, cost=0.0, pad=0):
    return Record.create(
        key(i, tenant), value if value is not None else f"v{i}" + "x" * pad,
        read_set=reads or {}, provenance=Provenance(f"req-{i}", 0.0, "e0", "c1",
                                                    tuple(upstream)),
        state=RecordState.SHADOW if shadow else RecordState.COMMITTED, cost_ms=cost)


def look(store, r, now=0.0, **kw):
    return store.lookup(r.name, r.key_bytes, now, **kw)


# -- hits, misses, tenants ---------------------------------------------------------------------


def test_hit_serves_value_and_counts():
    s = SubgraphStore(BIG)
    r = rec(1, value={"answer": [1, 2]})
    assert s.put(r, 0.0).outcome is PutOutcome.STORED
    got = look(s, r, 1.0)
    assert isinstance(got, Hit) and got.record.value == {"answer": [1, 2]}
    assert got.record.hits == 1 and look(s, r, 2.0).record.hits == 2
    assert look(s, rec(2)) == Miss(MissReason.ABSENT)
    assert s.snapshot() == {
        "hits": 2, "misses": 1, "collisions": 0, "stale": 0, "writing": 0, "shadow_matches": 0,
        "joins": 0, "puts": 1, "refused": 0, "promotions": 0, "drops": 0, "lost": 0,
        "evictions": 0, "invalidated_direct": 0, "invalidated_cascade": 0,
        "writes_announced": 0, "writes_committed": 0, "bytes_held": r.size,
        "records_held": 1, "in_flight": 0, "writes_open": 0}


def test_tenant_isolation_both_halves():
    t = Template("routing", "1", [StageSpec("exec", "tool", ("call",), tool="bfcl",
                                            tool_schema_version="2")])
    stage = t.stage("exec")
    rendered = stage.render({"call": "ls()"})

    def k(tenant):
        return key_for(stage, t.fingerprint("exec"), rendered, model="bfcl", revision="1",
                       tenant=tenant)

    s = SubgraphStore(BIG)
    s.put(Record.create(k("acme"), ["a.txt"], read_set={},
                        provenance=Provenance("r1", 0.0, "bfcl", "c1")), 0.0)
    same = s.lookup(reuse_name(k("acme")), k("acme").key_bytes(), 1.0)
    assert isinstance(same, Hit) and same.record.value == ["a.txt"]
    other = s.lookup(reuse_name(k("globex")), k("globex").key_bytes(), 1.0)
    assert other == Miss(MissReason.ABSENT)


def test_served_values_cannot_be_mutated_through_a_hit():
    s = SubgraphStore(BIG)
    r = rec(1, value={"xs": [1]})
    s.put(r, 0.0)
    look(s, r).record.value["xs"].append(99)
    assert look(s, r).record.value == {"xs": [1]}


# -- shadows ------------------------------------------------------------------------------------


def test_serving_lookup_never_exposes_a_shadow_value():
    s = SubgraphStore(BIG)
    r = rec(1, shadow=True)
    s.put(r, 0.0)
    assert look(s, r) == ShadowMatch(r.name, None)
    assert look(s, r, serving=False) == ShadowMatch(r.name, r)
    assert s.stats.hits == 0 and s.stats.shadow_matches == 2


def test_promote_commits_on_exact_key_and_fresh_reads():
    s = SubgraphStore(BIG)
    r = rec(1, shadow=True, reads={"fs": "0"})
    s.put(r, 0.0)
    assert s.promote(r.name, key(2).key_bytes(), 1.0) is None  # other key
    promoted = s.promote(r.name, r.key_bytes, 1.0)
    assert promoted is not None and promoted.committed and promoted.value == r.value
    assert s.promote(r.name, r.key_bytes, 2.0) == promoted  # idempotent
    assert isinstance(look(s, r), Hit)
    assert s.stats.promotions == 1


def test_promote_of_a_stale_shadow_is_none_and_removes_it():
    versions = VersionTable()
    s = SubgraphStore(BIG, versions=versions)
    r = rec(1, shadow=True, reads={"fs": "0"})
    s.put(r, 0.0)
    versions.observe("fs", "1")  # an owner reports a change behind the store's back
    assert s.promote(r.name, r.key_bytes, 1.0) is None
    assert r.name not in s and s.stats.stale == 1 and s.stats.invalidated_direct == 1


def test_drop_discards_shadows_only():
    s = SubgraphStore(BIG)
    shadow, committed = rec(1, shadow=True), rec(2)
    s.put(shadow, 0.0)
    s.put(committed, 0.0)
    assert s.drop(shadow.name) and not s.drop(committed.name) and not s.drop("nope")
    assert look(s, shadow) == Miss(MissReason.DROPPED)
    assert isinstance(look(s, committed), Hit)
    assert s.stats.drops == 1


def test_a_shadow_never_replaces_a_committed_record_of_the_same_key():
    s = SubgraphStore(BIG)
    s.put(rec(1), 0.0)
    assert s.put(rec(1, shadow=True), 1.0).outcome is PutOutcome.KEPT_COMMITTED
    assert isinstance(look(s, rec(1)), Hit)
    s.put(rec(2, shadow=True), 0.0)
    assert s.put(rec(2), 1.0).outcome is PutOutcome.REPLACED
    assert isinstance(look(s, rec(2)), Hit)
    assert s.bytes_held == rec(1).size + rec(2).size


# -- freshness and invalidation -----------------------------------------------------------------


def test_put_refuses_a_record_that_read_an_old_version():
    s = SubgraphStore(BIG)
    s.write("fs", "1", 0.0)
    res = s.put(rec(1, reads={"fs": "0"}), 1.0)
    assert res.outcome is PutOutcome.STALE and res.stale_reads == {"fs": ("0", "1")}
    assert len(s) == 0 and s.stats.refused == 1


def test_put_refuses_a_record_rendered_from_an_invalidated_record():
    s = SubgraphStore(BIG)
    up = rec(1, reads={"fs": "0"})
    assert s.put(up, 0.0).stored
    s.write("fs", "1", 1.0)  # invalidates `up` before its downstream record arrives
    late = s.put(rec(2, upstream=(up.name,)), 2.0)
    assert late.outcome is PutOutcome.STALE and len(s) == 0
    assert s.put(rec(3, upstream=("never-stored",)), 3.0).stored  # absent is not invalid


def test_first_read_of_a_resource_is_learned_not_overridden():
    s = SubgraphStore(BIG)
    assert s.observe_reads({"fs": "0"}) == {}
    assert s.observe_reads({"fs": "7"}) == {"fs": ("7", "0")}
    assert s.versions.current("fs") == "0"


def test_write_invalidates_readers_and_cascades_through_provenance():
    s = SubgraphStore(BIG)
    a = rec(1, reads={"fs": "0", "db": "5"})
    b = rec(2, upstream=[a.name])
    c = rec(3, upstream=[b.name], shadow=True)
    d = rec(4, reads={"fs": "0"}, upstream=["never-recorded"])
    e = rec(5, reads={"db": "5"})
    f = rec(6, upstream=[e.name])
    for r in (a, b, c, d, e, f):
        assert s.put(r, 0.0).stored
    inv = s.write("fs", "1", 1.0)
    assert inv.changed and inv.levels == (tuple(sorted([a.name, d.name])), (b.name,),
                                          (c.name,))
    assert (inv.direct, inv.cascade) == (2, 2)
    assert set(s.names()) == {e.name, f.name}
    assert all(look(s, r) == Miss(MissReason.INVALIDATED) for r in (a, b, c, d))
    assert isinstance(look(s, f), Hit)
    assert (s.stats.invalidated_direct, s.stats.invalidated_cascade) == (2, 2)
    again = s.write("fs", "1", 2.0)
    assert not again.changed and again.levels == ()


def test_write_with_unknown_new_version_stales_every_reader_until_reported():
    s = SubgraphStore(BIG)
    s.put(rec(1, reads={"fs": "0"}), 0.0)
    assert s.write("fs", None, 1.0).direct == 1
    assert s.put(rec(2, reads={"fs": "0"}), 2.0).outcome is PutOutcome.STALE
    assert s.put(rec(2, reads={"fs": "1"}), 2.0).outcome is PutOutcome.STALE
    s.versions.observe("fs", "1")
    assert s.put(rec(2, reads={"fs": "1"}), 3.0).stored


def test_guard_catches_stale_upstream_changed_behind_the_stores_back():
    versions = VersionTable()
    s = SubgraphStore(BIG, versions=versions)
    a = rec(1, reads={"corpus:musique": "v1"})
    b = rec(2, upstream=[a.name])
    c = rec(3, upstream=[b.name])
    for r in (a, b, c):
        s.put(r, 0.0)
    versions.observe("corpus:musique", "v2")
    got = look(s, c, 1.0)
    assert got == Stale(c.name, {"corpus:musique": ("v1", "v2")}, (a.name, b.name, c.name))
    assert len(s) == 0 and s.stats.stale == 1
    assert (s.stats.invalidated_direct, s.stats.invalidated_cascade) == (1, 2)


def test_invalidation_removes_pinned_records_and_voids_their_receipts():
    s = SubgraphStore(BIG)
    r = rec(1, reads={"fs": "0"})
    s.put(r, 0.0)
    receipt = s.pin(r.name)
    s.write("fs", "1", 1.0)
    assert r.name not in s and not s.unpin(receipt)


# -- eviction -----------------------------------------------------------------------------------


def _sized(n, **kw):
    return [rec(i, **kw) for i in range(n)]


def test_lru_evicts_least_recently_used_and_bytes_stay_within_capacity():
    rs = _sized(4)
    s = SubgraphStore(sum(r.size for r in rs[:3]))
    for t, r in enumerate(rs[:3]):
        s.put(r, float(t))
    look(s, rs[0], 5.0)
    res = s.put(rs[3], 6.0)
    assert res.evicted == (rs[1].name,)
    assert s.bytes_held <= s.capacity_bytes
    assert look(s, rs[1]) == Miss(MissReason.EVICTED)
    assert s.stats.evictions == 1


def test_cost_aware_evicts_least_saving_per_byte_ties_lru():
    rs = [rec(0, cost=50.0), rec(1, cost=5.0), rec(2, cost=5.0), rec(3, cost=500.0)]
    s = SubgraphStore(sum(r.size for r in rs[:3]) + 10, "cost")
    for t, r in enumerate(rs[:3]):
        s.put(r, float(t))
    assert s.put(rs[3], 9.0).evicted == (rs[1].name,)
    assert s.put(rec(4, cost=1.0), 10.0).evicted == (rs[2].name,)


def test_shadows_are_evicted_before_committed_records():
    committed, shadow, new = rec(0), rec(1, shadow=True), rec(2)
    s = SubgraphStore(committed.size + shadow.size + 10)
    s.put(committed, 0.0)
    s.put(shadow, 1.0)  # more recent, still first to go
    assert s.put(new, 2.0).evicted == (shadow.name,)


def test_pinned_and_in_flight_records_are_never_evicted():
    rs = _sized(4)
    s = SubgraphStore(sum(r.size for r in rs[:2]) + 10)
    s.put(rs[0], 0.0)
    s.put(rs[1], 1.0)
    receipt = s.pin(rs[0].name)
    ticket = s.begin(rs[1].name, rs[1].key_bytes, "req-x")
    res = s.put(rs[2], 2.0)
    assert res.outcome is PutOutcome.NO_ROOM and res.evicted == () and len(s) == 2
    assert s.unpin(receipt) and not s.unpin(receipt)
    assert s.put(rs[2], 3.0).evicted == (rs[0].name,)
    s.finish(ticket, None, 4.0)
    assert s.put(rs[3], 5.0).evicted == (rs[1].name,)


def test_a_record_larger_than_the_capacity_is_refused():
    r = rec(0, pad=1000)
    s = SubgraphStore(r.size - 1)
    assert s.put(r, 0.0).outcome is PutOutcome.TOO_LARGE and s.bytes_held == 0


def test_policies_by_name():
    assert isinstance(make_policy("lru"), LRU) and isinstance(make_policy("cost"), CostAware)
    with pytest.raises(UnknownNameError, match="unknown eviction policy 'lfu'"):
        SubgraphStore(1, "lfu")


def test_heap_stays_bounded_under_many_hits():
    s = SubgraphStore(BIG)
    r = rec(0)
    s.put(r, 0.0)
    for t in range(5000):
        look(s, r, float(t))
    assert len(s._heap) <= 2 * len(s) + 1025


def test_tombstones_are_bounded():
    s = SubgraphStore(BIG, tombstones=2)
    rs = _sized(3)
    for r in rs:
        s.put(r, 0.0)
        s.lose(r.name)
    assert [look(s, r).reason for r in rs] == [MissReason.ABSENT, MissReason.LOST,
                                               MissReason.LOST]


# -- in flight and lost objects ----------------------------------------------------------------


def test_second_executor_joins_and_finish_stores():
    s = SubgraphStore(BIG)
    r = rec(1)
    ticket = s.begin(r.name, r.key_bytes, "req-1")
    assert isinstance(ticket, Ticket) and ticket.registered
    join = s.begin(r.name, r.key_bytes, "req-2")
    assert join == JoinInFlight(ticket.ticket_id, r.name, "req-1")
    assert look(s, r) == JoinInFlight(ticket.ticket_id, r.name, "req-1")
    assert s.in_flight == 1
    assert s.finish(ticket, r, 1.0).stored
    assert isinstance(look(s, r), Hit) and s.in_flight == 0 and s.stats.joins == 2
    with pytest.raises(TicketError, match="is not open"):
        s.finish(ticket, None, 2.0)


def test_a_previous_incarnations_ticket_is_refused_not_closing_another():
    # a restarted shard numbers its tickets from 1 again: an old ticket with the id of a new
    # one must be refused (typed) and leave the new one open
    old = SubgraphStore(BIG).begin(rec(1).name, rec(1).key_bytes, "req-1")
    s = SubgraphStore(BIG)
    r = rec(2)
    new = s.begin(r.name, r.key_bytes, "req-2")
    assert new.ticket_id == old.ticket_id and new != old
    with pytest.raises(TicketError, match="is not open"):
        s.finish(old, None, 1.0)
    assert s.in_flight == 1 and s.finish(new, r, 1.0).stored


def test_colliding_executor_gets_an_unregistered_ticket():
    s = SubgraphStore(BIG)
    ticket = s.begin("n", b"key-a", "req-1")
    other = s.begin("n", b"key-b", "req-2")
    assert isinstance(other, Ticket) and not other.registered and s.stats.collisions == 1
    assert s.lookup("n", b"key-b", 0.0) == Miss(MissReason.COLLISION)
    s.finish(other, None, 1.0)
    assert s.lookup("n", b"key-a", 0.0) == JoinInFlight(ticket.ticket_id, "n", "req-1")
    with pytest.raises(TicketError, match="another key's record"):
        s.finish(ticket, rec(9), 1.0)
    s.finish(ticket, None, 1.0)
    assert s.in_flight == 0


def test_failed_execution_leaves_a_miss():
    s = SubgraphStore(BIG)
    r = rec(1)
    s.finish(s.begin(r.name, r.key_bytes, "req-1"), None, 1.0)
    assert look(s, r) == Miss(MissReason.ABSENT)


def test_lost_object_reads_as_a_miss_and_never_raises():
    s = SubgraphStore(BIG)
    r = rec(1)
    s.put(r, 0.0)
    assert s.lose(r.name) and not s.lose(r.name)
    assert look(s, r) == Miss(MissReason.LOST)
    assert s.promote(r.name, r.key_bytes, 1.0) is None and not s.drop(r.name)
    assert s.bytes_held == 0 and s.stats.lost == 1
    assert s.put(r, 2.0).stored and isinstance(look(s, r), Hit)


def test_waiters_wake_joiners_who_then_hit():
    s, waiters = SubgraphStore(BIG), Waiters()
    r = rec(1, value="computed once")
    executions = []

    async def stage(request_id):
        while True:
            got = s.lookup(r.name, r.key_bytes, 0.0)
            if isinstance(got, Hit):
                return got.record.value
            claim = s.begin(r.name, r.key_bytes, request_id)
            if isinstance(claim, JoinInFlight):
                await waiters.wait(claim.ticket_id)
                continue
            try:
                executions.append(request_id)
                await asyncio.sleep(0.01)
                s.finish(claim, r, 1.0)
            finally:
                waiters.wake(claim.ticket_id)
            return r.value

    async def main():
        return await asyncio.gather(*(stage(f"req-{i}") for i in range(5)))

    assert asyncio.run(main()) == ["computed once"] * 5
    assert executions == ["req-0"] and len(waiters) == 0 and s.in_flight == 0
