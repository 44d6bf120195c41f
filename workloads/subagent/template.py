"""The ``subagent`` workflow template: plan → a sub-agent per sub-topic → synthesise.

* ``plan`` (LLM, speculable, greedy): the question → reasoning, then research sub-topics,
  one per line, as ``<entity> >> <what to find out>``; a bridge entity written as ``#k``,
  the k-th sub-topic's finding (``plan="references"``, the default:
  :data:`TEMPLATE_REFERENCES`), or, with ``plan="resolved"`` (:data:`TEMPLATE_RESOLVED`),
  as the answer it stands for. A multi-valued branch at
  ``BranchCoordinate("subagent", "plan", 0)`` with an open vocabulary: it resolves to every
  sub-topic named, and all of their results are kept.
* per sub-topic, concurrently (with references: each once the findings it names exist), a
  **sub-agent**: a ReAct episode of its own over the
  sub-topic alone. ``sub_think`` (LLM, speculable, greedy): the sub-topic → reasoning and
  ``search[<entity>]``; ``retrieve`` (tool ``retrieve``, the BM25 tool of
  :mod:`workloads.react.retrieval`) for that entity; ``research`` (LLM, speculable, greedy):
  the sub-topic and its passages → reasoning and a short finding. The search ``sub_think``
  decodes is a branch of its own at ``BranchCoordinate("subagent", "sub_think", i)`` for
  the plan's ``i``-th sub-topic (open vocabulary, one winner): it resolves to the entity
  searched (:data:`NO_SEARCH` when there is none). No sub-agent input holds
  the parent question, so the same sub-task in two requests renders byte-identically and
  C1 serves the second one the first one's sub-agent.
* ``synthesise`` (LLM, speculable, greedy): the question and the findings in plan order →
  reasoning and the answer.

``subagent`` is the self-contained subgraph sub_think → retrieve → research that early fill
runs for a predicted sub-topic at the plan branch: a fill hides a whole sub-agent (three
stages, the workload's fill depth). At a sub-agent's search branch a fill runs
``retrieve`` and ``research`` for a predicted entity while ``sub_think`` decodes (ReAct's
one run-ahead cycle).
"""

from __future__ import annotations

from dataclasses import replace

from dynbranch.workflow import SamplingParams, StageSpec, SubgraphSpec, Template
from workloads.react.lengths import STAGE_MAX_TOKENS
from workloads.react.template import RETRIEVE  # NOTE: the same search stage as ReAct's

WORKFLOW = "subagent"
NO_SUBTOPIC = "<none>"
NO_SEARCH = "<no search>"
"""What a sub-agent's search branch resolves to when ``sub_think`` decodes no search."""

PLAN_PROMPT = (
    "You lead a team of research sub-agents. Break the question into the sub-topics they "
    "should research, one per line, each written as <entity> >> <what to find out about it>. "
    "Name each bridge entity as the answer it stands for.\n\n"
    "Question: {question}\n\n"
    "Sub-topics:\n"
)
PLAN_REFERENCES_PROMPT = (
    "You lead a team of research sub-agents. Break the question into the sub-topics they "
    "should research, one per line, each written as <entity> >> <what to find out about it>. "
    "Write an entity that only an earlier sub-topic's finding can name as #k, the finding of "
    "the k-th sub-topic; that sub-topic is researched once the k-th is found.\n\n"
    "Question: {question}\n\n"
    "Sub-topics:\n"
)
SUB_THINK_PROMPT = (
    "You are a research sub-agent. Think about the sub-topic, then write one action: "
    "search[<entity>] to read the passages about the entity it names.\n\n"
    "Sub-topic: {subtopic}\n\n"
    "Thought:"
)
RESEARCH_PROMPT = (
    "You are a research sub-agent. Using only the passages below, answer the sub-topic in a "
    "few words.\n\n"
    "Sub-topic: {subtopic}\n\n"
    "Passages (JSON):\n{passages}\n\n"
    "Finding:"
)
SYNTHESISE_PROMPT = (
    "Answer the question in a few words from your sub-agents' findings.\n\n"
    "Question: {question}\n\n"
    "Findings (JSON):\n{findings}\n\n"
    "Answer:"
)

PLAN = StageSpec(
    "plan",
    "llm",
    ("question",),
    prompt=PLAN_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=STAGE_MAX_TOKENS),
    speculable=True,
)
PLAN_REFERENCES = replace(PLAN, prompt=PLAN_REFERENCES_PROMPT)
SUB_THINK = StageSpec(
    "sub_think",
    "llm",
    ("subtopic",),
    prompt=SUB_THINK_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=STAGE_MAX_TOKENS),
    speculable=True,
)
RESEARCH = StageSpec(
    "research",
    "llm",
    ("subtopic", "passages"),
    prompt=RESEARCH_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=STAGE_MAX_TOKENS),
    speculable=True,
)
SYNTHESISE = StageSpec(
    "synthesise",
    "llm",
    ("question", "findings"),
    prompt=SYNTHESISE_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=STAGE_MAX_TOKENS),
    speculable=True,
)

TEMPLATE_RESOLVED = Template(
    WORKFLOW,
    "2",
    [PLAN, SUB_THINK, RETRIEVE, RESEARCH, SYNTHESISE],
    [SubgraphSpec("subagent", "sub_think", ("retrieve", "research"))],
)
"""The template of ``plan="resolved"``: the planner writes a bridge as the answer it stands
for, which only research can find (the replayed planner reads it from the trace)."""
TEMPLATE_REFERENCES = Template(
    WORKFLOW,
    "2",
    [PLAN_REFERENCES, SUB_THINK, RETRIEVE, RESEARCH, SYNTHESISE],
    [SubgraphSpec("subagent", "sub_think", ("retrieve", "research"))],
)
"""The template of ``plan="references"``: the planner writes a bridge as ``#k`` (MuSiQue's
own notation) and a sub-agent waits for the findings its sub-topic refers to."""
TEMPLATES = {"references": TEMPLATE_REFERENCES, "resolved": TEMPLATE_RESOLVED}
PLANS = tuple(TEMPLATES)
"""How the planner writes a bridge entity: as ``#k`` (``references``, the default: the
chain is researched in order) or as the answer it stands for (``resolved``: every sub-agent
starts at once, because the planner is handed what only research can find)."""
DEFAULT_PLAN = "references"
"""NOTE: the default since a planner cannot know a bridge's answer before its sub-agent
finds it; ``resolved`` hands it the trace's answers, so both its floor and its early-fill
bound rest on knowledge no model has (a plan fill of a chained step would be a fill of the
trace's future)."""
TEMPLATE = TEMPLATES[DEFAULT_PLAN]
"""The template of the default plan form."""
SUBAGENT_STAGES = ("sub_think", "retrieve", "research")
"""The stages of one sub-agent, in the order they run."""
