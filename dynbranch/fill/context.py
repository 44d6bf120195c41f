"""The :class:`~dynbranch.workload.StageContext` a fill runs its stages through.

Each stage is rendered exactly as the canonical path renders it (the request's own
:class:`~dynbranch.runtime.execution.RequestState`, plus the fill's own lineage), but

* only if the stage is reusable (declared speculable and, for a tool, this call declared
  read-only) and within every budget of the fill (the run's depth, a policy's own bounds) —
  anything else ends the fill (:class:`~dynbranch.errors.NotSpeculable`), never the request;
* on engines at speculative priority, logged with ``speculative=True``; an engine call a
  canonical stage joins (it waits on the fill's result) runs at canonical priority from
  then on, so the canonical path never waits behind its own speculative queue;
* into a *shadow* under the stage's reuse name (through the arm's reuse hook), invisible to
  serving paths until the canonical stage renders the same name and promotes it (or joins
  the fill still running).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from dynbranch.engines.protocol import CANONICAL, SPECULATIVE
from dynbranch.errors import NotSpeculable
from dynbranch.fill.model import Fill, FillStage
from dynbranch.reuse.hook import ReuseHook, StageOutcome
from dynbranch.runtime.execution import Lineage, RequestState, StageExecutor, remember
from dynbranch.runtime.stage import StageCall
from dynbranch.workflow import BranchPoint

Execute = Callable[[StageCall, str, FillStage, float], Awaitable[StageOutcome]]
"""Runs a claimed stage: the call, its reuse name, its trace, and when the stage began (its
row's start)."""


class FillContext:
    """Runs one fill's stages (see the module docstring)."""

    def __init__(self, state: RequestState, fill: Fill, executor: StageExecutor,
                 reuse: ReuseHook, claimed: Callable[[Fill, str], None]) -> None:
        self._state, self._fill, self._ex, self._reuse = state, fill, executor, reuse
        self._claimed = claimed
        self.request_id = state.request_id
        self._lineage: Lineage = []  # the fill's own (reuse name, output)
        self._joined: set[str] = set()  # reuse names a canonical stage waits on
        self._calls: dict[str, str] = {}  # reuse name → the engine call running it now
        self._promotions: set[asyncio.Task] = set()

    async def llm(self, stage: str, values: Mapping[str, Any]) -> str:
        start = self._ex.rel()  # NOTE: before rendering and the claim, as a canonical stage's
        return await self._run(self._enter(stage, "llm", values), self._generate, start)

    async def tool(self, stage: str, values: Mapping[str, Any]) -> Any:
        start = self._ex.rel()
        return await self._run(self._enter(stage, "tool", values), self._call_tool, start)

    async def human(self, stage: str, values: Mapping[str, Any], think_s: float) -> None:
        raise NotSpeculable(f"fill reached human stage {stage}")

    def branch(self, point: BranchPoint):
        raise NotSpeculable(f"fill reached branch {point.coordinate}")

    # -- one stage ------------------------------------------------------------------------

    def _enter(self, stage: str, kind: str, values: Mapping[str, Any]) -> StageCall:
        call = self._state.render(stage, kind, values, extra_lineage=self._lineage)
        if not call.reusable:
            raise NotSpeculable(f"stage {stage} is not speculable for this input")
        for budget in self._fill.budgets:
            reason = budget.stop_reason(self._fill.trace, call)
            if reason is not None:
                raise NotSpeculable(reason)
        return call

    async def _run(self, call: StageCall, execute: Execute, start_row: float) -> Any:
        spec = call.stage
        trace = FillStage(spec.name, spec.kind, spec.tool or "")
        self._fill.trace.append(trace)
        slot = await self._reuse.claim_fill(call)
        if slot.claim is None:  # the store already held it (a record, a shadow, a join)
            value = slot.value
        else:
            trace.claimed = slot.reuse_name
            self._claimed(self._fill, slot.reuse_name)
            self._reuse.when_joined(slot.claim, lambda n=slot.reuse_name: self._on_joined(n))
            clock = self._ex.clock
            start = clock.now()
            try:
                outcome = await execute(call, slot.reuse_name, trace, start_row)
            except BaseException:
                trace.duration_s = clock.now() - start
                await self._reuse.abandon(slot.claim)
                raise
            trace.duration_s, trace.done = clock.now() - start, True
            await self._reuse.shadow(slot.claim, outcome)
            value = outcome.value
        remember(self._lineage, slot.reuse_name, value)
        return value

    def _on_joined(self, name: str) -> None:
        """A canonical stage now waits on this fill's stage ``name``: its engine call (sent,
        or about to be) runs at canonical priority."""
        self._joined.add(name)
        call_id = self._calls.get(name)
        if call_id is not None:
            task = asyncio.ensure_future(self._ex.pool.promote(call_id))
            self._promotions.add(task)
            task.add_done_callback(self._promotions.discard)

    async def _generate(self, call: StageCall, name: str, trace: FillStage,
                        start: float) -> StageOutcome:
        fill = self._fill
        call_id = f"{self.request_id}/{fill.fill_id}/{len(fill.trace)}/{call.stage.name}"
        priority = CANONICAL if name in self._joined else SPECULATIVE
        self._calls[name] = call_id
        try:
            client, result = await self._ex.generate(call, self._state.instance,
                                                     call_id=call_id, priority=priority)
        finally:
            del self._calls[name]
        row = self._ex.row(call, start, seq=-1, coordinate=fill.coordinate,
                           engine=client.engine_id, reuse_name=name, output=result.text,
                           speculative=True, fill=fill.candidate, result=result)
        trace.engine_s = result.engine_s
        trace.prompt_tokens = result.prompt_tokens - result.cached_prompt_tokens
        trace.output_tokens = result.output_tokens
        return StageOutcome(result.text, {}, {}, client.engine_id, row.duration)

    async def _call_tool(self, call: StageCall, name: str, trace: FillStage,
                         start: float) -> StageOutcome:
        tool = self._state.instance.tool(call.stage.tool)
        if not tool.answers(call.rendered.fields):
            # NOTE: the state this call named moved on while the fill waited (on C1, or
            # behind the request's own path): its value would answer no question the
            # request asks, so the fill stops before the call runs (nothing to charge)
            raise NotSpeculable(f"stage {call.stage.name}: the state it named has moved on")
        result, measured = self._ex.call_tool(call, tool)
        await self._ex.charge(tool, measured)
        moved = "" if result.recordable else "answers another input than its name"
        row = self._ex.row(call, start, seq=-1, coordinate=self._fill.coordinate,
                           engine=tool.name, reuse_name=name, output=result.value,
                           error=moved, speculative=True, fill=self._fill.candidate,
                           tool_result=result)
        if moved:
            # NOTE: a tool that only tells after the call: the call ran and was charged and
            # logged (its row's error says why no shadow came of it), and the fill stops
            raise NotSpeculable(f"stage {call.stage.name}: the value {moved}")
        return StageOutcome(result.value, dict(result.reads), {}, tool.name, row.duration)
