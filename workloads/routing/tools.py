"""The ``bfcl`` tool: executes multi-turn calls on the request's API instances, or validates
single-turn calls against their schema.

Read-set and writes (C1's freshness guard): a multi-turn call on a request's own state reads
the resource ``"state:{lineage}/{ClassName}"`` — its class's state named by lineage (the
initial configuration and every mutating call since), an immutable value read at version
"0" and never written. On a shared workspace (``shared_state``) it reads
``"{workspace}/{ClassName}"`` at that class's version (an int, as text), and a call declared
mutating bumps the version and reports it in ``ToolResult.writes``. Single-turn validation is a pure function of the call text and the
record's schema, so it reads nothing.

Tool time, by default **modelled** (an assumption, stated here so it can be challenged):
the file system and math APIs are local in-memory stand-ins charged 2 ms per call; the
messaging, posting, ticket, trading, travel and vehicle APIs stand in for remote services
and are charged 30 ms (a fast same-region RPC); the single-turn schema validator is charged
1 ms. With ``tool_time="measured"`` the call's real duration is charged instead.
"""

from __future__ import annotations

from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from dynbranch.errors import ToolExecutionError, ToolInputError
from dynbranch.workload import (
    NO_WRITES,
    MeasuredCost,
    ModelledCost,
    Tool,
    ToolCost,
    ToolResult,
    WriteSet,
)
from workloads.routing.apis import ApiState
from workloads.routing.bfcl_data import Record
from workloads.routing.calls import CallSyntaxError, ParsedCall, parse_call
from workloads.routing.effects import declared_read_only
from workloads.routing.schema import SchemaViolation, validate_call
from workloads.routing.template import TOOL_NAME, TOOL_SCHEMA_VERSION

TOOL_TIMES = ("modelled", "measured")
LOCAL_API_S = 0.002
REMOTE_API_S = 0.030
VALIDATOR_S = 0.001
MODELLED_API_S: Mapping[str, float] = MappingProxyType(
    {
        "GorillaFileSystem": LOCAL_API_S,
        "MathAPI": LOCAL_API_S,
        "MessageAPI": REMOTE_API_S,
        "TwitterAPI": REMOTE_API_S,
        "TicketAPI": REMOTE_API_S,
        "TradingBot": REMOTE_API_S,
        "TravelAPI": REMOTE_API_S,
        "VehicleControlAPI": REMOTE_API_S,
    }
)


def _parse(fields: Mapping[str, Any]) -> tuple[str, ParsedCall]:
    text = fields.get("call")
    try:
        return text, parse_call(text)
    except CallSyntaxError as e:
        raise ToolInputError(TOOL_NAME, str(text), str(e)) from None


class ApiTool(Tool):
    """Executes multi-turn calls on one request's API instances (:class:`ApiState`).

    ``cost`` is the cost of the class the last call went to: the orchestrator reads it right
    after :meth:`call` returns; :meth:`cost_for` prices a call before running it.
    """

    name, schema_version = TOOL_NAME, TOOL_SCHEMA_VERSION

    def __init__(self, request_id: str, state: ApiState, tool_time: str = "modelled",
                 owner: str | None = None) -> None:
        self.request_id, self.state, self.tool_time = request_id, state, tool_time
        self.owner = owner  # a shared workspace's name, or None: the request's own state
        self.cost: ToolCost = (
            MeasuredCost() if tool_time == "measured" else ModelledCost(LOCAL_API_S)
        )

    def resource(self, cls: str) -> str:
        """The read-set key of one API class's state.

        A shared workspace is one mutable resource whose version every write bumps. A
        request's own state is named by its lineage (:attr:`ApiState.lineage`): an
        immutable value, so a write moves the request to a new resource instead of
        invalidating what others computed on the old one.
        """
        if self.owner is not None:
            return f"{self.owner}/{cls}"
        return f"state:{self.state.lineage[cls]}/{cls}"

    def cost_for(self, fields: Mapping[str, Any]) -> ToolCost:
        """What a call with these fields will be charged."""
        if self.tool_time == "measured":
            return MeasuredCost()
        try:
            cls = self.state.owner(parse_call(fields.get("call")).name)
        except CallSyntaxError:
            cls = None
        return ModelledCost(MODELLED_API_S.get(cls, REMOTE_API_S))

    def is_read_only(self, fields: Mapping[str, Any]) -> bool:
        try:
            call = parse_call(fields.get("call"))
            cls, bound = self.state.bind(call)
        except (CallSyntaxError, LookupError, TypeError):
            return False
        return declared_read_only(cls, call.name, bound.arguments)

    def write_set(self, fields: Mapping[str, Any]) -> WriteSet:
        """A mutating call on a shared workspace writes its class's state there; nothing
        else is written: a request's own state is named by lineage (a new value, never a
        write), and a call that does not bind is refused before it touches any state."""
        if self.owner is None or self.is_read_only(fields):
            return NO_WRITES
        try:
            cls, _ = self.state.bind(parse_call(fields.get("call")))
        except (CallSyntaxError, LookupError, TypeError):
            return NO_WRITES
        return WriteSet.of(self.resource(cls))

    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        text, call = _parse(fields)
        try:
            cls, bound = self.state.bind(call)
        except (LookupError, TypeError) as e:
            raise ToolInputError(TOOL_NAME, text, str(e)) from None
        self.cost = self.cost_for(fields)
        before, key = self.state.versions[cls], self.resource(cls)
        try:
            value = self.state.execute(cls, call, bound)
        except Exception as e:
            raise ToolExecutionError(TOOL_NAME, text, f"{type(e).__name__}: {e}") from e
        if self.owner is None:  # a lineage never changes: it is read at version 0, never written
            return ToolResult(value, reads={key: "0"})
        after = self.state.versions[cls]
        writes = {key: str(after)} if after != before else {}
        return ToolResult(value, reads={key: str(before)}, writes=writes)


class SchemaTool(Tool):
    """Validates single-turn calls against the record's function schemas (nothing to execute).

    Returns the normalised call ``{"name", "arguments"}``; every call is read-only.
    """

    name, schema_version = TOOL_NAME, TOOL_SCHEMA_VERSION

    def __init__(self, record: Record, tool_time: str = "modelled") -> None:
        self.record = record
        self.cost: ToolCost = (
            MeasuredCost() if tool_time == "measured" else ModelledCost(VALIDATOR_S)
        )

    def cost_for(self, fields: Mapping[str, Any]) -> ToolCost:
        return self.cost

    def is_read_only(self, fields: Mapping[str, Any]) -> bool:
        return True

    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        text, call = _parse(fields)
        doc = self.record.doc(call.name)
        if doc is None:
            raise ToolInputError(
                TOOL_NAME,
                text,
                f"{call.name!r} is not an offered function "
                f"({', '.join(self.record.function_names)})",
            )
        try:
            return ToolResult(validate_call(doc, call))
        except SchemaViolation as e:
            raise ToolInputError(TOOL_NAME, text, str(e)) from None
