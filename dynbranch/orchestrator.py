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

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from typing import Any

from dynbranch.arms import Arm
from dynbranch.backend import DRAFTER_ROLE, EngineClient
from dynbranch.canonical import value_digest
from dynbranch.clock import Clock
from dynbranch.engines.protocol import (
    CANONICAL,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)
from dynbranch.errors import DynBranchError, RenderError, StageError, ToolCallError
from dynbranch.fills import FillRunner
from dynbranch.hooks import (
    BranchSession,
    RunContext,
    Served,
    StageCall,
    StageOutcome,
    upstream_of,
)
from dynbranch.placement import PlacementPolicy
from dynbranch.records import BranchRecord, RequestRecord, StageRecord
from dynbranch.workflow import BranchPoint, StageSpec, as_text
from dynbranch.workload import BranchResolution, RequestInstance, Tool, ToolResult


class EnginePool:
    """The engines of each model role, with the open-call counts placement decides on."""

    def __init__(self, clients: Mapping[str, Sequence[EngineClient]],
                 placement: Callable[[], PlacementPolicy]) -> None:
        self._clients = {role: list(cs) for role, cs in clients.items()}
        self._open = {role: [0] * len(cs) for role, cs in self._clients.items()}
        self._placement = {role: placement() for role in self._clients}

    def roles(self) -> list[str]:
        return list(self._clients)

    async def generate(self, role: str, request: GenerateRequest
                       ) -> tuple[EngineClient, GenerateResult]:
        """Place ``request`` on an engine of ``role`` and run it."""
        clients = self._clients.get(role)
        if not clients:
            raise KeyError(f"no engines for model role {role!r}; roles: {self.roles()}")
        i = self._placement[role].choose(self._open[role], request)
        self._open[role][i] += 1
        try:
            return clients[i], await clients[i].generate(request)
        except asyncio.CancelledError:
            # NOTE: a cancelled caller (a losing fill) must not leave the call running on a
            # remote engine; in-process engines abort on cancellation already (no-op then).
            await asyncio.shield(clients[i].abort(request.request_id))
            raise
        finally:
            self._open[role][i] -= 1

    async def loads(self, exclude: Sequence[str] = ()) -> list[LoadSnapshot]:
        """The load snapshot of every engine, but those of the ``exclude`` roles."""
        return list(await asyncio.gather(
            *(c.load() for role, clients in self._clients.items() if role not in exclude
              for c in clients)))


class RunLog:
    """Every stage and branch record of a run, in the order they completed."""

    def __init__(self) -> None:
        self.stages: list[StageRecord] = []
        self.branches: list[BranchRecord] = []


class Orchestrator:
    """Runs request instances for one arm over one set of engines."""

    def __init__(self, clock: Clock, clients: Mapping[str, Sequence[EngineClient]],
                 arm: Arm, *, run: RunContext | None = None, audit: bool = True) -> None:
        self.run = run or RunContext(clock=clock, arm=arm.name)
        self.clock, self.arm, self.tenant = clock, arm, self.run.tenant
        self.audit = audit  # re-execute every served stage out of band (the splice checker)
        self.pool = EnginePool(clients, arm.make_placement)
        self.draft_generate = self._draft if DRAFTER_ROLE in self.pool.roles() else None
        self.reuse = arm.make_reuse(self.run)
        self.branch_hook = arm.make_branch(self.run, self.reuse)
        self.log = RunLog()
        self.fills = FillRunner(self)
        self.mechanism_stats: dict[str, Any] = {}
        self._t0: float | None = None

    async def finish_run(self) -> dict[str, Any]:
        """Collect the mechanisms' counters and holdings (call before engines shut down)."""
        self.branch_hook.close()
        self.mechanism_stats = {"reuse": await self.reuse.snapshot(),
                                "speculation": {**await self.branch_hook.snapshot(),
                                                "fills": self.fills.stats()}}
        return self.mechanism_stats

    async def _draft(self, request: GenerateRequest) -> GenerateResult:
        """One prediction call on the drafter engines (:attr:`BranchSession.generate`)."""
        _client, result = await self.pool.generate(DRAFTER_ROLE, request)
        return result

    async def serving_loads(self) -> list[LoadSnapshot]:
        """The loads C3 prices against: engines that serve stages and fills.

        NOTE: drafter engines serve neither; their snapshots would also break the load
        view's one-snapshot-per-priced-engine check.
        """
        return await self.pool.loads(exclude=(DRAFTER_ROLE,))

    def start_run(self) -> float:
        """Mark the run's time origin (call inside the running loop); returns it."""
        self._t0 = self.clock.now()
        return self._t0

    def rel(self, t: float | None = None) -> float:
        """Seconds since the run's origin."""
        assert self._t0 is not None, "start_run() first"
        return (self.clock.now() if t is None else t) - self._t0

    async def run_request(self, instance: RequestInstance, scheduled: float) -> RequestRecord:
        """Run one request to completion or failure; ``scheduled`` is relative to the origin.

        An arm whose reuse hook keeps whole requests (``lookup_request``: InstCache) may
        answer it whole instead (:meth:`serve_whole`).
        """
        lookup = getattr(self.reuse, "lookup_request", None)
        cached = lookup(instance) if lookup is not None else None
        if cached is not None:
            return self.serve_whole(instance, scheduled, cached)
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
            await self.fills.request_done(instance.request_id)
            await self.branch_hook.request_done(instance.request_id)
        origin = ctx.last_human_end if instance.latency_origin == "last_human" else None
        return RequestRecord(
            request_id=instance.request_id, arrival=scheduled, start=start, end=self.rel(),
            status=status, measured_from=origin, correct=correct, error_type=etype, error=emsg,
            stages=ctx.stages_run, prompt_tokens=ctx.prompt_tokens,
            output_tokens=ctx.output_tokens)

    def serve_whole(self, instance: RequestInstance, scheduled: float,
                    cached: Any) -> RequestRecord:
        """Complete ``instance`` from a whole-request cache entry: at once, on no engine.

        Each cached stage is logged as a ``cache`` row of zero duration (with the audit
        digests the entry can give), and the cached outcome is scored against this
        request's own ground truth.
        """
        at = self.rel()
        rows = cached.stage_records(instance, at, audit=self.audit)
        self.log.stages.extend(rows)
        status, correct, etype, emsg = "completed", None, "", ""
        try:
            correct = float(instance.score(cached.outcome()))
        except DynBranchError as e:
            status, etype, emsg = "failed", type(e).__name__, str(e)
        except Exception as e:  # a workload bug must fail its request, not the run
            status, etype, emsg = "failed", type(e).__name__, f"unexpected: {e!r}"
        return RequestRecord(
            request_id=instance.request_id, arrival=scheduled, start=at, end=at,
            status=status, correct=correct, error_type=etype, error=emsg, stages=len(rows))


class RequestContext:
    """The :class:`~dynbranch.workload.StageContext` of one request."""

    def __init__(self, orch: Orchestrator, instance: RequestInstance) -> None:
        self._o, self.instance = orch, instance
        self.request_id = instance.request_id
        self.stages_run = self.prompt_tokens = self.output_tokens = self._calls = 0
        self.last_human_end: float | None = None
        self._lineage: list[tuple[str, str]] = []  # (reuse name, output text)
        self._coordinate: str | None = None

    # -- stages ---------------------------------------------------------------------------

    async def llm(self, stage: str, values: Mapping[str, Any]) -> str:
        call = self.prepare(stage, "llm", values)
        start = self._o.rel()
        served = await self._o.reuse.lookup(call)
        if served is not None:
            return self._log_served(call, served, start)
        spec = call.stage
        self._calls += 1  # NOTE: taken at issue: parallel stages of one request must not share ids
        request = GenerateRequest(
            request_id=f"{self.request_id}/{self._calls}/{stage}", prompt=call.rendered.text,
            max_tokens=spec.sampling.max_tokens,
            replay_text=self.instance.replay_text(call.rendered), priority=CANONICAL,
            temperature=spec.sampling.temperature, top_p=spec.sampling.top_p,
            seed=spec.sampling.seed, cache_salt=self._o.tenant, session=self.request_id)
        try:
            client, result = await self._o.pool.generate(spec.model, request)
        except BaseException:
            await self._o.reuse.abandon(call)
            raise
        self.prompt_tokens += result.prompt_tokens
        self.output_tokens += result.output_tokens
        record = self._record(call, start, engine=client.engine_id, output=result.text)
        record.prompt_tokens, record.output_tokens = result.prompt_tokens, result.output_tokens
        record.cached_prompt_tokens = result.cached_prompt_tokens
        record.queued_s = result.first_scheduled_at - result.arrived_at
        record.engine_s, record.preemptions = result.engine_s, result.preemptions
        await self._o.reuse.record(call, StageOutcome(
            result.text, {}, {}, client.engine_id, record.duration))
        self._remember(call, result.text)
        return result.text

    async def tool(self, stage: str, values: Mapping[str, Any]) -> Any:
        call = self.prepare(stage, "tool", values)
        start = self._o.rel()
        served = await self._o.reuse.lookup(call)
        if served is not None:
            return self._log_served(call, served, start)
        tool = self.instance.tool(call.stage.tool)
        try:
            result, measured = self._call_tool(call, tool, start)
            await self._o.clock.charge(measured, tool.cost.charge_s(measured))
        except BaseException:
            await self._o.reuse.abandon(call)
            raise
        record = self._record(call, start, engine=tool.name, output=result.value)
        record.read_set, record.writes = dict(result.reads), dict(result.writes)
        if result.writes:
            await self._o.reuse.writes(self.request_id, result.writes)
        await self._o.reuse.record(call, StageOutcome(
            result.value, dict(result.reads), dict(result.writes), tool.name, record.duration))
        self._remember(call, as_text(result.value))
        return result.value

    def _call_tool(self, call: StageCall, tool: Tool, start: float) -> tuple[ToolResult, float]:
        with self._o.clock.stopwatch() as sw:
            try:
                result = tool.call(call.rendered.fields)
            except Exception as e:
                self._record(call, start, engine=tool.name, error=f"{type(e).__name__}: {e}")
                raise ToolCallError(self.request_id, call.stage.name,
                                    f"{type(e).__name__}: {e}") from e
        return result, sw.elapsed_s

    async def human(self, stage: str, values: Mapping[str, Any], think_s: float) -> None:
        call = self.prepare(stage, "human", values)
        start = self._o.rel()
        await self._o.clock.sleep(think_s)
        self.last_human_end = self._record(call, start, engine="human").end

    # -- branches -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def branch(self, point: BranchPoint) -> AsyncIterator[BranchResolution]:
        record = BranchRecord(self.request_id, str(point.coordinate), list(point.candidates),
                              [], self._o.rel(), None)
        self._o.log.branches.append(record)
        session = BranchSession(
            self.request_id, point, now=self._o.clock.now, loads=self._o.serving_loads,
            discard=self._o.fills.discard, generate=self._o.draft_generate,
            fillable=lambda candidate: self.instance.fillable(point, candidate),
            start_fill=lambda candidate, **kw: self._o.fills.start(self, point, candidate, **kw))
        await self._o.branch_hook.opened(session)
        scope = BranchResolution()
        # NOTE: stages decided inside the body and those that follow it carry this coordinate
        # until the next branch opens.
        self._coordinate = str(point.coordinate)
        yield scope
        if scope.chosen is None:
            raise StageError(self.request_id, point.coordinate.stage,
                             f"branch {point.coordinate} closed without resolving")
        record.chosen, record.resolved_at = list(scope.chosen), self._o.rel()
        await self._o.branch_hook.resolved(session, scope.chosen)

    # -- helpers --------------------------------------------------------------------------

    def prepare(self, stage: str, kind: str, values: Mapping[str, Any]) -> StageCall:
        """Render a stage of this request into a :class:`StageCall` (typed errors on misuse)."""
        template = self.instance.template
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
        return StageCall(self.request_id, spec, template.fingerprint(stage), rendered,
                         reusable=self._reusable(spec, rendered.fields),
                         upstream=upstream_of(self._lineage, rendered.text))

    def _audit(self, call: StageCall) -> str:
        """What canonical execution of a served stage returns now, for the splice checker.

        Out of band: nothing is charged on the clock and nothing is logged as a stage. An LLM
        stage's canonical output is the replay oracle's when engines replay the trace
        (``""``, not audited, when the trace has none or a real engine generates: it would
        have to run again); a tool stage (read-only, or it would not have
        been served) is called again on the request's own state as it is now.
        """
        if call.stage.kind == "llm":
            if not self._o.run.options.get("replay", True):
                return ""  # a real engine generates: the trace's text is not its output
            text = self.instance.replay_text(call.rendered)
            return value_digest(text) if text is not None else ""
        try:
            value = self.instance.tool(call.stage.tool).call(call.rendered.fields).value
        except Exception as e:
            return value_digest(f"audit raised {type(e).__name__}: {e}")
        return value_digest(value)

    def _reusable(self, spec: StageSpec, fields: Mapping[str, Any]) -> bool:
        if not spec.speculable:
            return False
        if spec.kind == "tool":
            return self.instance.tool(spec.tool).is_read_only(fields)
        return spec.kind == "llm"

    def _remember(self, call: StageCall, output: str) -> None:
        name = self._o.reuse.reuse_name(call)
        if name and output:
            self._lineage.append((name, output))

    def _record(self, call: StageCall, start: float, *, engine: str, output: Any = None,
                error: str = "") -> StageRecord:
        record = StageRecord(
            request_id=self.request_id, stage=call.stage.name, kind=call.stage.kind,
            seq=self.stages_run, coordinate=self._coordinate, start=start, end=self._o.rel(),
            engine=engine, reuse_name=self._o.reuse.reuse_name(call),
            fingerprint=call.fingerprint, input_digest=call.rendered.input_digest,
            output_digest=value_digest(output) if output is not None and not error else "",
            error=error)
        self.stages_run += 1
        self._o.log.stages.append(record)
        return record

    def _log_served(self, call: StageCall, served: Served, start: float) -> Any:
        record = self._record(call, start, engine="", output=served.value)
        record.served_from, record.reuse_name = served.served_from, served.reuse_name
        record.read_set = dict(served.read_set)
        if self._o.audit:
            record.audit_digest = self._audit(call)
        text = served.value if isinstance(served.value, str) else as_text(served.value)
        self._remember(call, text)
        return served.value
