"""Everything that touches Ray lives in this package, and nothing outside it imports Ray.

* :class:`RayBackend` — engines as Ray actors, one per placement-group bundle, so the same
  code puts one engine on each GPU of a GPU cluster and a CPU fraction each on a laptop.
* :class:`EngineActor` — a plain class wrapping one :class:`~dynbranch.engines.protocol.Engine`,
  made remote where it is created.
"""

from dynbranch.cluster.backend import ENGINE_RESOURCE, RayBackend, connect
from dynbranch.cluster.engine_actor import EngineActor

__all__ = ["ENGINE_RESOURCE", "EngineActor", "RayBackend", "connect"]
