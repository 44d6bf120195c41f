"""Everything that touches Ray lives in this package, and nothing outside it imports Ray.

* :class:`RayBackend` — engines as Ray actors, one per placement-group bundle, so the same
  code puts one engine on each GPU of a GPU cluster and a CPU fraction each on a laptop.
* :class:`EngineActor` — a plain class wrapping one :class:`~dynbranch.engines.protocol.Engine`,
  made remote where it is created.
* :class:`StoreActor` — one shard of C1's subgraph store, its records' Arrow bytes held in
  Ray's object store; :class:`RayStoreClient` — the orchestrator's store client over the
  shards (what :meth:`RayBackend.make_store` returns).
* :class:`GateActor` — C3's central gate, one named actor per run that restores its
  posteriors, returns and reservations from a checkpoint when Ray restarts it;
  :class:`RayGateClient` — the priced policy's gate client over it (what
  :meth:`RayBackend.make_gate` returns), degrading to "no fills" while it restarts.
"""

from dynbranch.cluster.backend import ENGINE_RESOURCE, RayBackend, connect
from dynbranch.cluster.engine_actor import EngineActor
from dynbranch.cluster.gate import (
    UNAVAILABLE,
    GateActor,
    GateCheckpoint,
    GateDeployment,
    RayGateClient,
    RetryPolicy,
)
from dynbranch.cluster.store import DEFAULT_SHARDS, Located, RayStoreClient, StoreActor

__all__ = ["DEFAULT_SHARDS", "ENGINE_RESOURCE", "UNAVAILABLE", "EngineActor", "GateActor",
           "GateCheckpoint", "GateDeployment", "Located", "RayBackend", "RayGateClient",
           "RayStoreClient", "RetryPolicy", "StoreActor", "connect"]
