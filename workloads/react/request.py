"""One ReAct request: its hop loop, its replay oracle and its score.

Control flow: ``think`` decides (a branch); a ``search[e]`` runs ``retrieve`` for ``e`` and
appends ``{"search": e, "passages": [...]}`` to the trajectory; ``finish[a]`` ends the request
with answer ``a``. At most :data:`MAX_THINKS` decisions; an action that does not parse ends
the request without an answer.

Replay (:meth:`ReActRequest.replay_text`) is a pure function of the rendered input. The
recorded path is the record's hop chain (:mod:`workloads.musique`): at hop ``h`` of a
trajectory whose searches equal the chain's first ``h`` entities, it answers a thought and
``search[<entity h>]``, and after the last hop ``finish[<gold answer>]``. MuSiQue records no
reasoning text, so the thought is written from the step (``"I need the spouse of Steve
Hillage."``): it stands in for the decode length, not for a model's words. Off the recorded
path (a fill that searched another entity) it answers a deterministic plausible action:
search the title of the top passage just read, or finish when that was searched already.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynbranch.workflow import BranchCoordinate, BranchPoint, RenderedInput
from dynbranch.workload import RequestInstance, StageContext, Tool
from workloads.musique import SUBTOPIC_SEP, MusiqueRecord, Step, exact_match, f1_score
from workloads.react.retrieval import TOOL_NAME, RetrieveTool, passage_values
from workloads.react.template import FINISH, INVALID, TEMPLATE, WORKFLOW

# NOTE: MuSiQue chains have at most 4 hops, so 4 searches and a finish; the bound only ends
# a request whose model never finishes.
MAX_THINKS = 8
UNKNOWN_ANSWER = "unknown"
_ACTION = re.compile(r"Action:\s*(search|finish)\[(.*)\]\s*$", re.S)


@dataclass(frozen=True)
class Action:
    """A parsed ``think`` decision."""

    kind: str  # search | finish
    argument: str


def parse_action(text: str) -> Action | None:
    """The action at the end of a ``think`` output, or ``None`` when there is none."""
    match = _ACTION.search(text.strip())
    if match is None or not match.group(2).strip():
        return None
    return Action(match.group(1), match.group(2).strip())


@dataclass
class ReActOutcome:
    """What :meth:`ReActRequest.run` returns and :meth:`ReActRequest.score` reads."""

    record_id: str
    kind: str
    searches: list[str] = field(default_factory=list)
    answer: str | None = None
    thinks: int = 0
    invalid: str | None = None


def search_text(step: Step, earlier: Sequence[Step]) -> str:
    """The replayed ``think`` output that searches ``step``'s entity."""
    said = f"The passages give {earlier[-1].answer}. " if earlier else ""
    if SUBTOPIC_SEP.strip() in step.question:
        need = f"I need the {step.ask} of {step.entity}."
    else:
        need = f"I need to find out: {step.ask}"
    return f" {said}{need}\nAction: search[{step.entity}]"


def finish_text(answer: str) -> str:
    """The replayed ``think`` output that finishes with ``answer``."""
    return f" The passages give the answer, {answer}.\nAction: finish[{answer}]"


class ReActRequest(RequestInstance):
    """A request built from one MuSiQue record, with its own ``retrieve`` tool object."""

    template = TEMPLATE

    def __init__(
        self, request_id: str, record: MusiqueRecord, tool: RetrieveTool, top_k: int = 3
    ) -> None:
        self.request_id, self.record, self._tool, self.top_k = request_id, record, tool, top_k
        self._open: dict[BranchCoordinate, list[dict[str, Any]]] = {}

    # -- control flow -------------------------------------------------------------------------

    async def run(self, ctx: StageContext) -> ReActOutcome:
        outcome = ReActOutcome(self.record.id, self.record.kind)
        trajectory: list[dict[str, Any]] = []
        for hop in range(MAX_THINKS):
            action = await self._think(ctx, hop, trajectory)
            outcome.thinks += 1
            if action is None:
                outcome.invalid = "the think output has no search[...] or finish[...] action"
                break
            if action.kind == "finish":
                outcome.answer = action.argument
                break
            passages = await ctx.tool("retrieve", self.retrieve_values(action.argument))
            trajectory.append({"search": action.argument, "passages": passage_values(passages)})
            outcome.searches.append(action.argument)
        return outcome

    async def _think(self, ctx: StageContext, hop: int, trajectory: list) -> Action | None:
        coordinate = BranchCoordinate(WORKFLOW, "think", hop)
        point = BranchPoint(coordinate, (), evidence=self.evidence(trajectory))
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

    def evidence(self, trajectory: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """What a predictor may see at a think branch: the question, the entities searched
        so far and the passages the previous hop returned (none at hop 0)."""
        return {
            "question": self.record.question,
            "searched": [t["search"] for t in trajectory],
            "passages": [dict(p) for p in trajectory[-1]["passages"]] if trajectory else [],
        }

    def think_values(self, trajectory: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        """The ``think`` stage's input values after ``trajectory``."""
        return {"question": self.record.question, "trajectory": list(trajectory)}

    def retrieve_values(self, entity: str) -> dict[str, Any]:
        """The ``retrieve`` stage's input values for a search of ``entity``."""
        return {"query": entity, "k": self.top_k}

    async def speculate(self, ctx: StageContext, point: BranchPoint, candidate: str) -> None:
        """C2's fill of the ``hop`` subgraph for ``candidate`` at the open think branch: the
        retrieve of ``candidate``, then the next ``think`` on the trajectory it would extend
        (both rendered exactly as :meth:`run` renders them if ``think`` decides
        ``search[candidate]``). Nothing for :data:`FINISH` or a branch not open."""
        opened = self._open.get(point.coordinate)
        if opened is None or self.fill_values(point.coordinate, candidate) is None:
            return
        passages = await ctx.tool("retrieve", self.retrieve_values(candidate))
        step = {"search": candidate, "passages": passage_values(passages)}
        await ctx.llm("think", self.think_values([*opened, step]))

    def fill_values(self, coordinate: BranchCoordinate, candidate: str) -> dict[str, Any] | None:
        """The ``retrieve`` values a fill of ``candidate`` at the open branch renders.

        ``None`` for :data:`FINISH`/:data:`INVALID` or a branch not open now. Equal to the
        canonical retrieve's values when ``think`` decides ``search[candidate]``.
        """
        if coordinate not in self._open or candidate in (FINISH, INVALID) or not candidate:
            return None
        return self.retrieve_values(candidate)

    def think_after(
        self, coordinate: BranchCoordinate, candidate: str, passages: Sequence[Mapping[str, Any]]
    ) -> dict[str, Any] | None:
        """The next ``think``'s values once a fill's retrieve of ``candidate`` returned
        ``passages`` (the rest of the ``hop`` subgraph); ``None`` off an open branch."""
        opened = self._open.get(coordinate)
        if opened is None or self.fill_values(coordinate, candidate) is None:
            return None
        step = {"search": candidate, "passages": passage_values(passages)}
        return self.think_values([*opened, step])

    def tool(self, name: str) -> Tool:
        if name != TOOL_NAME:
            raise KeyError(f"react requests have one tool, {TOOL_NAME!r}; asked for {name!r}")
        return self._tool

    # -- replay -------------------------------------------------------------------------------

    def replay_text(self, rendered: RenderedInput) -> str | None:
        if rendered.stage != "think":
            return None
        try:
            return self._replay_think(rendered.fields)
        except (KeyError, TypeError, AttributeError, IndexError):
            return None  # an input of a shape the trace never produced

    def _replay_think(self, fields: Mapping[str, Any]) -> str | None:
        if fields["question"] != self.record.question:
            return None
        trajectory = list(fields["trajectory"])
        searched = [t["search"] for t in trajectory]
        steps, h = self.record.steps, len(trajectory)
        if searched == list(self.record.chain[:h]):
            if h < len(steps):
                return search_text(steps[h], steps[:h])
            return finish_text(self.record.answer)
        # off the recorded path: follow the top passage just read, or give up
        last = trajectory[-1]["passages"]
        title = last[0]["title"] if last else None
        if title and title not in searched and h < MAX_THINKS - 1:
            return f" The passages mention {title}.\nAction: search[{title}]"
        return f" The passages do not say.\nAction: finish[{UNKNOWN_ANSWER}]"

    # -- scoring ------------------------------------------------------------------------------

    def score(self, outcome: ReActOutcome) -> float:
        """Exact match of the finished answer against the gold answer and its aliases."""
        return exact_match(outcome.answer, self.record.answers)

    def f1(self, outcome: ReActOutcome) -> float:
        """Token F1 of the finished answer (the best over the gold answer and its aliases)."""
        return f1_score(outcome.answer, self.record.answers)
