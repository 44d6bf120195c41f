"""Early fill (C2), the mechanism: run predicted downstream stages while a branch decides.

A *fill* is one candidate's downstream work: the request's
:meth:`~dynbranch.workload.RequestInstance.speculate` run through a :class:`FillContext`,
which executes each stage exactly as the canonical path would render it but

* only if the stage is reusable (declared speculable and, for a tool, this call declared
  read-only), and only up to the fill's depth — anything else ends the fill
  (:class:`~dynbranch.errors.NotSpeculable`), never the request;
* on engines at speculative priority, logged with ``speculative=True``;
* into a *shadow* under the stage's reuse name (through the arm's reuse hook), invisible to
  serving paths until the canonical stage renders the same name and promotes it (or joins
  the fill still running).

:class:`FillRunner` owns the fills' tasks: it starts them for a branch, cancels losers
(engine abort), drops shadows nobody consumed, and counts issued / consumed / discarded.
Which candidates to fill is policy (:mod:`dynbranch.speculation`), not decided here.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dynbranch.canonical import value_digest
from dynbranch.engines.protocol import SPECULATIVE, GenerateRequest
from dynbranch.errors import NotSpeculable
from dynbranch.hooks import StageCall, StageOutcome, upstream_of
from dynbranch.records import StageRecord
from dynbranch.workflow import BranchPoint, as_text

if TYPE_CHECKING:
    from dynbranch.orchestrator import Orchestrator, RequestContext


DEFAULT_DEPTH = 2
"""Stages one fill may run (e.g. handler + executor); deeper fills rarely finish in time."""


@dataclass
class Fill:
    """One candidate's speculative run and its fate."""

    fill_id: str
    request_id: str
    coordinate: str
    candidate: str
    rank: int
    started_at: float
    task: asyncio.Task | None = None
    names: list[str] = field(default_factory=list)  # reuse names it claimed (shadows)
    stages: int = 0
    engine_s: float = 0.0
    tokens: list[tuple[int, int]] = field(default_factory=list)  # (uncached prompt, output)
    consumed: bool = False
    state: str = "running"  # running | done | stopped | cancelled | failed
    ended_at: float | None = None
    error: str = ""
    reservation: Any = None  # the gate's KV reservation receipt, released when it ends

    @property
    def running(self) -> bool:
        return self.state == "running"


class FillRunner:
    """Starts, tracks and tears down fills for one orchestrator."""

    def __init__(self, orch: Orchestrator) -> None:
        self._o = orch
        self._by_request: dict[str, list[Fill]] = {}
        self._by_name: dict[tuple[str, str], Fill] = {}
        self._seq = 0
        self.depth = int(orch.run.options.get("depth", DEFAULT_DEPTH))
        self.counts = {"issued": 0, "consumed": 0, "discarded": 0, "cancelled": 0,
                       "stopped": 0, "failed": 0}
        hook = orch.reuse
        if hasattr(hook, "on_served"):
            hook.on_served = self._served

    @property
    def supported(self) -> bool:
        """Whether the arm's reuse hook can hold shadows (fills need it)."""
        return hasattr(self._o.reuse, "fill_stage")

    def start(self, ctx: RequestContext, point: BranchPoint, candidate: str, *,
              rank: int = 0, reservation: Any = None) -> Fill:
        """Start a fill of ``candidate`` for the open branch ``point`` of ``ctx``'s request."""
        if not self.supported:
            raise NotSpeculable(f"arm {self._o.arm.name} keeps no shadows; fills need them")
        self._seq += 1
        fill = Fill(f"fill{self._seq}", ctx.request_id, str(point.coordinate), candidate, rank,
                    self._o.rel(), reservation=reservation)
        fill.task = asyncio.create_task(self._run(fill, ctx, point),
                                        name=f"{ctx.request_id}/{fill.fill_id}")
        self._by_request.setdefault(ctx.request_id, []).append(fill)
        self.counts["issued"] += 1
        return fill

    async def _run(self, fill: Fill, ctx: RequestContext, point: BranchPoint) -> None:
        fctx = FillContext(self._o, ctx, fill, self.depth, self._claimed)
        try:
            await ctx.instance.speculate(fctx, point, fill.candidate)
            fill.state = "done"
        except NotSpeculable:
            fill.state = "stopped"
        except asyncio.CancelledError:
            fill.state = "cancelled"
            raise
        except Exception as e:  # a fill's failure is a miss, never the request's failure
            fill.state, fill.error = "failed", f"{type(e).__name__}: {e}"
        finally:
            fill.ended_at = self._o.rel()
            if fill.state in ("stopped", "failed", "cancelled"):
                self.counts[fill.state] += 1

    def _claimed(self, fill: Fill, name: str) -> None:
        fill.names.append(name)
        self._by_name[(fill.request_id, name)] = fill

    def _served(self, request_id: str, name: str, how: str) -> None:
        fill = self._by_name.get((request_id, name))
        if fill is not None and not fill.consumed:
            fill.consumed = True
            self.counts["consumed"] += 1

    def fills_of(self, request_id: str) -> list[Fill]:
        return list(self._by_request.get(request_id, ()))

    async def discard(self, fill: Fill) -> None:
        """Cancel a fill (engine abort) and drop every shadow it left that nobody consumed."""
        if fill.task is not None and not fill.task.done():
            fill.task.cancel()
            await asyncio.gather(fill.task, return_exceptions=True)
        if not fill.consumed:
            for name in fill.names:
                await self._o.reuse.drop_shadow(name)

    async def request_done(self, request_id: str) -> None:
        """Nothing of a finished request's speculation outlives it."""
        for fill in self._by_request.pop(request_id, []):
            await self.discard(fill)
            if not fill.consumed:
                self.counts["discarded"] += 1
            for name in fill.names:
                self._by_name.pop((request_id, name), None)

    @property
    def running(self) -> int:
        """Fills still running (0 at teardown, or something leaked)."""
        return sum(f.running for fills in self._by_request.values() for f in fills)

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "running": self.running}


class FillContext:
    """The :class:`~dynbranch.workload.StageContext` a fill runs its stages through."""

    def __init__(self, orch: Orchestrator, ctx: RequestContext, fill: Fill, depth: int,
                 claimed) -> None:
        self._o, self._ctx, self._fill, self._depth = orch, ctx, fill, depth
        self._claimed = claimed
        self.request_id = ctx.request_id
        self._lineage: list[tuple[str, str]] = []  # the fill's own (reuse name, output)

    async def llm(self, stage: str, values: Mapping[str, Any]) -> str:
        call = self._prepare(stage, "llm", values)

        async def execute() -> StageOutcome:
            spec = call.stage
            request = GenerateRequest(
                request_id=f"{self.request_id}/{self._fill.fill_id}/{self._fill.stages}/{stage}",
                prompt=call.rendered.text, max_tokens=spec.sampling.max_tokens,
                replay_text=self._ctx.instance.replay_text(call.rendered),
                priority=SPECULATIVE, temperature=spec.sampling.temperature,
                top_p=spec.sampling.top_p, seed=spec.sampling.seed, cache_salt=self._o.tenant,
                session=self.request_id)
            start = self._o.rel()
            client, result = await self._o.pool.generate(spec.model, request)
            row = self._log(call, start, client.engine_id, result.text)
            row.prompt_tokens, row.output_tokens = result.prompt_tokens, result.output_tokens
            row.cached_prompt_tokens, row.engine_s = result.cached_prompt_tokens, result.engine_s
            self._fill.engine_s += result.engine_s
            self._fill.tokens.append((result.prompt_tokens - result.cached_prompt_tokens,
                                      result.output_tokens))
            return StageOutcome(result.text, {}, {}, client.engine_id, row.duration)

        return await self._run(call, execute)

    async def tool(self, stage: str, values: Mapping[str, Any]) -> Any:
        call = self._prepare(stage, "tool", values)

        async def execute() -> StageOutcome:
            tool = self._ctx.instance.tool(call.stage.tool)
            start = self._o.rel()
            with self._o.clock.stopwatch() as sw:
                result = tool.call(call.rendered.fields)
            await self._o.clock.charge(sw.elapsed_s, tool.cost.charge_s(sw.elapsed_s))
            row = self._log(call, start, tool.name, result.value)
            row.read_set = dict(result.reads)
            return StageOutcome(result.value, dict(result.reads), {}, tool.name, row.duration)

        return await self._run(call, execute)

    async def human(self, stage: str, values: Mapping[str, Any], think_s: float) -> None:
        raise NotSpeculable(f"fill reached human stage {stage}")

    def branch(self, point: BranchPoint):
        raise NotSpeculable(f"fill reached branch {point.coordinate}")

    # -- helpers --------------------------------------------------------------------------

    def _prepare(self, stage: str, kind: str, values: Mapping[str, Any]) -> StageCall:
        call = self._ctx.prepare(stage, kind, values)
        if not call.reusable:
            raise NotSpeculable(f"stage {stage} is not speculable for this input")
        if self._fill.stages >= self._depth:
            raise NotSpeculable(f"fill depth {self._depth} reached at {stage}")
        upstream = call.upstream + upstream_of(self._lineage, call.rendered.text)
        return dataclasses.replace(call, upstream=upstream)

    async def _run(self, call: StageCall, execute) -> Any:
        self._fill.stages += 1
        hook = self._o.reuse
        value = await hook.fill_stage(call, execute,
                                      lambda name: self._claimed(self._fill, name))
        name = hook.reuse_name(call)
        text = value if isinstance(value, str) else as_text(value)
        if name and text:
            self._lineage.append((name, text))
        return value

    def _log(self, call: StageCall, start: float, engine: str, output: Any) -> StageRecord:
        row = StageRecord(
            request_id=self.request_id, stage=call.stage.name, kind=call.stage.kind,
            seq=-1, coordinate=self._fill.coordinate, start=start, end=self._o.rel(),
            engine=engine, speculative=True, fill=self._fill.candidate,
            reuse_name=self._o.reuse.reuse_name(call), fingerprint=call.fingerprint,
            input_digest=call.rendered.input_digest, output_digest=value_digest(output))
        self._o.log.stages.append(row)
        return row
