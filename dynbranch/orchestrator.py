"""The orchestrator: one asyncio task per request, running its workflow over engines and tools.

Each request's program (:meth:`RequestInstance.run`) calls back into a
:class:`RequestContext`, which renders every stage's complete input, gives C1 the chance
to serve it (:class:`~dynbranch.hooks.ReuseHook`), otherwise executes it on an engine of
the stage's model role or on the request's tool, and logs one :class:`StageRecord` per
stage. Branches are reported to C2 (:class:`~dynbranch.hooks.BranchHook`) when they open
and resolve. Time comes only from the injected clock; engines come only through
:class:`~dynbranch.backend.EngineClient`, so the same code runs on the local and the Ray
backend.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

from dynbranch.arms import Arm
from dynbranch.backend import EngineClient
from dynbranch.canonical import value_digest
from dynbranch.clock import Clock
from dynbranch.engines.protocol import CANONICAL, GenerateRequest, GenerateResult
from dynbranch.errors import DynBranchError, RenderError, StageError, ToolCallError
from dynbranch.hooks import Served, StageOutcome
from dynbranch.placement import PlacementPolicy
from dynbranch.records import BranchRecord, RequestRecord, StageRecord
from dynbranch.workflow import BranchPoint, RenderedInput, StageSpec
from dynbranch.workload import RequestInstance


class EnginePool:
    """The engines of each model role, with the open-call counts placement decides on."""

    def __init__(self, clients: Mapping[str, Sequence[EngineClient]],
                 placement: PlacementPolicy) -> None:
        self._clients = {role: list(cs) for role, cs in clients.items()}
        self._open = {role: [0] * len(cs) for role, cs in self._clients.items()}
        self._placement = placement

    def roles(self) -> list[str]:
        return list(self._clients)

    async def generate(self, role: str, request: GenerateRequest
                       ) -> tuple[EngineClient, GenerateResult]:
        """Place ``request`` on an engine of ``role`` and run it."""
        clients = self._clients.get(role)
        if not clients:
            raise KeyError(f"no engines for model role {role!r}; roles: {self.roles()}")
        i = self._placement.choose(self._open[role], request)
        self._open[role][i] += 1
        try:
            return clients[i], await clients[i].generate(request)
        finally:
            self._open[role][i] -= 1


class RunLog:
    """Every stage and branch record of a run, in the order they completed."""

    def __init__(self) -> None:
        self.stages: list[StageRecord] = []
        self.branches: list[BranchRecord] = []


class Orchestrator:
    """Runs request instances for one arm over one set of engines."""

    def __init__(self, clock: Clock, clients: Mapping[str, Sequence[EngineClient]],
                 arm: Arm, *, tenant: str = "default") -> None:
        self.clock, self.arm, self.tenant = clock, arm, tenant
        self.pool = EnginePool(clients, arm.make_placement())
        self.reuse = arm.make_reuse()
        self.branch_hook = arm.make_branch()
        self.log = RunLog()
        self._t0: float | None = None

    def start_run(self) -> float:
        """Mark the run's time origin (call inside the running loop); returns it."""
        self._t0 = self.clock.now()
        return self._t0

    def rel(self, t: float | None = None) -> float:
        """Seconds since the run's origin."""
        assert self._t0 is not None, "start_run() first"
        return (self.clock.now() if t is None else t) - self._t0

    async def run_request(self, instance: RequestInstance, scheduled: float) -> RequestRecord:
        """Run one request to completion or failure; ``scheduled`` is relative to the origin."""
        ctx = RequestContext(self, instance)
        start = self.rel()
        status, correct, etype, emsg = "completed", None, "", ""
        try:
            outcome = await instance.run(ctx)
            correct = float(instance.score(outcome))
        except DynBranchError as e:
            status, etype, emsg = "failed", type(e).__name__, str(e)
        except Exception as e:  # a workload bug must fail its request, not the run
            status, etype, emsg = "failed", type(e).__name__, f"unexpected: {e!r}"
        finally:
            await self.branch_hook.request_done(instance.request_id)
        origin = ctx.last_human_end if instance.latency_origin == "last_human" else None
        return RequestRecord(
            request_id=instance.request_id, arrival=scheduled, start=start, end=self.rel(),
            status=status, measured_from=origin, correct=correct, error_type=etype, error=emsg,
            stages=ctx.stages_run, prompt_tokens=ctx.prompt_tokens,
            output_tokens=ctx.output_tokens)


class _Branch:
    """An open branch; the workflow resolves it with what it chose."""

    def __init__(self) -> None:
        self.chosen: tuple[str, ...] | None = None

    def resolve(self, *chosen: str) -> None:
        if self.chosen is not None:
            raise RuntimeError("a branch resolves once")
        self.chosen = tuple(chosen)


class RequestContext:
    """The :class:`~dynbranch.workload.StageContext` of one request."""

    def __init__(self, orch: Orchestrator, instance: RequestInstance) -> None:
        self._o, self._inst = orch, instance
        self.request_id = instance.request_id
        self.stages_run = self.prompt_tokens = self.output_tokens = self._calls = 0
        self.last_human_end: float | None = None
        self._coordinate: str | None = None

    # -- stages ---------------------------------------------------------------------------

    async def llm(self, stage: str, values: Mapping[str, Any]) -> str:
        spec, fp, rendered = self._prepare(stage, "llm", values)
        start = self._o.rel()
        served = await self._o.reuse.lookup(self.request_id, spec, fp, rendered)
        if served is not None:
            self._log_served(spec, fp, rendered, served, start)
            return served.value
        self._calls += 1  # NOTE: taken at issue: parallel stages of one request must not share ids
        request = GenerateRequest(
            request_id=f"{self.request_id}/{self._calls}/{stage}", prompt=rendered.text,
            max_tokens=spec.sampling.max_tokens, replay_text=self._inst.replay_text(rendered),
            priority=CANONICAL, temperature=spec.sampling.temperature,
            top_p=spec.sampling.top_p, seed=spec.sampling.seed, cache_salt=self._o.tenant)
        client, result = await self._o.pool.generate(spec.model, request)
        self.prompt_tokens += result.prompt_tokens
        self.output_tokens += result.output_tokens
        record = self._record(spec, fp, rendered, start, engine=client.engine_id,
                              output=result.text)
        record.prompt_tokens, record.output_tokens = result.prompt_tokens, result.output_tokens
        record.cached_prompt_tokens = result.cached_prompt_tokens
        record.queued_s = result.first_scheduled_at - result.arrived_at
        record.engine_s, record.preemptions = result.engine_s, result.preemptions
        await self._o.reuse.record(self.request_id, spec, fp, rendered,
                                   StageOutcome(result.text, {}, (), client.engine_id))
        return result.text

    async def tool(self, stage: str, values: Mapping[str, Any]) -> Any:
        spec, fp, rendered = self._prepare(stage, "tool", values)
        start = self._o.rel()
        served = await self._o.reuse.lookup(self.request_id, spec, fp, rendered)
        if served is not None:
            self._log_served(spec, fp, rendered, served, start)
            return served.value
        tool = self._inst.tool(spec.tool)
        with self._o.clock.stopwatch() as sw:
            try:
                result = tool.call(rendered.fields)
            except Exception as e:
                self._record(spec, fp, rendered, start, engine=tool.name,
                             error=f"{type(e).__name__}: {e}")
                raise ToolCallError(self.request_id, stage, f"{type(e).__name__}: {e}") from e
        await self._o.clock.charge(sw.elapsed_s, tool.cost.charge_s(sw.elapsed_s))
        record = self._record(spec, fp, rendered, start, engine=tool.name, output=result.value)
        record.read_set, record.writes = dict(result.reads), list(result.writes)
        if result.writes:
            await self._o.reuse.writes(self.request_id, tuple(result.writes))
        await self._o.reuse.record(self.request_id, spec, fp, rendered, StageOutcome(
            result.value, dict(result.reads), tuple(result.writes), tool.name))
        return result.value

    async def human(self, stage: str, values: Mapping[str, Any], think_s: float) -> None:
        spec, fp, rendered = self._prepare(stage, "human", values)
        start = self._o.rel()
        await self._o.clock.sleep(think_s)
        self.last_human_end = self._record(spec, fp, rendered, start, engine="human").end

    # -- branches -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def branch(self, point: BranchPoint) -> AsyncIterator[_Branch]:
        record = BranchRecord(self.request_id, str(point.coordinate), list(point.candidates),
                              [], self._o.rel(), None)
        self._o.log.branches.append(record)
        await self._o.branch_hook.opened(self.request_id, point)
        scope = _Branch()
        # NOTE: stages decided inside the body and those that follow it carry this coordinate
        # until the next branch opens.
        self._coordinate = str(point.coordinate)
        yield scope
        if scope.chosen is None:
            raise StageError(self.request_id, point.coordinate.stage,
                             f"branch {point.coordinate} closed without resolving")
        record.chosen, record.resolved_at = list(scope.chosen), self._o.rel()
        await self._o.branch_hook.resolved(self.request_id, point, scope.chosen)

    # -- helpers --------------------------------------------------------------------------

    def _prepare(self, stage: str, kind: str, values: Mapping[str, Any]
                 ) -> tuple[StageSpec, str, RenderedInput]:
        template = self._inst.template
        try:
            spec = template.stage(stage)
        except KeyError as e:
            raise RenderError(self.request_id, stage, str(e)) from None
        if spec.kind != kind:
            raise RenderError(self.request_id, stage, f"is a {spec.kind} stage, run as {kind}")
        try:
            rendered = spec.render(values)
        except (KeyError, TypeError, ValueError) as e:
            raise RenderError(self.request_id, stage, f"cannot render input: {e}") from e
        return spec, template.fingerprint(stage), rendered

    def _record(self, spec: StageSpec, fp: str, rendered: RenderedInput, start: float, *,
                engine: str, output: Any = None, error: str = "") -> StageRecord:
        record = StageRecord(
            request_id=self.request_id, stage=spec.name, kind=spec.kind, seq=self.stages_run,
            coordinate=self._coordinate, start=start, end=self._o.rel(), engine=engine,
            reuse_name=self._o.reuse.reuse_name(spec, fp, rendered), fingerprint=fp,
            input_digest=rendered.input_digest,
            output_digest=value_digest(output) if output is not None and not error else "",
            error=error)
        self.stages_run += 1
        self._o.log.stages.append(record)
        return record

    def _log_served(self, spec: StageSpec, fp: str, rendered: RenderedInput, served: Served,
                    start: float) -> None:
        record = self._record(spec, fp, rendered, start, engine="", output=served.value)
        record.served_from, record.reuse_name = served.served_from, served.reuse_name
        record.read_set = dict(served.read_set)
