"""A direct lane to each engine actor: one TCP stream beside Ray's actor calls.

An engine call made as a Ray actor call goes through Ray's task machinery: the driver's core
worker submits a task, the actor's core worker queues it and hands it to the actor's event
loop, and the reply comes back as an object. On this project's 2-core machine that costs
about 1.7 / 10.9 ms (p50 / p99) per call before the engine does anything, and the same calls
sent to bare async actors cost as much (``scripts/bench_overhead.py``'s "Ray alone" rows):
Ray's own floor, not this code's.

The lane skips that machinery for the calls a run makes all the time (``generate``, ``abort``
and the load probe's ``load``): the engine actor listens on a TCP port of its node, on the
same event loop its engine steps on, and the driver's client keeps one connection to it,
over which calls and replies travel as length-prefixed msgpack frames, many in flight at
once, matched by call id. Ray still creates, places, restarts and stops the actors, and
answers ``health``; the lane only carries calls.

- **Opening.** :meth:`RayEngineClient.open_lane
  <dynbranch.cluster.backend.RayEngineClient.open_lane>` sends the actor a fresh random token
  through an ordinary actor call (:meth:`EngineActor.open_lane
  <dynbranch.cluster.engine_actor.EngineActor.open_lane>`), which starts the listener once and
  returns its address; the connection's first frame must be that token, or the actor closes
  it. A lane that cannot be opened (a port the cluster's firewall drops, say) leaves the
  client on ordinary actor calls.
- **Breaking.** When the connection ends (the actor's process died, or the network broke),
  every call in flight on it raises :class:`LaneBroken`, which the client turns into
  :class:`~dynbranch.errors.EngineDied`, as a Ray call on a dead actor does; later calls go
  as ordinary actor calls, and the pool's health probe, once Ray has restarted the actor,
  opens a new lane to it.
- **Errors.** An engine's own typed error comes back as itself where it is one of
  :mod:`dynbranch.errors`'s engine errors, and as an :class:`~dynbranch.errors.EngineError`
  naming it otherwise (a Ray call would carry any exception, pickled; the lane carries no
  pickle).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import struct
from collections.abc import Awaitable, Callable
from dataclasses import fields
from typing import Any

import msgpack

from dynbranch import errors
from dynbranch.engines.protocol import Engine, GenerateRequest, GenerateResult, LoadSnapshot
from dynbranch.errors import DynBranchError, EngineAborted, EngineDied, EngineError

_LENGTH = struct.Struct("!I")
MAX_FRAME = 1 << 28
"""Largest frame either side accepts (a call's prompt or a result's text, encoded)."""
OPEN_TIMEOUT_S = 10.0
"""How long opening a lane (the actor call, the connection and its token) may take."""
_FLUSH_AT = 1 << 20
"""Bytes a side lets its write buffer hold before it waits for the socket to drain."""

_REQUEST = tuple(f.name for f in fields(GenerateRequest))
_RESULT = tuple(f.name for f in fields(GenerateResult))
_LOAD = tuple(f.name for f in fields(LoadSnapshot))


class LaneBroken(DynBranchError):
    """The lane's connection ended (or was never open): the call's reply cannot come."""


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


def encode_error(error: BaseException) -> dict[str, Any]:
    """What the client needs to raise ``error`` again: its type's name, message and ids."""
    return {"type": type(error).__name__, "message": str(error),
            "request_id": getattr(error, "request_id", None),
            "cause": getattr(error, "cause", None)}


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


def _frame(value: Any) -> bytes:
    body = msgpack.packb(value, use_bin_type=True)
    return _LENGTH.pack(len(body)) + body


async def _read(reader: asyncio.StreamReader) -> Any:
    """The next frame's value; ``None`` at a clean end of the stream."""
    try:
        head = await reader.readexactly(_LENGTH.size)
    except asyncio.IncompleteReadError as e:
        if not e.partial:
            return None
        raise
    (n,) = _LENGTH.unpack(head)
    if n > MAX_FRAME:
        raise ConnectionError(f"a lane frame of {n} bytes (at most {MAX_FRAME})")
    return msgpack.unpackb(await reader.readexactly(n), raw=False)


async def _write(writer: asyncio.StreamWriter, value: Any) -> None:
    writer.write(_frame(value))
    if writer.transport.get_write_buffer_size() > _FLUSH_AT:
        await writer.drain()


class LaneServer:
    """The actor's side: calls from authenticated connections, run on the actor's loop.

    ``engine`` returns the started engine (the actor's :meth:`ready`); each call runs as its
    own task, so calls overlap on the engine as Ray's concurrent actor calls do.
    """

    def __init__(self, engine: Callable[[], Awaitable[Engine]]) -> None:
        self._engine = engine
        self._tokens: set[bytes] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._writers: set[asyncio.StreamWriter] = set()
        self.address: tuple[str, int] | None = None

    async def start(self, host: str) -> tuple[str, int]:
        """Listen on ``host`` at a free port (once); returns the address."""
        if self._server is None:
            self._server = await asyncio.start_server(self._serve, host, 0)
            port = self._server.sockets[0].getsockname()[1]
            self.address = (host, port)
        assert self.address is not None
        return self.address

    def allow(self, token: bytes) -> None:
        self._tokens.add(token)

    def close(self) -> None:
        """Stop listening and end every open connection (their callers see the lane break)."""
        if self._server is not None:
            self._server.close()
        for writer in list(self._writers):
            writer.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._writers.add(writer)
        try:
            hello = await asyncio.wait_for(_read(reader), OPEN_TIMEOUT_S)
            if not isinstance(hello, bytes) or not any(
                    hmac.compare_digest(hello, t) for t in self._tokens):
                return
            await _write(writer, b"ok")
            loop = asyncio.get_running_loop()
            while (call := await _read(reader)) is not None:
                task = loop.create_task(self._call(writer, *call))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        except (ConnectionError, OSError, asyncio.IncompleteReadError, TimeoutError,
                ValueError, TypeError):
            pass  # NOTE: a broken or malformed connection ends; the client sees it end
        finally:
            self._writers.discard(writer)
            writer.close()

    async def _call(self, writer: asyncio.StreamWriter, call_id: int, method: str,
                    arg: Any) -> None:
        try:
            engine = await self._engine()
            if method == "generate":
                reply = [call_id, 0, encode_result(await engine.generate(decode_request(arg)))]
            elif method == "abort":
                reply = [call_id, 0, await engine.abort(arg)]
            elif method == "load":
                reply = [call_id, 0, encode_load(engine.load())]
            else:
                raise EngineError(f"the engine lane has no call {method!r}")
        except Exception as e:  # NOTE: the engine's error goes back to the caller
            reply = [call_id, 1, encode_error(e)]
        if not writer.is_closing():
            with contextlib.suppress(ConnectionError, OSError):
                await _write(writer, reply)


class EngineLane:
    """The driver's side: one connection to an engine actor, many calls in flight on it."""

    def __init__(self, engine_id: str, reader: asyncio.StreamReader,
                 writer: asyncio.StreamWriter) -> None:
        self.engine_id = engine_id
        self._reader, self._writer = reader, writer
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self.broken: str | None = None
        self.calls = 0
        self._reading = asyncio.get_running_loop().create_task(
            self._read_replies(), name=f"engine lane {engine_id}")

    @classmethod
    async def connect(cls, engine_id: str, host: str, port: int, token: bytes) -> EngineLane:
        """A lane to the actor listening at ``host:port``, authenticated by ``token``."""
        reader, writer = await asyncio.open_connection(host, port)
        try:
            await _write(writer, token)
            if await _read(reader) != b"ok":
                raise ConnectionError(f"engine {engine_id} refused the lane's token")
        except BaseException:
            writer.close()
            raise
        return cls(engine_id, reader, writer)

    async def call(self, method: str, arg: Any, request_id: str) -> Any:
        """``method(arg)`` on the engine; raises the engine's error, or :class:`LaneBroken`."""
        if self.broken is not None:
            raise LaneBroken(self.broken)
        call_id = next(self._ids)
        reply = self._pending[call_id] = asyncio.get_running_loop().create_future()
        try:
            await _write(self._writer, [call_id, method, arg])
            self.calls += 1
            status, payload = await reply
        except (ConnectionError, OSError) as e:
            raise LaneBroken(f"{type(e).__name__}: {e}") from None
        finally:
            self._pending.pop(call_id, None)
        if status:
            raise decode_error(self.engine_id, request_id, payload)
        return payload

    async def _read_replies(self) -> None:
        reason = "the engine closed the lane"
        try:
            while (reply := await _read(self._reader)) is not None:
                call_id, status, payload = reply
                future = self._pending.get(call_id)
                if future is not None and not future.done():
                    future.set_result((status, payload))
        except (ConnectionError, OSError, asyncio.IncompleteReadError, ValueError,
                TypeError) as e:
            reason = f"{type(e).__name__}: {e}"
        finally:
            self._break(reason)

    def _break(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
        for future in self._pending.values():
            if not future.done():
                future.set_exception(LaneBroken(reason))
        self._writer.close()

    async def close(self) -> None:
        self._break("closed")
        self._reading.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._reading
