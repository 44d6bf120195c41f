"""The central gate actor of one run, as the Ray backend starts, hands out and stops it.

NOTE on *where*: the checkpoint directory is run-scoped (a fresh temporary directory by
default, removed at shutdown) and the actor is pinned to the driver's node (a hard node
affinity), so a restarted incarnation always finds the files its predecessor wrote. This
survives any crash of the actor's process; losing the node loses the driver too, and with
it the run. To let the gate move between nodes, pass a directory on a shared file system
and drop the pin; Ray's internal KV would also survive, but ``ray.experimental.internal_kv``
is private, and a detached KV actor would be one more thing to restart and to leak past the
job.
"""

from __future__ import annotations

import shutil
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from dynbranch.cluster.gate.actor import SNAPSHOT_EVERY, GateActor
from dynbranch.cluster.gate.client import RayGateClient, RetryPolicy
from dynbranch.cluster.threaded import threaded
from dynbranch.errors import ConfigError
from dynbranch.gate import ContentionModel, GateConfig
from dynbranch.gate.policy import make_policy

if TYPE_CHECKING:
    from ray.actor import ActorHandle


@dataclass
class GateDeployment:
    """The central gate actor of one run, as :class:`~dynbranch.cluster.RayBackend` holds it."""

    actor: ActorHandle
    name: str
    directory: Path
    model: ContentionModel
    config: GateConfig
    owns_directory: bool
    clients: list[RayGateClient] = field(default_factory=list)

    @classmethod
    def start(
        cls,
        model: ContentionModel,
        config: GateConfig,
        directory: str | Path | None = None,
        *,
        run_id: str | None = None,
        actor_cls: type[GateActor] = GateActor,
        snapshot_every: int = SNAPSHOT_EVERY,
    ) -> GateDeployment:
        """Start the named gate actor of run ``run_id`` (a fresh id by default).

        ``directory`` holds its checkpoint (a new temporary directory, removed by
        :meth:`stop`, by default); ``actor_cls`` is a subclass, for tests.

        NOTE: the actor takes no CPU (bookkeeping between RPCs must not compete with engines
        for a bundle) and is not detached: it is owned by the driver and dies with the job.
        It runs :func:`~dynbranch.cluster.threaded.threaded` (a plain actor, one call at a
        time). ``max_task_retries=0``: Ray does not resend a call that was in flight at a crash,
        because the client does, with the same call id. Not ``get_if_exists``: the name is
        new per run, so an existing actor under it is a bug to report, not one to reuse with
        whatever arguments it was built from; reuse within a run is the backend's (one
        deployment, checked against the model and config it was started with).
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        run_id = run_id or uuid.uuid4().hex[:12]
        owns = directory is None
        path = Path(tempfile.mkdtemp(prefix=f"dynbranch-gate-{run_id}-") if owns else directory)
        name = f"dynbranch-gate-{run_id}"
        here = ray.get_runtime_context().get_node_id()
        actor = (
            ray.remote(threaded(actor_cls))
            .options(
                name=name,
                max_restarts=-1,
                max_task_retries=0,
                num_cpus=0,
                scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
            )
            .remote(model, config, str(path), snapshot_every=snapshot_every, freeze_heap=True)
        )
        return cls(actor, name, path, model, config, owns)

    @property
    def laned(self) -> bool:
        """Whether a client of this gate was made with a lane."""
        return any(c.wants_lane for c in self.clients)

    def client(
        self, model: ContentionModel, config: GateConfig, retry: RetryPolicy | None = None,
        *, lane: bool = False, stream: bool = False,
    ) -> RayGateClient:
        """A new client of this run's gate, which must be the gate ``model``/``config`` ask for.

        ``lane``: the client's decisions go through a compiled-graph channel
        (:mod:`~dynbranch.cluster.gate.lane`; it keeps a core of the actor's node busy).
        NOTE: the actor runs one compiled graph at a time, so one laned client per gate.
        ``stream``: a client without a compiled lane sends them over a stream lane instead
        (:mod:`~dynbranch.cluster.stream`; any number of clients, no busy core).
        """
        if model != self.model or config != self.config:
            raise ConfigError(
                f"run's central gate {self.name} was started with "
                f"{self.config}; cannot serve {config} (one gate per run)"
            )
        if lane and self.laned:
            raise ConfigError(f"run's central gate {self.name} already has a laned client "
                              f"(an actor runs one compiled graph at a time)")
        client = RayGateClient(self.actor, make_policy(config.policy, config.p_star).name,
                               retry, lane=lane, stream=stream)
        self.clients.append(client)
        return client

    def stop(self) -> None:
        """Kill the actor for good and remove the checkpoint directory if it made it."""
        import ray

        try:
            for client in self.clients:  # NOTE: the lanes first, while the actor answers
                client.close_lane()
            ray.kill(self.actor, no_restart=True)
        finally:  # NOTE: even when Ray is already gone, the checkpoint must not outlive the run
            if self.owns_directory:
                shutil.rmtree(self.directory, ignore_errors=True)
