"""C1 lookups over a stream lane (:mod:`dynbranch.cluster.stream`): what travels and how.

With lanes on (the Ray backend's default), the client's batched lookups
(:class:`~dynbranch.cluster.store_reads.LookupBatcher`) reach each shard over one direct
stream instead of as actor calls; every other store call (puts, writes, tickets, resyncs)
stays an actor call. The shard runs them as ``lookup_many`` under its call lock, on the lane's
own thread (:meth:`StoreActor.open_stream <dynbranch.cluster.store.StoreActor.open_stream>`),
so they are still one operation at a time with its actor calls.

A lookup's answer travels as a row (:func:`encode_lookup`). A located record always travels
with its bytes: a small one's from the shard's view of them, as an actor call's reply carries
it, and a large one's read by the shard from its own node's object store (an actor call's
reply carries a ref instead, which a lane cannot: refs travel only through Ray). A lane that
breaks or does not answer in time fails its batch as an actor call that timed out does (the
lookups miss), and the shard set opens a new one once the shard is back and re-synchronised
(:class:`~dynbranch.cluster.shard_set.ShardSet`).
"""

from __future__ import annotations

from typing import Any

from dynbranch.cluster.store_reads import Located
from dynbranch.reuse.lookups import (
    JoinInFlight,
    Lookup,
    LookupKind,
    Miss,
    MissReason,
    ShadowMatch,
    Stale,
)
from dynbranch.reuse.record import RecordState


def encode_lookup(got: Lookup | Located, data: Any = None) -> list[Any]:
    """A shard's answer to one lookup as a row; ``data``: a located record's bytes when its
    answer carries a ref instead (a large record)."""
    if isinstance(got, Located):
        raw = got.data if got.data is not None else data
        if raw is None:
            raise ValueError(f"located record {got.name} has no bytes to send")
        return ["located", str(got.kind), got.name, str(got.state), got.hits, got.object_id,
                raw if isinstance(raw, bytes) else memoryview(raw).tobytes()]
    if isinstance(got, Miss):
        return ["miss", str(got.reason)]
    if isinstance(got, Stale):
        return ["stale", got.record_name,
                [[k, list(v)] for k, v in got.stale_reads.items()], list(got.removed)]
    if isinstance(got, ShadowMatch) and got.record is None:
        return ["shadow", got.name]
    if isinstance(got, JoinInFlight):
        return ["join", got.ticket_id, got.name, got.owner]
    raise TypeError(f"a lookup answer the store lane does not carry: {type(got).__name__}")


def decode_lookup(row: list[Any]) -> Lookup | Located:
    """The inverse of :func:`encode_lookup` (a located record's bytes as ``bytes``)."""
    tag = row[0]
    if tag == "located":
        _, kind, name, state, hits, object_id, data = row
        return Located(LookupKind(kind), name, RecordState(state), hits, (), object_id, data)
    if tag == "miss":
        return Miss(MissReason(row[1]))
    if tag == "stale":
        _, name, reads, removed = row
        return Stale(name, {k: (v[0], v[1]) for k, v in reads}, tuple(removed))
    if tag == "shadow":
        return ShadowMatch(row[1], None)
    if tag == "join":
        return JoinInFlight(row[1], row[2], row[3])
    raise ValueError(f"not a lookup row: {tag!r}")
