"""Engine calls over a lane (:mod:`dynbranch.cluster.stream`): what travels and how.

The Ray backend's engine clients send ``generate``, ``abort`` and the load probe's ``load``
over one direct stream per engine actor instead of as actor calls
(:class:`~dynbranch.cluster.backend.RayEngineClient`); ``health`` stays an actor call, and
is what reopens a lane once Ray has restarted a dead engine's actor. The actor serves the
lane on the event loop its engine steps on (:meth:`EngineActor.open_lane
<dynbranch.cluster.engine_actor.EngineActor.open_lane>`), so calls overlap on the engine as
concurrent actor calls do.

This module is the engine's side of it: the protocol's dataclasses as msgpack rows, the
actor's handler, and the caller's view of errors. A call in flight when the lane breaks
raises :class:`~dynbranch.errors.EngineDied` (the client turns
:class:`~dynbranch.cluster.stream.LaneBroken` into it),
as a Ray call on a dead actor does. An engine's own error comes back as itself where it is
one of :mod:`dynbranch.errors`'s engine errors, and as an :class:`EngineError` naming it
otherwise (a Ray call would carry any exception, pickled; a lane carries no pickle).
"""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Any

from dynbranch import errors
from dynbranch.cluster.stream import Handler
from dynbranch.engines.protocol import Engine, GenerateRequest, GenerateResult, LoadSnapshot
from dynbranch.errors import EngineAborted, EngineDied, EngineError

_REQUEST = tuple(f.name for f in fields(GenerateRequest))
_RESULT = tuple(f.name for f in fields(GenerateResult))
_LOAD = tuple(f.name for f in fields(LoadSnapshot))


def encode_request(request: GenerateRequest) -> list[Any]:
    return [getattr(request, name) for name in _REQUEST]


def decode_request(fields_: list[Any]) -> GenerateRequest:
    return GenerateRequest(*fields_)


def encode_result(result: GenerateResult) -> list[Any]:
    return [getattr(result, name) for name in _RESULT]


def decode_result(fields_: list[Any]) -> GenerateResult:
    return GenerateResult(*fields_)


def encode_load(snapshot: LoadSnapshot) -> list[Any]:
    return [getattr(snapshot, name) for name in _LOAD]


def decode_load(fields_: list[Any]) -> LoadSnapshot:
    return LoadSnapshot(*fields_)


def decode_error(engine_id: str, request_id: str, error: dict[str, Any]) -> Exception:
    """The engine's error as it was raised where :mod:`dynbranch.errors` has its type, else an
    :class:`EngineError` naming it."""
    name, message = error["type"], error["message"]
    rid = error.get("request_id") or request_id
    if name == "EngineAborted":
        return EngineAborted(rid)
    if name == "EngineDied":
        return EngineDied(engine_id, rid, error.get("cause") or message)
    kind = getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, EngineError):
        with contextlib.suppress(TypeError):
            return kind(message)
    return EngineError(f"{name} in engine {engine_id}: {message}")


def engine_handler(ready: Callable[[], Awaitable[Engine]]) -> Handler:
    """The actor's side of an engine lane: ``ready`` returns the started engine."""

    async def handle(method: str, arg: Any) -> Any:
        engine = await ready()
        if method == "generate":
            return encode_result(await engine.generate(decode_request(arg)))
        if method == "abort":
            return await engine.abort(arg)
        if method == "promote":
            return await engine.promote(arg)
        if method == "load":
            return encode_load(engine.load())
        raise EngineError(f"the engine lane has no call {method!r}")

    return handle
