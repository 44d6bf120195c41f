"""One Sub-Agent request: plan, concurrent sub-agents, synthesis; its replay and its score.

Control flow: ``plan`` decides the sub-topics (a multi-valued branch); one sub-agent per
sub-topic runs concurrently (``sub_think`` → ``retrieve`` → ``research``: a ReAct episode of
its own, whose inputs hold the sub-topic and nothing of the parent question; the search
``sub_think`` decodes is a branch, one per sub-agent); ``synthesise`` answers from the
findings. The workflow reads each output's decision
(:func:`~dynbranch.decode_lengths.decision_of`), never the modelled reasoning before it.

Replay (:meth:`SubAgentRequest.replay_text`) is a pure function of the rendered input,
wrapped in the workload's decode model (reasoning first, then the decision):

* ``plan`` for the record's question answers its decomposition's steps, one per line, with
  bridge entities written as MuSiQue does, ``#k`` for the k-th step's answer
  (:attr:`workloads.musique.Step.plan_line`; ``plan="references"``, the default): a
  sub-agent whose line names ``#k`` starts when the k-th sub-agent's finding exists, with
  the finding written in its place, so the plan's chain is researched in order and its
  later sub-topics are not known while the plan branch is open (only lines without
  references can be filled there). With ``plan="resolved"`` the bridges appear as the
  answers they stand for (:attr:`workloads.musique.Step.subtopic`) — the trace's
  resolution of them — so every sub-agent can start at once: that planner is an oracle over
  the decomposition, not a model that has to wait.
* ``sub_think`` for any sub-topic searches its entity (:func:`~workloads.musique.subtopic_entity`).
* ``research`` for one of the record's sub-topics answers that step's gold answer, whatever
  the passages (MuSiQue records the answer, not the reading); for a sub-topic off the
  recorded plan (a fill for a wrong prediction), a deterministic plausible finding: the
  title of the top passage, or ``unknown`` when nothing was retrieved.
* ``synthesise`` for the record's question answers the gold answer, whatever the findings.

Sub-topics recur across requests (MuSiQue composes questions from shared single-hop
questions); no sub-topic of the 2,417 dev questions has two different answers, so a
sub-agent replays the same text in every request that names it, as a deterministic model
would.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynbranch.decode_lengths import RECORDED, DecodeModel, decision_of
from dynbranch.predictors.plans import KnownPlan
from dynbranch.workflow import BranchCoordinate, BranchPoint, RenderedInput
from dynbranch.workload import RequestInstance, StageContext, Tool
from workloads.musique import (
    SUBTOPIC_SEP,
    MusiqueRecord,
    exact_match,
    f1_score,
    line_refs,
    substitute_refs,
    subtopic_entity,
)
from workloads.react.lengths import theta
from workloads.react.request import Action, parse_action
from workloads.react.retrieval import TOOL_NAME, RetrieveTool, passage_values
from workloads.subagent.template import (
    DEFAULT_PLAN,
    NO_SEARCH,
    NO_SUBTOPIC,
    PLANS,
    TEMPLATE,
    TEMPLATES,
    WORKFLOW,
)

# NOTE: MuSiQue decompositions have at most 4 steps; the bound only stops a model that lists
# many more sub-topics from fanning out without limit.
MAX_SUBTOPICS = 8
UNKNOWN_FINDING = "unknown"
PLAN_COORDINATE = BranchCoordinate(WORKFLOW, "plan", 0)
SEARCH_STAGE = "sub_think"


def search_coordinate(index: int) -> BranchCoordinate:
    """The coordinate of the search branch of the plan's ``index``-th sub-agent."""
    return BranchCoordinate(WORKFLOW, SEARCH_STAGE, index)


def parse_plan(text: str) -> list[str]:
    """The sub-topics in a ``plan`` output's decision: non-empty lines, list markers
    stripped, first occurrence of each kept, at most :data:`MAX_SUBTOPICS`."""
    subtopics: list[str] = []
    for line in decision_of(text).splitlines():
        line = line.strip().lstrip("-*• ").strip()
        if line and line not in subtopics and line != NO_SUBTOPIC:
            subtopics.append(line)
    return subtopics[:MAX_SUBTOPICS]


def sub_think_text(subtopic: str) -> str:
    """The replayed ``sub_think`` decision for ``subtopic``: search the entity it names."""
    ask = subtopic.split(SUBTOPIC_SEP, 1)[1] if SUBTOPIC_SEP in subtopic else subtopic
    return f" I need to find out: {ask.strip()}\nAction: search[{subtopic_entity(subtopic)}]"


@dataclass
class SubAgentOutcome:
    """What :meth:`SubAgentRequest.run` returns and :meth:`SubAgentRequest.score` reads."""

    record_id: str
    kind: str
    subtopics: list[str] = field(default_factory=list)
    findings: list[str] = field(default_factory=list)
    answer: str | None = None


class SubAgentRequest(RequestInstance):
    """A request built from one MuSiQue decomposition, with its own ``retrieve`` tool object."""

    template = TEMPLATE

    def __init__(
        self,
        request_id: str,
        record: MusiqueRecord,
        tool: RetrieveTool,
        top_k: int = 3,
        decode: DecodeModel = RECORDED,
        history: tuple[KnownPlan, ...] = (),
        plan: str = DEFAULT_PLAN,
    ) -> None:
        if plan not in PLANS:
            raise ValueError(f"plan {plan!r}: choose one of {', '.join(PLANS)}")
        self.request_id, self.record, self._tool, self.top_k = request_id, record, tool, top_k
        self.decode, self.history, self.plan = decode, history, plan
        self.template = TEMPLATES[plan]
        self._answers: dict[str, str] = {}
        for step in record.steps:
            self._answers.setdefault(step.subtopic, step.answer)
        self._planning = False
        self._searching: set[BranchCoordinate] = set()  # the sub-agents' open search branches

    # -- control flow -------------------------------------------------------------------------

    async def run(self, ctx: StageContext) -> SubAgentOutcome:
        outcome = SubAgentOutcome(self.record.id, self.record.kind)
        point = BranchPoint(PLAN_COORDINATE, (), multi_valued=True, evidence=self.evidence())
        self._planning = True
        try:
            async with ctx.branch(point) as branch:
                plan = await ctx.llm("plan", {"question": self.record.question})
                lines = parse_plan(plan)
                branch.resolve(*(lines or (NO_SUBTOPIC,)))
        finally:
            self._planning = False
        if self.plan == "references":
            outcome.subtopics, outcome.findings = await self.research_chain(ctx, lines)
        else:
            outcome.subtopics = lines
            outcome.findings = list(
                await asyncio.gather(
                    *(self.subagent(ctx, s, i) for i, s in enumerate(outcome.subtopics))
                )
            )
        values = self.synthesise_values(outcome.subtopics, outcome.findings)
        outcome.answer = decision_of(await ctx.llm("synthesise", values)).strip()
        return outcome

    async def research_chain(
        self, ctx: StageContext, lines: Sequence[str]
    ) -> tuple[list[str], list[str]]:
        """The sub-agents of a plan written with references: line ``i``'s sub-agent starts
        once the lines its ``#k`` name (earlier lines only; any other ``#k`` stays as
        written) have their findings, which replace them in its sub-topic. Returns the
        sub-topics as researched and their findings, in plan order."""
        subtopics = [""] * len(lines)
        tasks: list[asyncio.Task[str]] = []

        async def research(i: int, line: str) -> str:
            refs = [k for k in line_refs(line) if k < i]
            found = await asyncio.gather(*(tasks[k] for k in refs))
            subtopics[i] = substitute_refs(line, dict(zip(refs, found, strict=True)))
            return await self.subagent(ctx, subtopics[i], i)

        for i, line in enumerate(lines):
            tasks.append(asyncio.ensure_future(research(i, line)))
        try:
            findings = list(await asyncio.gather(*tasks))
        finally:
            # NOTE: on a failure the first error is raised; the rest are cancelled, and the
            # errors of those that also failed (waiting on it) are taken as seen
            for task in tasks:
                if task.done() and not task.cancelled():
                    task.exception()
                task.cancel()
        return subtopics, findings

    def evidence(self) -> dict[str, Any]:
        """What a predictor may see at the plan branch: the ``question`` and ``history``,
        the plans of questions answered before (the workload's ``train`` split; known
        before any request runs), and with references ``plan`` (how the planner writes a
        bridge)."""
        if self.plan == "references":
            return {"question": self.record.question, "history": self.history, "plan": self.plan}
        return {"question": self.record.question, "history": self.history}

    async def subagent(self, ctx: StageContext, subtopic: str, index: int) -> str:
        """The plan's ``index``-th sub-agent, over ``subtopic``: think (the search it decodes
        is a branch), search, read; returns its finding (a finish without a search is taken
        as the finding; no action at all finds nothing)."""
        coordinate = search_coordinate(index)
        point = BranchPoint(coordinate, (), evidence={"subtopic": subtopic})
        self._searching.add(coordinate)
        try:
            async with ctx.branch(point) as branch:
                action = parse_action(await ctx.llm("sub_think", self.sub_think_values(subtopic)))
                branch.resolve(action.argument if action and action.kind == "search" else NO_SEARCH)
        finally:
            self._searching.discard(coordinate)
        return await self._act(ctx, subtopic, action)

    async def episode(self, ctx: StageContext, subtopic: str) -> str:
        """A whole sub-agent over ``subtopic`` with no branch: what a fill of the plan branch
        runs (a fill never opens a branch), stage for stage as :meth:`subagent`."""
        action = parse_action(await ctx.llm("sub_think", self.sub_think_values(subtopic)))
        return await self._act(ctx, subtopic, action)

    async def _act(self, ctx: StageContext, subtopic: str, action: Action | None) -> str:
        if action is None:
            return UNKNOWN_FINDING
        if action.kind == "finish":
            return action.argument
        return await self.search(ctx, subtopic, action.argument)

    async def search(self, ctx: StageContext, subtopic: str, entity: str) -> str:
        """A sub-agent's search of ``entity`` and its reading: its finding."""
        passages = await ctx.tool("retrieve", self.retrieve_values(entity))
        finding = await ctx.llm("research", self.research_values(subtopic, passages))
        return decision_of(finding).strip()

    def sub_think_values(self, subtopic: str) -> dict[str, Any]:
        """The sub-agent's ``sub_think`` input: the sub-topic alone."""
        return {"subtopic": subtopic}

    def retrieve_values(self, entity: str) -> dict[str, Any]:
        """The sub-agent's ``retrieve`` input: the entity its think searched, and k."""
        return {"query": entity, "k": self.top_k}

    def research_values(
        self, subtopic: str, passages: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any]:
        """The sub-agent's ``research`` input: the sub-topic and its passages only."""
        return {"subtopic": subtopic, "passages": passage_values(passages)}

    def synthesise_values(
        self, subtopics: Sequence[str], findings: Sequence[str]
    ) -> dict[str, Any]:
        """The ``synthesise`` input: the question and each sub-topic's finding, in plan order."""
        return {
            "question": self.record.question,
            "findings": [
                {"subtopic": s, "finding": f} for s, f in zip(subtopics, findings, strict=True)
            ],
        }

    # -- early fill ---------------------------------------------------------------------------

    def fillable(self, point: BranchPoint, candidate: str) -> bool:
        return self.fill_values(point.coordinate, candidate) is not None

    async def speculate(self, ctx: StageContext, point: BranchPoint, candidate: str) -> None:
        """C2's fill for ``candidate`` at an open branch, rendered exactly as :meth:`run`
        renders it if the branch resolves to ``candidate``: at the plan branch a whole
        sub-agent (the ``subagent`` subgraph) for the predicted sub-topic; at a sub-agent's
        search branch the ``retrieve`` of the predicted entity and the ``research`` of its
        passages (the fill ends there: the sub-agent's finding is its last stage)."""
        if not self.fillable(point, candidate):
            return
        if point.coordinate == PLAN_COORDINATE:
            await self.episode(ctx, candidate)
        else:
            await self.search(ctx, str(point.evidence["subtopic"]), candidate)

    def fill_values(self, coordinate: BranchCoordinate, candidate: str) -> dict[str, Any] | None:
        """The values a fill of ``candidate`` renders first at an open branch: ``sub_think``'s
        for a sub-topic while the plan branch is open, ``retrieve``'s for an entity while a
        sub-agent's search branch is open; ``None`` otherwise."""
        if coordinate in self._searching:
            if not candidate.strip() or candidate == NO_SEARCH:
                return None
            return self.retrieve_values(candidate)
        if coordinate != PLAN_COORDINATE or not self._planning:
            return None
        if not candidate.strip() or candidate == NO_SUBTOPIC:
            return None
        if self.plan == "references" and line_refs(candidate):
            return None  # NOTE: its sub-topic needs a finding nobody has yet
        return self.sub_think_values(candidate)

    def tool(self, name: str) -> Tool:
        if name != TOOL_NAME:
            raise KeyError(f"subagent requests have one tool, {TOOL_NAME!r}; asked for {name!r}")
        return self._tool

    # -- replay -------------------------------------------------------------------------------

    def replay_text(self, rendered: RenderedInput) -> str | None:
        try:
            decision = self._replay_decision(rendered.stage, rendered.fields)
        except (KeyError, TypeError, IndexError, AttributeError):
            return None  # an input of a shape the trace never produced
        if decision is None:
            return None
        return self.decode.wrap(rendered, decision, theta(self.template.stage(rendered.stage)))

    def _replay_decision(self, stage: str, fields: Mapping[str, Any]) -> str | None:
        if stage in ("plan", "synthesise"):
            if fields["question"] != self.record.question:
                return None
            if stage == "plan":
                if self.plan == "references":
                    return "\n".join(dict.fromkeys(s.plan_line for s in self.record.steps))
                return "\n".join(dict.fromkeys(s.subtopic for s in self.record.steps))
            return self.record.answer
        if stage == "sub_think":
            subtopic = fields["subtopic"]
            return sub_think_text(subtopic) if subtopic.strip() else None
        if stage == "research":
            return self._replay_research(fields["subtopic"], fields["passages"])
        return None

    def _replay_research(self, subtopic: str, passages: Sequence[Mapping[str, Any]]) -> str:
        if subtopic in self._answers:
            return self._answers[subtopic]
        return str(passages[0]["title"]) if passages else UNKNOWN_FINDING

    # -- scoring ------------------------------------------------------------------------------

    def score(self, outcome: SubAgentOutcome) -> float:
        """Exact match of the synthesised answer against the gold answer and its aliases."""
        return exact_match(outcome.answer, self.record.answers)

    def f1(self, outcome: SubAgentOutcome) -> float:
        """Token F1 of the synthesised answer (the best over the gold answer and aliases)."""
        return f1_score(outcome.answer, self.record.answers)
