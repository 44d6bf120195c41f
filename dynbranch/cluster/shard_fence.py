"""The fence a restarted store shard keeps while C1 writes are in progress.

C1's write protocol marks the resources a write may change on every shard until the write
commits; a shard that died lost the marks of the writes open then, and a record that read
one of those resources inside its write window could be put on the restarted shard and
served from it. :class:`WriteFence` keeps such a shard serving nothing until every write
that was open when it was re-synchronised has been released on the other shards.
"""

from __future__ import annotations

from typing import Any

from dynbranch.reuse.lookups import Miss, MissReason, PutOutcome, PutResult


def fenced_call(method: str, args: tuple[Any, ...]) -> tuple[bool, Any]:
    """How a fenced shard takes a call: ``(True, answer)`` when it answers at once (it serves
    and stores nothing), ``(False, args)`` when the call goes through with ``args`` (a finish
    still closes the ticket the shard issued, without its record)."""
    if method == "lookup":
        return True, Miss(MissReason.LOST)
    if method == "lookup_many":
        return True, [Miss(MissReason.LOST)] * len(args[0])
    if method == "promote":
        return True, None
    if method == "put":
        return True, PutResult(PutOutcome.NO_ROOM)
    if method == "finish":
        ticket, _meta, _data, now = args
        return False, (ticket, None, None, now)
    return False, args


class WriteFence:
    """Which restarted shards must serve nothing yet: C1's write protocol marks resources
    on every shard while a write is in progress, and a restarted shard lost the marks of the
    writes open when it died. Until every write that was open (on the live shards) when it
    was re-synchronised has been released, it answers lookups with misses and stores
    nothing, so no record that read a resource in its write window is served from it.

    Pure bookkeeping over the calls the client makes: each ``announce`` on a shard opens a
    write of its request there, each ``release`` closes one.
    """

    def __init__(self, shards: int) -> None:
        self._open: list[dict[str, int]] = [{} for _ in range(shards)]
        self._fences: dict[int, set[str]] = {}

    def saw(self, shard: int, method: str, args: tuple[Any, ...]) -> None:
        """Count an answered ``announce`` (request id ``args[1]``) or ``release`` (receipt
        ``args[0]``) on ``shard``."""
        if method == "announce":
            rid = args[1]
            self._open[shard][rid] = self._open[shard].get(rid, 0) + 1
        elif method == "release":
            rid = getattr(args[0], "request_id", None)
            left = self._open[shard].get(rid, 0) - 1
            if left > 0:
                self._open[shard][rid] = left
            else:
                self._open[shard].pop(rid, None)

    def fence(self, shard: int) -> None:
        """``shard`` was just re-synchronised: fence it behind the writes open elsewhere."""
        self._open[shard].clear()
        open_ = {rid for i, o in enumerate(self._open) if i != shard for rid in o}
        if open_:
            self._fences[shard] = open_

    def fenced(self, shard: int) -> bool:
        """Whether ``shard`` must still serve nothing (lifted once its writes are released)."""
        fence = self._fences.get(shard)
        if fence is None:
            return False
        fence &= {rid for i, o in enumerate(self._open) if i != shard for rid in o}
        if not fence:
            del self._fences[shard]
        return bool(fence)
