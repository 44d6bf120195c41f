"""The orchestrator: one asyncio task per request, running its workflow over engines and tools.

Each request's program (:meth:`RequestInstance.run`) calls back into a
:class:`RequestContext`, which renders every stage's complete input, gives C1 the chance
to serve it (:class:`~dynbranch.reuse.hook.ReuseHook`), otherwise executes it on an engine
of the stage's model role or on the request's tool
(:class:`~dynbranch.runtime.execution.StageExecutor`), and logs one row per stage.
Branches open a :class:`~dynbranch.fill.runner.BranchSession` for C2
(:class:`~dynbranch.fill.hook.BranchHook`) and report when they resolve. Time comes only
from the injected clock; engines come only through
:class:`~dynbranch.engines.client.EngineClient` objects, so the same code runs on the local
and the Ray backend.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from dynbranch.arms.base import Arm
from dynbranch.audit import Rerun, SpliceAudit
from dynbranch.canonical import value_digest
from dynbranch.clock import Clock
from dynbranch.engines.client import EngineClient
from dynbranch.engines.scheduler import replayed_text
from dynbranch.errors import DeadlineExceeded, DynBranchError, StageError, ToolCallError
from dynbranch.fill.runner import FillRunner
from dynbranch.reuse.hook import Served, StageLookup, StageOutcome
from dynbranch.runtime.execution import RequestState, StageExecutor, remember
from dynbranch.runtime.pool import EnginePool
from dynbranch.runtime.run import RunContext
from dynbranch.runtime.runlog import BranchRecord, RequestRecord, RunLog, StageRecord
from dynbranch.runtime.stage import StageCall
from dynbranch.workflow import BranchPoint, as_text
from dynbranch.workload import BranchResolution, RequestInstance, Tool, ToolResult

_OPEN_BRANCH: contextvars.ContextVar[tuple[RequestContext, str] | None] = (
    contextvars.ContextVar("dynbranch_open_branch", default=None))
"""The branch a request's code path opened last, as (its request context, coordinate).

NOTE: a context variable, not an attribute of the request, because one request may run
several paths at once (a Sub-Agent's sub-agents, each with its own search branch): each
asyncio task carries its own copy, so a stage row carries the coordinate of the branch its
own path opened."""


class Orchestrator:
    """Runs request instances for one arm over one set of engines."""

    def __init__(self, clock: Clock, clients: Mapping[str, Sequence[EngineClient]],
                 arm: Arm, *, run: RunContext | None = None, audit: bool = True) -> None:
        self.run = run or RunContext(clock=clock, arm=arm.name)
        self.clock, self.arm, self.tenant = clock, arm, self.run.tenant
        self.audit = audit  # re-execute every served stage out of band (the splice checker)
        self.splices = SpliceAudit()  # the checker's own witness of every tool call
        self.pool = EnginePool(clients, arm.make_placement, clock=clock)
        self.log = RunLog()
        self.executor = StageExecutor(self.pool, clock, self.log, self.tenant,
                                      witness=self.splices if audit else None)
        self.reuse = arm.make_reuse(self.run)
        self.branch_hook = arm.make_branch(self.run, self.reuse)
        self.fills = FillRunner(self.executor, self.reuse, self.run.fill.depth)
        self.mechanism_stats: dict[str, Any] = {}
        self.cleanup_errors, self.last_cleanup_error = 0, ""

    async def finish_run(self) -> dict[str, Any]:
        """Collect the mechanisms' counters and holdings (call before engines shut down)."""
        self.branch_hook.close()
        self.mechanism_stats = {"reuse": await self.reuse.snapshot(),
                                "speculation": {**await self.branch_hook.snapshot(),
                                                "fills": self.fills.stats()}}
        return self.mechanism_stats

    def start_run(self) -> float:
        """Mark the run's time origin (call inside the running loop); returns it."""
        return self.executor.start_run()

    def rel(self, t: float | None = None) -> float:
        """Seconds since the run's origin."""
        return self.executor.rel(t)

    async def run_request(self, instance: RequestInstance, scheduled: float, *,
                          tenant: str | None = None,
                          deadline: float | None = None) -> RequestRecord:
        """Run one request to completion or failure; ``scheduled`` is relative to the origin.

        ``tenant`` is the tenant the serving side assigned it (default: the run's); every
        reuse name of its stages is scoped to it. ``deadline`` (relative to the origin) is
        when an unfinished request is cancelled with a typed ``deadline`` outcome. Whatever
        happens inside, a record comes back: failures are typed in it, and the request's
        cleanup never raises (a store or engine that died during cleanup is counted in
        ``cleanup_errors``, never charged to the request or the run).
        An arm whose reuse hook answers whole requests (InstCache) may serve it whole.
        """
        at = self.rel()
        whole = self.reuse.serve_request(instance, at, audit=self.audit)
        if whole is not None:
            self.log.stages.extend(whole.rows)
            return self._request_record(instance, scheduled, at, lambda: whole.outcome,
                                        stages=len(whole.rows))
        ctx = RequestContext(self, instance, tenant or self.tenant)
        until = None if deadline is None else self.clock.now() - self.rel() + deadline
        try:
            outcome = await self._scored(instance, lambda: instance.run(ctx), until,
                                         None if deadline is None else deadline - scheduled)
        finally:
            await self._clean_up(instance.request_id)
        origin = ctx.last_human_end if instance.latency_origin == "last_human" else None
        return RequestRecord(
            request_id=instance.request_id, arrival=scheduled, start=at,
            measured_from=origin, stages=ctx.stages_run, prompt_tokens=ctx.prompt_tokens,
            output_tokens=ctx.output_tokens, tenant=ctx.tenant, **outcome)

    async def _clean_up(self, rid: str) -> None:
        """End a request's speculation; an error here is counted, never raised."""
        await self._quietly(rid, self.branch_hook.request_ending(rid))
        fills = await self._quietly(rid, self.fills.request_done(rid), [])
        await self._quietly(rid, self.branch_hook.request_done(rid, fills))

    async def _quietly(self, rid: str, step: Awaitable[Any], default: Any = None) -> Any:
        try:
            return await step
        except Exception as e:  # NOTE: a dead store or gate must not fail the request
            self.cleanup_errors += 1
            self.last_cleanup_error = f"{rid}: {type(e).__name__}: {e}"
            return default

    async def _scored(self, instance: RequestInstance, run: Callable[[], Any],
                      until: float | None = None, budget_s: float | None = None) -> dict:
        """Run the request's program (cancelled at clock time ``until``, if given) and
        score its outcome: the record's fate fields and its ``end``.

        NOTE: a request ends when its program returns or fails: that is when its user has
        the answer. Scoring it against the data set's ground truth (up to a few ms of CPU for
        a long multi-turn record) and ending its speculation come after, and on the real
        clock they used to be counted in its latency.
        """
        deadline = (asyncio.timeout_at(until) if until is not None
                    else contextlib.nullcontext())
        try:
            try:
                async with deadline:
                    value = await run()
            finally:
                end = self.rel()
            fate: dict = {"status": "completed", "correct": float(instance.score(value))}
        except DynBranchError as e:
            fate = {"status": "failed", "error_type": type(e).__name__, "error": str(e)}
        except TimeoutError as e:
            if until is not None and deadline.expired():
                late = DeadlineExceeded(instance.request_id, budget_s or 0.0)
                fate = {"status": "deadline", "error_type": type(late).__name__,
                        "error": str(late)}
            else:
                fate = {"status": "failed", "error_type": type(e).__name__,
                        "error": f"unexpected: {e!r}"}
        except Exception as e:  # a workload bug must fail its request, not the run
            fate = {"status": "failed", "error_type": type(e).__name__,
                    "error": f"unexpected: {e!r}"}
        return {"end": end, **fate}

    def _request_record(self, instance: RequestInstance, scheduled: float, at: float,
                        outcome: Callable[[], Any], *, stages: int) -> RequestRecord:
        """A request completed at ``at`` in no time (served whole)."""
        try:
            fate: dict = {"status": "completed", "correct": float(instance.score(outcome()))}
        except DynBranchError as e:
            fate = {"status": "failed", "error_type": type(e).__name__, "error": str(e)}
        except Exception as e:  # a workload bug must fail its request, not the run
            fate = {"status": "failed", "error_type": type(e).__name__,
                    "error": f"unexpected: {e!r}"}
        return RequestRecord(request_id=instance.request_id, arrival=scheduled, start=at,
                             end=at, stages=stages, **fate)


class RequestContext:
    """The :class:`~dynbranch.workload.StageContext` of one request."""

    def __init__(self, orch: Orchestrator, instance: RequestInstance,
                 tenant: str = "default") -> None:
        self._o, self.instance, self.tenant = orch, instance, tenant
        self._ex = orch.executor
        self.state = RequestState(instance, tenant)
        self.request_id = instance.request_id
        self.stages_run = self.prompt_tokens = self.output_tokens = self._calls = 0
        self.last_human_end: float | None = None

    # -- stages ---------------------------------------------------------------------------

    async def llm(self, stage: str, values: Mapping[str, Any]) -> str:
        start = self._o.rel()  # NOTE: before rendering, which is the stage's own work
        call = self.state.render(stage, "llm", values)
        lookup = await self._lookup(call)
        if lookup.served is not None:
            return self._log_served(call, lookup.served, start)
        self._calls += 1  # NOTE: taken at issue: parallel stages of one request must not share ids
        try:
            client, result = await self._ex.generate(
                call, self.instance, call_id=f"{self.request_id}/{self._calls}/{stage}")
        except BaseException:
            await self._abandon(lookup)
            raise
        self.prompt_tokens += result.prompt_tokens
        self.output_tokens += result.output_tokens
        row = self._row(call, start, lookup, engine=client.engine_id, output=result.text,
                        result=result)
        await self._record(lookup, StageOutcome(result.text, {}, {}, client.engine_id,
                                                row.duration))
        remember(self.state.lineage, lookup.reuse_name, result.text)
        return result.text

    async def tool(self, stage: str, values: Mapping[str, Any]) -> Any:
        start = self._o.rel()  # NOTE: before rendering, which is the stage's own work
        call = self.state.render(stage, "tool", values)
        issued = self._o.splices.mark()
        lookup = await self._lookup(call)
        if lookup.served is not None:
            return self._log_served(call, lookup.served, start, issued)
        tool = self.instance.tool(call.stage.tool)
        try:
            result, row = await self._call_tool(call, tool, start, lookup)
        except BaseException:
            await self._abandon(lookup)
            raise
        await self._record(lookup, StageOutcome(result.value, dict(result.reads),
                                                dict(result.writes), tool.name, row.duration,
                                                result.recordable))
        if result.recordable:
            remember(self.state.lineage, lookup.reuse_name, result.value)
        return result.value

    async def _call_tool(self, call: StageCall, tool: Tool, start: float,
                         lookup: StageLookup) -> tuple[ToolResult, StageRecord]:
        """Run a tool stage under C1's write protocol, and log its row.

        What the call may write is announced before it runs (so no lookup is served what
        it is about to change) and committed once its charged time is over — also when it
        raised (then everything it declared counts as changed, to versions nobody reported)
        or was cancelled while charged (then what it reported).
        """
        reuse = self._o.reuse
        announced = await reuse.announce(self.request_id, tool.write_set(call.rendered.fields))
        try:
            result, measured = self._ex.call_tool(call, tool)
        except Exception as e:
            await reuse.commit(announced, None)  # it may have changed all it declared
            self._row(call, start, lookup, engine=tool.name, error=f"{type(e).__name__}: {e}")
            raise ToolCallError(self.request_id, call.stage.name,
                                f"{type(e).__name__}: {e}") from e
        try:
            await self._ex.charge(tool, measured)
        except BaseException:
            await reuse.commit(announced, dict(result.writes))
            raise
        row = self._row(call, start, lookup, engine=tool.name, output=result.value,
                        tool_result=result)
        await reuse.commit(announced, dict(result.writes))
        return result, row

    async def human(self, stage: str, values: Mapping[str, Any], think_s: float) -> None:
        start = self._o.rel()  # NOTE: before rendering, which is the stage's own work
        call = self.state.render(stage, "human", values)
        await self._o.clock.sleep(think_s)
        self.last_human_end = self._row(call, start, None, engine="human").end

    # -- branches -------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def branch(self, point: BranchPoint) -> AsyncIterator[BranchResolution]:
        record = BranchRecord(self.request_id, str(point.coordinate), list(point.candidates),
                              [], self._o.rel(), None)
        self._o.log.branches.append(record)
        session = self._o.fills.open_branch(self.state, point)
        # NOTE: C2 decides beside the canonical path, never in front of it: the decision
        # (a gate round trip, a load read across the network) runs while the body's stage
        # decodes or its user thinks, and is awaited only when the branch resolves, before
        # the resolution reaches C2 (a predictor's or gate's error fails the request there).
        opening = asyncio.ensure_future(self._o.branch_hook.opened(session))
        scope = BranchResolution()
        # NOTE: stages decided inside the body and those that follow it on the same path
        # carry this coordinate until the path opens its next branch.
        _OPEN_BRANCH.set((self, str(point.coordinate)))
        try:
            yield scope
        except BaseException:
            opening.cancel()
            await asyncio.gather(opening, return_exceptions=True)
            raise
        session.decide()  # NOTE: a decision that has not begun by now has no window left
        await opening
        if scope.chosen is None:
            raise StageError(self.request_id, point.coordinate.stage,
                             f"branch {point.coordinate} closed without resolving")
        record.chosen, record.resolved_at = list(scope.chosen), self._o.rel()
        await self._o.branch_hook.resolved(session, scope.chosen)

    # -- C1 -------------------------------------------------------------------------------

    async def _lookup(self, call: StageCall) -> StageLookup:
        """C1's answer for ``call``. A stage served a fill's result credits that fill; one
        that waited on a fill's execution and was not served charges the fill its wait."""
        clock = self._o.clock
        asked = clock.now()
        lookup = await self._o.reuse.lookup(call)
        served, waited = lookup.served, clock.now() - asked
        if served is not None and served.served_from in ("shadow", "join"):
            self._o.fills.consumed(self.request_id, served.reuse_name, served.served_from,
                                   waited)
        elif lookup.joined and served is None:
            self._o.fills.consumed(self.request_id, lookup.reuse_name, "expired", waited)
        return lookup

    async def _record(self, lookup: StageLookup, outcome: StageOutcome) -> None:
        if lookup.claim is not None:
            await self._o.reuse.record(lookup.claim, outcome)

    async def _abandon(self, lookup: StageLookup) -> None:
        if lookup.claim is not None:
            await self._o.reuse.abandon(lookup.claim)

    # -- rows -----------------------------------------------------------------------------

    def _coordinate(self) -> str | None:
        """The coordinate of the branch this path of the request opened last, if any."""
        opened = _OPEN_BRANCH.get()
        return opened[1] if opened is not None and opened[0] is self else None

    def _row(self, call: StageCall, start: float, lookup: StageLookup | None, *, engine: str,
             **fields: Any) -> StageRecord:
        row = self._ex.row(call, start, seq=self.stages_run, coordinate=self._coordinate(),
                           engine=engine, reuse_name=lookup.reuse_name if lookup else "",
                           **fields)
        self.stages_run += 1
        return row

    def _log_served(self, call: StageCall, served: Served, start: float,
                    issued: int | None = None) -> Any:
        """Log a served stage; the splice checker judges it (``issued``: the checker's mark
        when its lookup was issued, for tool stages)."""
        row = self._row(call, start, None, engine="", output=served.value)
        row.served_from, row.reuse_name = served.served_from, served.reuse_name
        row.read_set = dict(served.read_set)
        if self._o.audit:
            rerun = self._rerun(call)
            verdict = self._o.splices.check(call, row.output_digest,
                                            self._o.splices.mark() if issued is None
                                            else issued, rerun)
            row.audit_digest = rerun.digest
            row.audit_verdict, row.audit_note = verdict.verdict, verdict.note
        remember(self.state.lineage, served.reuse_name, served.value)
        return served.value

    def _rerun(self, call: StageCall) -> Rerun:
        """What canonical execution of a served stage returns now, for the splice checker.

        Out of band: nothing is charged on the clock and nothing is logged as a stage. An LLM
        stage's canonical output is the replay oracle's when engines replay the trace (not
        audited when the trace has none or a real engine generates: it would have to run
        again); a tool stage (read-only, or it would not have been served) is called again
        on the request's own state as it is now, and reports the reads it makes now.
        """
        if call.stage.kind == "llm":
            if not self._o.run.replay:
                return Rerun()  # a real engine generates: the trace's text is not its output
            text = self.instance.replay_text(call.rendered)
            if text is None:
                return Rerun()
            # NOTE: what the engine returns: cut at max_tokens and at the context left
            # after the prompt, as canonical execution would cut it
            return Rerun(value_digest(replayed_text(
                call.rendered.text, text, call.stage.sampling.max_tokens,
                self._o.run.replay_context)))
        try:
            result = self.instance.tool(call.stage.tool).call(call.rendered.fields)
        except Exception as e:
            return Rerun(error=f"{type(e).__name__}: {e}")
        return Rerun(value_digest(result.value), dict(result.reads))


__all__ = ["Orchestrator", "RequestContext", "as_text"]
