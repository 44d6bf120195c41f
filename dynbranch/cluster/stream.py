"""Direct streams to actors: one TCP connection per client, beside Ray's actor calls.

An actor call goes through Ray's task machinery: the caller's core worker submits a task, the
actor's core worker queues it and hands it to the actor's thread or event loop, and the reply
comes back as an object. On this project's 2-core machine that costs about 2 / 8 ms (p50 /
p99) per call at a replay's load, as much as the same calls sent to bare actors cost
(``scripts/bench_overhead.py``'s "Ray alone" rows): Ray's own floor, not this code's.

A lane skips that machinery for the calls a run makes all the time. The actor listens on a TCP
port of its node (:class:`LaneServer`, on the actor's event loop or, for a threaded actor,
on a thread of its own: :func:`serve_in_thread`), and the caller keeps one connection to it
(:class:`Lane`), over which calls and replies travel as length-prefixed msgpack frames, many
in flight at once, matched by call id. Ray still creates, places, restarts and stops the
actors; a lane only carries calls. Who uses it: engine calls
(:mod:`dynbranch.cluster.engine_lane`), the gate's decisions
(:meth:`GateActor.open_stream <dynbranch.cluster.gate.actor.GateActor.open_stream>`) and C1's
lookups (:mod:`dynbranch.cluster.store_lane`).

- **Opening.** The caller sends the actor a fresh random token through an ordinary actor call,
  which starts the listener once and returns its address; a connection's first frame must be
  that token, or the actor closes it. A lane that cannot be opened (a port the cluster's
  firewall drops, say) leaves its caller on actor calls.
- **Breaking.** When the connection ends (the actor's process died, the network broke), every
  call in flight on it raises :class:`LaneBroken`, and so does every later one: the caller
  decides what a lost reply means (an engine call: the engine died; a gate call: send it
  again the ordinary way, under the same call id).
- **Errors.** What the actor's handler raises comes back to the caller as a row (its type's
  name, message and ids) that the caller's ``errors`` function turns into an exception:
  a lane carries no pickle.
- **Cost.** Nothing while idle: both ends wait in the operating system's poll, not a busy
  loop (Ray's compiled-graph channels poll, keeping a core busy).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import itertools
import secrets
import struct
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import msgpack

from dynbranch.errors import DynBranchError

_LENGTH = struct.Struct("!I")
MAX_FRAME = 1 << 28
"""Largest frame either side accepts (a call's prompt or a result's text, encoded)."""
OPEN_TIMEOUT_S = 10.0
"""How long opening a lane (the actor call, the connection and its token) may take."""
_FLUSH_AT = 1 << 20
"""Bytes a side lets its write buffer hold before it waits for the socket to drain."""

Handler = Callable[[str, Any], Awaitable[Any]]
"""The actor's side of a lane: ``(method, argument) -> reply``, both msgpack-able."""
Errors = Callable[[str, dict[str, Any]], Exception]
"""The caller's side of errors: ``(request_id, error row) -> the exception to raise``."""


class LaneBroken(DynBranchError):
    """The lane's connection ended (or was never open): the call's reply cannot come."""


class Unsendable(LaneBroken):
    """A call whose argument msgpack cannot encode: not sent, and the lane stays open."""


def error_row(error: BaseException) -> dict[str, Any]:
    """What a caller needs to raise ``error`` again: its type's name, message and ids."""
    return {"type": type(error).__name__, "message": str(error),
            "request_id": getattr(error, "request_id", None),
            "cause": getattr(error, "cause", None)}


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


async def _send(writer: asyncio.StreamWriter, frame: bytes) -> None:
    writer.write(frame)
    await _flush(writer)


async def _flush(writer: asyncio.StreamWriter) -> None:
    """Wait for the socket to drain when the write buffer holds more than :data:`_FLUSH_AT`."""
    if writer.transport.get_write_buffer_size() > _FLUSH_AT:
        await writer.drain()


class LaneServer:
    """The actor's side: calls from authenticated connections, each run as its own task on
    the loop the server was started on (so calls overlap as concurrent actor calls do)."""

    def __init__(self, handler: Handler) -> None:
        self._handler = handler
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
            await _send(writer, _frame(b"ok"))
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
            reply = [call_id, 0, await self._handler(method, arg)]
        except Exception as e:  # NOTE: the handler's error goes back to the caller
            reply = [call_id, 1, error_row(e)]
        if not writer.is_closing():
            with contextlib.suppress(ConnectionError, OSError):
                await _send(writer, _frame(reply))


async def listen(server: LaneServer, token: bytes, *, in_thread: bool) -> list:
    """The actor's side of opening a lane: ``server`` listening on this node's Ray address
    (once; on a thread of its own for an actor with no event loop), letting a connection
    that first sends ``token`` in. Returns the address. NOTE: with ``in_thread`` it never
    suspends, so a threaded actor's method may await it."""
    import ray

    if server.address is None:
        host = ray.util.get_node_ip_address()
        if in_thread:
            serve_in_thread(server, host)
        else:
            await server.start(host)
    assert server.address is not None
    server.allow(token)
    return list(server.address)


async def open_lane(name: str, ask: Callable[[bytes], Awaitable[Any]], errors: Errors,
                    timeout_s: float = OPEN_TIMEOUT_S) -> Lane:
    """The caller's side of opening a lane: a fresh token sent with ``ask`` (the actor's
    opening call, which answers the address :func:`listen` returned), then the connection;
    raises whatever failed, or ``TimeoutError`` past ``timeout_s``."""
    token = secrets.token_bytes(16)
    async with asyncio.timeout(timeout_s):
        host, port = await ask(token)
        return await Lane.connect(name, host, port, token, errors)


def serve_in_thread(server: LaneServer, host: str) -> tuple[str, int]:
    """Run ``server`` on an event loop of its own, on a daemon thread (for an actor with no
    loop: a threaded actor); returns its address once it listens."""
    loop = asyncio.new_event_loop()
    started: list[tuple[str, int]] = []
    ready = threading.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        try:
            started.append(loop.run_until_complete(server.start(host)))
        finally:
            ready.set()
        loop.run_forever()

    threading.Thread(target=run, name="dynbranch lane", daemon=True).start()
    if not ready.wait(OPEN_TIMEOUT_S) or not started:
        raise LaneBroken(f"the lane's listener did not start on {host}")
    return started[0]


def answer(reply: asyncio.Future, errors: Errors, request_id: str = "") -> Any:
    """What the call whose reply is ``reply`` (done: :meth:`Lane.send`) returned; raises what
    its handler raised (through ``errors``), or :class:`LaneBroken`."""
    status, payload = reply.result()
    if status:
        raise errors(request_id, payload)
    return payload


class Lane:
    """The caller's side: one connection to an actor, many calls in flight on it."""

    def __init__(self, name: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                 errors: Errors) -> None:
        self.name, self._errors = name, errors
        self._reader, self._writer = reader, writer
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self.broken: str | None = None
        self.calls = 0
        self.loop = asyncio.get_running_loop()  # NOTE: a lane serves callers on this loop only
        self._reading = self.loop.create_task(
            self._read_replies(), name=f"lane {name}")

    @classmethod
    async def connect(cls, name: str, host: str, port: int, token: bytes,
                      errors: Errors) -> Lane:
        """A lane to the actor listening at ``host:port``, authenticated by ``token``."""
        reader, writer = await asyncio.open_connection(host, port)
        try:
            await _send(writer, _frame(token))
            if await _read(reader) != b"ok":
                raise ConnectionError(f"{name} refused the lane's token")
        except BaseException:
            writer.close()
            raise
        return cls(name, reader, writer, errors)

    async def call(self, method: str, arg: Any, request_id: str = "") -> Any:
        """``method(arg)`` on the actor; raises what its handler raised (through ``errors``),
        or :class:`LaneBroken`."""
        reply = self.send(method, arg)
        try:
            await _flush(self._writer)
            await reply
        except (ConnectionError, OSError) as e:
            raise LaneBroken(f"{type(e).__name__}: {e}") from None
        finally:
            if not reply.done():
                reply.cancel()  # NOTE: a cancelled caller; its reply is dropped when it comes
        return answer(reply, self._errors, request_id)

    def send(self, method: str, arg: Any) -> asyncio.Future:
        """Send ``method(arg)`` now, in the caller's own step, and return the future of its
        reply, which :func:`answer` reads (cancel it to drop a reply no one will read).

        NOTE: :meth:`call` is this, then a wait: a caller that has to wait on something else
        as well (the pool races an engine's call with the engine going down) sends at once
        instead of in a task of its own, which would send only when the event loop has run
        everything ready before it (another request's steps, milliseconds at the tail).
        """
        if self.broken is not None:
            raise LaneBroken(self.broken)
        call_id = next(self._ids)
        try:
            frame = _frame([call_id, method, arg])
        except (TypeError, ValueError, OverflowError) as e:
            raise Unsendable(f"{method}: {type(e).__name__}: {e}") from None
        reply = self._pending[call_id] = self.loop.create_future()
        try:
            self._writer.write(frame)
        except (ConnectionError, OSError) as e:
            del self._pending[call_id]
            raise LaneBroken(f"{type(e).__name__}: {e}") from None
        self.calls += 1
        return reply

    async def _read_replies(self) -> None:
        reason = f"{self.name} closed the lane"
        try:
            while (reply := await _read(self._reader)) is not None:
                call_id, status, payload = reply
                future = self._pending.pop(call_id, None)
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
        self._pending.clear()
        self._writer.close()

    def close(self) -> None:
        """End the connection; calls in flight raise :class:`LaneBroken`."""
        self._break("closed")
        self._reading.cancel()
