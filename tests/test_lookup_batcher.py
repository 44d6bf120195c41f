"""C1's lookup batching on the Ray backend (dynbranch.cluster.store_reads.LookupBatcher),
without Ray: what a turn's lookups send, what their callers get, and how many turns of the
event loop a batch takes from the lookups to their answers."""

from __future__ import annotations

import asyncio

import pytest

from dynbranch.cluster.store_reads import LookupBatcher


class _Shards:
    """A ``send`` that answers each query with its name, tagged with the shard."""

    def __init__(self, fail: bool = False) -> None:
        self.sent: list[tuple[int, list[str]]] = []
        self.fail = fail

    async def send(self, shard: int, queries):
        self.sent.append((shard, [q[0] for q in queries]))
        if self.fail:
            raise RuntimeError(f"shard {shard} is down")
        return [f"{shard}:{q[0]}" for q in queries]


def _look(batcher: LookupBatcher, shard: int, name: str):
    return batcher.lookup(shard, name, b"key", 0.0, True)


def test_a_turns_lookups_go_in_one_call_per_shard_and_come_back_in_order():
    shards = _Shards()
    batcher = LookupBatcher(shards.send)

    async def main():
        got = await asyncio.gather(*(_look(batcher, i % 2, f"n{i}") for i in range(8)))
        later = await _look(batcher, 0, "alone")
        return got, later

    got, later = asyncio.run(main())
    assert got == [f"{i % 2}:n{i}" for i in range(8)] and later == "0:alone"
    assert shards.sent == [(0, ["n0", "n2", "n4", "n6"]), (1, ["n1", "n3", "n5", "n7"]),
                           (0, ["alone"])]
    assert batcher.counts == {"calls": 3, "lookups": 9}


def test_a_batch_that_fails_fails_each_of_its_callers():
    batcher = LookupBatcher(_Shards(fail=True).send)

    async def main():
        return await asyncio.gather(*(_look(batcher, 1, f"n{i}") for i in range(3)),
                                    return_exceptions=True)

    got = asyncio.run(main())
    assert all(isinstance(e, RuntimeError) and "shard 1 is down" in str(e) for e in got)


@pytest.mark.parametrize("callers", [1, 4])
def test_a_batch_is_sent_in_the_next_turn_and_answered_in_the_one_after(callers):
    # NOTE: each turn of the loop runs what was ready at its start; a ticker that yields
    # once per turn counts them. The send answers without waiting, so the turns a caller
    # waits are the batcher's own: the batch closes and is sent in the next turn, and its
    # callers resume in the turn after that (a flushing callback that started the send as
    # a task, settled by a done callback, took four).
    shards = _Shards()
    batcher = LookupBatcher(shards.send)
    turns = 0

    async def ticker(running):
        nonlocal turns
        while running:
            await asyncio.sleep(0)
            turns += 1

    async def caller(i):
        asked = turns
        await _look(batcher, 0, f"n{i}")
        return turns - asked

    async def main():
        running = [True]
        tick = asyncio.ensure_future(ticker(running))
        await asyncio.sleep(0)  # NOTE: the ticker is running
        waited = await asyncio.gather(*(caller(i) for i in range(callers)))
        running.clear()
        await tick
        return waited

    waited = asyncio.run(main())
    assert len(waited) == callers and max(waited) <= 2, waited
    assert len(shards.sent) == 1
