"""C3's central gate on Ray: one named actor that survives its own crashes, and its client.

DESIGN.md §2 puts the gate in one place: every orchestrator task asks the same
:class:`~dynbranch.gate.Gate` (its Beta posteriors, per-coordinate returns and KV ledger) for
Actions 0 and 1. (The load envelope the admissions are priced against is observed by the
priced policy in the driver and passed in with each ``admit``; it is soft state, rebuilt by
the load probe within one window, so it is not checkpointed.) One module per concern:

* :mod:`~dynbranch.cluster.gate.codec` — the compact JSON rows of the wire and the journal;
* :mod:`~dynbranch.cluster.gate.journal` — :class:`GateCheckpoint`, a snapshot and the
  journal of calls since it;
* :mod:`~dynbranch.cluster.gate.actor` — :class:`GateActor`, the gate behind async methods,
  journaled call by call and restored from its checkpoint when Ray restarts it;
* :mod:`~dynbranch.cluster.gate.client` — :class:`RayGateClient`, which retries within a
  :class:`RetryPolicy` and then degrades to "no fills" while the actor restarts;
* :mod:`~dynbranch.cluster.gate.lane` — :class:`GateLane`, the opt-in compiled-graph channel
  (``--gate-lane``) that carries the client's calls in about a tenth of a millisecond, not
  an actor call's milliseconds, for a polling core on the actor's node;
* :mod:`~dynbranch.cluster.gate.deployment` — :class:`GateDeployment`, the run's named actor
  (where it runs, where it checkpoints, how it stops), as the backend holds it.
"""

from dynbranch.cluster.gate.actor import CALLS_KEPT, SNAPSHOT_EVERY, GateActor
from dynbranch.cluster.gate.client import (
    PENDING_LEARN_MAX,
    UNAVAILABLE,
    RayGateClient,
    RetryPolicy,
)
from dynbranch.cluster.gate.deployment import GateDeployment
from dynbranch.cluster.gate.journal import FORMAT, GateCheckpoint
from dynbranch.cluster.gate.lane import GateLane, LaneBroken

__all__ = [
    "CALLS_KEPT",
    "FORMAT",
    "PENDING_LEARN_MAX",
    "SNAPSHOT_EVERY",
    "UNAVAILABLE",
    "GateActor",
    "GateCheckpoint",
    "GateDeployment",
    "GateLane",
    "LaneBroken",
    "RayGateClient",
    "RetryPolicy",
]
