"""The ``react`` workflow template: think → retrieve → read per hop, until think finishes.

* ``think`` (LLM, speculable, greedy): the question and the trajectory so far (each earlier
  hop's searched entity and the observation its read step wrote, in order) → reasoning, a
  thought and one action, ``search[<entity>]`` or ``finish[<answer>]``. Each decision is a
  branch at ``BranchCoordinate("react", "think", hop)`` with an open vocabulary. Thoughts
  are not fed back: the trajectory holds actions and observations only, as a Qwen3 agent
  framework drops earlier turns' thinking, so the next ``think``'s input is fixed by the
  entity chosen and what reading its passages gives.
* ``retrieve`` (tool ``retrieve``, speculable, read-only): ``{"query": <entity>, "k": k}`` →
  the top-k passages (:mod:`workloads.react.retrieval`). Its input is the query alone, so the
  same search in two requests renders byte-identically (C1's unit of reuse).
* ``read`` (LLM, speculable, greedy): the question, the entity searched and the passages →
  reasoning and ``Observation: <what the passages say that the question needs>``.

``hop`` is the self-contained subgraph retrieve + read that early fill runs for a predicted
entity (two stages, the default fill depth).
"""

from __future__ import annotations

from dynbranch.workflow import SamplingParams, StageSpec, SubgraphSpec, Template
from workloads.react.lengths import STAGE_MAX_TOKENS
from workloads.react.retrieval import TOOL_NAME, TOOL_SCHEMA_VERSION

WORKFLOW = "react"
FINISH = "<finish>"
INVALID = "<invalid>"

THINK_PROMPT = (
    "Answer the question by searching a passage index, one entity at a time. Think, then "
    "write exactly one action: search[<entity>] to read the passages about an entity, or "
    "finish[<answer>] when the observations so far answer the question.\n\n"
    "Question: {question}\n\n"
    "Searches so far and what was observed (JSON):\n{trajectory}\n\n"
    "Thought:"
)
READ_PROMPT = (
    "You read search results for an agent answering a question. Write one line, "
    "Observation: <what these passages say about the entity that the question needs>.\n\n"
    "Question: {question}\n\n"
    "Searched: {search}\n\n"
    "Passages (JSON):\n{passages}\n\n"
)

THINK = StageSpec(
    "think",
    "llm",
    ("question", "trajectory"),
    prompt=THINK_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=STAGE_MAX_TOKENS),
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
READ = StageSpec(
    "read",
    "llm",
    ("question", "search", "passages"),
    prompt=READ_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=STAGE_MAX_TOKENS),
    speculable=True,
)

TEMPLATE = Template(
    WORKFLOW, "2", [THINK, RETRIEVE, READ], [SubgraphSpec("hop", "retrieve", ("read",))]
)
