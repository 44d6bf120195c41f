"""C1, exact subgraph reuse: reuse names, records and shadows, freshness, invalidation.

Pure Python (no Ray, no clock reads: methods that need time take ``now``). The lifecycle
of one stage, as the orchestrator's :class:`~dynbranch.reuse.hook.ReuseHook` drives it:

1. **Name.** :func:`key_for` builds the stage's :class:`ReuseKey` (fingerprint, complete
   rendered input, model and revision, sampling parameters, tool schema version, tenant);
   :func:`reuse_name` digests its canonical :meth:`~ReuseKey.key_bytes`.
2. **Lookup.** :meth:`SubgraphStore.lookup` answers :class:`Hit` (committed, equal key,
   fresh read-set: serve it), :class:`ShadowMatch` (a fill's result; a serving lookup gets
   no value and must :meth:`~SubgraphStore.promote` it), :class:`JoinInFlight` (an equal
   key is executing: wait, then look up again), :class:`Stale` (removed, execute) or
   :class:`Miss` with a :class:`MissReason` (execute). Full key bytes are compared on every
   hit; a name match with another key is ``Miss(COLLISION)``.
3. **Execute.** :meth:`~SubgraphStore.begin` claims the name (a :class:`Ticket`) or joins
   the claimant; :meth:`~SubgraphStore.finish` closes the ticket with the result.
4. **Record / shadow.** :meth:`Record.create` captures the key, value, read-set and
   :class:`Provenance` (including the upstream record names the input was rendered from);
   canonical executions are committed, fills are shadows. :meth:`~SubgraphStore.put`
   refuses records whose reads are already stale.
5. **Promote / drop.** At branch resolution the canonical stage promotes a shadow on an
   exact key match with a fresh read-set; losing fills' shadows are dropped.
6. **Invalidate.** :meth:`~SubgraphStore.write` bumps a resource's version, removes every
   record that read an older one and, transitively, every record rendered from a removed
   record (write-cascade), reporting each level in an :class:`Invalidation`. A mutating
   stage first :meth:`~SubgraphStore.announce` s what it may write (a
   :class:`WriteReceipt`): until :meth:`~SubgraphStore.commit` applies its versions, a
   record that read one serves nothing (``Miss(WRITING)``) and none is stored
   (``PutOutcome.WRITING``), so no lookup sees a value the write has already changed.
7. **Evict.** When a put exceeds the byte capacity the store evicts by policy
   (:class:`LRU` or :class:`CostAware`), shadows first, never pinned or in-flight names.

Records serialise to Arrow IPC (:func:`to_arrow` / :func:`from_arrow`) for the Ray store.
"""

from dynbranch.reuse.client import LocalStoreClient, StoreClient
from dynbranch.reuse.eviction import LRU, POLICIES, CostAware, EvictionPolicy, make_policy
from dynbranch.reuse.joins import Waiters
from dynbranch.reuse.lookups import (
    Hit,
    Invalidation,
    JoinInFlight,
    Lookup,
    LookupKind,
    Miss,
    MissReason,
    PinReceipt,
    PutOutcome,
    PutResult,
    ShadowMatch,
    Stale,
    StoreStats,
    Ticket,
    WriteReceipt,
)
from dynbranch.reuse.names import (
    KEY_SCHEMA_VERSION,
    HashFn,
    ReuseKey,
    key_for,
    reuse_name,
    sha256hex,
)
from dynbranch.reuse.record import (
    RECORD_SCHEMA,
    Provenance,
    Record,
    RecordState,
    from_arrow,
    to_arrow,
)
from dynbranch.reuse.store import SubgraphStore
from dynbranch.reuse.versions import StaleReads, VersionTable

__all__ = [
    "KEY_SCHEMA_VERSION", "LRU", "POLICIES", "RECORD_SCHEMA", "CostAware", "EvictionPolicy",
    "HashFn", "Hit", "Invalidation", "JoinInFlight", "LocalStoreClient", "Lookup",
    "LookupKind", "Miss", "MissReason", "PinReceipt", "Provenance", "PutOutcome", "PutResult",
    "Record", "RecordState", "ReuseKey", "ShadowMatch", "Stale", "StaleReads", "StoreClient",
    "StoreStats", "SubgraphStore", "Ticket", "VersionTable", "Waiters", "WriteReceipt",
    "from_arrow", "key_for", "make_policy", "reuse_name", "sha256hex", "to_arrow",
]
