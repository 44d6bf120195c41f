"""The simulated engine: iteration-level continuous batching timed by a roofline profile.

The engine plays one GPU. Its scheduler (:mod:`dynbranch.engines.scheduler`) plans each
step's batch the way vLLM v1 does, the step takes its roofline time
(:meth:`Profile.step_time`), and when the time is up the step is applied: KV blocks fill
and finished prefills and decodes sample their next token, which streams one piece of the
request's recorded ``replay_text``. So the *text* comes from the trace and the *duration*
from the engine, and contention between concurrent requests emerges from the step model
(more sequences read more KV per step) rather than a penalty. KV memory is a finite pool of
blocks with vLLM-style prefix caching (:mod:`dynbranch.engines.blocks`); a full pool
preempts in recompute mode.

Time. The engine waits on a clock :class:`~dynbranch.clock.Alarm` set for the end of the
step in flight; on the virtual clock a step boundary is processed after every other event
of its instant (so a request that arrives exactly at a boundary joins the next step, and
what the engine does never depends on asyncio's order among simultaneous timers). Every
entry point (a new request, an abort, :meth:`SimEngine.load`, a stream asking for its
next chunk) first catches up with the boundaries already passed, so the engine's state is
always what it is at that moment.

Skip-ahead (``skip_ahead=True``, the default). The decoding requests are stepped
together (:class:`~dynbranch.engines.skip_ahead.Stepper`): a step touches only the few
requests with something happening (a new KV block, an end, a prefill chunk, an admission),
steps are applied lazily when someone looks, and the engine wakes on its own only where
something observable happens (a request ends, a stream's next token) or the future is not
yet known. Every step time is summed in the same order and every pool operation happens in
the same order as stepping one by one (``skip_ahead=False``), so every result, chunk and
load snapshot is identical; only the work per step and the number of clock events differ.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from dynbranch.clock import Alarm, Clock
from dynbranch.engines.blocks import BlockPool
from dynbranch.engines.profile import Profile, kv_blocks_for
from dynbranch.engines.protocol import (
    Engine,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)
from dynbranch.engines.queued import DONE, RUNNING
from dynbranch.engines.scheduler import EOS_TOKEN_ID, ReplayPlan, Scheduler, Seq, replay_plan
from dynbranch.engines.skip_ahead import BusyWindow, Stepper
from dynbranch.engines.tokenizer import encode_array
from dynbranch.errors import EngineError, PromptTooLongError

BUSY_WINDOW_S = 2.0
"""Window over which :meth:`SimEngine.load` reports utilisation."""

__all__ = ["BUSY_WINDOW_S", "EOS_TOKEN_ID", "BlockPool", "ReplayPlan", "SimEngine", "replay_plan"]


class SimEngine(Engine):
    """A continuous-batching engine simulated on the injected clock (see the module doc).

    ``kv_blocks`` overrides the KV pool size the profile derives (tests use tiny pools);
    ``prefix_caching`` turns vLLM-style reuse of cached prompt blocks on or off;
    ``skip_ahead=False`` wakes at every step (the reference the skip-ahead path must match).
    ``steps`` counts the steps applied and ``wakes`` the times the engine woke on its own
    (benchmarks report them).
    """

    def __init__(
        self,
        profile: Profile,
        clock: Clock,
        engine_id: str = "sim-0",
        *,
        kv_blocks: int | None = None,
        prefix_caching: bool = True,
        skip_ahead: bool = True,
    ) -> None:
        blocks = profile.kv_pool_blocks if kv_blocks is None else kv_blocks
        if blocks < 1:
            raise ValueError(f"engine {engine_id}: kv_blocks must be >= 1, got {blocks}")
        self.profile, self.clock, self.skip_ahead = profile, clock, skip_ahead
        self.engine_id, self.model = engine_id, profile.model.name
        self.block_pool = BlockPool(blocks, prefix_caching)
        self._block_size = profile.scheduler.block_size
        self._sched = Scheduler(profile, self.block_pool, engine_id, self)
        self._seqs: dict[str, Seq] = {}
        self._streams: set[Seq] = set()  # requests whose stream waits for its next token
        self._busy = BusyWindow(BUSY_WINDOW_S)
        # an idle engine's step: one sequence decoding one token with no context
        self._idle_step_s = profile.step_time(1, 1, 0, 0)
        self._stepper = Stepper(self._sched, profile, skip_ahead, self._streams, self._wake)
        self._alarm: Alarm | None = None
        self._start_pending = False
        self._failure: BaseException | None = None
        self._closed = False
        self.steps = self.wakes = 0

    # -- the protocol ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise EngineError(f"engine {self.engine_id} was shut down")
        if self._alarm is None:
            self._alarm = self.clock.alarm(self._on_alarm)

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        seq = self._submit(request)
        try:
            while seq.result is None:
                await self._wait(seq, streaming=False)
            return seq.result
        finally:
            if seq.state != DONE:
                self._end_now(seq, "abort")

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        seq = self._submit(request)
        try:
            while True:
                chunk = self._next_chunk(seq)
                if chunk is None:
                    await self._wait(seq, streaming=True)
                    continue
                yield chunk
                if chunk.finished:
                    return
        finally:
            # NOTE: a consumer that is cancelled or stops iterating must not leave its
            # request running (holding a batch slot and KV) inside the engine.
            if seq.state != DONE:
                self._end_now(seq, "abort")

    async def abort(self, request_id: str) -> bool:
        seq = self._seqs.get(request_id)
        if seq is None:
            return False
        # NOTE: a step in flight may include it; whatever it computes for it is dropped.
        self._end_now(seq, "abort")
        return True

    async def promote(self, request_id: str) -> bool:
        seq = self._seqs.get(request_id)
        if seq is None or not seq.speculative:
            return False
        if self._failure is None:
            self._advance()
        self._stepper.settle(seq)
        if not self._sched.promote(seq):
            return False
        self._batch_may_change()  # NOTE: the queue's order changed: the next step re-plans
        return True

    def load(self) -> LoadSnapshot:
        if self._alarm is not None and self._failure is None:
            self._advance()
        sched, pool, now = self._sched, self.block_pool, self.clock.now()
        return LoadSnapshot(
            engine_id=self.engine_id,
            time=now,
            running=len(sched.running),
            waiting=len(sched.waiting),
            kv_blocks_used=pool.num_blocks - pool.num_free,
            kv_blocks_total=pool.num_blocks,
            spec_running=sched.spec_running,
            spec_waiting=sched.spec_waiting,
            spec_kv_blocks=sched.spec_kv_blocks,
            preemptions_total=sched.preemptions,
            busy=self._busy.fraction(now),
            stretch=max(1.0, self._busy.mean_s(now) / self._idle_step_s),
        )

    async def health(self) -> bool:
        return self._alarm is not None and not self._closed and self._failure is None

    async def shutdown(self) -> None:
        for seq in list(self._seqs.values()):
            self._end_now(seq, "abort")
        self._closed = True
        if self._alarm is not None:
            self._alarm.cancel()

    # -- arrival and departure ------------------------------------------------------------

    def _submit(self, request: GenerateRequest) -> Seq:
        if self._alarm is None or self._closed or self._failure is not None:
            raise EngineError(f"engine {self.engine_id} is not running (start() it first)")
        if request.request_id in self._seqs:
            raise EngineError(f"engine {self.engine_id}: request {request.request_id} is in flight")
        prompt_ids = encode_array(request.prompt)
        if not prompt_ids:
            raise EngineError(f"request {request.request_id}: the prompt is empty")
        plan = replay_plan(request, self.profile.model.max_model_len - len(prompt_ids))
        self._check_fits(request, len(prompt_ids), plan)
        self._advance()
        sched = self._sched
        sched.arrivals += 1
        seq = Seq(
            request=request,
            plan=plan,
            prompt_len=len(prompt_ids),
            token_ids=prompt_ids,
            arrival=sched.arrivals,
            arrived_at=self.clock.now(),
            queue_key=(request.priority, sched.arrivals),
        )
        self._seqs[request.request_id] = seq
        sched.add(seq)
        self._batch_may_change()
        return seq

    def _check_fits(self, request: GenerateRequest, prompt_len: int, plan: ReplayPlan) -> None:
        # NOTE: the last sampled token is never fed back, so its KV is never computed.
        kv_tokens = prompt_len + len(plan.token_ids) - 1
        limit = self.profile.model.max_model_len
        if (
            prompt_len >= limit
            or kv_blocks_for(kv_tokens, self._block_size) > self.block_pool.num_blocks
        ):
            raise PromptTooLongError(
                f"request {request.request_id}: {prompt_len} prompt + {len(plan.token_ids)} "
                f"output tokens cannot fit engine {self.engine_id} even alone "
                f"(KV pool {self.block_pool.num_blocks * self._block_size} tokens, "
                f"max_model_len {limit})"
            )

    def _end_now(self, seq: Seq, reason: str) -> None:
        """End ``seq`` now (an abort): whatever the step in flight computes for it is lost."""
        if self._failure is None:
            self._advance()
        self._stepper.settle(seq)
        self._sched.end(seq, reason, self.clock.now())
        self._batch_may_change()

    def _batch_may_change(self) -> None:
        """A request came or went: the next boundary schedules afresh (or an idle engine
        wakes)."""
        if self._failure is not None or self._closed:
            return
        if not self._stepper.busy:
            if not self._start_pending and self._sched.waiting:
                # NOTE: the engine starts one callback later, as a woken step-loop task
                # would: calls made in between in this instant join its first step.
                self._start_pending = True
                asyncio.get_running_loop().call_soon(self._on_start)
            return
        self._stepper.changed()
        self._arm()

    # -- what the scheduler reports (the Listener) ----------------------------------------

    def sampled(self, seq: Seq) -> None:
        if seq.streaming and seq.waiter is not None:
            self._wake(seq)

    def ended(self, seq: Seq) -> None:
        del self._seqs[seq.request.request_id]
        self._stepper.forget(seq)
        if seq.waiter is not None:
            self._wake(seq)

    # -- callers waiting ------------------------------------------------------------------

    async def _wait(self, seq: Seq, *, streaming: bool) -> None:
        """Wait until ``seq`` ends (or, for a stream, samples its next token)."""
        fut = asyncio.get_running_loop().create_future()
        seq.waiter, seq.streaming = fut, streaming
        if streaming:
            self._streams.add(seq)
            self._arm()
        try:
            await fut
        finally:
            if seq.waiter is fut:
                seq.waiter = None
                self._streams.discard(seq)
        if self._failure is not None:
            raise EngineError(
                f"engine {self.engine_id}: step loop failed: {self._failure!r}"
            ) from self._failure

    def _wake(self, seq: Seq) -> None:
        fut, seq.waiter = seq.waiter, None
        self._streams.discard(seq)
        if not fut.done():
            fut.set_result(None)

    def _next_chunk(self, seq: Seq) -> GenerateChunk | None:
        """The next chunk of ``seq``'s stream, if it has been produced by now."""
        if seq.state != DONE:
            self._advance()
        k, rid, result = seq.sent, seq.request.request_id, seq.result
        sampled = self._sampled(seq)
        if k < sampled:
            seq.sent = k + 1
            pieces = seq.plan.pieces
            delta = pieces[k] if k < len(pieces) else ""
            last = result is not None and result.finish_reason != "abort" and k + 1 == sampled
            return GenerateChunk(rid, delta, result if last else None)
        if result is not None:  # aborted: a last, empty chunk carries the result
            seq.sent = k + 1
            return GenerateChunk(rid, "", result)
        return None

    def _sampled(self, seq: Seq) -> int:
        return seq.sampled if seq.state != RUNNING else self._stepper.sampled(seq)

    # -- time -----------------------------------------------------------------------------

    def _advance(self) -> None:
        """Catch up with every step boundary already passed (the entry points call this)."""
        if self._failure is not None:
            raise EngineError(
                f"engine {self.engine_id}: step loop failed: {self._failure!r}"
            ) from self._failure
        try:
            if self._catch_up():
                self._arm()
        except Exception as exc:
            self._fail(exc)
            raise EngineError(f"engine {self.engine_id}: step loop failed: {exc!r}") from exc

    def _catch_up(self) -> bool:
        alarm, stepper, moved = self._alarm, self._stepper, False
        assert alarm is not None
        while stepper.busy and alarm.due(stepper.end):
            stepper.boundary(self._busy)
            self.steps += 1
            moved = True
        return moved

    def _arm(self) -> None:
        """Set the alarm where the engine must next act on its own."""
        alarm, stepper = self._alarm, self._stepper
        assert alarm is not None
        if not stepper.busy:
            alarm.cancel()
        elif any(stepper.is_member(s) for s in self._streams):
            alarm.set(stepper.end)  # a stream waits for the token of the step in flight
        else:
            alarm.set(stepper.horizon())

    def _on_alarm(self) -> None:
        self.wakes += 1
        try:
            self._catch_up()
            self._arm()
        except Exception as exc:
            self._fail(exc)
            asyncio.get_running_loop().call_exception_handler(
                {"message": f"engine {self.engine_id}: step loop failed", "exception": exc}
            )

    def _on_start(self) -> None:
        self._start_pending = False
        if self._stepper.busy or self._closed or self._failure is not None:
            return
        try:
            self._stepper.start(self.clock.now())
            self._arm()
        except Exception as exc:
            self._fail(exc)
            raise

    def _fail(self, exc: BaseException) -> None:
        """A bug in the simulator fails the calls in flight instead of hanging them."""
        self._failure = exc
        self._stepper.busy = False
        if self._alarm is not None:
            self._alarm.cancel()
        for seq in list(self._seqs.values()):
            if seq.waiter is not None:
                self._wake(seq)
