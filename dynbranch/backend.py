"""Backends: where engines live. The orchestrator sees only :class:`EngineClient` objects.

``local`` runs engines in the orchestrator's own event loop (with either clock); ``ray``
(in :mod:`dynbranch.cluster`, the only package that imports Ray) runs one engine per Ray
actor. Both hand the orchestrator the same clients, so the same orchestrator code runs on
both, and engines are grouped by *model role* (``target`` serves canonical stages; a
``drafter`` role is for predictors).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynbranch.clock import Clock
from dynbranch.engines.client import EngineClient, LocalEngineClient
from dynbranch.engines.config import EngineConfig
from dynbranch.engines.protocol import Engine
from dynbranch.runtime.pool import DRAFTER_ROLE
from dynbranch.runtime.run import ModelId

if TYPE_CHECKING:
    from dynbranch.reuse.client import StoreClient

BACKENDS = ("local", "ray")
__all__ = ["BACKENDS", "DRAFTER_ROLE", "Backend", "EngineClient", "EngineSpec", "LocalBackend",
           "LocalEngineClient"]


@dataclass(frozen=True)
class EngineSpec:
    """The engines of one model role: which kind, which profile or model, how many, and
    (real engines) their settings."""

    kind: str = "sim"
    profile: str = "qwen3-32b@h200"
    workers: int = 4
    model_path: str | None = None
    config: EngineConfig | None = None

    def __post_init__(self) -> None:
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")


class Backend(ABC):
    """Starts engines for each model role and stops them."""

    name: str
    clock: Clock
    _roles: dict[str, EngineSpec]
    make_gate: Callable[..., Any] | None = None
    """A factory of the backend's one central gate (Ray); ``None``: each run's gate lives in
    the driver's process."""

    @abstractmethod
    async def start(self) -> None:
        """Start every engine (inside the clock's running loop)."""

    @abstractmethod
    def clients(self) -> Mapping[str, list[EngineClient]]:
        """Engine clients by model role; valid after :meth:`start`."""

    @abstractmethod
    async def shutdown(self) -> None:
        """Stop every engine; nothing may keep running after this returns."""

    def models(self) -> dict[str, ModelId]:
        """The model serving each role (part of every LLM stage's reuse name)."""
        return {role: ModelId(spec.model_path or spec.profile, spec.kind)
                for role, spec in self._roles.items()}

    def make_store(self, capacity_bytes: int, policy: str = "lru") -> StoreClient:
        """A subgraph store for C1 records (default: in the orchestrator's process)."""
        from dynbranch.reuse.client import LocalStoreClient
        from dynbranch.reuse.store import SubgraphStore

        return LocalStoreClient(SubgraphStore(capacity_bytes, policy))

    def lane_counts(self) -> dict[str, int]:
        """What the backend's direct lanes to remote actors carried (none in process)."""
        return {}

    def describe(self) -> str:
        """One line naming the backend and its engines, for reports."""
        parts = [f"{role}: {len(cs)}×{cs[0].engine_id.split('-')[0]}"
                 for role, cs in self.clients().items() if cs]
        return f"{self.name} ({', '.join(parts)})"


class LocalBackend(Backend):
    """Engines in process: deterministic on the virtual clock, real-time on the real one."""

    name = "local"

    def __init__(self, clock: Clock, roles: Mapping[str, EngineSpec]) -> None:
        self.clock = clock
        self._roles = dict(roles)
        self._engines: dict[str, list[Engine]] = {}
        self._clients: dict[str, list[EngineClient]] = {}

    async def start(self) -> None:
        from dynbranch.engines import make_engine

        for role, spec in self._roles.items():
            engines = [make_engine(spec.kind, profile=spec.model_path or spec.profile, clock=self.clock,
                                   engine_id=f"{spec.kind}-{role}-{i}", config=spec.config)
                       for i in range(spec.workers)]
            for e in engines:
                await e.start()
            self._engines[role] = engines
            self._clients[role] = [LocalEngineClient(e) for e in engines]

    def clients(self) -> Mapping[str, list[EngineClient]]:
        return self._clients

    async def shutdown(self) -> None:
        for engines in self._engines.values():
            for e in engines:
                await e.shutdown()
        self._engines.clear()
