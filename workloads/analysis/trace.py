"""Run request programs without engines: what a replay of them renders, stage by stage.

:class:`TraceContext` is a minimal sequential :class:`~dynbranch.workload.StageContext`: it
renders every stage through the template (exactly as the orchestrator does), answers LLM
stages from the request's replay oracle, executes tools, and keeps every rendered input,
tool result and branch. Recurrence and predictor-coverage analyses read these records; the
workloads' tests use it to run requests end to end.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from dynbranch.workflow import BranchPoint, RenderedInput
from dynbranch.workload import BranchResolution, RequestInstance, ToolResult


class ReplayGapError(RuntimeError):
    """An LLM stage the request's replay oracle has no recorded output for."""


@dataclass
class Trace:
    """What one request rendered and decided, in order."""

    request_id: str
    rendered: list[RenderedInput] = field(default_factory=list)
    tool_results: list[tuple[RenderedInput, ToolResult]] = field(default_factory=list)
    branches: list[tuple[BranchPoint, tuple[str, ...]]] = field(default_factory=list)
    outcome: Any = None

    def inputs(self, stage: str) -> list[RenderedInput]:
        """The rendered inputs of ``stage``, in the order they ran."""
        return [r for r in self.rendered if r.stage == stage]


class TraceContext:
    """A sequential stage context over one request (see the module docstring)."""

    def __init__(self, request: RequestInstance) -> None:
        self.request, self.request_id = request, request.request_id
        self.trace = Trace(request.request_id)

    async def llm(self, stage: str, values: Any) -> str:
        rendered = self.request.template.stage(stage).render(values)
        rendered.input_digest  # noqa: B018 - every input must have a canonical encoding
        self.trace.rendered.append(rendered)
        text = self.request.replay_text(rendered)
        if text is None:
            raise ReplayGapError(
                f"{self.request_id}: no replay for {stage}: {rendered.text[-200:]}"
            )
        return text

    async def tool(self, stage: str, values: Any) -> Any:
        spec = self.request.template.stage(stage)
        rendered = spec.render(values)
        rendered.input_digest  # noqa: B018
        self.trace.rendered.append(rendered)
        result = self.request.tool(spec.tool).call(rendered.fields)
        self.trace.tool_results.append((rendered, result))
        return result.value

    async def human(self, stage: str, values: Any, think_s: float) -> None:
        self.trace.rendered.append(self.request.template.stage(stage).render(values))

    @asynccontextmanager
    async def branch(self, point: BranchPoint):
        scope = BranchResolution()
        yield scope
        if scope.chosen is None:
            raise RuntimeError(f"{self.request_id}: branch {point.coordinate} did not resolve")
        self.trace.branches.append((point, scope.chosen))


def trace_request(request: RequestInstance) -> Trace:
    """Run one request to the end through a :class:`TraceContext`."""
    ctx = TraceContext(request)
    ctx.trace.outcome = asyncio.run(request.run(ctx))
    return ctx.trace


def trace_all(requests: Sequence[RequestInstance]) -> list[Trace]:
    """:func:`trace_request` for each request, in order."""
    return [trace_request(r) for r in requests]
