"""The ``routing`` workflow template: router → (handler → executor) per call, per user turn.

* ``router`` (LLM, speculable, greedy): the workspace the request acts on (its scenario's
  name; empty for single-turn records), the functions offered at this turn and the
  conversation so far → its reasoning, then the function(s) to call next, comma-separated when they run in parallel, or
  :data:`END_OF_TURN` when the latest user turn is complete. Each decision is a branch at
  ``BranchCoordinate("routing", "router", step)``.
* ``handler`` (LLM, speculable, greedy): the workspace, the conversation before this user
  turn, the names of the functions offered at this turn, the chosen function's doc, the user turn, the calls and results so far in this turn, and how many calls of the same function precede this one
  in its parallel group (``occurrence``) → its reasoning, then one call in BFCL's python
  syntax.
* ``executor`` (tool ``bfcl``): the call text and the request's API scope → the call's
  value. Speculable at template level; the tool's ``is_read_only`` decides per call.

``handle`` is the self-contained subgraph handler + executor that early fill speculates.
"""

from __future__ import annotations

from dynbranch.workflow import SamplingParams, StageSpec, SubgraphSpec, Template
from workloads.routing.bfcl_wheel import BFCL_VERSION

WORKFLOW = "routing"
TOOL_NAME = "bfcl"
TOOL_SCHEMA_VERSION = f"bfcl-eval-{BFCL_VERSION}/1"
END_OF_TURN = "<end_of_turn>"
# NOTE: a thinking turn's reasoning and its decision must fit: the decode model caps
# reasoning at 4,096 tokens (workloads.routing.decode), a decision is far shorter.
MAX_OUTPUT_TOKENS = 8192

# NOTE: the prompts put what many calls share first, so a prefix-caching engine prefills it
# once: the router's function list (the same for every record of an API family) before the
# workspace and the conversation; the handler's workspace, history, turn and calls so far
# (the same for every handler and fill of one decision) before the function it writes.
ROUTER_PROMPT = (
    "You route a user's requests to functions. Given the available functions and the "
    "conversation so far, name the function to call next. Name several, separated by "
    "commas, when they should be called in parallel. Answer " + END_OF_TURN + " when the "
    "latest user turn needs no further call.\n\n"
    "Available functions (JSON):\n{functions}\n\n"
    "Workspace: {workspace}\n\n"
    "Conversation so far (JSON):\n{conversation}\n\n"
    "Next function(s):"
)

HANDLER_PROMPT = (
    "Write one call of a function in Python syntax, name(parameter=value, ...), "
    "with literal values only.\n\n"
    "Workspace: {workspace}\n\n"
    "Conversation before this request (JSON):\n{history}\n\n"
    "User request:\n{turn}\n\n"
    "Calls made for this request so far, with their results (JSON):\n{calls}\n\n"
    "Functions available now: {offered}\n\n"
    "The function to call (JSON):\n{function}\n\n"
    "Calls of this function earlier in the same parallel group: {occurrence}\n\n"
    "Call:"
)

ROUTER = StageSpec(
    "router",
    "llm",
    ("workspace", "functions", "conversation"),
    prompt=ROUTER_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=MAX_OUTPUT_TOKENS),
    speculable=True,
)
HANDLER = StageSpec(
    "handler",
    "llm",
    ("workspace", "history", "offered", "function", "turn", "calls", "occurrence"),
    prompt=HANDLER_PROMPT,
    model="target",
    sampling=SamplingParams(max_tokens=MAX_OUTPUT_TOKENS),
    speculable=True,
)
EXECUTOR = StageSpec(
    "executor",
    "tool",
    ("call", "scope"),
    tool=TOOL_NAME,
    tool_schema_version=TOOL_SCHEMA_VERSION,
    speculable=True,
)

TEMPLATE = Template(
    WORKFLOW, "2", [ROUTER, HANDLER, EXECUTOR], [SubgraphSpec("handle", "handler", ("executor",))]
)
