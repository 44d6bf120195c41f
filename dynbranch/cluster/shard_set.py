"""The client side of restartable store shards: handles that retry through a restart and
degrade every call to what a shard holding nothing would answer (see
:mod:`dynbranch.cluster.store_faults` for why this costs misses, never a request or a stale
value).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from dynbranch.cluster.shard_fence import WriteFence, fenced_call
from dynbranch.cluster.store_faults import ShardNotSynced
from dynbranch.cluster.store_lane import decode_lookup
from dynbranch.cluster.stream import Lane, LaneBroken, open_lane
from dynbranch.errors import StoreUnavailable, TicketError
from dynbranch.reuse.lookups import (
    Invalidation,
    JoinInFlight,
    Miss,
    MissReason,
    PutOutcome,
    PutResult,
    Ticket,
)

if TYPE_CHECKING:
    from ray.actor import ActorHandle


@dataclass(frozen=True)
class ShardRetry:
    """How long calls wait on a shard (wall seconds: they bound RPCs on the real clock).

    ``lookup_timeout_s``: a lookup waits this long, then misses; it never waits out a restart
    (``stats_timeout_s``: the same for the stats read at the end of a run).
    ``restart_deadline_s``: a mutating call keeps retrying a restarting shard this long, then
    the shard is lost for the run. ``backoff_s``: first pause between
    retries (doubling, at most one second).
    """

    lookup_timeout_s: float = 1.0
    stats_timeout_s: float = 10.0
    restart_deadline_s: float = 30.0
    backoff_s: float = 0.05

    def __post_init__(self) -> None:
        if not all(math.isfinite(v) and v > 0 for v in vars(self).values()):
            raise ValueError(f"ShardRetry values must be finite and > 0: {vars(self)}")


EPOCH_IDS = 1 << 40
"""Ticket ids one shard incarnation may issue before the next incarnation's range."""
_READS = frozenset({"lookup", "lookup_many", "stats", "held_objects"})
"""Calls that change nothing a caller depends on: they may time out and be abandoned."""
_orphans = itertools.count(1)


def _degraded(method: str, args: tuple[Any, ...]) -> Any:
    """What a shard that holds nothing answers ``method``; raises when there is no such
    answer (a call added to the store that this module does not know)."""
    if method == "lookup":
        return Miss(MissReason.LOST)
    if method == "lookup_many":
        return [Miss(MissReason.LOST)] * len(args[0])
    if method in ("promote", "finish"):
        return None
    if method in ("drop", "lose"):
        return False
    if method == "put":
        return PutResult(PutOutcome.NO_ROOM)  # NOTE: not stored; nothing else said
    if method in ("stats", "held_objects", "observe_reads", "invalidate_upstream"):
        return {}
    if method == "write":
        return Invalidation(args[0], False, ())
    if method == "begin":
        name, key_bytes, request_id = args[:3]
        # NOTE: negative ids are no shard's: the stage executes, records nothing, and a
        # joiner can never be handed this ticket.
        return Ticket(-next(_orphans), name, key_bytes, request_id, registered=False)
    if method == "release":
        return None
    if method == "announce":  # C1's write protocol: a part no shard holds (a lost shard's)
        from dynbranch.reuse.lookups import WriteReceipt

        resources, request_id = args[:2]
        names = None if resources is None else frozenset(resources)
        return WriteReceipt(-next(_orphans), names, request_id)
    raise KeyError(method)


class ShardSet:
    """The fault-tolerant handles of one run's store shards (see the module doc)."""

    def __init__(self, actors: Sequence[ActorHandle], retry: ShardRetry | None = None, *,
                 stream: bool = False) -> None:
        self.actors = list(actors)
        self.stream = stream  # lookups over a stream lane per shard (store_lane.py)
        self._lanes: dict[int, Lane] = {}
        self._lane_tried: dict[int, int] = {}  # shard -> the epoch its lane was last opened at
        self._opening: dict[int, asyncio.Task] = {}
        self.retry = retry or ShardRetry()
        self.handles = [ShardHandle(self, i) for i in range(len(self.actors))]
        self._lost: set[int] = set()
        self._resyncing: dict[int, asyncio.Task] = {}
        self._epoch = [0] * len(self.actors)  # resyncs of each shard so far
        self.writes = WriteFence(len(self.actors))
        self.counts = dict.fromkeys(
            (
                "degraded",
                "retries",
                "resyncs",
                "dependents_dropped",
                "lost_shards",
                "stale_tickets",
                "fenced",
                "stream_lookups",
                "stream_broken",
                "stream_unopened",
            ),
            0,
        )

    async def call(self, shard: int, method: str, args: tuple[Any, ...]) -> Any:
        """``method(*args)`` on shard ``shard``, retried through a restart, else degraded."""
        if method == "finish":
            local = self._local_ticket(shard, args[0])
            if local is None:
                return None
            args = (local, *args[1:])
        if shard in self._lost:
            return self._degrade(method, args, None)
        try:
            got = await self._attempts(shard, method, args)
        except _GiveUp as e:
            if method == "write" and len(args) > 3:
                # NOTE: a restarted shard never held the announcement; the version must land
                return await self.call(shard, "write", args[:3])
            if method == "resolve":
                return await self._unresolved(shard, *args)
            return self._degrade(method, args, e)
        self.writes.saw(shard, method, args)
        return self._tag(shard, got)

    async def _unresolved(self, shard: int, receipt: Any, writes: Any) -> dict[str, None]:
        """C1's write protocol: the versions a commit applies when the shard that resolves
        its contention cannot (it died and lost the announcement): an unknown version for
        everything it may have written, as for a contended write (costs misses only)."""
        self.counts["degraded"] += 1
        if writes is not None:
            return dict.fromkeys(sorted(writes))
        if receipt.resources is not None:
            return dict.fromkeys(sorted(receipt.resources))
        for peer in (i for i in range(len(self.actors)) if i != shard and i not in self._lost):
            try:
                return dict.fromkeys(sorted(await self.actors[peer].versions.remote()))
            except Exception:  # NOTE: that peer is down too; try the next
                continue
        raise StoreUnavailable(shard, "resolve", "no live shard knows the resources")

    def _tag(self, shard: int, got: Any) -> Any:
        """A ticket id unique across the shard's incarnations (their own ids start again);
        each answer of a ``lookup_many`` tagged alike."""
        if isinstance(got, list):
            return [self._tag(shard, g) for g in got]
        if isinstance(got, (Ticket, JoinInFlight)) and got.ticket_id > 0:
            return replace(got, ticket_id=got.ticket_id + self._epoch[shard] * EPOCH_IDS)
        return got

    def _local_ticket(self, shard: int, ticket: Ticket) -> Ticket | None:
        """The shard's own ticket, or ``None`` when no live incarnation issued it."""
        if ticket.ticket_id < 0:
            return None  # a degraded begin's: no shard holds it
        epoch, local = divmod(ticket.ticket_id, EPOCH_IDS)
        if epoch != self._epoch[shard]:
            self.counts["stale_tickets"] += 1
            return None
        return replace(ticket, ticket_id=local)

    async def _attempts(self, shard: int, method: str, args: tuple[Any, ...]) -> Any:
        """The shard's answer; :class:`_GiveUp` when there will be none worth waiting for."""
        retry, read = self.retry, method in _READS
        deadline = time.monotonic() + retry.restart_deadline_s
        pause, epoch = retry.backoff_s, self._epoch[shard]
        while True:
            if method == "finish" and self._epoch[shard] != epoch:
                # NOTE: the incarnation that issued the ticket died while it was finishing
                self.counts["stale_tickets"] += 1
                raise _GiveUp("the ticket's shard incarnation is gone")
            if self.writes.fenced(shard):  # NOTE: also right after a resync in this loop
                answered, got = fenced_call(method, args)
                self.counts["fenced"] += 1
                if answered:
                    return got
                args = got
            failure = await self._attempt(shard, method, args, deadline)
            if not isinstance(failure, _Failure):
                return failure
            if failure.refused:
                raise _GiveUp(failure.why)
            if failure.final or read:
                if failure.final:
                    self._lose(shard)
                raise _GiveUp(failure.why)
            if failure.unsynced:
                await self._resync(shard)  # raises _GiveUp when it cannot be done
                continue
            if time.monotonic() + pause >= deadline:
                self._lose(shard)
                raise _GiveUp(f"not back within {retry.restart_deadline_s:g}s ({failure.why})")
            self.counts["retries"] += 1
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)

    async def _attempt(
        self, shard: int, method: str, args: tuple[Any, ...], deadline: float
    ) -> Any:
        """One try: the answer, or a :class:`_Failure` saying what went wrong."""
        from ray.exceptions import ActorDiedError, RayActorError

        if method in ("lookup", "lookup_many") and self.stream:
            lane = await self._lane(shard)
            if lane is not None:
                return await self._on_lane(shard, lane, method, args)
        ref = getattr(self.actors[shard], method).remote(*args)
        if method in ("lookup", "lookup_many"):
            timeout = self.retry.lookup_timeout_s
        elif method in _READS:
            timeout = self.retry.stats_timeout_s
        else:
            timeout = max(1e-3, deadline - time.monotonic())
        try:
            return await asyncio.wait_for(ref, timeout)
        except ShardNotSynced:
            return _Failure("restarted", unsynced=True)
        except TicketError as e:  # NOTE: a ticket the shard does not hold: nothing to finish
            return _Failure(f"refused: {e}", refused=True)
        except ActorDiedError as e:  # NOTE: no restarts left: it will not come back
            return _Failure(f"died for good: {type(e).__name__}", final=True)
        except (RayActorError, TimeoutError) as e:
            return _Failure(type(e).__name__)

    async def _on_lane(self, shard: int, lane: Lane, method: str, args: tuple[Any, ...]) -> Any:
        """A lookup batch over ``shard``'s lane: the answers, or a :class:`_Failure` as an
        actor call's (the lane is dropped; the next batch goes as an actor call)."""
        queries = [list(args)] if method == "lookup" else [list(q) for q in args[0]]
        try:
            # NOTE: a timeout on this task, not wait_for (a task of its own: three turns of
            # the loop more, see RayGateClient._call)
            async with asyncio.timeout(self.retry.lookup_timeout_s):
                rows = await lane.call("lookup_many", queries)
        except ShardNotSynced:
            return _Failure("restarted", unsynced=True)
        except (LaneBroken, TimeoutError) as e:
            self.counts["stream_broken"] += 1
            self._drop_lane(shard)
            return _Failure(f"lane: {type(e).__name__}: {e}")
        except StoreUnavailable as e:  # NOTE: the shard's own error: this batch misses
            return _Failure(f"lane: {e.cause}")
        self.counts["stream_lookups"] += len(rows)
        got = [decode_lookup(row) for row in rows]
        return got[0] if method == "lookup" else got

    async def _lane(self, shard: int) -> Lane | None:
        """``shard``'s open lane, opening one (once per incarnation) when it has none."""
        lane = self._lanes.get(shard)
        if lane is not None:
            if lane.broken is None and lane.loop is asyncio.get_running_loop():
                return lane
            broken = lane.broken
            self._drop_lane(shard)
            if broken is None:  # NOTE: opened on another event loop: open one on this one
                self._lane_tried.pop(shard, None)
            else:
                self.counts["stream_broken"] += 1
        if self._lane_tried.get(shard) == self._epoch[shard]:
            return None  # NOTE: one lane per incarnation; a resync moves the epoch on
        task = self._opening.get(shard)
        if task is None or task.done():
            task = self._opening[shard] = asyncio.get_running_loop().create_task(
                self._open_lane(shard))
        await asyncio.shield(task)
        return self._lanes.get(shard)

    async def _open_lane(self, shard: int) -> None:
        self._lane_tried[shard] = self._epoch[shard]
        try:
            self._lanes[shard] = await open_lane(
                f"store shard {shard}", self.actors[shard].open_stream.remote, _store_error)
        except Exception:  # NOTE: a closed port, a restarting shard: actor calls remain
            self.counts["stream_unopened"] += 1

    def _drop_lane(self, shard: int) -> None:
        lane = self._lanes.pop(shard, None)
        if lane is not None:
            lane.close()

    def close_lanes(self) -> None:
        """Close every shard's lane (later lookups go as actor calls)."""
        for shard in list(self._lanes):
            self._drop_lane(shard)
        self.stream = False

    async def _resync(self, shard: int) -> None:
        """Re-synchronise restarted shard ``shard`` (once, whoever asks first); raises
        :class:`_GiveUp` (and the shard is lost) when that cannot be done."""
        task = self._resyncing.get(shard)
        if task is None or task.done():
            task = asyncio.get_running_loop().create_task(self._do_resync(shard))
            self._resyncing[shard] = task
        try:
            await asyncio.shield(task)
        except _GiveUp:
            raise
        except Exception as e:  # NOTE: it died again mid-resync, or will not answer
            self._lose(shard)
            raise _GiveUp(f"resync failed: {type(e).__name__}: {e}") from None

    async def _do_resync(self, shard: int) -> None:
        peers = [i for i in range(len(self.actors)) if i != shard and i not in self._lost]
        versions = None
        for peer in peers:
            try:
                versions = await asyncio.wait_for(
                    self.actors[peer].versions.remote(), self.retry.lookup_timeout_s * 5
                )
                break
            except Exception:  # NOTE: that peer is down too; try the next
                continue
        if versions is None:
            # NOTE: nobody to copy versions from: serving would risk a stale version.
            self._lose(shard)
            raise _GiveUp(f"shard {shard} restarted and no live peer can re-synchronise it")
        await asyncio.wait_for(
            self.actors[shard].resync.remote(versions), self.retry.restart_deadline_s
        )
        self.writes.fence(shard)
        self._epoch[shard] += 1
        self.counts["resyncs"] += 1
        dropped = await asyncio.gather(
            *(self.actors[p].drop_dependents_of.remote(shard, len(self.actors)) for p in peers),
            return_exceptions=True,
        )
        self.counts["dependents_dropped"] += sum(d for d in dropped if isinstance(d, int))

    def _lose(self, shard: int) -> None:
        if shard not in self._lost:
            self._lost.add(shard)
            self.counts["lost_shards"] += 1

    def _degrade(self, method: str, args: tuple[Any, ...], error: Exception | None) -> Any:
        self.counts["degraded"] += 1
        try:
            return _degraded(method, args)
        except KeyError:
            raise StoreUnavailable(-1, method, str(error or "shard lost")) from None


def _store_error(request_id: str, row: dict[str, Any]) -> Exception:
    """A shard's error over its lane: a restarted shard's refusal as itself, anything else as
    an error naming it (the batch then fails as an actor call's would)."""
    if row["type"] == "ShardNotSynced":
        return ShardNotSynced(row["message"])
    return StoreUnavailable(-1, "lookup_many", f"{row['type']}: {row['message']}")


class _GiveUp(Exception):
    """A shard call that will not be answered: degrade it."""


@dataclass(frozen=True)
class _Failure:
    """Why one attempt got no answer: ``unsynced`` (a restarted shard waiting for its
    resync), ``final`` (it will never answer again), ``refused`` (it answered that the call
    makes no sense to it now, e.g. a ticket it does not hold), or none (down, restarting,
    slow)."""

    why: str
    unsynced: bool = False
    final: bool = False
    refused: bool = False


class ShardHandle:
    """Stands in for one shard's actor handle: ``handle.method.remote(*args)`` is awaitable
    and goes through :meth:`ShardSet.call`.

    As on an actor handle, a call is under way the moment ``remote`` returns, whatever its
    caller does next: a caller cancelled before it awaits (a gather cancelled before its
    children ran) or while it waits does not stop a write from reaching the shard. A
    cancelled ``begin`` still returns its ticket (and the cancellation is delivered at the
    caller's next await), so the caller's own cleanup finishes it and wakes whoever joined
    it; a ticket dropped here would leave its joiners waiting for good.
    """

    def __init__(self, shards: ShardSet, index: int) -> None:
        self._shards, self.index = shards, index

    def __getattr__(self, method: str) -> _Method:
        if method.startswith("_"):
            raise AttributeError(method)
        return _Method(self._shards, self.index, method)

    async def read_now(self, method: str, *args: Any) -> Any:
        """A read (:data:`_READS`) awaited in the caller's own task: sent, on a lane, in the
        caller's step, and its answer read in the caller's next one. NOTE: ``remote`` starts
        a task, which sends a turn of the event loop late and answers a turn late; a caller
        that awaits at once has no use for that."""
        if method not in _READS:
            raise ValueError(f"{method!r} is not a read; call it with remote()")
        return await self._shards.call(self.index, method, args)


class _Method:
    def __init__(self, shards: ShardSet, index: int, method: str) -> None:
        self._shards, self._index, self._method = shards, index, method

    def remote(self, *args: Any) -> Any:
        """The call, started now, as an awaitable (see :class:`ShardHandle`)."""
        task = asyncio.ensure_future(self._shards.call(self._index, self._method, args))
        if self._method in _READS:
            return task  # NOTE: a read nobody waits for may simply stop
        if self._method == "begin":
            return _handed_over(task)
        return asyncio.shield(task)


async def _handed_over(task: asyncio.Future) -> Any:
    """``task``'s result even if the caller is cancelled meanwhile; the cancellation is then
    re-delivered at the caller's next await."""
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
            break
        except asyncio.CancelledError:
            if task.cancelled():
                raise
            cancelled = True
    if cancelled:
        me = asyncio.current_task()
        if me is not None:
            me.cancel()
    return result
