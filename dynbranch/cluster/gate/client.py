"""The priced policy's client of the central gate actor: retries, then degrades.

:class:`RayGateClient` retries a call that fails because the actor is restarting, within a
:class:`RetryPolicy`, then *degrades*: ``generation`` answers closed, ``admit`` refuses
every candidate (reason :data:`UNAVAILABLE`); ``release``, ``learn`` and the abandonment of
a degraded ``admit`` are queued and sent once the gate answers again. A gate outage
therefore costs fills, never a request, and never admits an unpriced fill. Each deciding
or learning call carries a fresh call id, which the actor uses to answer a retry from its
log (:mod:`~dynbranch.cluster.gate.actor`).

With ``stream=True`` (the Ray backend's default) the calls that decide or change the gate
go over a stream lane (:mod:`~dynbranch.cluster.stream`, one TCP connection to the actor,
idle at no cost); with ``lane=True`` over a compiled-graph channel
(:mod:`~dynbranch.cluster.gate.lane`, which keeps a core busy). Either carries them while it
works, and the plain way (with the retries above, under the same call ids) from the first
call it fails on.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import itertools
import math
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynbranch import errors
from dynbranch.cluster.gate.codec import decode_reply, encode_candidate, journal_args
from dynbranch.cluster.gate.lane import GateLane, LaneBroken, fits_lane
from dynbranch.cluster.stream import Lane, Unsendable, open_lane
from dynbranch.cluster.stream import LaneBroken as StreamBroken
from dynbranch.gate import (
    Admission,
    Candidate,
    GenerationDecision,
    LoadView,
    Observation,
    Settlement,
)
from dynbranch.gate.client import BranchDecision, GateClient

if TYPE_CHECKING:
    from ray.actor import ActorHandle

PENDING_LEARN_MAX = 4096
"""Calls a client queues while the gate is down before it drops the oldest learning batch."""
STREAM_RETRY_S = 5.0
"""Seconds after a stream broke or did not open before the client tries to open it again."""
UNAVAILABLE = "gate_unavailable"
"""The refusal reason of a candidate the gate could not be asked about."""


@dataclass(frozen=True)
class RetryPolicy:
    """How long a client keeps asking a restarting gate before it degrades a call.

    NOTE: a decision takes well under a millisecond, and Ray restarts the actor in about a
    second (a new worker process, then the restore); the bounds are sized so an outage
    costs a branch at most ``deadline_s``, and later branches nothing while ``cooldown_s``
    lets the actor come back.
    """

    call_timeout_s: float = 0.5  # one attempt
    deadline_s: float = 1.0  # all attempts of one call
    backoff_s: float = 0.05  # first pause between attempts; doubles each time
    cooldown_s: float = 0.5  # after a call degrades, answer locally this long without asking
    startup_timeout_s: float = 60.0  # the actor's first start (a worker process and imports)

    def __post_init__(self) -> None:
        bad = [f"{k}={v!r}" for k, v in vars(self).items() if not (math.isfinite(v) and v >= 0)]
        if bad or self.call_timeout_s <= 0:
            raise ValueError(f"invalid RetryPolicy: {', '.join(bad) or 'call_timeout_s <= 0'}")


class _Unavailable(Exception):
    """The gate did not answer within the retry policy."""


class RayGateClient(GateClient):
    """A :class:`GateClient` over the central :class:`GateActor` (see the module doc).

    What must reach the gate eventually (releases, learning, abandoned admits) goes through
    one FIFO queue, sent by ``release``, ``learn``, ``stats`` and ``close``; what cannot
    wait (Actions 0 and 1) is asked directly and degrades. The client owns no actor (the
    backend kills it at shutdown). NOTE: its timeouts read the wall clock
    (``time.monotonic``): they bound real RPCs, and the Ray backend runs on the real clock
    only.
    """

    batches_decisions = True

    def __init__(self, actor: ActorHandle, policy: str, retry: RetryPolicy | None = None,
                 *, lane: bool = False, stream: bool = False) -> None:
        self._actor, self.policy = actor, policy
        self.retry = retry or RetryPolicy()
        self._ids = (f"{uuid.uuid4().hex[:12]}:{i}" for i in itertools.count())
        self._ready = actor.ping.remote()
        self._down_until = 0.0
        self._pending: list[tuple[str, tuple]] = []
        self.wants_lane = lane
        self._lane: GateLane | None = None  # opened once the actor first answers
        self.wants_stream = stream and not lane
        self._stream: Lane | None = None  # a stream lane (cluster/stream.py), opened likewise
        self._stream_retry_at = 0.0  # no reopening before (a broken or unopened stream)
        self._reopening: asyncio.Task | None = None
        self.lane_error: str | None = None  # why the lane broke or did not open
        self.counts = dict.fromkeys(
            (
                "calls",
                "retries",
                "degraded_generation",
                "degraded_admit",
                "degraded_decide",
                "learn_dropped",
                "lane_calls",
                "lane_broken",
                "lane_unopened",
                "stream_calls",
                "stream_broken",
                "stream_unopened",
                "stream_reopened",
            ),
            0,
        )

    async def generation(self, coordinate: str, now: float) -> GenerationDecision:
        """Action 0; closed (no fills) while the gate cannot answer."""
        if not self._down():
            try:
                return await self._call("generation", next(self._ids), coordinate, now)
            except _Unavailable:
                pass
        self.counts["degraded_generation"] += 1
        return GenerationDecision(False, math.nan)

    async def admit(
        self, coordinate: str, candidates: Sequence[Candidate], view: LoadView, now: float
    ) -> list[Admission]:
        """Action 1; every candidate refused (:data:`UNAVAILABLE`) while the gate cannot answer."""
        if not self._down():
            call_id = next(self._ids)
            try:
                return await self._call("admit", call_id, coordinate, list(candidates), view, now)
            except _Unavailable:
                # NOTE: the call may still have run (its reply lost) or run later; abandoning
                # its id releases what it reserved, or makes it admit nothing.
                self._pending.append(("abandon", ([call_id],)))
        self.counts["degraded_admit"] += 1
        return [
            Admission(c.name, c.rank, 0.0, 0.0, 0.0, c.gain_ms, 0.0, 0.0, UNAVAILABLE)
            for c in candidates
        ]

    async def decide(
        self, coordinate: str, candidates: Sequence[Candidate], view: LoadView, now: float
    ) -> BranchDecision:
        """Actions 0 and 1 in one round trip; closed (no fills) while the gate cannot answer.

        NOTE: the candidates travel as codec rows and the view as its tuple, encoded once
        here: the actor journals what arrives, and rows pickle smaller and faster than the
        dataclasses they stand for.
        """
        if not self._down():
            call_id = next(self._ids)
            rows = [encode_candidate(c) for c in candidates]
            try:
                return await self._call("decide", call_id, coordinate, rows, view.as_tuple(), now)
            except _Unavailable:
                self._pending.append(("abandon", ([call_id],)))  # as for a degraded admit
        self.counts["degraded_decide"] += 1
        return BranchDecision(GenerationDecision(False, math.nan))

    async def release(self, reservations: Sequence[Any]) -> int:
        """Returns how many receipts the gate still held; 0 while they wait in the queue."""
        if reservations:
            self._pending.append(("release", (list(reservations),)))
        return await self._flush()

    async def learn(
        self, observations: Sequence[Observation], settlements: Sequence[Settlement]
    ) -> None:
        """Queue one learning call (with a fresh call id) and send the queue if the gate is up."""
        self._pending.append(("learn", (next(self._ids), list(observations), list(settlements))))
        self._bound_queue()
        await self._flush()

    async def stats(self) -> dict[str, Any]:
        """The actor's stats (``reserved_blocks`` None when it cannot answer) and this
        client's counters under ``client``."""
        await self._flush(force=True)
        try:
            got = await self._call("stats")
        except _Unavailable:
            got = {"reserved_blocks": None, "unavailable": True}
        queued = {
            f"pending_{m}": sum(1 for n, _ in self._pending if n == m)
            for m in ("release", "learn", "abandon")
        }
        lane = ({"lane_error": self.lane_error} if self.wants_lane or self.wants_stream
                else {})
        return {**got, "client": {**self.counts, **queued, **lane}}

    async def close(self) -> None:
        """Send what is still queued, if the gate answers; then close the lane."""
        try:
            await self._flush(force=True)
        finally:
            self.close_lane()

    def close_lane(self) -> None:
        """Tear down the compiled-graph lane or the stream lane, if open (later calls go the
        plain way)."""
        lane, self._lane = self._lane, None
        if lane is not None:
            lane.close()
        self._drop_stream()

    def _drop_stream(self) -> None:
        stream, self._stream = self._stream, None
        if stream is not None:
            stream.close()

    # -- internals -------------------------------------------------------------------------

    def _down(self) -> bool:
        return time.monotonic() < self._down_until

    def _bound_queue(self) -> None:
        """Past :data:`PENDING_LEARN_MAX` queued calls, drop the oldest learning batch.

        NOTE: only learning: a dropped release or abandon would leak reserved blocks.
        """
        if len(self._pending) > PENDING_LEARN_MAX:
            oldest = next((i for i, (m, _) in enumerate(self._pending) if m == "learn"), None)
            if oldest is not None:
                del self._pending[oldest]
                self.counts["learn_dropped"] += 1

    async def _flush(self, force: bool = False) -> int:
        """Send the queue in order; returns how many released receipts the gate still held.

        A call the gate refuses (bad input) is dropped and its error raised; the rest of
        the queue stays queued.
        """
        if not self._pending or (self._down() and not force):
            return 0
        todo, self._pending = _merged(self._pending), []
        freed = 0
        for i, (method, args) in enumerate(todo):
            try:
                reply = await self._call(method, *args)
            except _Unavailable:
                self._pending[:0] = todo[i:]
                break
            except BaseException:
                self._pending[:0] = todo[i + 1 :]
                raise
            freed += reply if method == "release" else 0
        return freed

    async def _call(self, method: str, *args: Any) -> Any:
        """The actor's reply, retried through a restart within the policy.

        Raises :class:`_Unavailable` when the policy is spent (and starts the cooldown);
        an error the gate itself raised (bad input) propagates as it would in process.
        """
        from ray.exceptions import RayActorError

        await self._started()
        self.counts["calls"] += 1
        lane = self._lane
        if lane is not None and fits_lane(method, args):
            try:
                reply = lane.call(method, args)
                self.counts["lane_calls"] += 1
                return reply
            except LaneBroken as e:
                # NOTE: the call may have run with its reply lost; sent again below, the
                # gate answers it from its call log (or releases nothing twice).
                self.counts["lane_broken"] += 1
                self.lane_error = str(e)
                self.close_lane()
        stream = self._stream
        if stream is not None and stream.loop is not asyncio.get_running_loop():
            # NOTE: a client driven from a new event loop (one ``asyncio.run`` after another)
            # opens its stream again on it: a stream belongs to the loop that opened it
            self._drop_stream()
            await self._open_stream()
            stream = self._stream
        if stream is not None and fits_lane(method, args):
            try:
                # NOTE: a timeout on this task, not wait_for: wait_for runs the call as a task
                # of its own, which sends a turn of the loop late and answers two turns late
                async with asyncio.timeout(self.retry.call_timeout_s):
                    reply = await stream.call(method, journal_args(method, args))
                self.counts["stream_calls"] += 1
                return _stream_reply(method, reply)
            except Unsendable:
                pass  # NOTE: this call goes the plain way; the lane stays open
            except (StreamBroken, TimeoutError) as e:
                # NOTE: as for the compiled lane: sent again below under the same call id
                self.counts["stream_broken"] += 1
                self.lane_error = f"{type(e).__name__}: {e}"
                self._drop_stream()
        retry = self.retry
        deadline, pause = time.monotonic() + retry.deadline_s, retry.backoff_s
        while True:
            ref = getattr(self._actor, method).remote(*args)
            left = deadline - time.monotonic()
            try:
                reply = await asyncio.wait_for(ref, max(1e-3, min(retry.call_timeout_s, left)))
                self._reopen_stream()
                return reply
            except (RayActorError, TimeoutError) as e:
                _cancel(ref)
                if time.monotonic() + pause >= deadline:
                    self._down_until = time.monotonic() + retry.cooldown_s
                    raise _Unavailable(f"gate actor: {method} failed: {e!r}") from e
            self.counts["retries"] += 1
            await asyncio.sleep(pause)
            pause *= 2

    async def _started(self) -> None:
        """Wait (up to ``startup_timeout_s``) for the actor's first start.

        NOTE: every caller awaits the same ping until it has answered once: concurrent
        first calls must not spend their per-call timeouts on the worker's start-up.
        """
        from ray.exceptions import RayActorError

        if self._ready is None:
            return
        with contextlib.suppress(RayActorError, TimeoutError):
            await asyncio.wait_for(self._ready, self.retry.startup_timeout_s)
        if self._ready is None:
            return  # NOTE: another caller finished the start-up while this one waited
        self._ready = None
        if self.wants_stream:
            await self._open_stream()
        if self.wants_lane:
            try:
                self._lane = GateLane(self._actor, self.retry.call_timeout_s,
                                      self.retry.startup_timeout_s)
            except Exception as e:  # NOTE: no lane (no compiled graphs, actor down): plain
                self.counts["lane_unopened"] += 1
                self.lane_error = f"{type(e).__name__}: {str(e).strip()[:300]}"

    async def _open_stream(self) -> None:
        try:
            self._stream = await open_lane("the gate", self._actor.open_stream.remote,
                                           _gate_error)
        except Exception as e:  # NOTE: no lane (a closed port, actor down): plain calls
            self.counts["stream_unopened"] += 1
            self.lane_error = f"{type(e).__name__}: {str(e).strip()[:300]}"
            self._stream_retry_at = time.monotonic() + STREAM_RETRY_S

    def _reopen_stream(self) -> None:
        """After a plain call answered (the gate is up), open the stream again in the
        background if it broke, at most once per :data:`STREAM_RETRY_S`."""
        if (not self.wants_stream or self._stream is not None
                or time.monotonic() < self._stream_retry_at
                or (self._reopening is not None and not self._reopening.done())):
            return
        self._stream_retry_at = time.monotonic() + STREAM_RETRY_S
        self.counts["stream_reopened"] += 1
        self._reopening = asyncio.get_running_loop().create_task(self._open_stream())


def _stream_reply(method: str, row: Any) -> Any:
    """The inverse of the actor's encoding of a stream-lane reply."""
    return decode_reply(method, row) if method in ("generation", "admit", "decide") else row


def _gate_error(request_id: str, row: dict[str, Any]) -> Exception:
    """The gate's error (a bad input) raised again as the type it raised, where that is a
    built-in or a :mod:`dynbranch.errors` type taking a message."""
    name, message = row["type"], row["message"]
    kind = getattr(builtins, name, None) or getattr(errors, name, None)
    if isinstance(kind, type) and issubclass(kind, Exception):
        with contextlib.suppress(TypeError):
            return kind(message)
    return RuntimeError(f"{name} in the gate: {message}")


def _merged(todo: list[tuple[str, tuple]]) -> list[tuple[str, tuple]]:
    """``todo`` with each run of consecutive ``release`` calls as one call (one round trip
    for the receipts of every fill that ended since the last flush). NOTE: only adjacent
    ones: a release must not overtake the learning or abandonment queued before it."""
    out: list[tuple[str, tuple]] = []
    for method, args in todo:
        if method == "release" and out and out[-1][0] == "release":
            out[-1] = ("release", (out[-1][1][0] + list(args[0]),))
        else:
            out.append((method, args))
    return out


def _cancel(ref: Any) -> None:
    """Best effort: drop a call that timed out if it has not run (its id makes a late run
    harmless anyway)."""
    import ray
    from ray.exceptions import RayError

    with contextlib.suppress(RayError, TypeError, ValueError):
        ray.cancel(ref)
