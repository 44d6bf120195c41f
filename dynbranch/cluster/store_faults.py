"""Store shards that restart, and a client side that degrades to misses while they do.

C1's store on Ray is a few shard actors (:mod:`dynbranch.cluster.store`). A shard that dies
takes its records and their bytes with it; that can only cost misses, never a request or a
stale value, if three things hold, and this module makes them hold:

* **Shards restart, and a restarted shard serves nothing until it is re-synchronised.**
  :class:`RestartableStoreActor` is created with ``max_restarts``; an instance Ray rebuilt
  refuses every operation (:class:`ShardNotSynced`) until the client
  (:class:`~dynbranch.cluster.shard_set.ShardSet`) has given it the version table of a live
  peer (every shard's table is the same by construction), so it never adopts a stale
  version from a late record. The peers then drop what was rendered from records the dead
  shard held (the write cascade could no longer reach it).
* **Every call degrades.** :class:`~dynbranch.cluster.shard_set.ShardHandle` stands in for a
  shard's actor handle (the client calls ``handle.method.remote(...)`` exactly as on an
  actor) and answers as a shard with nothing would: a lookup misses (``LOST``) rather than
  wait out a restart, a drop or a lose finds nothing, a put or finish stores nothing, stats
  are empty; a ``begin`` hands out a ticket no shard holds, so the stage executes and
  records nothing. A mutating call waits up to ``restart_deadline_s`` for the restart first
  (its effect matters); a shard that does not come back by then, or has no restarts left,
  is *lost* for the run and every later call degrades at once.
* **Tickets of a dead incarnation finish nowhere.** A restarted shard's ticket ids start
  again from 1, so the handle numbers each incarnation's tickets in a range of their own
  and finishes on a shard only the tickets its current incarnation issued.

The actor side is here; the client side (the handles, their retries and degraded
answers) is :mod:`dynbranch.cluster.shard_set`, and the fence a restarted shard keeps while
writes are in progress is :mod:`dynbranch.cluster.shard_fence`. Nothing here changes the
store's semantics: a shard that answers answers as :class:`~dynbranch.cluster.store.StoreActor`
does.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from dynbranch.cluster.store import StoreActor, beside_driver, shard_of
from dynbranch.cluster.threaded import threaded

if TYPE_CHECKING:
    from ray.actor import ActorHandle

SHARD_RESTARTS = 4
"""Times Ray rebuilds one shard whose process died, per run (then it is lost)."""


class ShardNotSynced(Exception):
    """A restarted shard asked to serve before it was re-synchronised."""


# -- the actor --------------------------------------------------------------------------------


def _guarded(method: Callable[..., Any]) -> Callable[..., Any]:
    async def guarded(self: RestartableStoreActor, *args: Any, **kwargs: Any) -> Any:
        if not self.synced:
            raise ShardNotSynced(f"shard {self.shard} restarted and is not re-synchronised")
        return await method(self, *args, **kwargs)

    guarded.__name__, guarded.__doc__ = method.__name__, method.__doc__
    return guarded


class RestartableStoreActor(StoreActor):
    """A :class:`StoreActor` that knows whether Ray rebuilt it, and then waits for a resync.

    Every public operation of the store actor is guarded (added on the class below), so
    one it gains later is guarded too.
    """

    def __init__(
        self, capacity_bytes: int, policy: str = "lru", shard: int = 0, *, tombstones: int = 4096
    ) -> None:
        import ray

        super().__init__(capacity_bytes, policy, shard, tombstones=tombstones)
        self.boot = uuid.uuid4().hex[:12]
        self.synced = not ray.get_runtime_context().was_current_actor_reconstructed

    async def incarnation(self) -> tuple[str, bool]:
        """This instance's boot id and whether it serves."""
        return self.boot, self.synced

    async def versions(self) -> dict[str, str]:
        """Every resource's current version (what a restarted peer adopts)."""
        if not self.synced:
            raise ShardNotSynced(f"shard {self.shard} is not synchronised itself")
        # NOTE: the table's mapping is read directly; the version table has no public
        # iteration, and copying it whole is the point.
        return dict(self._store.versions._current)

    async def resync(self, versions: Mapping[str, str]) -> str:
        """Adopt a peer's versions and start serving; returns the boot id."""
        self._store.versions.learn(versions)
        self.synced = True
        return self.boot

    async def drop_dependents_of(self, shard: int, shards: int) -> int:
        """Remove the records rendered from records that lived on ``shard`` (now gone), in
        cascade; returns how many."""
        if not self.synced:
            raise ShardNotSynced(f"shard {self.shard} restarted and is not re-synchronised")
        gone = {
            name: 0 for name in list(self._store._dependents) if shard_of(name, shards) == shard
        }
        return len(self._store.invalidate_upstream(gone)) if gone else 0

    async def pid(self) -> int:
        """The actor's process id (fault injection kills it)."""
        import os

        return os.getpid()


for _name, _method in list(vars(StoreActor).items()):
    if (
        not _name.startswith("_")
        and asyncio.iscoroutinefunction(_method)
        and _name not in vars(RestartableStoreActor)
    ):
        setattr(RestartableStoreActor, _name, _guarded(_method))


def make_restartable_shards(
    capacity_bytes: int, policy: str, shards: int, restarts: int = SHARD_RESTARTS
) -> list[ActorHandle]:
    """Start ``shards`` :class:`RestartableStoreActor` s (``capacity_bytes`` split evenly),
    each rebuilt by Ray up to ``restarts`` times (see :func:`~dynbranch.cluster.store.make_shards`
    on why they take no CPU and no placement group, and run beside the driver)."""
    import ray

    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    remote_cls = ray.remote(threaded(RestartableStoreActor))
    per_shard = capacity_bytes // shards
    return [
        remote_cls.options(
            num_cpus=0,
            max_restarts=restarts,
            max_task_retries=0,
            scheduling_strategy=beside_driver(),
        ).remote(per_shard, policy, i)
        for i in range(shards)
    ]
