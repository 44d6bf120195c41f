"""The ``subagent`` workflow template: plan → (retrieve → research) per sub-topic → synthesise.

* ``plan`` (LLM, speculable, greedy): the question → research sub-topics, one per line, as
  ``<entity> >> <what to find out>``. A multi-valued branch at
  ``BranchCoordinate("subagent", "plan", 0)`` with an open vocabulary: it resolves to every
  sub-topic named, and all of their results are kept.
* per sub-topic, concurrently, a **sub-agent**: ``retrieve`` (tool ``retrieve``, the BM25 tool
  of :mod:`workloads.react.retrieval`) for the sub-topic's entity, then ``research`` (LLM,
  speculable, greedy): the sub-topic and its passages → a short finding. Neither input holds
  the parent question, so the same sub-task in two requests renders byte-identically.
* ``synthesise`` (LLM, speculable, greedy): the question and the findings in plan order → the
  answer.

``subagent`` is the self-contained subgraph retrieve + research that early fill runs for a
predicted sub-topic.
"""

from __future__ import annotations

from dynbranch.workflow import SamplingParams, StageSpec, SubgraphSpec, Template
from workloads.react.retrieval import TOOL_NAME, TOOL_SCHEMA_VERSION

WORKFLOW = "subagent"
NO_SUBTOPIC = "<none>"

PLAN_PROMPT = (
    "You lead a team of research sub-agents. Break the question into the sub-topics they "
    "should research, one per line, each written as <entity> >> <what to find out about it>. "
    "Name each bridge entity as the answer it stands for.\n\n"
    "Question: {question}\n\n"
    "Sub-topics:\n"
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
    sampling=SamplingParams(max_tokens=256),
    speculable=True,
)
RETRIEVE = StageSpec(
    "retrieve",
    "tool",
    ("query", "k"),
    tool=TOOL_NAME,
    tool_schema_version=TOOL_SCHEMA_VERSION,
    speculable=True,
)
RESEARCH = StageSpec(
    "research",
    "llm",
    ("subtopic", "passages"),
    prompt=RESEARCH_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=64),
    speculable=True,
)
SYNTHESISE = StageSpec(
    "synthesise",
    "llm",
    ("question", "findings"),
    prompt=SYNTHESISE_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=64),
    speculable=True,
)

TEMPLATE = Template(
    WORKFLOW,
    "1",
    [PLAN, RETRIEVE, RESEARCH, SYNTHESISE],
    [SubgraphSpec("subagent", "retrieve", ("research",))],
)
