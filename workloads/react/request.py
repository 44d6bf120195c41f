"""One ReAct request: its hop loop, its replay oracle and its score.

Control flow: ``think`` decides (a branch); a ``search[e]`` runs ``retrieve`` for ``e``, then
``read`` over the passages, and appends ``{"search": e, "observation": <the read's
observation>}`` to the trajectory; ``finish[a]`` ends the request with answer ``a``. At most
:data:`MAX_THINKS` decisions; an action that does not parse ends the request without an
answer. What the workflow reads of an LLM output is its decision
(:func:`~dynbranch.decode_lengths.decision_of`), never the modelled reasoning before it.

Replay (:meth:`ReActRequest.replay_text`) is a pure function of the rendered input, wrapped
in the workload's decode model (reasoning first, then the decision). The recorded path is
the record's hop chain (:mod:`workloads.musique`): at hop ``h`` of a trajectory whose
searches and observations equal the chain's first ``h`` steps, ``think`` answers a thought
and ``search[<entity h>]``, and after the last hop ``finish[<gold answer>]``; ``read`` of a
chain entity observes that step's answer (:func:`observation_text`). MuSiQue records no
reasoning or thought text, so those are written from the step (``"I need the spouse of
Steve Hillage."``): they stand in for the decode, not for a model's words. Off the recorded
path (a fill that searched another entity) ``read`` observes what the top passage is about,
and ``think`` gives up with ``finish[unknown]``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynbranch.decode_lengths import RECORDED, DecodeModel, decision_of
from dynbranch.workflow import BranchCoordinate, BranchPoint, RenderedInput
from dynbranch.workload import RequestInstance, StageContext, Tool
from workloads.musique import SUBTOPIC_SEP, MusiqueRecord, Step, exact_match, f1_score
from workloads.react.lengths import theta
from workloads.react.retrieval import TOOL_NAME, RetrieveTool, passage_values
from workloads.react.template import FINISH, INVALID, TEMPLATE, WORKFLOW

# NOTE: MuSiQue chains have at most 4 hops, so 4 searches and a finish; the bound only ends
# a request whose model never finishes.
MAX_THINKS = 8
UNKNOWN_ANSWER = "unknown"
QUESTION_PASSAGE_TITLE = ""
_ACTION = re.compile(r"Action:\s*(search|finish)\[(.*)\]\s*$", re.S)
_OBSERVATION = "Observation:"


@dataclass(frozen=True)
class Action:
    """A parsed ``think`` decision."""

    kind: str  # search | finish
    argument: str


def parse_action(text: str) -> Action | None:
    """The action at the end of a ``think`` output's decision, or ``None`` when there is none."""
    match = _ACTION.search(decision_of(text).strip())
    if match is None or not match.group(2).strip():
        return None
    return Action(match.group(1), match.group(2).strip())


def parse_observation(text: str) -> str:
    """What a ``read`` output observed: its decision after ``Observation:`` (all of it when
    the marker is missing)."""
    decision = decision_of(text).strip()
    i = decision.find(_OBSERVATION)
    return decision[i + len(_OBSERVATION) :].strip() if i >= 0 else decision


@dataclass
class ReActOutcome:
    """What :meth:`ReActRequest.run` returns and :meth:`ReActRequest.score` reads."""

    record_id: str
    kind: str
    searches: list[str] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    answer: str | None = None
    thinks: int = 0
    invalid: str | None = None


def search_text(step: Step, earlier: Sequence[Step]) -> str:
    """The replayed ``think`` decision that searches ``step``'s entity."""
    said = f"The passages give {earlier[-1].answer}. " if earlier else ""
    if SUBTOPIC_SEP.strip() in step.question:
        need = f"I need the {step.ask} of {step.entity}."
    else:
        need = f"I need to find out: {step.ask}"
    return f" {said}{need}\nAction: search[{step.entity}]"


def finish_text(answer: str) -> str:
    """The replayed ``think`` decision that finishes with ``answer``."""
    return f" The passages give the answer, {answer}.\nAction: finish[{answer}]"


def observation_text(step: Step) -> str:
    """What ``read`` observes on the recorded path: the step's ask and its answer."""
    if SUBTOPIC_SEP.strip() in step.question:
        return f"The {step.ask} of {step.entity} is {step.answer}."
    return f"{step.ask.rstrip(' ?')}? {step.answer}."


class ReActRequest(RequestInstance):
    """A request built from one MuSiQue record, with its own ``retrieve`` tool object."""

    template = TEMPLATE

    def __init__(
        self,
        request_id: str,
        record: MusiqueRecord,
        tool: RetrieveTool,
        top_k: int = 3,
        decode: DecodeModel = RECORDED,
    ) -> None:
        self.request_id, self.record, self._tool, self.top_k = request_id, record, tool, top_k
        self.decode = decode
        self._open: dict[BranchCoordinate, list[dict[str, Any]]] = {}

    # -- control flow -------------------------------------------------------------------------

    async def run(self, ctx: StageContext) -> ReActOutcome:
        outcome = ReActOutcome(self.record.id, self.record.kind)
        trajectory: list[dict[str, Any]] = []
        passages: list[dict[str, str]] = []  # the last hop's, for the next branch's evidence
        for hop in range(MAX_THINKS):
            action = await self._think(ctx, hop, trajectory, passages)
            outcome.thinks += 1
            if action is None:
                outcome.invalid = "the think output has no search[...] or finish[...] action"
                break
            if action.kind == "finish":
                outcome.answer = action.argument
                break
            found = await ctx.tool("retrieve", self.retrieve_values(action.argument))
            passages = passage_values(found)
            read = await ctx.llm("read", self.read_values(action.argument, passages))
            trajectory.append({"search": action.argument, "observation": parse_observation(read)})
            outcome.searches.append(action.argument)
            outcome.observations.append(trajectory[-1]["observation"])
        return outcome

    async def _think(
        self, ctx: StageContext, hop: int, trajectory: list, passages: list[dict[str, str]]
    ) -> Action | None:
        coordinate = BranchCoordinate(WORKFLOW, "think", hop)
        point = BranchPoint(coordinate, (), evidence=self.evidence(trajectory, passages))
        self._open[coordinate] = list(trajectory)
        try:
            async with ctx.branch(point) as branch:
                action = parse_action(await ctx.llm("think", self.think_values(trajectory)))
                if action is None:
                    branch.resolve(INVALID)
                else:
                    branch.resolve(action.argument if action.kind == "search" else FINISH)
        finally:
            self._open.pop(coordinate, None)
        return action

    def evidence(
        self, trajectory: Sequence[Mapping[str, Any]], passages: Sequence[Mapping[str, str]] = ()
    ) -> dict[str, Any]:
        """What a predictor may see at a think branch, all known when it opens.

        ``question``; ``searched`` (the entities searched so far); ``passages``: the passages
        the previous hop returned, best first — at hop 0, where nothing was retrieved yet,
        the question itself as the one text read (``{"title": "", "text": question}``), so a
        ranker of names in passages can rank the entities the question names;
        ``observation``: what the previous hop's ``read`` observed (``""`` at hop 0);
        ``index``: the passage index the ``retrieve`` tool searches (its corpus and titles are
        known before any request runs; a predictor may read or search it).

        NOTE: on replay the observation states the recorded step's answer, which is usually
        the next hop's entity (91 % of the test split's later hops), even where the passages
        do not contain it (28 % of them): a predictor that reads it is measured against a
        reader that never misses (the entity ranker's accuracy is reported both ways).
        """
        read = (
            [dict(p) for p in passages]
            if trajectory
            else [{"title": QUESTION_PASSAGE_TITLE, "text": self.record.question}]
        )
        return {
            "question": self.record.question,
            "searched": [t["search"] for t in trajectory],
            "passages": read,
            "observation": trajectory[-1]["observation"] if trajectory else "",
            "index": self._tool.index,
        }

    def think_values(self, trajectory: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``think`` stage's input values after ``trajectory``."""
        return {"question": self.record.question, "trajectory": [dict(t) for t in trajectory]}

    def retrieve_values(self, entity: str) -> dict[str, Any]:
        """The ``retrieve`` stage's input values for a search of ``entity``."""
        return {"query": entity, "k": self.top_k}

    def read_values(self, entity: str, passages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``read`` stage's input values for the passages a search of ``entity`` found."""
        return {
            "question": self.record.question,
            "search": entity,
            "passages": passage_values(passages),
        }

    # -- early fill ---------------------------------------------------------------------------

    def fillable(self, point: BranchPoint, candidate: str) -> bool:
        return self.fill_values(point.coordinate, candidate) is not None

    async def speculate(self, ctx: StageContext, point: BranchPoint, candidate: str) -> None:
        """C2's fill of the ``hop`` subgraph for ``candidate`` at the open think branch: the
        retrieve of ``candidate`` and the read of its passages, rendered exactly as
        :meth:`run` renders them if ``think`` decides ``search[candidate]``. Nothing for
        :data:`FINISH` or a branch not open.

        NOTE: the fill ends with the read (the paper's one run-ahead cycle). The next
        ``think`` is the next branch's decision: running it ahead would decide that branch
        too, which the paper finds consumes nothing; and a fill that ends on its own is
        ``done``, so the priced gate learns its execution time from it.
        """
        if (
            point.coordinate not in self._open
            or self.fill_values(point.coordinate, candidate) is None
        ):
            return
        found = await ctx.tool("retrieve", self.retrieve_values(candidate))
        await ctx.llm("read", self.read_values(candidate, passage_values(found)))

    def fill_values(self, coordinate: BranchCoordinate, candidate: str) -> dict[str, Any] | None:
        """The ``retrieve`` values a fill of ``candidate`` at the open branch renders.

        ``None`` for :data:`FINISH`/:data:`INVALID` or a branch not open now. Equal to the
        canonical retrieve's values when ``think`` decides ``search[candidate]``.
        """
        if coordinate not in self._open or candidate in (FINISH, INVALID) or not candidate:
            return None
        return self.retrieve_values(candidate)

    def tool(self, name: str) -> Tool:
        if name != TOOL_NAME:
            raise KeyError(f"react requests have one tool, {TOOL_NAME!r}; asked for {name!r}")
        return self._tool

    # -- replay -------------------------------------------------------------------------------

    def replay_text(self, rendered: RenderedInput) -> str | None:
        try:
            if rendered.stage == "think":
                decision = self._replay_think(rendered.fields)
            elif rendered.stage == "read":
                decision = self._replay_read(rendered.fields)
            else:
                return None
        except (KeyError, TypeError, AttributeError, IndexError):
            return None  # an input of a shape the trace never produced
        if decision is None:
            return None
        return self.decode.wrap(rendered, decision, theta(self.template.stage(rendered.stage)))

    def _replay_think(self, fields: Mapping[str, Any]) -> str | None:
        if fields["question"] != self.record.question:
            return None
        trajectory = list(fields["trajectory"])
        steps, h = self.record.steps, len(trajectory)
        recorded = [{"search": s.entity, "observation": observation_text(s)} for s in steps[:h]]
        if [dict(t) for t in trajectory] != recorded:
            return f" The observations do not say.\nAction: finish[{UNKNOWN_ANSWER}]"
        if h < len(steps):
            return search_text(steps[h], steps[:h])
        return finish_text(self.record.answer)

    def _replay_read(self, fields: Mapping[str, Any]) -> str | None:
        if fields["question"] != self.record.question:
            return None
        entity, passages = fields["search"], list(fields["passages"])
        step = next((s for s in self.record.steps if s.entity == entity), None)
        if step is not None:
            return f"Observation: {observation_text(step)}"
        if passages:
            return f"Observation: The passages are about {passages[0]['title']}."
        return f"Observation: Nothing was found for {entity}."

    # -- scoring ------------------------------------------------------------------------------

    def score(self, outcome: ReActOutcome) -> float:
        """Exact match of the finished answer against the gold answer and its aliases."""
        return exact_match(outcome.answer, self.record.answers)

    def f1(self, outcome: ReActOutcome) -> float:
        """Token F1 of the finished answer (the best over the gold answer and its aliases)."""
        return f1_score(outcome.answer, self.record.answers)
