"""The ``hci`` workflow template: offer → pick (the user thinks) → lookup → respond.

* ``offer`` (LLM, greedy): the service, the dialogue so far and the menu (the service's
  results) → the system's offer utterance (replayed from SGD).
* ``pick`` (human): the user reads the offer and the menu and picks an entry after a sampled
  think time. It opens the branch ``BranchCoordinate("hci", "pick", 0)`` (one pick per
  request) whose candidates are the menu entries' indices.
* ``lookup`` (tool ``sgd``): the picked entry's details (read-only: speculable) or, after a
  failed booking that offered an alternative, the booking of it (mutating: never filled).
  The tool's ``is_read_only`` decides per call.
* ``respond`` (LLM, greedy): the dialogue including the offer, the pick and the lookup's
  value → the next system utterance (replayed).

``next_turn`` is the self-contained subgraph lookup + respond that early fill speculates
during the user's think time. Requests measure latency from the end of ``pick``
(``latency_origin = "last_human"``): what the user feels after the click.
"""

from __future__ import annotations

from dynbranch.workflow import SamplingParams, StageSpec, SubgraphSpec, Template
from workloads.hci.services import FIELDS, TOOL_NAME, TOOL_SCHEMA_VERSION

WORKFLOW = "hci"
PICK_STEP = 0

OFFER_PROMPT = (
    "You are a task assistant using the {service} service. Given the conversation so far "
    "and the service's results, offer the user the result(s) that fit best, in one short "
    "reply.\n\n"
    "Conversation so far (JSON):\n{dialogue}\n\n"
    "Service results (JSON):\n{menu}\n\n"
    "Reply:"
)

RESPOND_PROMPT = (
    "You are a task assistant using the {service} service. The user picked result {pick} "
    "of the results you offered. Given the conversation so far and the service's answer for "
    "the pick, write your next reply.\n\n"
    "Conversation so far (JSON):\n{dialogue}\n\n"
    "Service answer (JSON):\n{result}\n\n"
    "Reply:"
)

OFFER = StageSpec(
    "offer",
    "llm",
    ("service", "dialogue", "menu"),
    prompt=OFFER_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=128),
    speculable=True,
)
PICK = StageSpec("pick", "human", ("offer", "menu"))
LOOKUP = StageSpec(
    "lookup",
    "tool",
    FIELDS,
    tool=TOOL_NAME,
    tool_schema_version=TOOL_SCHEMA_VERSION,
    speculable=True,
)
RESPOND = StageSpec(
    "respond",
    "llm",
    ("service", "dialogue", "pick", "result"),
    prompt=RESPOND_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=128),
    speculable=True,
)

TEMPLATE = Template(
    WORKFLOW,
    "1",
    [OFFER, PICK, LOOKUP, RESPOND],
    [SubgraphSpec("next_turn", "lookup", ("respond",))],
)
