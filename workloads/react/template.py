"""The ``react`` workflow template: think → retrieve per hop, until think finishes.

* ``think`` (LLM, speculable, greedy): the question and the trajectory so far (each earlier
  hop's searched entity and the passages it returned, in order) → a thought and one action,
  ``search[<entity>]`` or ``finish[<answer>]``. Each decision is a branch at
  ``BranchCoordinate("react", "think", hop)`` with an open vocabulary. Thoughts are not fed
  back: the trajectory holds actions and observations only, so the next ``think``'s input
  is fixed by the entity chosen — which is what lets a fill run the next hop ahead.
* ``retrieve`` (tool ``retrieve``, speculable, read-only): ``{"query": <entity>, "k": k}`` →
  the top-k passages (:mod:`workloads.react.retrieval`). Its input is the query alone, so the
  same search in two requests renders byte-identically (C1's unit of reuse).

``hop`` is the self-contained subgraph retrieve + the next ``think`` that early fill runs
for a predicted entity.
"""

from __future__ import annotations

from dynbranch.workflow import SamplingParams, StageSpec, SubgraphSpec, Template
from workloads.react.retrieval import TOOL_NAME, TOOL_SCHEMA_VERSION

WORKFLOW = "react"
FINISH = "<finish>"
INVALID = "<invalid>"

THINK_PROMPT = (
    "Answer the question by searching a passage index, one entity at a time. Think, then "
    "write exactly one action: search[<entity>] to read the passages about an entity, or "
    "finish[<answer>] when the passages read so far answer the question.\n\n"
    "Question: {question}\n\n"
    "Searches so far and the passages they returned (JSON):\n{trajectory}\n\n"
    "Thought:"
)

THINK = StageSpec(
    "think",
    "llm",
    ("question", "trajectory"),
    prompt=THINK_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=128),
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

TEMPLATE = Template(WORKFLOW, "1", [THINK, RETRIEVE], [SubgraphSpec("hop", "retrieve", ("think",))])
