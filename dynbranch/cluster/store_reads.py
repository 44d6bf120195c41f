"""The read path of C1's store on Ray: a hit in one round trip, lookups batched per shard.

* **Bytes as Arrow buffers in the object store.** A shard puts each record's
  :func:`~dynbranch.reuse.record.to_arrow` bytes as a ``uint8`` array (:func:`hold`), so a
  reader maps the object store's copy instead of copying it: the shard keeps a zero-copy view
  of its own small records, and a client reads a large one straight from shared memory
  (:func:`read_located`, which hands Arrow a buffer over the mapped object).
* **A hit in one round trip.** A small record's bytes (at most :data:`INLINE_MAX`) travel
  inside the lookup's reply (:class:`Located` ``.data``), so the client need not ask the
  object store for them in a second round trip; a large one travels as its ref.
* **One call per shard per batch.** :class:`LookupBatcher` gathers the lookups a client's
  callers start in the same event-loop turn (the stages of one stage group, the fills of one
  branch, other requests' stages that became ready together) and sends each shard one
  ``lookup_many``; a shard answers each query exactly as ``lookup`` would, in order.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dynbranch.errors import CorruptRecordError
from dynbranch.reuse.lookups import LookupKind
from dynbranch.reuse.record import Record, RecordState, from_arrow

if TYPE_CHECKING:
    from ray import ObjectRef

INLINE_MAX = 64 * 1024
"""Largest record (serialised bytes) whose bytes a lookup's reply carries inline.

NOTE: below Ray's own inlining limit for task replies (100 KiB), so an inline reply is one
message; a larger record is read from the object store through its ref (zero-copy on the
reader's node), where the second round trip costs less than copying it through the reply.
"""


@dataclass(frozen=True, slots=True)
class Located:
    """A servable record on a shard: what the shard knows now, and where its bytes are.

    ``state`` and ``hits`` are the shard's current values (a promotion or a hit changes them
    after the bytes were written); everything else comes from the bytes. ``data`` is a copy
    of the bytes when the record is small enough to come inline, and then ``refs`` is empty;
    otherwise ``refs`` holds exactly one ref to read them from. ``object_id`` names the
    object either way (what the client reports when the bytes do not decode).

    NOTE: an inline reply carries no ref: a ref in a reply makes the client a borrower,
    which costs the owner and the client protocol messages of their own on every hit. A
    ref travels inside this object, not as a return value of its own, so Ray hands the
    client the ref (to fetch, and to report if it is lost) instead of resolving it.
    """

    kind: LookupKind  # HIT or SHADOW
    name: str
    state: RecordState
    hits: int
    refs: tuple[ObjectRef, ...]
    object_id: str
    data: Any = None  # the record's bytes (a read-only uint8 array), or None: read the ref


@dataclass(slots=True)
class Held:
    """A shard's hold on one record's bytes: the ref that owns them in the object store and,
    for a record of at most :data:`INLINE_MAX` bytes, a zero-copy view of them to reply
    with (``None``: replies carry the ref only)."""

    ref: ObjectRef
    nbytes: int
    view: Any = None


def hold(data: bytes) -> Held:
    """Put ``data`` in the object store as a ``uint8`` array owned by the calling actor.

    NOTE: the view of a small record is read back with a blocking ``ray.get`` inside the
    shard's event loop; the object was just sealed on this node by this process, so the get
    maps it at once (Ray logs a one-time warning about blocking gets in async actors). It
    pins nothing the ref does not already pin, and keeps no second copy.
    """
    import numpy as np
    import ray

    ref = ray.put(np.frombuffer(data, dtype=np.uint8))
    view = ray.get(ref) if len(data) <= INLINE_MAX else None
    return Held(ref, len(data), view)


async def read_located(located: Located, key_bytes: bytes) -> Record:
    """The record ``located`` carries or points at, checked against the name and key looked
    up; raises Ray's error when its bytes are lost, :class:`CorruptRecordError` when they do
    not decode to that record."""
    import pyarrow as pa

    data = located.data if located.data is not None else await located.refs[0]
    record = from_arrow(pa.py_buffer(data) if not isinstance(data, bytes) else data)
    if record.name != located.name or record.key_bytes != key_bytes:
        raise CorruptRecordError(f"object {located.object_id} holds another record")
    return record


@dataclass
class _Batch:
    queries: list[tuple[str, bytes, float, bool]] = field(default_factory=list)
    futures: list[asyncio.Future] = field(default_factory=list)


class LookupBatcher:
    """Gathers lookups per shard within one event-loop turn and sends each shard one call.

    ``send(shard, queries)`` makes the call (a ``lookup`` for one query, ``lookup_many``
    for several) and returns the shard's answers in query order. A batch's failure fails
    each of its callers with the same error. Counters: ``calls`` made, ``lookups`` sent.
    """

    def __init__(self, send: Callable[[int, Sequence[tuple]], Any]) -> None:
        self._send = send
        self._open: dict[int, _Batch] = {}
        self._running: set[asyncio.Task] = set()
        self.counts = {"calls": 0, "lookups": 0}

    async def lookup(
        self, shard: int, name: str, key_bytes: bytes, now: float, serving: bool
    ) -> Any:
        """The shard's answer to one lookup, sent with whatever else this turn asked it."""
        loop = asyncio.get_running_loop()
        batch = self._open.get(shard)
        if batch is None:
            batch = self._open[shard] = _Batch()
            # NOTE: the batch's task takes its first step in the next turn, after every
            # callback already scheduled in this one, so the stages of a gather (started
            # together) all join before it is sent; it sends in that step and hands the
            # answers over in its last (a flushing callback and a task started from it,
            # settled by a done callback, took a turn more at each end)
            task = loop.create_task(self._run(shard, batch))
            self._running.add(task)
            task.add_done_callback(self._running.discard)
        future = loop.create_future()
        batch.queries.append((name, key_bytes, now, serving))
        batch.futures.append(future)
        return await future

    async def _run(self, shard: int, batch: _Batch) -> None:
        if self._open.get(shard) is batch:
            del self._open[shard]
        self.counts["calls"] += 1
        self.counts["lookups"] += len(batch.queries)
        try:
            answers = await self._send(shard, batch.queries)
        except BaseException as e:
            _settle(batch.futures, None, e)
            if not isinstance(e, Exception):
                raise  # NOTE: a cancellation (the loop ending) ends this task as well
        else:
            _settle(batch.futures, answers, None)


def _settle(futures: list[asyncio.Future], answers: Sequence[Any] | None,
            error: BaseException | None) -> None:
    """Hand each caller its answer (or the batch's error); a caller gone meanwhile
    (cancelled) is skipped."""
    for i, future in enumerate(futures):
        if future.done():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            assert answers is not None
            future.set_result(answers[i])
