"""Rendering a stage and running it: the one place every stage is built, canonical or not.

A request's own stages (:class:`~dynbranch.orchestrator.RequestContext`) and a fill's
(:class:`~dynbranch.fill.context.FillContext`) differ only in priority, in what they may run
and in where their results go. Both render through :meth:`RequestState.render`, run LLM
stages through :meth:`StageExecutor.generate` and tools through
:meth:`StageExecutor.call_tool`, and log through :meth:`StageExecutor.row`, so the engine
request and the stage row of a fill are exactly those of the canonical stage it stands for.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from dynbranch.canonical import value_digest
from dynbranch.clock import Clock
from dynbranch.decode_lengths import decision_of
from dynbranch.engines.client import EngineClient
from dynbranch.engines.protocol import CANONICAL, GenerateRequest, GenerateResult
from dynbranch.errors import RenderError
from dynbranch.runtime.pool import EnginePool
from dynbranch.runtime.runlog import RunLog, StageRecord
from dynbranch.runtime.stage import StageCall, upstream_of
from dynbranch.workflow import StageSpec, as_text
from dynbranch.workload import RequestInstance, Tool, ToolResult, WriteSet

Lineage = list[tuple[str, str]]
"""(reuse name, output text) of the stages a request (or a fill) has run, in order."""


class RequestState:
    """One request's instance, tenant and lineage: what its stages are rendered from."""

    def __init__(self, instance: RequestInstance, tenant: str = "default") -> None:
        self.instance, self.tenant = instance, tenant
        self.request_id = instance.request_id
        self.lineage: Lineage = []

    def render(self, stage: str, kind: str, values: Mapping[str, Any],
               extra_lineage: Sequence[tuple[str, str]] = ()) -> StageCall:
        """Render ``stage`` on ``values`` into a :class:`StageCall` (typed errors on misuse).

        ``extra_lineage`` is a fill's own lineage: its upstream records come after the
        request's own.
        """
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
        upstream = upstream_of(self.lineage, rendered.text)
        if extra_lineage:
            upstream += upstream_of(extra_lineage, rendered.text)
        return StageCall(self.request_id, spec, template.fingerprint(stage), rendered,
                         reusable=self._reusable(spec, rendered.fields),
                         upstream=upstream, tenant=self.tenant)

    def _reusable(self, spec: StageSpec, fields: Mapping[str, Any]) -> bool:
        if not spec.speculable:
            return False
        if spec.kind == "tool":
            return self.instance.tool(spec.tool).is_read_only(fields)
        return spec.kind == "llm"


def remember(lineage: Lineage, reuse_name: str, value: Any) -> None:
    """Add a stage's output to ``lineage`` (stages without a reuse name leave no provenance):
    what a workflow reads of it, the text after its reasoning block
    (:func:`~dynbranch.decode_lengths.decision_of`).

    NOTE: an LLM stage that reasons before its decision passes only the decision on, so the
    whole text never occurs in a later input and :func:`upstream_of` linked no record to
    it: a write-variant Routing run's executor records named no handler upstream (20 of
    20). The decision is a suffix of the text, so matching it only widens the cascade."""
    text = value if isinstance(value, str) else as_text(value)
    text = decision_of(text)
    if reuse_name and text:
        lineage.append((reuse_name, text))


class ToolWitness(Protocol):
    """Who hears of every tool call the moment it returns (the splice checker)."""

    def called(self, call: StageCall, result: ToolResult, at: float) -> None: ...

    def raised(self, call: StageCall, write_set: WriteSet, at: float) -> None: ...


class StageExecutor:
    """Runs stages on the pool's engines and the request's tools, and logs their rows.

    It also keeps the run's time origin: every row's times are seconds since
    :meth:`start_run`. ``witness`` hears of every tool call, canonical or a fill's, the
    moment it returns or raises.
    """

    def __init__(self, pool: EnginePool, clock: Clock, log: RunLog, tenant: str,
                 witness: ToolWitness | None = None) -> None:
        self.pool, self.clock, self.log, self.tenant = pool, clock, log, tenant
        self.witness = witness
        self._t0: float | None = None

    def start_run(self) -> float:
        """Mark the run's time origin (call inside the running loop); returns it."""
        self._t0 = self.clock.now()
        return self._t0

    def rel(self, t: float | None = None) -> float:
        """Seconds since the run's origin."""
        assert self._t0 is not None, "start_run() first"
        return (self.clock.now() if t is None else t) - self._t0

    async def generate(self, call: StageCall, instance: RequestInstance, *, call_id: str,
                       priority: int = CANONICAL) -> tuple[EngineClient, GenerateResult]:
        """Run an LLM stage on an engine of its model role at ``priority``."""
        spec = call.stage
        request = GenerateRequest(
            request_id=call_id, prompt=call.rendered.text, max_tokens=spec.sampling.max_tokens,
            replay_text=instance.replay_text(call.rendered), priority=priority,
            temperature=spec.sampling.temperature, top_p=spec.sampling.top_p,
            seed=spec.sampling.seed, cache_salt=call.tenant, session=call.request_id)
        return await self.pool.generate(spec.model, request)

    def call_tool(self, call: StageCall, tool: Tool) -> tuple[ToolResult, float]:
        """Call a tool stage synchronously: its result and the seconds it really took.

        The tool's own exceptions propagate; :meth:`charge` then charges the clock.
        """
        with self.clock.stopwatch() as sw:
            try:
                result = tool.call(call.rendered.fields)
            except Exception:
                if self.witness is not None:
                    self.witness.raised(call, tool.write_set(call.rendered.fields), self.rel())
                raise
        if self.witness is not None:
            self.witness.called(call, result, self.rel())
        return result, sw.elapsed_s

    async def charge(self, tool: Tool, measured_s: float) -> None:
        """Charge a tool call's duration on the clock (its cost model decides how much)."""
        await self.clock.charge(measured_s, tool.cost.charge_s(measured_s))

    def row(self, call: StageCall, start: float, *, seq: int, coordinate: str | None,
            engine: str, reuse_name: str, output: Any = None, error: str = "",
            speculative: bool = False, fill: str = "",
            result: GenerateResult | None = None,
            tool_result: ToolResult | None = None) -> StageRecord:
        """Log one stage row ending now (an engine call's or a tool call's details with it)."""
        row = StageRecord(
            request_id=call.request_id, stage=call.stage.name, kind=call.stage.kind, seq=seq,
            coordinate=coordinate, start=start, end=self.rel(), engine=engine,
            speculative=speculative, fill=fill, reusable=call.reusable, reuse_name=reuse_name,
            fingerprint=call.fingerprint, input_digest=call.rendered.input_digest,
            output_digest=value_digest(output) if output is not None and not error else "",
            error=error)
        if result is not None:
            row.call_id = result.request_id
            row.prompt_tokens, row.output_tokens = result.prompt_tokens, result.output_tokens
            row.cached_prompt_tokens = result.cached_prompt_tokens
            row.queued_s = result.first_scheduled_at - result.arrived_at
            row.engine_s, row.preemptions = result.engine_s, result.preemptions
        if tool_result is not None:
            row.read_set, row.writes = dict(tool_result.reads), dict(tool_result.writes)
        self.log.stages.append(row)
        return row
