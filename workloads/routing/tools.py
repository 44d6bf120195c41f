"""The ``bfcl`` tool: executes multi-turn calls on the request's API instances, or validates
single-turn calls against their schema.

Read-set and writes (C1's freshness guard): a multi-turn call on a request's own state reads
the resource ``"state:{lineage}/{ClassName}"`` — its class's state named by lineage (the
initial configuration and every mutating call since), an immutable value read at version
"0" and never written. On a shared workspace (``shared_state``) it reads
``"{workspace}/{ClassName}"`` at that class's version (an int, as text), and a call declared
mutating bumps the version and reports it in ``ToolResult.writes``. Single-turn validation is a pure function of the call text and the
record's schema, so it reads nothing.

Tool time, by default **modelled** per API family (:func:`modelled_latency_s`), from these
sources:

* file system and math: in-process in a deployment too, so charged what BFCL's own classes
  take: the p50 of ``scripts/measure_bfcl_tool_times.py`` over every ground-truth call of
  ``multi_turn_base`` (5 repeats; 31 us GorillaFileSystem, 38 us MathAPI);
* trading (TradingBot ~ a broker API): 25 ms, Alpaca support's timing of an order
  (20 ms request round trip, the order's status readable 25 ms later; forum.alpaca.markets
  "Order Execution times", #18156);
* vehicle (VehicleControlAPI ~ a connected-car API): 3 s for the car's own commands and
  sensor reads, the low end of Smartcar's documented average ("requests should take
  between three and 45 seconds", smartcar.com/docs, "Make requests to Smartcar"); its unit
  conversions run in process (measured as above) and its web lookups (zip codes, tire
  shops, weather) are charged as a SaaS call;
* messaging, posting, tickets, travel, and every single-turn function (BFCL ships no
  implementation; the executor only validates): an **assumed** 150 ms p50 for a SaaS REST
  call, inside the band APIContext's weekly monitoring of public APIs reports (fastest
  medians ~50-70 ms; 450 ms the responsiveness mark it tracks); no per-vendor p50 is
  published for these.

With ``tool_time="measured"`` the call's real duration is charged instead.
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
FILE_SYSTEM_S = 31e-6  # measured p50, see the module docstring
MATH_S = 38e-6  # measured p50
IN_PROCESS_S = 27e-6  # measured p50 of VehicleControlAPI's calls (its conversions)
BROKER_API_S = 0.025
SAAS_API_S = 0.150
CONNECTED_CAR_S = 3.0
VALIDATOR_S = SAAS_API_S  # a single-turn call stands for an unknown remote API
MODELLED_API_S: Mapping[str, float] = MappingProxyType(
    {
        "GorillaFileSystem": FILE_SYSTEM_S,
        "MathAPI": MATH_S,
        "MessageAPI": SAAS_API_S,
        "TwitterAPI": SAAS_API_S,
        "TicketAPI": SAAS_API_S,
        "TradingBot": BROKER_API_S,
        "TravelAPI": SAAS_API_S,
        "VehicleControlAPI": CONNECTED_CAR_S,
    }
)
# NOTE: VehicleControlAPI mixes the car's commands with in-process unit conversions and web
# lookups; those are charged as what they are.
METHOD_S: Mapping[tuple[str, str], float] = MappingProxyType(
    {
        ("VehicleControlAPI", "liter_to_gallon"): IN_PROCESS_S,
        ("VehicleControlAPI", "gallon_to_liter"): IN_PROCESS_S,
        ("VehicleControlAPI", "estimate_drive_feasibility_by_mileage"): IN_PROCESS_S,
        ("VehicleControlAPI", "estimate_distance"): SAAS_API_S,
        ("VehicleControlAPI", "get_zipcode_based_on_city"): SAAS_API_S,
        ("VehicleControlAPI", "find_nearest_tire_shop"): SAAS_API_S,
        ("VehicleControlAPI", "get_outside_temperature_from_weather_com"): SAAS_API_S,
        ("VehicleControlAPI", "get_outside_temperature_from_google"): SAAS_API_S,
    }
)


def modelled_latency_s(cls: str | None, method: str) -> float:
    """The modelled latency of ``cls.method`` (an unknown class: a SaaS call)."""
    if (cls, method) in METHOD_S:
        return METHOD_S[cls, method]
    return MODELLED_API_S.get(cls, SAAS_API_S)


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
            MeasuredCost() if tool_time == "measured" else ModelledCost(FILE_SYSTEM_S)
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

    def _names(self, fields: Mapping[str, Any], cls: str) -> bool:
        """Whether the call's input names the state of ``cls`` it is about to run on. An
        executor's input carries the lineage it was rendered on, and its reuse name with it;
        a parallel call, or the request's own path while a fill waited, may have moved the
        state on since: the value then answers another input."""
        scope = fields.get("scope")
        named = scope.get("state") if isinstance(scope, Mapping) else None
        if not isinstance(named, Mapping):
            return True  # the input names no lineage (a direct call): nothing to disagree with
        return named.get(cls) == self.state.lineage[cls]

    def answers(self, fields: Mapping[str, Any]) -> bool:
        """Whether the call, run now, reads the state its input names (a shared workspace,
        or a call that does not bind: nothing to disagree with)."""
        if self.owner is not None:
            return True
        try:
            cls, _ = self.state.bind(parse_call(fields.get("call")))
        except (CallSyntaxError, LookupError, TypeError):
            return True  # refused when it runs, as on the canonical path
        return self._names(fields, cls)

    def cost_for(self, fields: Mapping[str, Any]) -> ToolCost:
        """What a call with these fields will be charged."""
        if self.tool_time == "measured":
            return MeasuredCost()
        try:
            method = parse_call(fields.get("call")).name
        except CallSyntaxError:
            return ModelledCost(SAAS_API_S)
        return ModelledCost(modelled_latency_s(self.state.owner(method), method))

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
        recordable = self.owner is not None or self._names(fields, cls)
        try:
            value = self.state.execute(cls, call, bound)
        except Exception as e:
            raise ToolExecutionError(TOOL_NAME, text, f"{type(e).__name__}: {e}") from e
        if self.owner is None:  # a lineage never changes: it is read at version 0, never written
            return ToolResult(value, reads={key: "0"}, recordable=recordable)
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
