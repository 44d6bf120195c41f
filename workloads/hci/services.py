"""The ``sgd`` tool: SGD's services replayed from the calls the raw dialogues made.

**Service database.** Every SYSTEM frame of the loaded dialogues that carries a
``service_call`` records that call's ``service_results``. :class:`ServiceDB` keys them by the
call's canonical form (service, method, parameters; :meth:`~workloads.hci.sgd_data.Call.key`),
so a lookup of a call the dialogues made returns what they recorded. A few calls were
recorded with *different* results in different dialogues (per-user state such as
``Alarm_1.GetAlarms`` or ``Banks_2.CheckBalance``, and searches over a catalogue that
changed between dialogues): such a call is answered per **session** (the dialogue that made
it), so its rendered input names the session and only then; a session that itself recorded
two different results for one call has no answer.

**Effects.** A method is read-only iff its schema intent has ``is_transactional: false``
(searches, ``GetRide``-style quotes, balances); transactional methods (bookings,
reservations, transfers, purchases) are **mutating**: declared, not observed, so a fill may
never run them. Every call reads the resource ``"sgd:<service>"`` at the service's current
version (C1's read-set, the version before any write of its own); a mutating call bumps
that version and reports the resource with its new version in ``ToolResult.writes``, so
every record that read the service turns stale. Versions live in a
:class:`ServiceVersions` shared by the requests of one batch, as a remote service's state is
shared by its users; the recorded results themselves never change.

**Tool time** (an assumption, stated so it can be challenged): SGD's services stand in for
third-party web APIs (restaurants, flights, banks), so a read-only call is charged what the
Routing workload charges a SaaS REST call, an assumed 150 ms p50
(:data:`workloads.routing.tools.SAAS_API_S`, where its sources are), and a transactional
call 300 ms (a write that commits at the provider: two round trips). Until 2026-12-07 a read
was charged 30 ms "as the Routing workload charges its remote APIs", which Routing no longer
did. With ``tool_time="measured"`` the call's real duration is charged instead.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from dynbranch.errors import ToolInputError
from dynbranch.workload import (
    NO_WRITES,
    MeasuredCost,
    ModelledCost,
    Tool,
    ToolCost,
    ToolResult,
    WriteSet,
)
from workloads.hci.sgd_data import Call, Dialogue, Intent, Service

TOOL_NAME = "sgd"
TOOL_SCHEMA_VERSION = "sgd-dstc8-e852981/1"
TOOL_TIMES = ("modelled", "measured")
READ_S = 0.150  # NOTE: Routing's SaaS call (a test keeps the two equal)
TRANSACTION_S = 2 * READ_S
FIELDS = ("service", "method", "parameters", "session", "result")


def resource(service: str) -> str:
    """The read-set key of one service's data."""
    return f"sgd:{service}"


def _frozen(results: Iterable[Mapping[str, str]]) -> str:
    return json.dumps([dict(r) for r in results], sort_keys=True, ensure_ascii=False)


class ServiceDB:
    """The recorded results of every call the loaded dialogues made (immutable once built)."""

    def __init__(self, services: Mapping[str, Service], dialogues: Iterable[Dialogue]) -> None:
        self.services = services
        seen: dict[str, dict[str, set[str]]] = {}  # key -> session -> distinct result lists
        for d in dialogues:
            for turn in d.turns:
                for frame in turn.frames:
                    if frame.call is not None:
                        by_session = seen.setdefault(frame.call.key(), {})
                        by_session.setdefault(d.id, set()).add(_frozen(frame.results or ()))
        self._shared: dict[str, str] = {}
        self._scoped: dict[tuple[str, str], str] = {}
        self._ambiguous: dict[str, int] = {}
        for key, by_session in seen.items():
            distinct = set().union(*by_session.values())
            if len(distinct) == 1:
                self._shared[key] = next(iter(distinct))
                continue
            self._ambiguous[key] = len(by_session)
            for session, results in by_session.items():
                if len(results) == 1:
                    self._scoped[(key, session)] = next(iter(results))

    def __len__(self) -> int:
        """Number of distinct calls recorded."""
        return len(self._shared) + len(self._ambiguous)

    @property
    def ambiguous_calls(self) -> int:
        """Calls recorded with different results in different dialogues (answered per session)."""
        return len(self._ambiguous)

    def intent(self, service: str, method: str) -> Intent | None:
        known = self.services.get(service)
        return known.intents.get(method) if known else None

    def needs_session(self, call: Call) -> bool:
        """Whether ``call`` is answered per session (see the module docstring)."""
        return call.key() in self._ambiguous

    def answers(self, call: Call, session: str | None) -> bool:
        """Whether :meth:`results` has an answer for ``call`` in ``session``."""
        try:
            self.results(call, session)
        except LookupError:
            return False
        return True

    def results(self, call: Call, session: str | None = None) -> list[dict[str, str]]:
        """A fresh copy of the results the dialogues recorded for ``call``.

        Raises :class:`LookupError` saying why when there is no single recorded answer.
        """
        key = call.key()
        if key in self._shared:
            return json.loads(self._shared[key])
        if key not in self._ambiguous:
            raise LookupError("no dialogue made this call")
        if session is None:
            raise LookupError(
                f"recorded with different results in {self._ambiguous[key]} "
                "dialogues; the call must name its session"
            )
        scoped = self._scoped.get((key, session))
        if scoped is None:
            raise LookupError(f"session {session!r} has no single recorded result for this call")
        return json.loads(scoped)


class ServiceVersions:
    """The current data version of each service, shared by the requests of one batch."""

    def __init__(self) -> None:
        self._versions: dict[str, int] = {}

    def current(self, service: str) -> str:
        return str(self._versions.get(service, 0))

    def bump(self, service: str) -> str:
        """A mutating call changed ``service``; returns its new version."""
        self._versions[service] = self._versions.get(service, 0) + 1
        return self.current(service)


def call_fields(
    call: Call, session: str | None = None, result: int | None = None
) -> dict[str, Any]:
    """The ``sgd`` tool's fields for ``call``; ``result`` picks one entry of its results."""
    return {
        "service": call.service,
        "method": call.method,
        "parameters": dict(call.parameters),
        "session": session,
        "result": result,
    }


class ServiceTool(Tool):
    """Runs service calls on a :class:`ServiceDB`, versioned by a :class:`ServiceVersions`.

    Fields (:data:`FIELDS`): ``service``, ``method``, ``parameters`` (slot → text),
    ``session`` (a dialogue id or ``None``) and ``result`` (``None``: the call's result list;
    an index: that one entry, the details of a picked menu item). ``cost`` is the cost of
    the last call: the orchestrator reads it right after :meth:`call` returns.
    """

    name, schema_version = TOOL_NAME, TOOL_SCHEMA_VERSION

    def __init__(
        self, db: ServiceDB, versions: ServiceVersions, tool_time: str = "modelled"
    ) -> None:
        self.db, self.versions, self.tool_time = db, versions, tool_time
        self.cost: ToolCost = MeasuredCost() if tool_time == "measured" else ModelledCost(READ_S)

    def cost_for(self, fields: Mapping[str, Any]) -> ToolCost:
        """What a call with these fields will be charged."""
        if self.tool_time == "measured":
            return MeasuredCost()
        return ModelledCost(TRANSACTION_S if not self.is_read_only(fields) else READ_S)

    def is_read_only(self, fields: Mapping[str, Any]) -> bool:
        try:
            call, _, _ = self._parse(fields)
        except ToolInputError:
            return False
        return not self.db.intent(call.service, call.method).transactional

    def write_set(self, fields: Mapping[str, Any]) -> WriteSet:
        """A transactional call writes its service's data; nothing else writes (a call
        that does not parse is refused before it touches any version)."""
        try:
            call, _, _ = self._parse(fields)
        except ToolInputError:
            return NO_WRITES
        if not self.db.intent(call.service, call.method).transactional:
            return NO_WRITES
        return WriteSet.of(resource(call.service))

    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        call, session, index = self._parse(fields)
        try:
            results = self.db.results(call, session)
        except LookupError as e:
            raise ToolInputError(TOOL_NAME, call.key(), str(e)) from None
        value: Any = results
        if index is not None:
            if not 0 <= index < len(results):
                raise ToolInputError(
                    TOOL_NAME, call.key(), f"result {index} out of range: {len(results)} results"
                )
            value = results[index]
        self.cost = self.cost_for(fields)
        key, before = resource(call.service), self.versions.current(call.service)
        if self.db.intent(call.service, call.method).transactional:
            return ToolResult(
                value, reads={key: before}, writes={key: self.versions.bump(call.service)}
            )
        return ToolResult(value, reads={key: before})

    def _parse(self, fields: Mapping[str, Any]) -> tuple[Call, str | None, int | None]:
        text = json.dumps({k: fields.get(k) for k in FIELDS}, sort_keys=True, default=repr)
        extra = sorted(set(fields) - set(FIELDS))
        if extra:
            raise ToolInputError(TOOL_NAME, text, f"unknown fields {extra}")
        service, method, params = (fields.get(k) for k in ("service", "method", "parameters"))
        session, index = fields.get("session"), fields.get("result")
        if not isinstance(service, str) or not isinstance(method, str):
            raise ToolInputError(TOOL_NAME, text, "service and method must be text")
        if self.db.intent(service, method) is None:
            raise ToolInputError(TOOL_NAME, text, f"{service}.{method} is not in the schema")
        if not isinstance(params, Mapping) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in params.items()
        ):
            raise ToolInputError(TOOL_NAME, text, "parameters must map slot names to text")
        if session is not None and not isinstance(session, str):
            raise ToolInputError(TOOL_NAME, text, "session must be text or null")
        if index is not None and (not isinstance(index, int) or isinstance(index, bool)):
            raise ToolInputError(TOOL_NAME, text, "result must be an index or null")
        return Call(service, method, dict(params)), session, index
