"""The engines of each model role, where each call goes, and which engines are down.

:class:`EnginePool` keeps each engine's open-call counts (what placement decides on) and its
health. A fill is placed on the engines' open calls; a canonical call on their open canonical
calls with each open fill weighed at ``fill_load`` (:data:`FILL_LOAD`, half a call by default,
which says what other weights did). An engine is *down* from the moment a call on it raises
:class:`~dynbranch.errors.EngineDied`, its load cannot be read, or a health sweep finds it
not serving, until its health probe answers again (Ray restarts a dead engine actor; the
pool only watches). A down engine gets no calls: placement sees it saturated and the pool
overrides any policy that still picks it; the load view gets an explicit
:class:`~dynbranch.engines.client.DownSnapshot` for it. A call in flight on an engine that
goes down is abandoned (aborted) and, when it is idempotent (a replayed stage, or greedy
decoding: running it twice returns the same text), retried once on another engine;
otherwise, or when the retry dies too, it raises ``EngineDied`` into its request.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial

from dynbranch.clock import Clock
from dynbranch.engines.client import SATURATED, DownSnapshot, EngineClient
from dynbranch.engines.protocol import CANONICAL, GenerateRequest, GenerateResult, LoadSnapshot
from dynbranch.errors import EngineDied, NoEngineError
from dynbranch.runtime.placement import PlacementPolicy

TARGET_ROLE = "target"
"""The model role whose engines serve the workflow's LLM stages and their fills."""
DRAFTER_ROLE = "drafter"
"""The model role of the engines predictors draft on (never serves a stage, never priced)."""
FILL_LOAD = 0.5
"""What one open fill weighs, against one open canonical call, when a canonical call is placed
(the pool's default; :class:`EnginePool` takes another).

A running fill shares every step it is in like a canonical call; a queued one costs canonical
work nothing; and a canonical call blocked on KV waits for running fills to finish (the engine
admits in queue order and preempts only for a running sequence's next block, as vLLM v1).
Measured at weights 0, 0.5 and 1 on 2026-12-07 (virtual clock, ``full``):

* ``fig8``'s full Routing run (200 requests, 3 seeds; ``python -m experiments.fig8 --workload
  routing --jobs 2``). At weight 1 the long multi-turn sessions of 8B/4090 seed 2 at load
  piled onto the one 4090 the fills had left quietest (fills go off their request's engine,
  so the engines they fill look busy): its routers queued 245 s in all (9-21 s on each other
  engine), kept 52 % of their prompts cached against 74-89 %, and ``full``'s p99 was 160.3 s
  against the floor's 118.4 s. 8B/4090 at load, mean and p99 against the floor: weight 1
  −28.6 % / +2.7 ± 28.2 %; 0: −30.5 % / −10.9 ± 3.6 %; 0.5: −31.2 % / −12.0 ± 0.8 %. The other
  cells moved by under 0.3 points in mean.
* ``fig14``'s Routing mix (``dynbranch experiment fig14 --jobs 2``: 1,200 requests, 2 seeds,
  7 rates), weight 0.5 against 1 in the same tree: ``full`` 0.2-1.3 % faster at 0.5, 1, 4 and
  8 req/s, 0.2 % slower at 2, and 2.4 % and 2.6 % slower at 12 and 16 req/s (saturated: mean
  latency 40-45 s), which put it behind ``c1`` there.
* The saturated rates again over 8 seeds (seeds 0-7, 1,200 requests each, the same cells;
  ``python scripts/fig14_saturation.py``, 2026-12-08), ``full``'s latency less ``c1``'s
  (mean over seeds, standard error): at 12 req/s weight 1 +0.27 s (0.27), weight 0.5 +0.73 s
  (0.22); at 16 req/s +0.78 s (0.37) and +0.90 s (0.26). So at saturation ``full`` trails
  ``c1`` by 0.7-2 % at either weight (the 2 seeds above, where weight 1 was ahead, were lucky
  ones), and the weight's own cost there is 0.1-0.5 s in 40-45 s. Pricing every fill 2 or 4
  times higher, or scaling audits by the engines' idle share (a one-off patch of the same
  cells), left ``full`` 0.1-0.5 s behind ``c1`` as well: C3 at saturation stays open.

So 0.5 is the default (since 2026-12-08): it removes a p99 tail worse than the floor's at
realistic load for a cost within noise at saturation. Weight 1 is the placement of every
commit before 08c862f."""


@dataclass(frozen=True)
class HealthPolicy:
    """How the pool watches its engines (seconds on the run clock).

    ``probe_s`` (> 0) is the pause between health probes of a down engine; ``sweep_s``
    (> 0, or ``None``: no sweep) the period of the sweep over every engine that finds one
    which stopped serving without failing a call (a hung actor, a lost node).
    """

    probe_s: float = 0.5
    sweep_s: float | None = 2.0

    def __post_init__(self) -> None:
        if not self.probe_s > 0 or (self.sweep_s is not None and not self.sweep_s > 0):
            raise ValueError(
                f"HealthPolicy needs probe_s > 0 and sweep_s > 0 or None "
                f"(got {self.probe_s}, {self.sweep_s})"
            )


def idempotent(request: GenerateRequest) -> bool:
    """Whether running ``request`` twice returns the same text: a replayed stage (its text is
    the trace's) or greedy decoding."""
    return request.replay_text is not None or request.temperature == 0.0


class _Engine:
    """One engine's place in the pool: its client, open calls (all, and canonical) and
    health."""

    def __init__(self, client: EngineClient) -> None:
        self.client = client
        self.open = 0
        self.canonical = 0  # open calls that run as canonical (sent so, or promoted)
        self.down_reason: str | None = None
        self.gone: asyncio.Future | None = None  # set when it goes down; calls race it
        self.sent: set[asyncio.Future] = set()  # calls sent at once, cancelled if it goes down
        self.probe: asyncio.Task | None = None

    @property
    def up(self) -> bool:
        return self.down_reason is None


class EnginePool:
    """The engines of each model role, with the open-call counts placement decides on.

    ``clock`` paces the health probes (without it, a down engine stays down for the run);
    ``health`` says how often; ``fill_load`` (>= 0) is what an open fill weighs, against an
    open canonical call, when a canonical call is placed (:data:`FILL_LOAD` by default).
    """

    def __init__(
        self,
        clients: Mapping[str, Sequence[EngineClient]],
        placement: Callable[[], PlacementPolicy],
        *,
        clock: Clock | None = None,
        health: HealthPolicy | None = None,
        fill_load: float | None = None,
    ) -> None:
        self._engines = {role: [_Engine(c) for c in cs] for role, cs in clients.items()}
        self._placement = {role: placement() for role in self._engines}
        self.clock, self.health = clock, health or HealthPolicy()
        self._sweep: asyncio.Task | None = None
        self.fill_load = FILL_LOAD if fill_load is None else fill_load
        if not (math.isfinite(self.fill_load) and self.fill_load >= 0.0):
            raise ValueError(f"fill_load must be finite and >= 0, got {self.fill_load!r}")
        self._remote = any(e.client.remote for es in self._engines.values() for e in es)
        self._where: dict[str, _Engine] = {}  # an open call's id → the engine running it
        self._canonical: dict[str, _Engine] = {}  # open calls counted as canonical → where
        self.counts = {"went_down": 0, "retried": 0, "recovered": 0, "abandoned": 0,
                       "promoted": 0}

    def roles(self) -> list[str]:
        return list(self._engines)

    @property
    def drafts(self) -> bool:
        """Whether the pool has drafter engines for predictors to draft on."""
        return DRAFTER_ROLE in self._engines

    def down(self) -> dict[str, str]:
        """Engine id → why it is down, for every engine that is down now."""
        return {
            e.client.engine_id: e.down_reason
            for es in self._engines.values()
            for e in es
            if e.down_reason is not None
        }

    async def generate(
        self, role: str, request: GenerateRequest
    ) -> tuple[EngineClient, GenerateResult]:
        """Place ``request`` on an engine of ``role`` that is up and run it (retried once on
        another engine if that one dies and the call is idempotent)."""
        engines = self._engines.get(role)
        if not engines:
            raise KeyError(f"no engines for model role {role!r}; roles: {self.roles()}")
        self._ensure_sweep()
        tried: list[int] = []
        while True:
            i, note = self._place(role, request, tried)
            tried.append(i)
            try:
                return engines[i].client, await self._run_on(engines[i], request, note)
            except EngineDied as e:
                self._mark_down(engines[i], e.cause)
                if len(tried) > 1 or not idempotent(request) or not self._any_up(role, tried):
                    raise EngineDied(
                        e.engine_id, e.request_id, e.cause, retried=len(tried) > 1
                    ) from e
                self.counts["retried"] += 1

    async def promote(self, request_id: str) -> bool:
        """Have the engine running open call ``request_id`` serve it as canonical from now on
        (a canonical stage joined the fill that sent it); whether the engine moved it. Never
        raises: an engine that cannot, or is down, leaves the call as it was."""
        engine = self._where.get(request_id)
        if engine is None or not engine.up:
            return False
        try:
            moved = bool(await engine.client.promote(request_id))
        except Exception:  # NOTE: the call itself goes on; only its priority stays
            return False
        if moved and self._where.get(request_id) is engine and request_id not in self._canonical:
            self._canonical[request_id] = engine  # NOTE: canonical work now: placement counts it
            engine.canonical += 1
        self.counts["promoted"] += moved
        return moved

    async def draft(self, request: GenerateRequest) -> GenerateResult:
        """One prediction call on the drafter engines."""
        _client, result = await self.generate(DRAFTER_ROLE, request)
        return result

    async def serving_loads(self) -> list[LoadSnapshot]:
        """The loads C3 prices against: one per engine that serves stages and fills, a
        :class:`DownSnapshot` for each that is down (or whose load cannot be read now).

        NOTE: drafter engines serve neither; their snapshots would also break the load
        view's one-snapshot-per-priced-engine check.
        """
        engines = [e for role, es in self._engines.items() if role != DRAFTER_ROLE for e in es]
        if engines and all(e.client.load_at_once for e in engines):
            # NOTE: an engine in this loop answers its load without suspending, so a task per
            # engine (asyncio.gather) is pure cost: at 64 engines a fifth of a replay. The
            # event loop still turns as often as through gather (read after the callbacks
            # already due, resume after what the reads set off), so every replay runs as
            # before. A load that crosses a modelled network suspends: those go through
            # gather, concurrently, as they did.
            await asyncio.sleep(0)
            loads = [await self._load(e) for e in engines]
            await asyncio.sleep(0)
            await asyncio.sleep(0)
            return loads
        return list(await asyncio.gather(*(self._load(e) for e in engines)))

    async def close(self) -> None:
        """Stop the health sweep and every probe (call before the engines shut down)."""
        tasks = [
            t
            for t in (self._sweep, *(e.probe for es in self._engines.values() for e in es))
            if t is not None
        ]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._sweep = None

    # -- placement ------------------------------------------------------------------------

    def _place(self, role: str, request: GenerateRequest,
               tried: Sequence[int]) -> tuple[int, Callable[[], None] | None]:
        """The policy's choice among the engines that are up and not yet tried, and what
        the policy notes of the call once it is sent there (see :meth:`_run_on`)."""
        engines = self._engines[role]
        usable = [i for i, e in enumerate(engines) if e.up and i not in tried]
        if not usable:
            raise NoEngineError(
                role, request.request_id, [e.client.engine_id for e in engines if not e.up]
            )
        # NOTE: a down engine reads saturated to the policy, which then places elsewhere; a
        # policy that picks it anyway (prefix affinity within its guard) is overridden.
        # NOTE: a canonical call weighs the engines' open fills at fill_load (FILL_LOAD); at
        # a whole call that is every open call, counted as a fill's are (no float arithmetic)
        w = self.fill_load
        counts = ([e.canonical + w * (e.open - e.canonical) for e in engines]
                  if request.priority <= CANONICAL and w != 1.0 else [e.open for e in engines])
        outstanding = [c if i in usable else SATURATED for i, c in enumerate(counts)]
        i, note = self._placement[role].place(outstanding, request)
        if i not in usable:
            i = min(usable, key=lambda j: (counts[j], j))
        return i, None if note is None else partial(note, i)

    def _any_up(self, role: str, tried: Sequence[int]) -> bool:
        return any(e.up and i not in tried for i, e in enumerate(self._engines[role]))

    # -- one call -------------------------------------------------------------------------

    async def _run_on(self, engine: _Engine, request: GenerateRequest,
                      note: Callable[[], None] | None = None) -> GenerateResult:
        """Run ``request`` on ``engine``; a remote engine's call is abandoned
        (``EngineDied``) if the engine goes down while it runs. ``note`` (the placement's
        note of the call) runs once the call is sent, in this same step of the event loop:
        the next call placed sees it, and the call does not wait for it."""
        engine.open += 1
        if request.priority <= CANONICAL:
            engine.canonical += 1
            self._canonical[request.request_id] = engine
        client = engine.client
        self._where[request.request_id] = engine
        try:
            if not client.remote:  # NOTE: in process: it fails by raising, and costs no task
                if note is not None:
                    note()  # NOTE: the engine runs the call inside the await: note it first
                try:
                    return await client.generate(request)
                except BaseException:
                    await asyncio.shield(self._abort(engine, request.request_id))
                    raise
            # NOTE: sent now where the client can (an open lane), not from a task of its own,
            # which the event loop would start only after everything ready before it
            started = client.start(request)
            if started is not None:
                if note is not None:
                    note()
                return await self._answer(engine, started, request)
            call = asyncio.ensure_future(client.generate(request))
            if note is not None:
                note()
            return await self._race(engine, call, request)
        finally:
            engine.open -= 1
            if self._where.get(request.request_id) is engine:
                del self._where[request.request_id]
            if self._canonical.get(request.request_id) is engine:
                del self._canonical[request.request_id]
                engine.canonical -= 1

    async def _answer(self, engine: _Engine, started: asyncio.Future,
                      request: GenerateRequest) -> GenerateResult:
        """The answer to a call the client sent at once (``started``), read as soon as it
        comes (one turn of the event loop); the engine going down cancels it
        (:meth:`_mark_down`), which abandons the call."""
        engine.sent.add(started)
        try:
            try:
                await started
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if engine.up or (task is not None and task.cancelling()):
                    raise  # NOTE: the caller was cancelled
                self.counts["abandoned"] += 1
                raise EngineDied(engine.client.engine_id, request.request_id,
                                 f"went down while the call ran ({engine.down_reason})"
                                 ) from None
            except Exception:
                pass  # NOTE: the call's own failure, which finish() raises typed
            return engine.client.finish(started, request)
        except BaseException:
            if started.cancelled():
                # NOTE: a cancelled caller (a losing fill) or an abandoned call must not keep
                # running on a remote engine
                await asyncio.shield(self._abort(engine, request.request_id))
            raise
        finally:
            engine.sent.discard(started)

    async def _race(self, engine: _Engine, call: asyncio.Future,
                    request: GenerateRequest) -> GenerateResult:
        """The result of a remote call run as a task (``call``), raced with the engine going
        down, which abandons it."""
        try:
            if engine.gone is None or engine.gone.done():
                engine.gone = asyncio.get_running_loop().create_future()
            await asyncio.wait((call, engine.gone), return_when=asyncio.FIRST_COMPLETED)
            if call.done():
                return call.result()
            self.counts["abandoned"] += 1
            raise EngineDied(
                engine.client.engine_id,
                request.request_id,
                f"went down while the call ran ({engine.down_reason})",
            )
        except BaseException:
            if not call.done():
                # NOTE: a cancelled caller or an abandoned call must not keep running
                call.cancel()
                await asyncio.shield(self._abort(engine, request.request_id))
            raise

    @staticmethod
    async def _abort(engine: _Engine, request_id: str) -> None:
        with contextlib.suppress(Exception):
            await engine.client.abort(request_id)

    async def _load(self, engine: _Engine) -> LoadSnapshot:
        now = self.clock.now() if self.clock is not None else 0.0
        if not engine.up:
            return DownSnapshot.of(engine.client.engine_id, now, engine.down_reason or "")
        try:
            return await engine.client.load()
        except EngineDied as e:
            self._mark_down(engine, e.cause)
            return DownSnapshot.of(engine.client.engine_id, now, e.cause)

    # -- health ---------------------------------------------------------------------------

    def _mark_down(self, engine: _Engine, reason: str) -> None:
        if not engine.up:
            return
        engine.down_reason = reason or "down"
        self.counts["went_down"] += 1
        if engine.gone is not None and not engine.gone.done():
            engine.gone.set_result(None)
        for started in list(engine.sent):
            started.cancel()  # NOTE: each call sent at once on it is abandoned (_answer)
        if self.clock is not None and (engine.probe is None or engine.probe.done()):
            engine.probe = asyncio.get_running_loop().create_task(
                self._probe(engine), name=f"probe {engine.client.engine_id}"
            )

    async def _probe(self, engine: _Engine) -> None:
        """Ask a down engine's health until it answers (a restarted actor), then take it up."""
        assert self.clock is not None
        while not engine.up:
            await self.clock.sleep(self.health.probe_s)
            if await engine.client.health():
                engine.down_reason = None
                self.counts["recovered"] += 1

    def _ensure_sweep(self) -> None:
        """Start the sweep on the first call, if any engine is remote (one in this process
        fails by raising, so it needs none)."""
        if self.clock is None or self.health.sweep_s is None or not self._remote:
            return
        if self._sweep is None or self._sweep.done():
            self._sweep = asyncio.get_running_loop().create_task(
                self._sweep_loop(), name="engine health sweep"
            )

    async def _sweep_loop(self) -> None:
        """Every ``sweep_s``, probe the engines that are up; one that fails goes down."""
        assert self.clock is not None and self.health.sweep_s is not None
        while True:
            await self.clock.sleep(self.health.sweep_s)
            up = [e for es in self._engines.values() for e in es if e.up and e.client.remote]
            healthy = await asyncio.gather(*(e.client.health() for e in up))
            for engine, ok in zip(up, healthy, strict=True):
                if not ok:
                    self._mark_down(engine, "health probe failed")
