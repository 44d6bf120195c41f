"""The fence of a restarted store shard: it serves and stores nothing until every C1 write
that was open on the other shards when it was re-synchronised has been released."""

from dynbranch.cluster.shard_fence import WriteFence, fenced_call
from dynbranch.reuse.lookups import Miss, MissReason, PutOutcome, Ticket


class Receipt:
    def __init__(self, request_id: str) -> None:
        self.request_id = request_id


def test_a_restarted_shard_is_fenced_until_the_open_writes_are_released():
    fence = WriteFence(3)
    for shard in range(3):
        fence.saw(shard, "announce", (["r"], "writer-a"))
    fence.saw(0, "announce", (["s"], "writer-b"))
    fence.fence(2)  # shard 2 died with both writes open and was just re-synchronised
    assert fence.fenced(2) and not fence.fenced(0)
    fence.saw(0, "release", (Receipt("writer-a"),))
    fence.saw(1, "release", (Receipt("writer-a"),))
    assert fence.fenced(2)  # writer-b is still open on shard 0
    fence.saw(0, "announce", (["t"], "writer-c"))  # a write announced after the resync
    fence.saw(0, "release", (Receipt("writer-b"),))
    assert not fence.fenced(2)  # only what was open at the resync counts


def test_a_shard_resynchronised_with_nothing_open_is_not_fenced():
    fence = WriteFence(2)
    fence.saw(0, "announce", (None, "w"))
    fence.saw(0, "release", (Receipt("w"),))
    fence.fence(1)
    assert not fence.fenced(1)


def test_a_fenced_shard_serves_and_stores_nothing_but_closes_its_tickets():
    assert fenced_call("lookup", ("n", b"k", 1.0, True)) == (True, Miss(MissReason.LOST))
    assert fenced_call("promote", ("n", b"k", 1.0)) == (True, None)
    answered, put = fenced_call("put", ("meta", b"data", 1.0))
    assert answered and put.outcome is PutOutcome.NO_ROOM and not put.stored
    ticket = Ticket(7, "n", b"k", "req")
    assert fenced_call("finish", (ticket, "meta", b"data", 2.0)) == (
        False,
        (ticket, None, None, 2.0),
    )
    assert fenced_call("write", ("r", "v2", 2.0)) == (False, ("r", "v2", 2.0))
