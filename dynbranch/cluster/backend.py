"""The Ray backend: one engine actor per placement-group bundle.

Each bundle asks for one unit of the custom resource ``dynbranch_engine`` plus the engine's
device share: one GPU per engine for GPU engines, a CPU fraction for simulated ones. A
local run declares ``dynbranch_engine`` itself (one unit per worker); a cluster declares
it per node (one per GPU; see ``ray_cluster/``). The same placement code therefore puts one
engine on each GPU of a cluster and a CPU fraction each on a laptop.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from dynbranch.backend import Backend, EngineClient, EngineSpec
from dynbranch.clock import Clock
from dynbranch.cluster.engine_lane import (
    decode_error,
    decode_load,
    decode_result,
    encode_request,
)
from dynbranch.cluster.store import DEFAULT_SHARDS
from dynbranch.cluster.stream import OPEN_TIMEOUT_S, Lane, LaneBroken, answer, open_lane
from dynbranch.engines.protocol import GenerateRequest, GenerateResult, LoadSnapshot
from dynbranch.errors import ConfigError, EngineDied
from dynbranch.reuse.client import StoreClient

if TYPE_CHECKING:
    from dynbranch.cluster.gate import RayGateClient
    from dynbranch.gate import ContentionModel, GateConfig

ENGINE_RESOURCE = "dynbranch_engine"
GPU_ENGINES = ("vllm",)
"""Engine kinds that need a whole GPU per actor."""
CPU_PER_SIM_ENGINE = 0.25
PLACEMENT_TIMEOUT_S = 60.0
ENGINE_RESTARTS = 4
"""Times Ray rebuilds one engine actor whose process died, per run (then it stays down)."""
SHUTDOWN_TIMEOUT_S = 30.0
"""Seconds the engines get to shut down cleanly before they are killed."""
HEALTH_TIMEOUT_S = 2.0
"""Seconds an engine's health probe or load snapshot may take before it counts as down."""


def connect(address: str | None, workers: int) -> bool:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), else start a local one.

    Returns whether this call started Ray (and so should stop it). A local instance
    declares ``workers`` units of :data:`ENGINE_RESOURCE`.
    """
    import ray

    if ray.is_initialized():
        return False
    address = address or os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=False)
    else:
        # NOTE: address="local" starts a new instance even when another Ray runs on this
        # machine; a bare ray.init() would join that one (and refuse our resources).
        ray.init(address="local", resources={ENGINE_RESOURCE: workers},
                 include_dashboard=False, log_to_driver=False, configure_logging=False)
    return True


class RayEngineClient(EngineClient):
    """The orchestrator's handle on an engine actor.

    A call whose actor died (or is restarting) raises :class:`~dynbranch.errors.EngineDied`;
    an error the engine itself raised comes back as itself (a typed engine error), not
    wrapped in Ray's task error. ``health`` and ``load`` answer within their timeouts
    (wall clock: they bound RPCs, and the Ray backend runs on the real clock only).

    With a lane open (:meth:`open_lane`, :mod:`dynbranch.cluster.engine_lane`), ``generate``,
    ``abort`` and ``load`` go over it instead of as actor calls; ``health`` stays an actor
    call, and when the lane has broken, a healthy answer opens a new one.
    """

    remote = True

    def __init__(self, actor, engine_id: str, *, health_timeout_s: float = HEALTH_TIMEOUT_S
                 ) -> None:
        self._actor, self.engine_id = actor, engine_id
        self.health_timeout_s = health_timeout_s
        self.lane: Lane | None = None
        self._errors = functools.partial(decode_error, engine_id)  # a handler's error, typed
        self.laned = False  # whether this client wants a lane (reopened after a break)
        self.lane_counts = {"opened": 0, "broken": 0, "failed_to_open": 0, "lane_calls": 0,
                            "actor_calls": 0}

    async def open_lane(self, timeout_s: float = OPEN_TIMEOUT_S) -> bool:
        """Open a lane to the actor (see :mod:`dynbranch.cluster.engine_lane`); returns whether
        it opened. A lane that does not open within ``timeout_s`` leaves the client on actor
        calls (``lane_counts["failed_to_open"]``)."""
        self.laned = True
        try:
            lane = await open_lane(f"engine {self.engine_id}", self._actor.open_lane.remote,
                                   self._errors, timeout_s)
        except Exception:  # NOTE: a dead actor, a closed port, a timeout: actor calls remain
            self.lane_counts["failed_to_open"] += 1
            return False
        if self.lane is not None:
            self.lane.close()
        self.lane = lane
        self.lane_counts["opened"] += 1
        return True

    def close_lane(self) -> None:
        if self.lane is not None:
            self.lane.close()
        self.lane, self.laned = None, False

    def _open_lane(self) -> Lane | None:
        lane = self.lane
        if lane is None:
            return None
        if lane.broken is not None:
            self.lane = None
            self.lane_counts["broken"] += 1
            return None
        return lane

    async def _on_lane(self, lane: Lane, method: str, arg, request_id: str):
        self.lane_counts["lane_calls"] += 1
        with _lane_errors(self.engine_id, request_id):
            return await lane.call(method, arg, request_id)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        lane = self._open_lane()
        if lane is not None:
            return decode_result(await self._on_lane(lane, "generate", encode_request(request),
                                                     request.request_id))
        self.lane_counts["actor_calls"] += 1
        with _engine_errors(self.engine_id, request.request_id):
            return await self._actor.generate.remote(request)

    def start(self, request: GenerateRequest) -> asyncio.Future | None:
        lane = self._open_lane()
        if lane is None:
            return None  # NOTE: an actor call is sent from a task, as it always was
        self.lane_counts["lane_calls"] += 1
        with _lane_errors(self.engine_id, request.request_id):
            return lane.send("generate", encode_request(request))

    def finish(self, started: asyncio.Future, request: GenerateRequest) -> GenerateResult:
        with _lane_errors(self.engine_id, request.request_id):
            return decode_result(answer(started, self._errors, request.request_id))

    async def abort(self, request_id: str) -> bool:
        return await self._by_id("abort", request_id)

    async def promote(self, request_id: str) -> bool:
        return await self._by_id("promote", request_id)

    async def _by_id(self, method: str, request_id: str) -> bool:
        """A call that names one request by id (``abort``, ``promote``): over the lane when
        one is open, else as an actor call."""
        lane = self._open_lane()
        if lane is not None:
            return bool(await self._on_lane(lane, method, request_id, request_id))
        self.lane_counts["actor_calls"] += 1
        with _engine_errors(self.engine_id, request_id):
            return await getattr(self._actor, method).remote(request_id)

    async def load(self) -> LoadSnapshot:
        lane = self._open_lane()
        try:
            if lane is not None:
                async with asyncio.timeout(self.health_timeout_s):  # NOTE: not a task of its own
                    return decode_load(await self._on_lane(lane, "load", None, "load"))
            self.lane_counts["actor_calls"] += 1
            with _engine_errors(self.engine_id, "load"):
                return await asyncio.wait_for(self._actor.load.remote(),
                                              self.health_timeout_s)
        except TimeoutError:
            raise EngineDied(self.engine_id, "load",
                             f"no load reply within {self.health_timeout_s:g}s") from None

    async def health(self) -> bool:
        """The actor's health within the timeout; ``False`` when dead, restarting or slow.

        NOTE: a restarted actor starts its engine on this first call, which may take longer
        than one timeout for a real model; the pool simply probes again. A client that wants
        a lane and has lost it opens a new one once the actor answers healthy.
        """
        try:
            ok = bool(await asyncio.wait_for(self._actor.health.remote(),
                                             self.health_timeout_s))
        except Exception:  # NOTE: dead, restarting, timed out or raised: not serving
            return False
        if ok and self.laned and self._open_lane() is None:
            await self.open_lane()
        return ok


@contextlib.contextmanager
def _engine_errors(engine_id: str, request_id: str) -> Iterator[None]:
    """Ray's errors as DynBranch's: a dead actor is ``EngineDied``; an engine's own error is
    unwrapped from the task error that carries it."""
    from ray.exceptions import RayActorError, RayTaskError

    try:
        yield
    except RayActorError as e:
        raise EngineDied(engine_id, request_id, f"{type(e).__name__}: {_first_line(e)}") \
            from None
    except RayTaskError as e:
        if isinstance(e.cause, Exception):
            raise e.cause from None
        raise


@contextlib.contextmanager
def _lane_errors(engine_id: str, request_id: str) -> Iterator[None]:
    """A broken lane as ``EngineDied``: like an actor call on a dead actor, the call did not
    finish there."""
    try:
        yield
    except LaneBroken as e:
        raise EngineDied(engine_id, request_id, f"engine lane broke: {e}") from None


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:200] if text else type(error).__name__


class RayBackend(Backend):
    """Engines as Ray actors in one placement group; the orchestrator stays in the driver."""

    name = "ray"

    def __init__(self, clock: Clock, roles: Mapping[str, EngineSpec], *,
                 address: str | None = None, gate_lane: bool = False,
                 stream_lanes: bool = True) -> None:
        if clock.kind != "real":
            raise ConfigError("the Ray backend runs on the real clock only")
        self.clock, self._roles, self._address = clock, dict(roles), address
        self.gate_lane = gate_lane  # the gate's decisions over a compiled graph (gate/lane.py)
        self.stream_lanes = stream_lanes  # engine, gate, lookup calls over streams (stream.py)
        self._actors: list = []
        self._store_actors: list = []
        self.shard_sets: list = []  # one per store made (its counters go into the summary)
        self._clients: dict[str, list[EngineClient]] = {}
        self._pg = None
        self._started_ray = False

    def _bundles(self) -> list[dict[str, float]]:
        bundles = []
        for spec in self._roles.values():
            # NOTE: a tensor-parallel engine holds all its GPUs in one actor (one bundle).
            gpus = float(spec.config.tensor_parallel_size if spec.config else 1)
            share = {"GPU": gpus} if spec.kind in GPU_ENGINES else {"CPU": CPU_PER_SIM_ENGINE}
            bundles += [{ENGINE_RESOURCE: 1.0, **share} for _ in range(spec.workers)]
        return bundles

    async def start(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = self._bundles()
        self._started_ray = connect(self._address, len(bundles))
        _check_capacity(bundles)
        self._pg = placement_group(bundles, strategy="PACK", name="")
        try:
            await _wait(self._pg.ready(), PLACEMENT_TIMEOUT_S)
        except TimeoutError:
            raise ConfigError(f"placement group {bundles} not placed within "
                              f"{PLACEMENT_TIMEOUT_S:.0f}s; cluster has "
                              f"{ray.available_resources()}") from None
        from dynbranch.cluster.engine_actor import EngineActor

        remote_cls = ray.remote(EngineActor)
        index = 0
        for role, spec in self._roles.items():
            clients = []
            for i in range(spec.workers):
                engine_id = f"{spec.kind}-{role}-{i}"
                bundle = bundles[index]
                actor = remote_cls.options(
                    num_cpus=bundle.get("CPU", 0.0), num_gpus=bundle.get("GPU", 0.0),
                    resources={ENGINE_RESOURCE: 1.0}, max_concurrency=10_000,
                    max_restarts=ENGINE_RESTARTS, max_task_retries=0,
                    scheduling_strategy=PlacementGroupSchedulingStrategy(
                        self._pg, placement_group_bundle_index=index),
                ).remote(spec.kind, spec.model_path or spec.profile, engine_id, spec.config)
                self._actors.append(actor)
                clients.append(RayEngineClient(actor, engine_id))
                index += 1
            self._clients[role] = clients
        await _gather([a.start.remote() for a in self._actors])
        if self.stream_lanes:
            await asyncio.gather(*(c.open_lane() for cs in self._clients.values() for c in cs
                                   if isinstance(c, RayEngineClient)))

    def clients(self) -> Mapping[str, list[EngineClient]]:
        return self._clients

    def lane_counts(self) -> dict[str, int]:
        """Engine calls over lanes and as actor calls, lanes opened, broken and not opened,
        summed over the engines; lookups over the store shards' lanes and those lanes'
        breaks (the gate client reports its own)."""
        if not self.stream_lanes:
            return {}
        out: dict[str, int] = {}
        for clients in self._clients.values():
            for c in clients:
                if isinstance(c, RayEngineClient):
                    for k, v in c.lane_counts.items():
                        out[f"engine_{k}"] = out.get(f"engine_{k}", 0) + v
        for shard_set in self.shard_sets:
            for k in ("stream_lookups", "stream_broken", "stream_unopened"):
                key = "store_" + k.removeprefix("stream_")
                out[key] = out.get(key, 0) + shard_set.counts[k]
        return out

    def make_store(self, capacity_bytes: int, policy: str = "lru", *,
                   shards: int = DEFAULT_SHARDS) -> StoreClient:
        """C1's store as ``shards`` store actors (``capacity_bytes`` split evenly) holding
        records in Ray's object store; they live until :meth:`shutdown`.

        Shards restart when their process dies, and the client reaches them through
        :class:`~dynbranch.cluster.shard_set.ShardSet`, so a dead shard costs misses,
        never a request (see :mod:`dynbranch.cluster.store_faults`).
        """
        import ray

        from dynbranch.cluster.shard_set import ShardSet
        from dynbranch.cluster.store import RayStoreClient
        from dynbranch.cluster.store_faults import make_restartable_shards

        if not ray.is_initialized():
            raise ConfigError("RayBackend.make_store needs a connected backend: call start() "
                              "first")
        actors = make_restartable_shards(capacity_bytes, policy, shards)
        self._store_actors.extend(actors)
        self.shard_sets.append(ShardSet(actors, stream=self.stream_lanes))
        return RayStoreClient(self.shard_sets[-1].handles)

    def make_gate(self, model: ContentionModel, config: GateConfig, *,
                  checkpoint_dir: str | None = None) -> RayGateClient:
        """C3's central gate for this run: a named :class:`~dynbranch.cluster.GateActor`,
        started on the first call and shared by every later one (they must ask for the same
        ``model`` and ``config``); it lives until :meth:`shutdown`.

        ``checkpoint_dir`` is where it checkpoints (default: a temporary directory on this
        node, removed at shutdown); see :mod:`dynbranch.cluster.gate`. With ``gate_lane``
        the first client's calls go through a compiled-graph lane
        (:mod:`dynbranch.cluster.gate.lane`), later ones' the plain way.
        """
        import ray

        from dynbranch.cluster.gate import GateDeployment

        if not ray.is_initialized():
            raise ConfigError("RayBackend.make_gate needs a connected backend: call start() "
                              "first")
        # NOTE: set here, not in __init__, so that make_gate stays self-contained.
        if getattr(self, "_gate", None) is None:
            self._gate = GateDeployment.start(model, config, checkpoint_dir)
        return self._gate.client(model, config, lane=self.gate_lane and not self._gate.laned,
                                 stream=self.stream_lanes)

    async def shutdown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        for clients in self._clients.values():
            for c in clients:
                if isinstance(c, RayEngineClient):
                    c.close_lane()
        for shard_set in self.shard_sets:
            shard_set.close_lanes()
        try:
            if self._actors:
                # NOTE: an engine that died mid-run cannot shut down; it is killed below like
                # the rest, and a run's results never wait on it.
                await asyncio.wait_for(asyncio.gather(
                    *(a.shutdown.remote() for a in self._actors), return_exceptions=True),
                    SHUTDOWN_TIMEOUT_S)
        except TimeoutError:
            pass
        finally:
            # NOTE: each step on its own: one actor that is already gone must not keep the
            # rest (or Ray itself) running.
            for a in self._actors + self._store_actors:
                with contextlib.suppress(Exception):
                    ray.kill(a)
            self._actors.clear()
            self._store_actors.clear()
            if getattr(self, "_gate", None) is not None:
                with contextlib.suppress(Exception):
                    self._gate.stop()
                self._gate = None
            if self._pg is not None:
                with contextlib.suppress(Exception):
                    remove_placement_group(self._pg)
                self._pg = None
            if self._started_ray:
                ray.shutdown()


def _check_capacity(bundles: list[dict[str, float]]) -> None:
    import ray

    need: dict[str, float] = {}
    for b in bundles:
        for k, v in b.items():
            need[k] = need.get(k, 0.0) + v
    have = ray.cluster_resources()
    short = {k: (v, have.get(k, 0.0)) for k, v in need.items() if have.get(k, 0.0) < v}
    if short:
        detail = ", ".join(f"{k}: need {n:g}, cluster has {h:g}" for k, (n, h) in short.items())
        hint = (f" Start Ray with --resources='{{\"{ENGINE_RESOURCE}\": N}}' (N = engines per "
                f"node, one per GPU), as ray_cluster/ does." if ENGINE_RESOURCE in short else "")
        raise ConfigError(f"the Ray cluster cannot hold the engines ({detail}).{hint}")


async def _wait(ref, timeout: float):
    return await asyncio.wait_for(asyncio.ensure_future(ref), timeout)


async def _gather(refs):
    return await asyncio.gather(*refs)
