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
InlineHandler = Callable[[str, Any], Any]
"""An actor's side that never waits: ``(method, argument) -> reply``, run where its frame is
read (:class:`LaneServer` with ``inline=True``)."""
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


def _reply_frame(call_id: int, reply: list) -> bytes:
    """``reply``'s frame; a reply msgpack cannot encode goes back as that error instead."""
    try:
        return _frame(reply)
    except (TypeError, ValueError, OverflowError) as e:
        return _frame([call_id, 1, error_row(e)])


class _Frames(asyncio.Protocol):
    """One connection's frames, each handed to ``on_frame`` as soon as its last byte is read,
    in the transport's own callback.

    NOTE: a protocol, not a stream reader: a reader wakes the task that reads it, one turn
    of the event loop after the bytes came, and only that task's step wakes whoever waits
    for the frame, a turn later. Each turn waits behind everything made ready before it
    (other requests' steps, under load milliseconds at the tail), so a reply reaches its
    caller, and a call its handler, one turn sooner this way.
    """

    def __init__(self, on_frame: Callable[[Any], None],
                 on_lost: Callable[[str], None],
                 on_read: Callable[[], None] | None = None) -> None:
        self.on_frame, self.on_lost = on_frame, on_lost
        self.on_read = on_read  # NOTE: after the frames of one read were handed over
        self.transport: asyncio.Transport | None = None
        self._buffer = bytearray()
        self._paused = False
        self.reading_paused = False  # NOTE: paused by its owner until the writes drain
        self._drained: list[asyncio.Future] = []
        self.lost: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        try:
            while len(buffer) >= _LENGTH.size:
                (n,) = _LENGTH.unpack_from(buffer)
                if n > MAX_FRAME:
                    raise ValueError(f"a lane frame of {n} bytes (at most {MAX_FRAME})")
                end = _LENGTH.size + n
                if len(buffer) < end:
                    break
                value = msgpack.unpackb(memoryview(buffer)[_LENGTH.size:end], raw=False)
                del buffer[:end]
                self.on_frame(value)
                if self.lost is not None:
                    break  # NOTE: the frame ended the connection: nothing after it is read
        except (ValueError, TypeError, msgpack.UnpackException) as e:
            # NOTE: a malformed frame ends the connection; the other side sees it end
            self.abort(f"{type(e).__name__}: {e}")
        if self.on_read is not None and self.lost is None:
            self.on_read()

    def abort(self, reason: str) -> None:
        """End the connection now (its pending writes dropped), for ``reason``."""
        if self.lost is None:
            self.lost = reason
        if self.transport is not None:
            self.transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost is None:
            self.lost = "the connection ended" if exc is None else f"{type(exc).__name__}: {exc}"
        for waiter in self._drained:
            if not waiter.done():
                waiter.set_exception(ConnectionResetError(self.lost))
        self._drained.clear()
        self.on_lost(self.lost)

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        if self.reading_paused and self.transport is not None:
            self.reading_paused = False
            self.transport.resume_reading()
        for waiter in self._drained:
            if not waiter.done():
                waiter.set_result(None)
        self._drained.clear()

    async def flush(self) -> None:
        """Wait for the socket to drain when the write buffer holds more than
        :data:`_FLUSH_AT` (raises ``ConnectionResetError`` once the connection ended)."""
        transport = self.transport
        if self.lost is not None:
            raise ConnectionResetError(self.lost)
        if transport is None or transport.get_write_buffer_size() <= _FLUSH_AT:
            return
        while self._paused:
            waiter = asyncio.get_running_loop().create_future()
            self._drained.append(waiter)
            await waiter


class LaneServer:
    """The actor's side: calls from authenticated connections, each run as its own task on
    the loop the server was started on (so calls overlap as concurrent actor calls do).

    With ``inline``, ``handler`` is an :data:`InlineHandler`, for an actor whose calls never
    wait (the gate's: each runs to completion under its lock). Each call then runs in the
    callback that read its frame, with no task of its own, and the replies to the calls of
    one read leave in one write once all of them have run. Calls that arrive together (the
    branches of a busy run) are answered without a turn of the loop per call or a system
    call per reply. While the replies wait for the socket to drain, the connection reads no
    more calls.
    """

    def __init__(self, handler: Handler | InlineHandler, *, inline: bool = False) -> None:
        self._handler = handler
        self.inline = inline
        self._tokens: set[bytes] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task] = set()
        self._connections: set[_Frames] = set()
        self.address: tuple[str, int] | None = None

    async def start(self, host: str) -> tuple[str, int]:
        """Listen on ``host`` at a free port (once); returns the address."""
        if self._server is None:
            loop = asyncio.get_running_loop()
            self._server = await loop.create_server(lambda: self._connection(loop), host, 0)
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
        for connection in list(self._connections):
            if connection.transport is not None:
                connection.transport.close()

    def _connection(self, loop: asyncio.AbstractEventLoop) -> _Frames:
        """A new connection: its first frame must be an allowed token, within
        :data:`OPEN_TIMEOUT_S`; every later one is a call ``[call_id, method, argument]``."""
        allowed = False

        def on_frame(frame: Any) -> None:
            nonlocal allowed
            if not allowed:
                timer.cancel()
                if not isinstance(frame, bytes) or not any(
                        hmac.compare_digest(frame, t) for t in self._tokens):
                    connection.abort("a wrong token")
                    return
                allowed = True
                self._write(connection, _frame(b"ok"))
                return
            if type(frame) is not list or len(frame) != 3:
                connection.abort("a malformed call")
                return
            if self.inline:
                replies.append(self._run_inline(*frame))
                return
            task = loop.create_task(self._call(connection, *frame))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

        def on_read() -> None:
            if not replies:
                return
            self._write(connection, b"".join(replies))
            replies.clear()
            transport = connection.transport
            if (transport is not None and not transport.is_closing()
                    and transport.get_write_buffer_size() > _FLUSH_AT):
                connection.reading_paused = True  # NOTE: until resume_writing
                transport.pause_reading()

        def on_lost(_reason: str) -> None:
            timer.cancel()
            self._connections.discard(connection)

        replies: list[bytes] = []  # NOTE: inline: this read's replies, written at its end
        connection = _Frames(on_frame, on_lost, on_read if self.inline else None)
        timer = loop.call_later(OPEN_TIMEOUT_S, connection.abort, "no token in time")
        self._connections.add(connection)
        return connection

    def _run_inline(self, call_id: int, method: str, arg: Any) -> bytes:
        """One call run now, by an inline handler: its reply frame."""
        try:
            reply = [call_id, 0, self._handler(method, arg)]
        except Exception as e:  # NOTE: the handler's error goes back to the caller
            reply = [call_id, 1, error_row(e)]
        return _reply_frame(call_id, reply)

    @staticmethod
    def _write(connection: _Frames, frame: bytes) -> None:
        transport = connection.transport
        if transport is not None and not transport.is_closing():
            transport.write(frame)

    async def _call(self, connection: _Frames, call_id: int, method: str, arg: Any) -> None:
        try:
            reply = [call_id, 0, await self._handler(method, arg)]
        except Exception as e:  # NOTE: the handler's error goes back to the caller
            reply = [call_id, 1, error_row(e)]
        self._write(connection, _reply_frame(call_id, reply))
        with contextlib.suppress(ConnectionError, OSError):
            await connection.flush()


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

    def __init__(self, name: str, connection: _Frames, errors: Errors) -> None:
        self.name, self._errors = name, errors
        self._connection = connection
        self._ids = itertools.count()
        self._pending: dict[int, asyncio.Future] = {}
        self.broken: str | None = None
        self.calls = 0
        self.loop = asyncio.get_running_loop()  # NOTE: a lane serves callers on this loop only
        connection.on_frame, connection.on_lost = self._reply, self._break
        # NOTE: a task that only waits, so that the loop's end (``asyncio.run`` cancels what
        # is left) closes the connection while the loop can still run its callbacks
        self._ended = self.loop.create_future()
        self._guard = self.loop.create_task(self._close_at_loop_end(), name=f"lane {name}")
        if connection.lost is not None:
            self._break(connection.lost)

    @classmethod
    async def connect(cls, name: str, host: str, port: int, token: bytes,
                      errors: Errors) -> Lane:
        """A lane to the actor listening at ``host:port``, authenticated by ``token``."""
        loop = asyncio.get_running_loop()
        hello: asyncio.Future = loop.create_future()

        def first(frame: Any) -> None:
            if not hello.done():
                hello.set_result(frame)

        def lost(reason: str) -> None:
            if not hello.done():
                hello.set_exception(ConnectionError(f"{name} ended the lane: {reason}"))

        transport, connection = await loop.create_connection(
            lambda: _Frames(first, lost), host, port)
        try:
            transport.write(_frame(token))
            if await hello != b"ok":
                raise ConnectionError(f"{name} refused the lane's token")
        except BaseException:
            transport.close()
            raise
        return cls(name, connection, errors)

    async def call(self, method: str, arg: Any, request_id: str = "") -> Any:
        """``method(arg)`` on the actor; raises what its handler raised (through ``errors``),
        or :class:`LaneBroken`."""
        reply = self.send(method, arg)
        try:
            await self._connection.flush()
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
        transport = self._connection.transport
        if transport is None or transport.is_closing():
            self._break("the connection is closing")
            raise LaneBroken(self.broken or "closed")
        reply = self._pending[call_id] = self.loop.create_future()
        transport.write(frame)
        self.calls += 1
        return reply

    def _reply(self, reply: Any) -> None:
        """A reply frame, as the connection reads it: its caller's future is done now."""
        if type(reply) is not list or len(reply) != 3:
            self._connection.abort(f"a malformed reply from {self.name}")
            return
        call_id, status, payload = reply
        future = self._pending.pop(call_id, None)
        if future is not None and not future.done():
            future.set_result((status, payload))

    async def _close_at_loop_end(self) -> None:
        try:
            await self._ended
        finally:
            self._break("the event loop ended")

    def _break(self, reason: str) -> None:
        if self.broken is None:
            self.broken = reason
        pending, self._pending = self._pending, {}
        if self.loop.is_closed():
            return  # NOTE: nothing can run on it any more (its end closed the connection)
        for future in pending.values():
            if not future.done():
                future.set_exception(LaneBroken(reason))
        if not self._ended.done():
            self._ended.set_result(None)
        if self._connection.transport is not None:
            self._connection.transport.close()

    def close(self) -> None:
        """End the connection; calls in flight raise :class:`LaneBroken`."""
        self._break("closed")
