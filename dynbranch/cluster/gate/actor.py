"""C3's central gate as a Ray actor: one :class:`Gate`, checkpointed call by call.

:class:`GateActor` is a plain class; :meth:`GateDeployment.start
<dynbranch.cluster.gate.deployment.GateDeployment.start>` makes it remote with
``max_restarts=-1``: when its process dies, Ray re-runs ``__init__`` with the same
arguments, and ``__init__`` rebuilds the gate from its checkpoint
(:class:`~dynbranch.cluster.gate.journal.GateCheckpoint`).

Every mutating call (``generation``, ``admit``, ``decide``, ``release``, ``learn``,
``abandon``) is
journaled with its inputs *after* it is applied and *before* its reply leaves the actor;
a snapshot is written every :data:`SNAPSHOT_EVERY` journal entries and on
:meth:`GateActor.checkpoint`. The gate is pure and deterministic, so snapshot + journal
replay restores exactly the state the dead incarnation had after its last acknowledged
call: posteriors, returns, counters, the RNG and the outstanding reservations (a receipt
taken before a crash can be released after it). NOTE: a full snapshot costs milliseconds
once the ledger remembers its 4,096 released receipts and the log its 512 replies, far too
much per decision; one journal line costs microseconds. So every call is durable, and
snapshots only bound the replay (at most :data:`SNAPSHOT_EVERY` calls, well under a
second). While a snapshot is taken no call is answered, so it is kept short: each
remembered receipt's and reply's row is built and packed once, when it is released or
remembered, and a snapshot joins them with the rest of the gate's state
(:class:`~dynbranch.cluster.gate.journal.Packed`). In ``bench_gate_ray.py`` that took a
snapshot from 6.8-8.9 ms to 1.9-2.1 ms on average. A snapshot that cannot be written (a full
disk) fails no call: the journal keeps every entry, the actor's stats say why, and the
next is tried :data:`SNAPSHOT_EVERY` entries later.

Every deciding or learning call carries a call id, and the actor answers a repeated id from
its log instead of deciding again, so a client's retry after a lost reply neither reserves
twice nor learns twice (the log is part of the checkpoint).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import math
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

from dynbranch.cluster.gate.codec import (
    decode_candidate,
    decode_observation,
    decode_receipt,
    decode_reply,
    decode_settlement,
    encode_reply,
    journal_args,
)
from dynbranch.cluster.gate.journal import FORMAT, GateCheckpoint, Packed, pack
from dynbranch.cluster.gate.lane import LANE_METHODS
from dynbranch.cluster.stream import LaneServer, listen
from dynbranch.errors import ConfigError, DynBranchError
from dynbranch.gate import (
    Admission,
    Candidate,
    ContentionModel,
    Gate,
    GateConfig,
    GenerationDecision,
    LoadView,
    Observation,
    Reservation,
    Settlement,
)
from dynbranch.gate.client import BranchDecision, apply_learning

SNAPSHOT_EVERY = 1024
"""Journal entries between two snapshots (bounds the replay after a crash)."""
_CLOSED = GenerationDecision(False, math.nan)
CALLS_KEPT = 512
"""Recent call replies the actor keeps to answer a retried call id (with the checkpoint)."""


class GateActor:
    """One :class:`Gate` behind async methods, checkpointed call by call (see the module doc).

    A plain class: :meth:`GateDeployment.start` makes it remote, as a
    :func:`~dynbranch.cluster.threaded.threaded` actor. Its methods never ``await``, so each
    runs to completion, and the journal's order is the order in which the gate saw the calls. ``generation``, ``admit``, ``decide`` and ``learn`` take a
    ``call_id``: a repeated id is answered from the call log without touching the gate.
    """

    def __init__(
        self,
        model: ContentionModel,
        config: GateConfig,
        directory: str,
        *,
        snapshot_every: int = SNAPSHOT_EVERY,
        freeze_heap: bool = False,
    ) -> None:
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self._checkpoint = GateCheckpoint(directory)
        self._snapshot_every = snapshot_every
        # NOTE: each remembered reply with its snapshot row, encoded and packed once when it
        # is remembered: a snapshot joins the packed rows instead of encoding 512 replies
        # (0.7 ms of a 3.9 ms snapshot in process) and packing them while no call is answered
        self._calls: OrderedDict[str, tuple[str, Any, bytes]] = OrderedDict()
        self.gate = Gate(model, config)
        self._seq = self._snapshot_seq = 0
        self._counts: dict[str, float] = {
            "snapshots": 0, "duplicates": 0, "replayed": 0, "snapshot_failures": 0,
            # NOTE: how long the snapshots took (no call is answered meanwhile)
            "snapshot_ms_last": 0.0, "snapshot_ms_max": 0.0, "snapshot_ms_total": 0.0,
        }
        # NOTE: ordinary calls run on Ray's task thread, lane calls on the compiled graph's
        # own thread (:mod:`~dynbranch.cluster.gate.lane`); both take this lock, so each
        # call still runs to completion, one at a time.
        self._lock = threading.RLock()
        self._stream: LaneServer | None = None  # the stream lane's listener (open_stream)
        self.restored = self._restore(model, config)
        self._snapshot_due = self._snapshot_seq + snapshot_every
        self._snapshot_error = ""  # NOTE: why the last snapshot failed, if one did
        self.gate.ledger.encode_rows_with(pack)  # NOTE: for the snapshots (see _save)
        self._freeze_heap = freeze_heap
        self._freeze()

    def _freeze(self) -> None:
        """Move what the process holds now out of the cyclic collector's reach, if asked to.

        NOTE: called once built, and once a lane has opened: what exists then (Ray's
        worker, the modules, the restored gate, a lane's machinery) lives as long as the
        actor, and a full collection that walks it answers no call meanwhile. In a plain
        process holding a gate after 20,000 decisions, a full collection took 23-26 ms;
        frozen, 0.6-1.0 ms. In ``bench_gate_ray.py``, snapshots that met a full collection
        after the compiled-graph lane opened (135,000 more objects) took 70-88 ms. Frozen
        objects are still freed when nothing refers to them; only a cycle among them would
        stay. The deployment asks for it; a plain GateActor in another process (a test's)
        leaves that process's collector alone.
        """
        if self._freeze_heap:
            gc.freeze()

    # -- the GateClient's calls ------------------------------------------------------------

    async def generation(self, call_id: str, coordinate: str, now: float) -> GenerationDecision:
        """Action 0 for ``coordinate`` at ``now``."""
        return self._answer("generation",
                            *journal_args("generation", (call_id, coordinate, now)))

    async def admit(
        self,
        call_id: str,
        coordinate: str,
        candidates: Sequence[Candidate],
        view: LoadView,
        now: float,
    ) -> list[Admission]:
        """Action 1; an id the client has abandoned (see :meth:`abandon`) admits nothing."""
        return self._answer("admit", *journal_args("admit", (call_id, coordinate, candidates,
                                                             view, now)))

    async def decide(
        self, call_id: str, coordinate: str, rows: Sequence[list], view: Sequence[float],
        now: float,
    ) -> BranchDecision:
        """Action 0 and, if it opens, Action 1 in one call (one journal entry): what
        ``generation`` then ``admit`` would answer with no call between them.

        ``rows`` are the candidates as :func:`~dynbranch.cluster.gate.codec.encode_candidate`
        writes them and ``view`` is :meth:`LoadView.as_tuple`: the client encodes once, and
        the journal keeps what arrived (nothing is encoded again here).
        """
        return self._answer("decide", *journal_args("decide", (call_id, coordinate, rows, view,
                                                               now)))

    async def release(self, reservations: Sequence[Reservation]) -> int:
        """Return receipts to the ledger; how many it still held."""
        return self._answer("release", *journal_args("release", (reservations,)))

    async def learn(
        self,
        call_id: str,
        observations: Sequence[Observation],
        settlements: Sequence[Settlement],
    ) -> None:
        """Posterior observations and settled branch returns, applied as one call."""
        self._answer("learn", *journal_args("learn", (call_id, observations, settlements)))

    async def abandon(self, call_ids: Sequence[str]) -> int:
        """Admits whose replies a client gave up on: release what they reserved, and make
        any of them that has not run yet admit nothing. Returns how many receipts that freed."""
        return self._answer("abandon", *journal_args("abandon", (call_ids,)))

    async def open_stream(self, token: bytes) -> list:
        """Listen for a stream lane (:mod:`dynbranch.cluster.stream`) on this node, once, on
        a thread of its own, and let a connection that first sends ``token`` in; returns the
        listener's address.

        Its calls are :data:`~dynbranch.cluster.gate.lane.LANE_METHODS` with their journal
        rows (``[call_id, args]``, what the methods above build) and their replies come back
        as :func:`~dynbranch.cluster.gate.codec.encode_reply` rows: they take the actor's lock
        like every call, so each still runs to completion, one at a time.
        """
        if self._stream is None:
            # NOTE: inline: a gate call never waits, so it runs where its frame is read, and
            # the replies to the calls of one read leave in one write
            self._stream = LaneServer(self._stream_run, inline=True)
        address = await listen(self._stream, token, in_thread=True)
        self._freeze()
        return address

    def _stream_run(self, op: str, arg: list) -> Any:
        """One stream-lane call: ``op`` with its journal rows, as the methods above run it."""
        if op not in LANE_METHODS:
            raise ValueError(f"{op!r} does not go through the gate lane")
        reply = self._answer(op, *arg)
        return encode_reply(op, reply) if op in ("generation", "admit", "decide") else reply

    def _answer(self, op: str, call_id: str | None, rows: list) -> Any:
        """``op`` run with its journal rows, answered as the call answers."""
        reply = self._run(op, call_id, rows)
        if op == "decide" and not isinstance(reply, BranchDecision):
            # NOTE: an id abandoned before it ran is answered from the log with no
            # admissions (and nothing decided); its client has stopped waiting
            return BranchDecision(_CLOSED)
        return reply

    def lane(self, request: tuple[str, Sequence[Any]]) -> tuple[bool, Any]:
        """One call of the compiled-graph lane (:mod:`~dynbranch.cluster.gate.lane`):
        ``request`` is ``(method, args)`` for one of the calls above; the reply is
        ``(True, what the call returns)``, or ``(False, the error it raised)`` so that a bad
        input reaches its caller without breaking the channel.

        NOTE: a plain method. Under :func:`~dynbranch.cluster.threaded.threaded` (as Ray
        runs it) the call it names is plain too; on the plain class it is a coroutine that
        never suspends, driven to completion here.
        """
        method, args = request
        try:
            if method not in LANE_METHODS and method != "ping":  # NOTE: ping opens a lane
                raise ValueError(f"{method!r} does not go through the gate lane")
            if method == "ping":
                self._freeze()
            reply = getattr(self, method)(*args)
            if inspect.iscoroutine(reply):
                try:
                    reply.send(None)
                except StopIteration as done:
                    return True, done.value
                reply.close()
                raise RuntimeError(f"GateActor.{method} suspended")
            return True, reply
        except Exception as e:  # NOTE: returned, not raised: the channel stays open
            return False, e

    # -- inspection and checkpoints --------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """``reserved_blocks`` and the gate's counters (as the local client reports them),
        plus this incarnation's checkpoint counters under ``checkpoint``."""
        with self._lock:
            return self._stats()

    def _stats(self) -> dict[str, Any]:
        return {
            "reserved_blocks": self.gate.reserved_blocks,
            **self.gate.counters,
            "checkpoint": {
                **self._counts,
                "seq": self._seq,
                "restored": self.restored,
                "snapshot_seq": self._snapshot_seq,
                "snapshot_error": self._snapshot_error,
                "directory": str(self._checkpoint.directory),
            },
        }

    async def state(self) -> dict[str, Any]:
        """:meth:`Gate.state` of the gate as it is now."""
        with self._lock:
            return self.gate.state()

    async def checkpoint(self) -> dict[str, int]:
        """Write a snapshot now; returns the journal position it covers and its size (and
        raises what stopped the write, if anything did)."""
        with self._lock:
            return {"seq": self._seq, "bytes": self._save()}

    async def ping(self) -> int:
        """The journal position (cheap: answers once the actor is up)."""
        return self._seq

    # -- the journal -----------------------------------------------------------------------

    def _run(self, op: str, call_id: str | None, args: list) -> Any:
        with self._lock:
            return self._run_locked(op, call_id, args)

    def _run_locked(self, op: str, call_id: str | None, args: list) -> Any:
        if call_id is not None and call_id in self._calls:
            self._counts["duplicates"] += 1
            return self._calls[call_id][1]
        self._seq += 1
        entry = [self._seq, op, call_id, args]
        try:
            return self._apply(entry)
        finally:
            # NOTE: journaled even when the call raised (bad input): replay raises the same
            # error at the same point, so the replayed state matches whatever it changed.
            self._checkpoint.append(entry)
            if self._seq >= self._snapshot_due:
                try:
                    self._save()
                except OSError as e:  # NOTE: the call was applied and journaled; it stands
                    self._counts["snapshot_failures"] += 1
                    self._snapshot_error = f"{type(e).__name__}: {e}"
                    self._snapshot_due = self._seq + self._snapshot_every

    def _apply(self, entry: list) -> Any:
        _, op, call_id, args = entry
        reply = getattr(self, f"_apply_{op}")(*args)
        if call_id is not None:
            self._remember(call_id, op, reply)
        return reply

    def _apply_generation(self, coordinate: str, now: float) -> GenerationDecision:
        return self.gate.generation(coordinate, now)

    def _apply_admit(self, coordinate: str, rows: list, view: list, now: float) -> list[Admission]:
        return self.gate.admit(
            coordinate, [decode_candidate(r) for r in rows], LoadView(*view), now
        )

    def _apply_decide(self, coordinate: str, rows: list, view: list, now: float
                      ) -> BranchDecision:
        generation = self.gate.generation(coordinate, now)
        if not generation.open:
            return BranchDecision(generation)
        return BranchDecision(generation, tuple(self._apply_admit(coordinate, rows, view, now)))

    def _apply_release(self, receipts: list) -> int:
        return sum(self.gate.release(decode_receipt(r)) for r in receipts)

    def _apply_learn(self, observations: list, settlements: list) -> None:
        apply_learning(
            self.gate,
            [decode_observation(row) for row in observations],
            [decode_settlement(row) for row in settlements],
        )

    def _apply_abandon(self, call_ids: list) -> int:
        freed = 0
        for call_id in call_ids:
            kind, reply, _ = self._calls.get(call_id, ("", None, None))
            if kind == "decide":
                kind, reply = "admit", reply.admissions
            if kind == "admit":
                freed += sum(self.gate.release(a.reservation) for a in reply if a.admitted)
            elif not kind:
                self._remember(call_id, "abandoned", [])
        return freed

    def _remember(self, call_id: str, kind: str, reply: Any) -> None:
        self._calls[call_id] = (kind, reply, pack([call_id, kind, encode_reply(kind, reply)]))
        if len(self._calls) > CALLS_KEPT:
            self._calls.popitem(last=False)

    # -- snapshots and restore -------------------------------------------------------------

    def _save(self) -> int:
        """Write a snapshot of the gate as it is now; returns its size in bytes."""
        t0 = time.perf_counter()
        state = self.gate.state()
        state["ledger"]["released"] = Packed(self.gate.ledger.encoded_released())
        calls = Packed([row for _, _, row in self._calls.values()])
        nbytes = self._checkpoint.save(
            {"format": FORMAT, "seq": self._seq, "gate": state, "calls": calls}
        )
        self._snapshot_seq = self._seq
        self._snapshot_due = self._seq + self._snapshot_every
        ms = (time.perf_counter() - t0) * 1e3
        counts = self._counts
        counts["snapshots"] += 1
        counts["snapshot_ms_last"] = ms
        counts["snapshot_ms_max"] = max(counts["snapshot_ms_max"], ms)
        counts["snapshot_ms_total"] += ms
        return nbytes

    def _restore(self, model: ContentionModel, config: GateConfig) -> bool:
        """Rebuild the gate from the checkpoint, if there is one; whether there was."""
        snapshot, entries = self._checkpoint.load()
        if snapshot is not None:
            self._load_snapshot(snapshot, model, config)
        for entry in entries:
            # NOTE: the same errors the live call raised (and reported) when it ran.
            with contextlib.suppress(ValueError, DynBranchError):
                self._apply(entry)
            self._seq = entry[0]
        self._counts["replayed"] = len(entries)
        return snapshot is not None or bool(entries)

    def _load_snapshot(
        self, snapshot: dict[str, Any], model: ContentionModel, config: GateConfig
    ) -> None:
        if snapshot.get("format") != FORMAT:
            raise ValueError(
                f"gate checkpoint format {snapshot.get('format')!r}, expected {FORMAT}"
            )
        gate = Gate.from_state(snapshot["gate"])
        if gate.model != model or gate.config != config:
            raise ConfigError(
                f"the gate checkpoint in {self._checkpoint.directory} belongs to "
                f"another gate (config {gate.config}, not {config})"
            )
        self.gate = gate
        for call_id, kind, row in snapshot["calls"]:
            self._calls[call_id] = (kind, decode_reply(kind, row), pack([call_id, kind, row]))
        self._seq = self._snapshot_seq = snapshot["seq"]
