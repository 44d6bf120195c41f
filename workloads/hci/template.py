"""The ``hci`` workflow template: offer → pick (the user thinks) → lookup → respond.

* ``offer`` (LLM, greedy): the service, the dialogue so far and the menu (the service's
  results) → the system's offer utterance (replayed from SGD).
* ``pick`` (human): the user reads the offer and the menu, thinks, clicks an entry and says
  something (the pick-turn utterance). It opens the branch
  ``BranchCoordinate("hci", "pick", 0)`` (one pick per request) whose candidates are the
  menu entries' indices.
* ``lookup`` (tool ``sgd``): the picked entry's details (read-only: speculable) or, after a
  failed booking that offered an alternative, the booking of it (mutating: never filled).
  The tool's ``is_read_only`` decides per call.
* ``respond`` (LLM, greedy): the conversation so far (the offer's own prompt, then the
  offer), the pick and the lookup's value, and **last the user's utterance** → the next
  system utterance (replayed). The utterance is known only after the click, so no fill can
  render this stage's input.
* ``respond_prefix`` (LLM, one token): the part of ``respond``'s prompt known before the
  click — its prompt *is* ``respond``'s prompt up to the utterance. A fill runs it only to
  warm the engine's prefix cache; its output is never anyone's value.

Prompt layout (NOTE: why this order): ``respond``'s prompt begins with ``offer``'s complete
prompt, as a chat conversation grows turn by turn, so the engine that served the offer
(the request's home under session affinity) already caches that prefix; pick and result
come next, because a fill knows them for a predicted pick; the utterance comes last. A
prefix-caching engine (sim's chained block hashes, vLLM's) then prefills only what follows
the cached blocks.

``next_turn`` is the self-contained subgraph lookup + respond. Requests measure latency
from the end of ``pick`` (``latency_origin = "last_human"``): what the user feels after the
click.
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

RESPOND_PREFIX_PROMPT = (
    OFFER_PROMPT + " {offer}\n\n"
    "The user picked result {pick}. The service's answer for it (JSON):\n{result}\n\n"
)
# NOTE: the prefix ends on a whitespace run and the rest starts with a letter, so the
# prefix's tokens are exactly the first tokens of the whole prompt (block hashes match).
RESPOND_PROMPT = RESPOND_PREFIX_PROMPT + "The user said: {utterance}\n\nYour next reply:"

TURN_MAX_TOKENS = 8192
"""A dialogue turn's output cap: reasoning (at most 4,096 modelled tokens) and the reply."""

PREFIX_INPUTS = ("service", "dialogue", "menu", "offer", "pick", "result")

OFFER = StageSpec(
    "offer",
    "llm",
    ("service", "dialogue", "menu"),
    prompt=OFFER_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=TURN_MAX_TOKENS),
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
    (*PREFIX_INPUTS, "utterance"),
    prompt=RESPOND_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=TURN_MAX_TOKENS),
    speculable=True,
)
RESPOND_PREFIX = StageSpec(
    "respond_prefix",
    "llm",
    PREFIX_INPUTS,
    prompt=RESPOND_PREFIX_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=1),
    speculable=True,
)

TEMPLATE = Template(
    WORKFLOW,
    "2",
    [OFFER, PICK, LOOKUP, RESPOND, RESPOND_PREFIX],
    [SubgraphSpec("next_turn", "lookup", ("respond",))],
)
