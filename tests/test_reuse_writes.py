"""C1's write protocol in the store: announce, then commit; nothing stale in between."""

import asyncio

import pytest

from dynbranch.errors import TicketError
from dynbranch.reuse import (
    Hit,
    LocalStoreClient,
    Miss,
    MissReason,
    PutOutcome,
    ShadowMatch,
    SubgraphStore,
    WriteReceipt,
)
from dynbranch.reuse.writes import WriteMarks
from tests.test_reuse_store import BIG, look, rec


def test_a_record_reading_a_resource_being_written_serves_nothing_until_the_commit():
    s = SubgraphStore(BIG)
    r, other = rec(1, reads={"fs": "0"}), rec(2, reads={"db": "0"})
    assert s.put(r, 0.0).stored and s.put(other, 0.0).stored
    receipt = s.announce({"fs"}, "w")
    assert look(s, r, 1.0) == Miss(MissReason.WRITING)
    assert s.promote(r.name, r.key_bytes, 1.0) is None
    assert isinstance(look(s, other, 1.0), Hit)  # another resource is not touched
    assert r.name in s  # kept: the write may change nothing
    assert s.commit(receipt, {"fs": "1"}, 2.0)[0].removed == (r.name,)
    assert look(s, r, 3.0) == Miss(MissReason.INVALIDATED)
    assert s.snapshot()["writes_open"] == 0
    assert (s.stats.writing, s.stats.writes_announced, s.stats.writes_committed) == (2, 1, 1)


def test_a_write_that_changed_nothing_withdraws_and_the_record_serves_again():
    s = SubgraphStore(BIG)
    r = rec(1, reads={"fs": "0"})
    s.put(r, 0.0)
    receipt = s.announce({"fs"}, "w")
    assert s.commit(receipt, {}, 1.0) == ()
    assert isinstance(look(s, r, 2.0), Hit)


def test_a_record_whose_execution_overlapped_a_write_is_refused():
    s = SubgraphStore(BIG)
    s.observe_reads({"fs": "0"})
    receipt = s.announce({"fs"}, "w")
    before = s.put(rec(1, reads={"fs": "0"}), 1.0)  # read before the effect, stored during
    during = s.put(rec(2, reads={"fs": "1"}), 1.0)  # read the new state before the commit
    assert (before.outcome, during.outcome) == (PutOutcome.WRITING, PutOutcome.WRITING)
    assert s.put(rec(3, reads={"db": "0"}), 1.0).stored
    s.commit(receipt, {"fs": "1"}, 2.0)
    assert s.put(rec(1, reads={"fs": "0"}), 3.0).outcome is PutOutcome.STALE
    assert s.put(rec(2, reads={"fs": "1"}), 3.0).stored  # read what the write left


def test_a_record_rendered_from_one_reading_a_resource_being_written_misses():
    s = SubgraphStore(BIG)
    up = rec(1, reads={"fs": "0"})
    down = rec(2, upstream=(up.name,))
    s.put(up, 0.0)
    s.put(down, 0.0)
    receipt = s.announce({"fs"}, "w")
    assert look(s, down, 1.0) == Miss(MissReason.WRITING)
    s.commit(receipt, {"fs": "1"}, 2.0)
    assert set(s.names()) == set()  # the write's cascade removed both


def test_a_shadow_reading_a_resource_being_written_is_not_promoted():
    s = SubgraphStore(BIG)
    shadow = rec(1, reads={"fs": "0"}, shadow=True)
    s.put(shadow, 0.0)
    receipt = s.announce({"fs"}, "w")
    assert look(s, shadow, 1.0) == Miss(MissReason.WRITING)
    assert s.promote(shadow.name, shadow.key_bytes, 1.0) is None
    s.commit(receipt, {}, 2.0)
    assert isinstance(look(s, shadow, 3.0), ShadowMatch)


def test_an_unbounded_announcement_marks_every_resource_and_overlapping_ones_stack():
    s = SubgraphStore(BIG)
    a, b = rec(1, reads={"fs": "0"}), rec(2, reads={"db": "0"})
    s.put(a, 0.0)
    s.put(b, 0.0)
    anything = s.announce(None, "w1")
    fs = s.announce({"fs"}, "w2")
    assert look(s, a) == look(s, b) == Miss(MissReason.WRITING)
    s.commit(anything, {}, 1.0)
    assert look(s, a) == Miss(MissReason.WRITING) and isinstance(look(s, b), Hit)
    s.commit(fs, {}, 2.0)
    assert isinstance(look(s, a), Hit)


def test_a_failed_write_commits_an_unknown_version_of_what_it_announced():
    s = SubgraphStore(BIG)
    s.put(rec(1, reads={"fs": "0"}), 0.0)
    s.put(rec(2, reads={"db": "0"}), 0.0)
    receipt = s.announce({"fs"}, "w")
    (inv,) = s.commit(receipt, None, 1.0)
    assert inv.resource == "fs" and inv.changed and inv.direct == 1
    assert s.put(rec(3, reads={"fs": "1"}), 2.0).outcome is PutOutcome.STALE
    assert isinstance(look(s, rec(2, reads={"db": "0"})), Hit)
    anything = s.announce(None, "w2")  # a failed call that may have written anything
    invs = s.commit(anything, None, 3.0)
    assert [i.resource for i in invs] == ["db", "fs"] and len(s) == 0


def test_a_receipt_is_consumed_once_and_a_second_commit_changes_nothing():
    s = SubgraphStore(BIG)
    s.observe_reads({"fs": "0"})
    receipt = s.announce({"fs"}, "w")
    s.commit(receipt, {"fs": "1"}, 1.0)
    with pytest.raises(TicketError):
        s.commit(receipt, {"fs": "2"}, 2.0)
    with pytest.raises(TicketError):
        s.release(receipt)
    with pytest.raises(TicketError):
        s.write("fs", "3", 3.0, under=receipt)
    assert s.versions.current("fs") == "1"
    forged = WriteReceipt(receipt.receipt_id, frozenset({"db"}), "w")
    with pytest.raises(TicketError):
        WriteMarks().release(forged)


def test_the_local_client_carries_the_protocol():
    s = SubgraphStore(BIG)
    client = LocalStoreClient(s)
    r = rec(1, reads={"fs": "0"})

    async def go():
        await client.put(r, 0.0)
        receipt = await client.announce(["fs"], "w")
        missed = await client.lookup(r.name, r.key_bytes, 1.0)
        invs = await client.commit(receipt, {"fs": "1"}, 2.0)
        return missed, invs, await client.stats()

    missed, invs, stats = asyncio.run(go())
    assert missed == Miss(MissReason.WRITING) and invs[0].removed == (r.name,)
    assert stats["writes_open"] == 0 and stats["records_held"] == 0


def test_overlapping_writes_of_one_resource_commit_an_unknown_version():
    """Their effects may land in either order and their commits in another: W1 announces,
    W2 announces and commits its version, W1 commits an older one."""
    s = SubgraphStore(BIG)
    s.observe_reads({"fs": "0", "db": "0"})
    w1 = s.announce({"fs", "db"}, "w1")
    w2 = s.announce({"fs"}, "w2")
    assert s.resolve(w2, {"fs": "2"}) == {"fs": None}
    s.commit(w2, {"fs": "2"}, 1.0)
    assert s.resolve(w1, {"fs": "1", "db": "1"}) == {"fs": None, "db": "1"}
    s.commit(w1, {"fs": "1", "db": "1"}, 2.0)
    assert s.versions.current("db") == "1"
    for version in ("0", "1", "2"):  # nothing that read fs is taken as fresh
        assert s.put(rec(1, reads={"fs": version}), 3.0).outcome is PutOutcome.STALE
    alone = s.announce({"fs"}, "w3")  # a later write alone in its window reports again
    s.commit(alone, {"fs": "3"}, 4.0)
    assert s.put(rec(1, reads={"fs": "3"}), 5.0).stored


def test_a_write_reported_outside_any_receipt_contends_the_open_ones():
    s = SubgraphStore(BIG)
    s.observe_reads({"fs": "0"})
    w = s.announce({"fs"}, "w")
    s.write("fs", "5", 1.0)  # an unannounced write lands inside w's window
    assert s.resolve(w, {"fs": "1"}) == {"fs": None}
    unbounded = s.announce(None, "u")
    other = s.announce({"db"}, "o")
    assert s.resolve(unbounded, {"db": "1", "x": "1"}) == {"db": None, "x": "1"}
    assert s.resolve(other, {"db": "1"}) == {"db": None}
