"""A fast lane to the gate actor: one Ray Compiled Graph channel instead of an actor call.

An ordinary actor call goes through Ray's task machinery (submit, schedule, reply object):
on this project's 2-core machine its no-op round trip has a p99 of 2–5 ms before the gate
does anything (``scripts/bench_gate_ray.py``). A Ray Compiled Graph (``ray.dag``; beta
since Ray 2.44) sets up a shared-memory channel to one actor method once, and then each
execution writes the request to the channel and reads the reply from another. Measured
on the 2-core machine (``scripts/bench_gate_ray.py``, p50 / p99): ``generation`` 0.10 /
0.35 ms through the lane against 1.25 / 3.68 ms as an actor call and 0.004 / 0.006 ms in
process; a no-op compiled graph on a bare test actor 0.04 / 0.11 ms.

What it costs, and why the lane is opt-in (``dynbranch replay --gate-lane``):

- **A core.** The actor's side of the channel waits for the next request by polling: the
  gate actor's process keeps one CPU core busy for as long as the lane is open, idle or not
  (measured on a bare test actor: 3.0 s of CPU in 3 s idle). On a GPU node with dozens of cores that is the price
  of a sub-millisecond decision; on a 2-core laptop it is half the machine.
- **One caller, one call at a time.** Only the process that compiled the lane may use it,
  and :meth:`GateLane.call` blocks its caller (the driver's event loop) until the reply is
  back: microseconds when the gate answers, :attr:`GateLane.timeout_s` when it does not.
  Calls therefore reach the gate in the order they were made, as the plain path's do.
- **No restart.** A lane does not survive its actor's restart. The first call that fails
  (timeout, channel error) raises :class:`LaneBroken`; the client then closes the lane and
  sends that call, and every later one, the plain way, whose retries and call ids already
  handle a restarting gate (a call that ran but whose reply was lost is answered from the
  gate's call log, not decided twice).

The actor side is :meth:`GateActor.lane <dynbranch.cluster.gate.actor.GateActor.lane>`:
it runs on the compiled graph's own thread, beside the actor's ordinary calls, and both
take the actor's lock, so each call still runs to completion and the journal's order is
the order the gate saw them.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

from dynbranch.errors import DynBranchError

if TYPE_CHECKING:
    from ray.actor import ActorHandle

LANE_METHODS = frozenset({"generation", "admit", "decide", "release", "learn", "abandon"})
"""The gate calls a lane carries: every call that decides or changes the gate. NOTE: all of
them, not just the decisions a branch waits on: an ordinary call the actor runs on its main
thread while its lane thread polls costs both threads the GIL (measured: with releases sent
the ordinary way, the lane's ``decide`` p99 under 16 callers went from 0.9 to 248 ms)."""
LANE_BATCH_MAX = 1024
"""Items (observations and settlements, or receipts, or call ids) past which a call goes the
ordinary way: the train split's history is learnt in one batch of tens of thousands of
observations before the clock starts, longer than a lane call may wait (measured: the gate
learns 10,000 observations in 30 ms in process, and a replay's 56,392-observation warm-up
ran past :data:`LANE_TIMEOUT_S` through the lane); a request's own learning is a few
dozen."""
LANE_TIMEOUT_S = 0.5
"""How long one lane call waits for its reply before the lane counts as broken."""
OPEN_TIMEOUT_S = 30.0
"""How long the lane's first call (a ``ping``) may take: the actor starts its side of the
channel on it (measured: 1.3 s on the 2-core machine, 10 ms on a later lane)."""


def fits_lane(method: str, args: tuple) -> bool:
    """Whether ``method(*args)`` goes through a lane: one of :data:`LANE_METHODS`, and no
    batch of more than :data:`LANE_BATCH_MAX` items."""
    if method not in LANE_METHODS:
        return False
    if method == "learn":  # (call_id, observations, settlements)
        return len(args[1]) + len(args[2]) <= LANE_BATCH_MAX
    if method in ("release", "abandon"):  # (receipts,) or (call_ids,)
        return len(args[0]) <= LANE_BATCH_MAX
    return True


class LaneBroken(DynBranchError):
    """The lane did not deliver a reply (the actor died, restarted or stalled)."""


class GateLane:
    """One compiled-graph channel to a gate actor's ``lane`` method (see the module doc)."""

    def __init__(self, actor: ActorHandle, timeout_s: float = LANE_TIMEOUT_S,
                 open_timeout_s: float = OPEN_TIMEOUT_S) -> None:
        """Compile the channel and wait (up to ``open_timeout_s``) for its first reply;
        :class:`LaneBroken` if none comes."""
        import ray
        from ray.dag import InputNode
        from ray.exceptions import RayError

        if not (timeout_s > 0 and open_timeout_s > 0):
            raise ValueError(f"timeouts must be > 0, got {timeout_s}, {open_timeout_s}")
        self.timeout_s = timeout_s
        with InputNode() as request:
            dag = actor.lane.bind(request)
        self._compiled: Any = dag.experimental_compile(_submit_timeout=timeout_s)
        self.calls = 0
        try:
            ray.get(self._compiled.execute(("ping", ())), timeout=open_timeout_s)
        except (RayError, TimeoutError) as e:
            self.close()
            raise LaneBroken(f"gate lane: no first reply: {type(e).__name__}") from e

    @property
    def open(self) -> bool:
        return self._compiled is not None

    def call(self, method: str, args: tuple) -> Any:
        """The gate's reply to ``method(*args)``; an error the gate raised (bad input) is
        raised here as it would be in process. :class:`LaneBroken` when no reply came."""
        import ray
        from ray.exceptions import RayError

        if self._compiled is None:
            raise LaneBroken("the gate lane is closed")
        if method not in LANE_METHODS:
            raise ValueError(f"{method!r} does not go through the gate lane")
        self.calls += 1
        try:
            ok, value = ray.get(self._compiled.execute((method, args)), timeout=self.timeout_s)
        except (RayError, TimeoutError) as e:
            raise LaneBroken(f"gate lane: {method} got no reply: {type(e).__name__}: "
                             f"{str(e).strip()[:200]}") from e
        if not ok:
            raise value
        return value

    def close(self) -> None:
        """Tear the channel down (idempotent); the actor's thread stops polling."""
        compiled, self._compiled = self._compiled, None
        if compiled is not None:
            # NOTE: best effort: a dead actor's half of the channel is gone already.
            with contextlib.suppress(Exception):
                compiled.teardown()
