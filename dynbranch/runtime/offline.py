"""Running a request ahead of time, off the run's clock: InstCache's pre-population, the
oracle's branch outcomes, and the train split the predictors learn from before a run.

:func:`precompute` runs one request's program to its end through an :class:`OfflineContext`:
a sequential :class:`~dynbranch.workload.StageContext` that renders every stage through the
template exactly as the orchestrator does, answers LLM stages with what an engine returns
for them (by default :func:`replay_generate`: the text the ``sim`` and ``zero`` engines emit
for the request's replay oracle, cut at ``max_tokens`` the same way), executes tools on the
request's own tool objects, and keeps every stage with its output. Nothing waits on a
clock, nothing is logged to a run, no engine of the run is touched.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynbranch.engines.protocol import CANONICAL, GenerateRequest
from dynbranch.engines.sim import replay_plan
from dynbranch.workflow import BranchPoint, RenderedInput, StageSpec
from dynbranch.workload import BranchResolution, RequestInstance

Generate = Callable[[GenerateRequest], Awaitable[str]]
"""Answers one LLM call with its output text (an engine client's ``generate`` adapted)."""


async def replay_generate(request: GenerateRequest) -> str:
    """The text a replay engine emits for ``request`` (raises ``EngineError`` without one)."""
    text = request.replay_text
    if text is not None and len(text) < request.max_tokens:
        # NOTE: a piece covers at least one character, so a text of fewer characters than
        # ``max_tokens`` has fewer pieces: nothing is cut, and it need not be tokenized
        return text
    return "".join(replay_plan(request).pieces)


@dataclass(frozen=True)
class PrecomputedStage:
    """One stage of a precomputed run: what it rendered and what it returned.

    ``tool`` names a tool stage's tool; ``effectful`` marks a tool call its tool did not
    declare read-only (a write).
    """

    stage: str
    kind: str
    coordinate: str | None
    fingerprint: str
    rendered: RenderedInput
    output: Any
    tool: str | None = None
    effectful: bool = False


@dataclass(frozen=True)
class Precomputed:
    """A request run to its end offline: its outcome and its stages in completion order."""

    request_id: str
    outcome: Any
    stages: tuple[PrecomputedStage, ...]
    branches: tuple[tuple[BranchPoint, tuple[str, ...]], ...] = ()  # (point, chosen) in order

    @property
    def interactive(self) -> bool:
        """Whether the program waited on a person (a human stage)."""
        return any(s.kind == "human" for s in self.stages)

    @property
    def effectful(self) -> bool:
        """Whether the program made a call with external effects."""
        return any(s.effectful for s in self.stages)


@dataclass
class OfflineContext:
    """A sequential stage context over one request (see the module docstring)."""

    instance: RequestInstance
    generate: Generate = replay_generate
    tenant: str = "default"
    stages: list[PrecomputedStage] = field(default_factory=list, init=False)
    branches: list[tuple[BranchPoint, tuple[str, ...]]] = field(default_factory=list, init=False)
    opened: Callable[[BranchPoint], None] | None = None  # told of each branch as it opens
    _coordinate: str | None = field(default=None, init=False)

    @property
    def request_id(self) -> str:
        return self.instance.request_id

    async def llm(self, stage: str, values: Mapping[str, Any]) -> str:
        spec, rendered = self._render(stage, values)
        request = GenerateRequest(
            request_id=f"{self.request_id}/offline/{len(self.stages)}/{stage}",
            prompt=rendered.text, max_tokens=spec.sampling.max_tokens,
            replay_text=self.instance.replay_text(rendered), priority=CANONICAL,
            temperature=spec.sampling.temperature, top_p=spec.sampling.top_p,
            seed=spec.sampling.seed, cache_salt=self.tenant)
        text = await self.generate(request)
        self._keep(spec, rendered, text)
        return text

    async def tool(self, stage: str, values: Mapping[str, Any]) -> Any:
        spec, rendered = self._render(stage, values)
        tool = self.instance.tool(spec.tool)
        effectful = not tool.is_read_only(rendered.fields)
        value = tool.call(rendered.fields).value
        self._keep(spec, rendered, value, effectful=effectful)
        return value

    async def human(self, stage: str, values: Mapping[str, Any], think_s: float) -> None:
        spec, rendered = self._render(stage, values)
        self._keep(spec, rendered, None)

    @contextlib.asynccontextmanager
    async def branch(self, point: BranchPoint) -> AsyncIterator[BranchResolution]:
        scope = BranchResolution()
        self._coordinate = str(point.coordinate)  # as the orchestrator labels stages
        if self.opened is not None:
            self.opened(point)  # NOTE: while it is open, as a live branch hook sees it
        yield scope
        if scope.chosen is None:
            raise RuntimeError(f"{self.request_id}: branch {point.coordinate} did not resolve")
        self.branches.append((point, scope.chosen))

    def _render(self, stage: str, values: Mapping[str, Any]) -> tuple[StageSpec, RenderedInput]:
        spec = self.instance.template.stage(stage)
        return spec, spec.render(values)

    def _keep(self, spec: StageSpec, rendered: RenderedInput, output: Any, *,
              effectful: bool = False) -> None:
        self.stages.append(PrecomputedStage(
            spec.name, spec.kind, self._coordinate, self.instance.template.fingerprint(spec.name),
            rendered, output, spec.tool, effectful))


async def precompute(instance: RequestInstance, generate: Generate = replay_generate, *,
                     tenant: str = "default",
                     opened: Callable[[BranchPoint], None] | None = None) -> Precomputed:
    """Run ``instance`` to its end offline; any error of its program propagates.
    ``opened`` hears of each branch point while the branch is open (before it resolves)."""
    ctx = OfflineContext(instance, generate, tenant, opened)
    outcome = await instance.run(ctx)
    return Precomputed(instance.request_id, outcome, tuple(ctx.stages), tuple(ctx.branches))
