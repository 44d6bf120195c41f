"""C3's central gate on Ray: one named actor that survives its own crashes, and its client.

DESIGN.md §2 puts the gate in one place: every orchestrator task asks the same
:class:`~dynbranch.gate.Gate` (its Beta posteriors, per-coordinate returns and KV ledger) for
Actions 0 and 1. (The load envelope the admissions are priced against is observed by the
priced policy in the driver and passed in with each ``admit``; it is soft state, rebuilt by
the load probe within one window, so it is not checkpointed.) On Ray that gate lives in a
:class:`GateActor`, a plain class made remote by :meth:`GateDeployment.start` with
``max_restarts=-1``: when its process dies, Ray re-runs ``__init__`` with the same
arguments, and ``__init__`` rebuilds the gate from its checkpoint.

**The checkpoint** (:class:`GateCheckpoint`) is a directory holding

* ``snapshot.json`` — :meth:`Gate.state` (plus the recent call replies, below) and the
  journal position it covers, written atomically every :data:`SNAPSHOT_EVERY` journal
  entries and on :meth:`GateActor.checkpoint`;
* ``journal.jsonl`` — every mutating call since that snapshot (``generation``, ``admit``,
  ``release``, ``learn``, ``abandon``) with its inputs, appended *after* the call is applied
  and *before* its reply leaves the actor.

The gate is pure and deterministic, so snapshot + journal replay restores exactly the state
the dead incarnation had after its last acknowledged call: posteriors, returns, counters,
the RNG and the outstanding reservations (a receipt taken before a crash can be released
after it). NOTE: a full snapshot costs tens of milliseconds once the ledger remembers its
4,096 released receipts (``Gate.state`` builds every one), far too much per decision; one
journal line costs microseconds. So every call is durable, and snapshots only bound the
replay (at most :data:`SNAPSHOT_EVERY` calls, well under a second).

NOTE on *where*: the directory is run-scoped (a fresh temporary directory by default,
removed at shutdown) and the actor is pinned to the driver's node (a hard node affinity),
so a restarted incarnation always finds the files its predecessor wrote. This survives any
crash of the actor's process; losing the node loses the driver too, and with it the run.
Writes are not fsync'ed for the same reason: a dead process's writes are in the page cache.
To let the gate move between nodes, pass a directory on a shared file system and drop the
pin; Ray's internal KV would also survive, but ``ray.experimental.internal_kv`` is private,
and a detached KV actor would be one more thing to restart and to leak past the job.

**The client** (:class:`RayGateClient`) retries a call that fails because the actor is
restarting, within a :class:`RetryPolicy`, then *degrades*: ``generation`` answers closed,
``admit`` refuses every candidate (reason :data:`UNAVAILABLE`); ``release``, ``learn`` and the
abandonment of a degraded ``admit`` are queued and sent once the gate answers again. A gate
outage therefore costs fills, never a request, and never admits an unpriced fill.
Every deciding or learning call carries a call id, and the actor answers a repeated id from
its log instead of deciding again, so a retry after a lost reply neither reserves twice nor
learns twice (the log is part of the checkpoint).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import math
import os
import shutil
import tempfile
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynbranch.errors import ConfigError, DynBranchError
from dynbranch.gate import (
    Admission,
    BranchReturn,
    Candidate,
    ContentionModel,
    FillShape,
    Gate,
    GateConfig,
    GenerationDecision,
    LoadView,
    Reservation,
)
from dynbranch.gate.client import GateClient, apply_learning
from dynbranch.gate.policy import make_policy

if TYPE_CHECKING:
    from ray.actor import ActorHandle

SNAPSHOT_EVERY = 1024
"""Journal entries between two snapshots (bounds the replay after a crash)."""
CALLS_KEPT = 512
"""Recent call replies the actor keeps to answer a retried call id (with the checkpoint)."""
PENDING_LEARN_MAX = 4096
"""Calls a client queues while the gate is down before it drops the oldest learning batch."""
UNAVAILABLE = "gate_unavailable"
"""The refusal reason of a candidate the gate could not be asked about."""
FORMAT = 1

Observation = tuple[str, int, bool, bool | None]


# -- the wire and the journal: compact, JSON-able rows -------------------------------------------


def _enc_candidate(c: Candidate) -> list:
    s = c.shape
    return [c.name, c.rank, c.stage_key, c.gain_ms,
            [s.prompt_tokens, s.output_tokens, s.context_tokens], c.kv_blocks]


def _dec_candidate(row: list) -> Candidate:
    name, rank, stage_key, gain_ms, shape, kv_blocks = row
    return Candidate(name, rank, stage_key, gain_ms, FillShape(*shape), kv_blocks)


def _enc_receipt(r: Reservation) -> list:
    return [r.ledger, r.reservation_id, r.coordinate, r.candidate, r.blocks, r.reserved_at]


def _enc_admission(a: Admission) -> list:
    receipt = None if a.reservation is None else _enc_receipt(a.reservation)
    return [a.candidate, a.rank, a.p_tilde, a.p_sel, a.p_use, a.gain_ms, a.price_ms,
            a.utility_ms, a.reason, a.audit, receipt]


def _dec_admission(row: list) -> Admission:
    *values, receipt = row
    return Admission(*values, reservation=None if receipt is None else Reservation(*receipt))


def _enc_reply(kind: str, reply: Any) -> Any:
    if kind == "generation":
        return [reply.open, reply.estimate, reply.audit]
    if kind == "admit":
        return [_enc_admission(a) for a in reply]
    return None


def _dec_reply(kind: str, row: Any) -> Any:
    if kind == "generation":
        return GenerationDecision(*row)
    if kind == "admit":
        return [_dec_admission(a) for a in row]
    return [] if kind == "abandoned" else None


def _plain(value: Any) -> Any:
    """JSON's fallback: numpy scalars (a virtual clock's ``now``) as Python numbers."""
    item = getattr(value, "item", None)
    if item is None:
        raise TypeError(f"not JSON-able: {type(value).__name__}")
    return item()


def _dumps(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":"), default=_plain).encode()


# -- the checkpoint ----------------------------------------------------------------------------


class GateCheckpoint:
    """A gate's snapshot and the journal of calls since it, in one directory."""

    SNAPSHOT = "snapshot.json"
    JOURNAL = "journal.jsonl"

    def __init__(self, directory: str | Path) -> None:
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._snapshot = self.directory / self.SNAPSHOT
        self._journal = self.directory / self.JOURNAL
        self._fd: int | None = None

    def load(self) -> tuple[dict[str, Any] | None, list[list]]:
        """The snapshot (None if there is none) and the journal entries written after it.

        NOTE: only the last line can be torn (the process died inside its write); it is cut
        off, so the next incarnation appends after the last whole entry. That entry's call
        was never answered, so dropping it loses nothing a caller was told.
        """
        snapshot = json.loads(self._snapshot.read_bytes()) if self._snapshot.exists() else None
        covered = snapshot["seq"] if snapshot is not None else 0
        data = self._journal.read_bytes() if self._journal.exists() else b""
        whole = data[: data.rfind(b"\n") + 1]
        if len(whole) < len(data):
            os.truncate(self._journal, len(whole))
        entries = [json.loads(line) for line in whole.splitlines()]
        return snapshot, [e for e in entries if e[0] > covered]

    def append(self, entry: list) -> None:
        """Add one entry to the journal (one ``write``: a dying process leaves it whole or torn)."""
        if self._fd is None:
            self._fd = os.open(self._journal, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.write(self._fd, _dumps(entry) + b"\n")

    def save(self, snapshot: dict[str, Any]) -> int:
        """Replace the snapshot atomically, then empty the journal; returns its size in bytes.

        NOTE: a crash between the two leaves entries the snapshot already covers; ``load``
        skips them by sequence number, so none is applied twice.
        """
        data = _dumps(snapshot)
        tmp = self._snapshot.with_suffix(".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, self._snapshot)
        if self._fd is not None:
            os.ftruncate(self._fd, 0)
        elif self._journal.exists():
            os.truncate(self._journal, 0)
        return len(data)


# -- the actor ---------------------------------------------------------------------------------


class GateActor:
    """One :class:`Gate` behind async methods, checkpointed call by call (see the module doc).

    A plain class: :meth:`GateDeployment.start` makes it remote. Its methods never ``await``,
    so each runs to completion on the actor's loop, and the journal's order is the order in
    which the gate saw the calls. ``generation``, ``admit`` and ``learn`` take a ``call_id``:
    a repeated id is answered from the call log without touching the gate.
    """

    def __init__(self, model: ContentionModel, config: GateConfig, directory: str, *,
                 snapshot_every: int = SNAPSHOT_EVERY) -> None:
        if snapshot_every < 1:
            raise ValueError(f"snapshot_every must be >= 1, got {snapshot_every}")
        self._checkpoint = GateCheckpoint(directory)
        self._snapshot_every = snapshot_every
        self._calls: OrderedDict[str, tuple[str, Any]] = OrderedDict()
        self.gate = Gate(model, config)
        self._seq = self._snapshot_seq = 0
        self._counts = {"snapshots": 0, "duplicates": 0, "replayed": 0}
        self.restored = self._restore(model, config)

    # -- the GateClient's calls ------------------------------------------------------------

    async def generation(self, call_id: str, coordinate: str, now: float) -> GenerationDecision:
        return self._run("generation", call_id, [coordinate, now])

    async def admit(self, call_id: str, coordinate: str, candidates: Sequence[Candidate],
                    view: LoadView, now: float) -> list[Admission]:
        """Action 1; an id the client has abandoned (see :meth:`abandon`) admits nothing."""
        rows = [_enc_candidate(c) for c in candidates]
        return self._run("admit", call_id, [coordinate, rows, list(view.as_tuple()), now])

    async def release(self, reservations: Sequence[Reservation]) -> int:
        return self._run("release", None, [[_enc_receipt(r) for r in reservations]])

    async def learn(self, call_id: str, observations: Sequence[Observation],
                    settlements: Sequence[tuple[str, BranchReturn]]) -> None:
        settled = [[c, [r.saved_ms, r.setup_ms, r.fill_cost_ms, r.wait_ms]]
                   for c, r in settlements]
        self._run("learn", call_id, [[list(o) for o in observations], settled])

    async def abandon(self, call_ids: Sequence[str]) -> int:
        """Admits whose replies a client gave up on: release what they reserved, and make
        any of them that has not run yet admit nothing. Returns how many receipts that freed."""
        return self._run("abandon", None, [list(call_ids)])

    # -- inspection and checkpoints --------------------------------------------------------

    async def stats(self) -> dict[str, Any]:
        """``reserved_blocks`` and the gate's counters (as the local client reports them),
        plus this incarnation's checkpoint counters under ``checkpoint``."""
        return {"reserved_blocks": self.gate.reserved_blocks, **self.gate.counters,
                "checkpoint": {**self._counts, "seq": self._seq, "restored": self.restored,
                               "snapshot_seq": self._snapshot_seq,
                               "directory": str(self._checkpoint.directory)}}

    async def state(self) -> dict[str, Any]:
        """:meth:`Gate.state` of the gate as it is now."""
        return self.gate.state()

    async def checkpoint(self) -> dict[str, int]:
        """Write a snapshot now; returns the journal position it covers and its size."""
        return {"seq": self._seq, "bytes": self._save()}

    async def ping(self) -> int:
        """The journal position (cheap: answers once the actor is up)."""
        return self._seq

    # -- the journal -----------------------------------------------------------------------

    def _run(self, op: str, call_id: str | None, args: list) -> Any:
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
            if self._seq - self._snapshot_seq >= self._snapshot_every:
                self._save()

    def _apply(self, entry: list) -> Any:
        _, op, call_id, args = entry
        reply = getattr(self, f"_apply_{op}")(*args)
        if call_id is not None:
            self._remember(call_id, op, reply)
        return reply

    def _apply_generation(self, coordinate: str, now: float) -> GenerationDecision:
        return self.gate.generation(coordinate, now)

    def _apply_admit(self, coordinate: str, rows: list, view: list, now: float) -> list[Admission]:
        return self.gate.admit(coordinate, [_dec_candidate(r) for r in rows], LoadView(*view), now)

    def _apply_release(self, receipts: list) -> int:
        return sum(self.gate.release(Reservation(*r)) for r in receipts)

    def _apply_learn(self, observations: list, settlements: list) -> None:
        apply_learning(self.gate, [tuple(o) for o in observations],
                       [(c, BranchReturn(*r)) for c, r in settlements])

    def _apply_abandon(self, call_ids: list) -> int:
        freed = 0
        for call_id in call_ids:
            kind, reply = self._calls.get(call_id, ("", None))
            if kind == "admit":
                freed += sum(self.gate.release(a.reservation) for a in reply if a.admitted)
            elif not kind:
                self._remember(call_id, "abandoned", [])
        return freed

    def _remember(self, call_id: str, kind: str, reply: Any) -> None:
        self._calls[call_id] = (kind, reply)
        if len(self._calls) > CALLS_KEPT:
            self._calls.popitem(last=False)

    # -- snapshots and restore -------------------------------------------------------------

    def _save(self) -> int:
        calls = [[cid, kind, _enc_reply(kind, reply)] for cid, (kind, reply) in self._calls.items()]
        nbytes = self._checkpoint.save(
            {"format": FORMAT, "seq": self._seq, "gate": self.gate.state(), "calls": calls})
        self._snapshot_seq = self._seq
        self._counts["snapshots"] += 1
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

    def _load_snapshot(self, snapshot: dict[str, Any], model: ContentionModel,
                       config: GateConfig) -> None:
        if snapshot.get("format") != FORMAT:
            raise ValueError(f"gate checkpoint format {snapshot.get('format')!r}, "
                             f"expected {FORMAT}")
        gate = Gate.from_state(snapshot["gate"])
        if gate.model != model or gate.config != config:
            raise ConfigError(f"the gate checkpoint in {self._checkpoint.directory} belongs to "
                              f"another gate (config {gate.config}, not {config})")
        self.gate = gate
        for call_id, kind, row in snapshot["calls"]:
            self._calls[call_id] = (kind, _dec_reply(kind, row))
        self._seq = self._snapshot_seq = snapshot["seq"]


# -- the client --------------------------------------------------------------------------------


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

    def __init__(self, actor: ActorHandle, policy: str,
                 retry: RetryPolicy | None = None) -> None:
        self._actor, self.policy = actor, policy
        self.retry = retry or RetryPolicy()
        self._ids = (f"{uuid.uuid4().hex[:12]}:{i}" for i in itertools.count())
        self._ready = actor.ping.remote()
        self._down_until = 0.0
        self._pending: list[tuple[str, tuple]] = []
        self.counts = dict.fromkeys(("calls", "retries", "degraded_generation",
                                     "degraded_admit", "learn_dropped"), 0)

    async def generation(self, coordinate: str, now: float) -> GenerationDecision:
        """Action 0; closed (no fills) while the gate cannot answer."""
        if not self._down():
            try:
                return await self._call("generation", next(self._ids), coordinate, now)
            except _Unavailable:
                pass
        self.counts["degraded_generation"] += 1
        return GenerationDecision(False, math.nan)

    async def admit(self, coordinate: str, candidates: Sequence[Candidate], view: LoadView,
                    now: float) -> list[Admission]:
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
        return [Admission(c.name, c.rank, 0.0, 0.0, 0.0, c.gain_ms, 0.0, 0.0, UNAVAILABLE)
                for c in candidates]

    async def release(self, reservations: Sequence[Any]) -> int:
        """Returns how many receipts the gate still held; 0 while they wait in the queue."""
        if reservations:
            self._pending.append(("release", (list(reservations),)))
        return await self._flush()

    async def learn(self, observations: Sequence[Observation],
                    settlements: Sequence[tuple[str, BranchReturn]]) -> None:
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
        queued = {f"pending_{m}": sum(1 for n, _ in self._pending if n == m)
                  for m in ("release", "learn", "abandon")}
        return {**got, "client": {**self.counts, **queued}}

    async def close(self) -> None:
        """Send what is still queued, if the gate answers."""
        await self._flush(force=True)

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
        todo, self._pending = self._pending, []
        freed = 0
        for i, (method, args) in enumerate(todo):
            try:
                reply = await self._call(method, *args)
            except _Unavailable:
                self._pending[:0] = todo[i:]
                break
            except BaseException:
                self._pending[:0] = todo[i + 1:]
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
        retry = self.retry
        deadline, pause = time.monotonic() + retry.deadline_s, retry.backoff_s
        while True:
            ref = getattr(self._actor, method).remote(*args)
            left = deadline - time.monotonic()
            try:
                return await asyncio.wait_for(ref, max(1e-3, min(retry.call_timeout_s, left)))
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
        self._ready = None


def _cancel(ref: Any) -> None:
    """Best effort: drop a call that timed out if it has not run (its id makes a late run
    harmless anyway)."""
    import ray
    from ray.exceptions import RayError

    with contextlib.suppress(RayError, TypeError, ValueError):
        ray.cancel(ref)


# -- the backend's handle ----------------------------------------------------------------------


@dataclass
class GateDeployment:
    """The central gate actor of one run, as :class:`~dynbranch.cluster.RayBackend` holds it."""

    actor: ActorHandle
    name: str
    directory: Path
    model: ContentionModel
    config: GateConfig
    owns_directory: bool

    @classmethod
    def start(cls, model: ContentionModel, config: GateConfig,
              directory: str | Path | None = None, *, run_id: str | None = None,
              actor_cls: type[GateActor] = GateActor,
              snapshot_every: int = SNAPSHOT_EVERY) -> GateDeployment:
        """Start the named gate actor of run ``run_id`` (a fresh id by default).

        ``directory`` holds its checkpoint (a new temporary directory, removed by
        :meth:`stop`, by default); ``actor_cls`` is a subclass, for tests.

        NOTE: the actor takes no CPU (bookkeeping between RPCs must not compete with engines
        for a bundle) and is not detached: it is owned by the driver and dies with the job.
        ``max_task_retries=0``: Ray does not resend a call that was in flight at a crash,
        because the client does, with the same call id. Not ``get_if_exists``: the name is
        new per run, so an existing actor under it is a bug to report, not one to reuse with
        whatever arguments it was built from; reuse within a run is the backend's (one
        deployment, checked against the model and config it was started with).
        """
        import ray
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        run_id = run_id or uuid.uuid4().hex[:12]
        owns = directory is None
        path = Path(tempfile.mkdtemp(prefix=f"dynbranch-gate-{run_id}-") if owns else directory)
        name = f"dynbranch-gate-{run_id}"
        here = ray.get_runtime_context().get_node_id()
        actor = ray.remote(actor_cls).options(
            name=name, max_restarts=-1, max_task_retries=0, num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(here, soft=False),
        ).remote(model, config, str(path), snapshot_every=snapshot_every)
        return cls(actor, name, path, model, config, owns)

    def client(self, model: ContentionModel, config: GateConfig,
               retry: RetryPolicy | None = None) -> RayGateClient:
        """A new client of this run's gate, which must be the gate ``model``/``config`` ask for."""
        if model != self.model or config != self.config:
            raise ConfigError(f"run's central gate {self.name} was started with "
                              f"{self.config}; cannot serve {config} (one gate per run)")
        return RayGateClient(self.actor, make_policy(config.policy, config.p_star).name, retry)

    def stop(self) -> None:
        """Kill the actor for good and remove the checkpoint directory if it made it."""
        import ray

        try:
            ray.kill(self.actor, no_restart=True)
        finally:  # NOTE: even when Ray is already gone, the checkpoint must not outlive the run
            if self.owns_directory:
                shutil.rmtree(self.directory, ignore_errors=True)
