"""One replay on the Ray backend with one fault injected mid-run (the fault battery's worker).

``python -m experiments.fault_inject SPEC_JSON`` runs the replay :class:`FaultSpec` describes
in this process and writes its results to ``spec.out`` like any replay. :class:`FaultyBackend`
is the Ray backend with a task that, ``at_s`` seconds after the engines started, kills one
actor the way a crash would: an engine's or a store shard's process gets SIGKILL (Ray then
restarts the actor), the gate actor is killed for Ray to restart. Everything else is the
real stack; what survives is the stack's own doing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dynbranch.backend import EngineSpec
from dynbranch.clock import Clock
from dynbranch.cluster import RayBackend

TARGETS = ("engine", "store", "gate", "none")


@dataclass(frozen=True)
class FaultSpec:
    """A replay (``replay``: :class:`~dynbranch.driver.ReplayConfig` fields) and its fault:
    kill ``target`` (``engine``, ``store``, ``gate`` or ``none``) number ``index`` at
    ``at_s`` seconds after the engines started; for an engine, ``index=None`` picks the one
    running the most requests then (the lowest number of those tied)."""

    out: str
    target: str = "none"
    at_s: float = 5.0
    index: int | None = 1
    replay: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.target not in TARGETS:
            raise ValueError(f"FaultSpec.target={self.target!r} not one of {TARGETS}")


class FaultyBackend(RayBackend):
    """The Ray backend, plus one fault at ``spec.at_s`` (see the module doc)."""

    def __init__(self, clock: Clock, roles: Mapping[str, EngineSpec], spec: FaultSpec, *,
                 stream_lanes: bool = True) -> None:
        super().__init__(clock, roles, stream_lanes=stream_lanes)
        self.spec = spec
        self.injected: dict[str, Any] = {}
        self._injector: asyncio.Task | None = None

    async def start(self) -> None:
        await super().start()
        self._injector = asyncio.get_running_loop().create_task(self._inject())

    async def shutdown(self) -> None:
        if self._injector is not None:
            self._injector.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._injector
        self.injected["shard_sets"] = [s.counts for s in self.shard_sets]
        await super().shutdown()

    async def _inject(self) -> None:
        import ray

        await asyncio.sleep(self.spec.at_s)
        target, i = self.spec.target, self.spec.index
        if target == "engine":
            if i is None:
                # NOTE: the busiest engine, so the kill cuts calls short: an idle one can be
                # rebuilt before anything calls it, and the run then never sees it go down.
                loads = await asyncio.gather(*(a.load.remote() for a in self._actors))
                i = max(range(len(loads)), key=lambda k: (loads[k].running, -k))
                self.injected["running_at_kill"] = loads[i].running
            pid = await self._actors[i].pid.remote()
            os.kill(pid, signal.SIGKILL)
        elif target == "store":
            pid = await self._store_actors[i].pid.remote()
            os.kill(pid, signal.SIGKILL)
        elif target == "gate" and getattr(self, "_gate", None) is not None:
            ray.kill(self._gate.actor, no_restart=False)
        else:
            return
        self.injected.update(target=target, index=i, at_s=self.spec.at_s)


def run(spec: FaultSpec) -> dict[str, Any]:
    """Run the replay with its fault; returns what was injected (the results are in out)."""
    from dynbranch.driver import ReplayConfig, make_backend, prepare, run_replay

    cfg = ReplayConfig(backend="ray", out=spec.out, progress=False, **spec.replay)
    prepared = prepare(cfg, progress=lambda _m: None)
    plain = make_backend(cfg, prepared.clock)
    backend = FaultyBackend(prepared.clock, plain._roles, spec, stream_lanes=cfg.stream_lanes)
    run_replay(prepared, backend)
    return backend.injected


def main(argv: list[str] | None = None) -> int:
    spec = FaultSpec(**json.loads((argv or sys.argv[1:])[0]))
    injected = run(spec)
    print(json.dumps({"injected": injected}, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
