"""The simulated engine: iteration-level continuous batching timed by a roofline profile.

One asyncio task plays the GPU. Each step it schedules a batch the way vLLM v1 does —
running decodes first (one token each), then chunks of unfinished prefills, then new
requests from the waiting queue, within ``max_num_batched_tokens`` and ``max_num_seqs`` —
then sleeps on the injected clock for the step's roofline time
(:meth:`Profile.step_cost`) and applies the step: KV blocks fill, finished prefills and
decodes sample their next token. Text is not generated: the request's recorded
``replay_text`` is streamed one tokenizer piece per sampled token, so the *text* comes from
the trace and the *duration* from the engine, and contention between concurrent requests
emerges from the step model (more sequences read more KV per step) rather than a penalty.

KV memory is a finite pool of blocks (:class:`BlockPool`) with vLLM-style prefix caching.
When a running request needs a block and none is free, the lowest-priority, latest-arrived
running request is preempted in recompute mode: its blocks are freed and it rejoins the
front of its priority class in the waiting queue.
"""

from __future__ import annotations

import asyncio
import bisect
import contextlib
import hashlib
import struct
from collections import OrderedDict, deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from dynbranch.clock import Clock
from dynbranch.engines.profile import Profile, SeqWork, kv_blocks_for
from dynbranch.engines.protocol import (
    SPECULATIVE,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)
from dynbranch.engines.queued import DONE, RUNNING, WAITING, QueuedEngine
from dynbranch.engines.tokenizer import encode, pieces
from dynbranch.errors import EngineError, PromptTooLongError

BUSY_WINDOW_S = 2.0
"""Window over which :meth:`SimEngine.load` reports utilisation."""
EOS_TOKEN_ID = 151_645
"""Qwen3's ``<|im_end|>``: the token a chat turn ends on; its step emits no text."""


# -- what a replayed call emits -------------------------------------------------------------


@dataclass(frozen=True)
class ReplayPlan:
    """The output a replay engine will emit for one request: text pieces and token ids.

    ``token_ids`` has one more entry than ``pieces`` when the call ends on EOS (``stop``);
    it has as many when ``max_tokens`` cuts the text (``length``).
    """

    pieces: tuple[str, ...]
    token_ids: tuple[int, ...]
    finish_reason: str


def replay_plan(request: GenerateRequest, max_output: int | None = None) -> ReplayPlan:
    """What replaying ``request.replay_text`` emits, within ``max_tokens`` (and ``max_output``).

    NOTE: EOS counts as an output token, as in vLLM's usage accounting, so a text of n
    pieces that ends naturally reports n + 1 output tokens.
    """
    if request.replay_text is None:
        raise EngineError(
            f"request {request.request_id}: the sim engine replays recorded text and needs "
            "GenerateRequest.replay_text (use a real engine to generate new text)"
        )
    limit = request.max_tokens if max_output is None else min(request.max_tokens, max_output)
    text_pieces, ids = pieces(request.replay_text), encode(request.replay_text)
    if len(text_pieces) < limit:
        return ReplayPlan(tuple(text_pieces), (*ids, EOS_TOKEN_ID), "stop")
    return ReplayPlan(tuple(text_pieces[:limit]), tuple(ids[:limit]), "length")


# -- KV blocks ------------------------------------------------------------------------------


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The prefix-cache key of a full block: chained through its parent's key."""
    return hashlib.sha256(parent + struct.pack(f"<{len(token_ids)}I", *token_ids)).digest()


def root_hash(cache_salt: str | None) -> bytes:
    """The parent key of a request's first block: its cache salt isolates its prefixes."""
    return hashlib.sha256(b"salt:" + (cache_salt or "").encode("utf-8")).digest()


class BlockPool:
    """A fixed pool of KV blocks with vLLM-style prefix caching.

    A block is *free* when no request references it. A free block may still hold the KV of
    a full, hashed block (it stays findable through :meth:`lookup`) until :meth:`allocate`
    reuses it; free blocks are reused least recently freed first.
    """

    def __init__(self, num_blocks: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self._refs = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks whose KV can be found by hash (referenced or not)."""
        return len(self._cached)

    def lookup(self, hashes: Sequence[bytes]) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes``."""
        hits: list[int] = []
        for h in hashes if self.caching else ():
            block = self._cached.get(h)
            if block is None:
                break
            hits.append(block)
        return hits

    def free_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free (and would stop being so if touched)."""
        return sum(1 for b in blocks if self._refs[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks a request reuses."""
        for b in blocks:
            if self._refs[b] == 0:
                del self._free[b]
            self._refs[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks, evicting the cached KV they held."""
        assert n <= self.num_free, "caller checks num_free first"
        out = []
        for _ in range(n):
            b, _ = self._free.popitem(last=False)
            self._uncache(b)
            self._refs[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a request's references; unused blocks become free but stay cached."""
        # NOTE: tail first, so a prefix's last blocks are evicted before its first (vLLM).
        for b in reversed(blocks):
            self._refs[b] -= 1
            if self._refs[b] == 0:
                self._free[b] = None

    def cache(self, block: int, key: bytes) -> None:
        """Record that ``block`` holds the full block ``key`` (first holder wins)."""
        if self.caching and key not in self._cached:
            self._cached[key] = block
            self._hash[block] = key

    def _uncache(self, block: int) -> None:
        key = self._hash[block]
        if key is not None:
            del self._cached[key]
            self._hash[block] = None


# -- one request inside the engine ----------------------------------------------------------



@dataclass(eq=False)
class _Seq:
    """A request's state in the engine (``token_ids`` = prompt + tokens sampled so far)."""

    request: GenerateRequest
    plan: ReplayPlan
    prompt_len: int
    token_ids: list[int]
    arrival: int  # arrival order, for FCFS within a priority and for victim choice
    arrived_at: float
    queue_key: tuple[int, int]
    chunks: asyncio.Queue[GenerateChunk | None] = field(default_factory=asyncio.Queue)
    state: str = WAITING
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    sampled: int = 0
    cached_prompt_tokens: int = -1
    preemptions: int = 0
    first_scheduled_at: float | None = None
    first_token_at: float | None = None

    @property
    def priority(self) -> int:
        return self.request.priority

    @property
    def remaining(self) -> int:
        """Tokens whose KV is not computed yet (1 for a decode)."""
        return len(self.token_ids) - self.num_computed

    def full_block_hashes(self, n: int, block_size: int) -> list[bytes]:
        """Keys of this request's first ``n`` full blocks (computed once, then kept)."""
        while len(self.hashes) < n:
            start = len(self.hashes) * block_size
            assert start + block_size <= len(self.token_ids), "only full blocks have keys"
            parent = self.hashes[-1] if self.hashes else root_hash(self.request.cache_salt)
            self.hashes.append(block_hash(parent, self.token_ids[start : start + block_size]))
        return self.hashes[:n]


class _StepPlan:
    """The batch of one step: tokens per scheduled request, within the token budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.tokens: dict[_Seq, int] = {}
        self.context: dict[_Seq, int] = {}

    def add(self, seq: _Seq, n: int) -> None:
        self.tokens[seq] = n
        self.context[seq] = seq.num_computed
        self.budget -= n

    def drop(self, seq: _Seq) -> None:
        if seq in self.tokens:
            self.budget += self.tokens.pop(seq)
            del self.context[seq]

    def work(self) -> list[SeqWork]:
        return [SeqWork(self.context[s], n) for s, n in self.tokens.items()]


# -- the engine -----------------------------------------------------------------------------


class SimEngine(QueuedEngine):
    """A continuous-batching engine simulated on the injected clock (see the module doc).

    ``kv_blocks`` overrides the KV pool size the profile derives (tests use tiny pools);
    ``prefix_caching`` turns vLLM-style reuse of cached prompt blocks on or off.
    """

    def __init__(
        self,
        profile: Profile,
        clock: Clock,
        engine_id: str = "sim-0",
        *,
        kv_blocks: int | None = None,
        prefix_caching: bool = True,
    ) -> None:
        blocks = profile.kv_pool_blocks if kv_blocks is None else kv_blocks
        if blocks < 1:
            raise ValueError(f"engine {engine_id}: kv_blocks must be >= 1, got {blocks}")
        self.profile, self.clock = profile, clock
        self.engine_id, self.model = engine_id, profile.model.name
        self.block_pool = BlockPool(blocks, prefix_caching)
        self._block_size = profile.scheduler.block_size
        self._seqs: dict[str, _Seq] = {}
        self._waiting: list[_Seq] = []  # sorted by queue_key
        self._running: list[_Seq] = []  # in admission order
        self._arrivals = 0
        self._front = 0  # queue keys below every arrival: the front of a priority class
        self._preemptions = 0
        self._busy: deque[tuple[float, float]] = deque()  # (step end, step seconds)
        self._busy_s = 0.0
        self._wake: asyncio.Event | None = None
        self._loop_task: asyncio.Task[None] | None = None
        self._failure: BaseException | None = None
        self._closed = False

    # -- the protocol ---------------------------------------------------------------------

    async def start(self) -> None:
        if self._closed:
            raise EngineError(f"engine {self.engine_id} was shut down")
        if self._loop_task is None:
            self._wake = asyncio.Event()
            self._loop_task = asyncio.get_running_loop().create_task(
                self._step_loop(), name=f"{self.engine_id}-steps"
            )

    def load(self) -> LoadSnapshot:
        spec_running = [s for s in self._running if s.priority >= SPECULATIVE]
        pool = self.block_pool
        return LoadSnapshot(
            engine_id=self.engine_id,
            time=self.clock.now(),
            running=len(self._running),
            waiting=len(self._waiting),
            kv_blocks_used=pool.num_blocks - pool.num_free,
            kv_blocks_total=pool.num_blocks,
            spec_running=len(spec_running),
            spec_waiting=sum(1 for s in self._waiting if s.priority >= SPECULATIVE),
            spec_kv_blocks=len({b for s in spec_running for b in s.blocks}),
            preemptions_total=self._preemptions,
            busy=self._busy_fraction(),
        )

    def _busy_fraction(self) -> float:
        """Share of the last :data:`BUSY_WINDOW_S` spent in steps (the engine's utilisation)."""
        horizon = self.clock.now() - BUSY_WINDOW_S
        while self._busy and self._busy[0][0] < horizon:
            self._busy_s -= self._busy.popleft()[1]
        return min(1.0, max(0.0, self._busy_s / BUSY_WINDOW_S))

    async def health(self) -> bool:
        return self._loop_task is not None and not self._loop_task.done()

    async def shutdown(self) -> None:
        self._closed = True
        for seq in list(self._seqs.values()):
            self._end(seq, "abort")
        task, self._loop_task = self._loop_task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    # -- arrival and departure ------------------------------------------------------------

    def _submit(self, request: GenerateRequest) -> _Seq:
        if self._loop_task is None or self._closed or self._failure is not None:
            raise EngineError(f"engine {self.engine_id} is not running (start() it first)")
        if request.request_id in self._seqs:
            raise EngineError(f"engine {self.engine_id}: request {request.request_id} is in flight")
        prompt_ids = encode(request.prompt)
        if not prompt_ids:
            raise EngineError(f"request {request.request_id}: the prompt is empty")
        plan = replay_plan(request, self.profile.model.max_model_len - len(prompt_ids))
        self._check_fits(request, len(prompt_ids), plan)
        self._arrivals += 1
        seq = _Seq(
            request=request,
            plan=plan,
            prompt_len=len(prompt_ids),
            token_ids=prompt_ids,
            arrival=self._arrivals,
            arrived_at=self.clock.now(),
            queue_key=(request.priority, self._arrivals),
        )
        self._seqs[request.request_id] = seq
        bisect.insort(self._waiting, seq, key=lambda s: s.queue_key)
        assert self._wake is not None
        self._wake.set()
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

    def _end(self, seq: _Seq, reason: str, delta: str = "") -> None:
        """Finish ``seq`` (done or aborted): free its blocks and send its last chunk."""
        if seq.state == RUNNING:
            self._running.remove(seq)
        elif seq.state == WAITING:
            self._waiting.remove(seq)
        self.block_pool.release(seq.blocks)
        seq.blocks, seq.state = [], DONE
        del self._seqs[seq.request.request_id]
        result = self._result(seq, reason, self.clock.now())
        # NOTE: no wake-up needed: the loop only idles when nothing runs or waits.
        seq.chunks.put_nowait(GenerateChunk(seq.request.request_id, delta, result))

    def _result(self, seq: _Seq, reason: str, now: float) -> GenerateResult:
        shown = seq.plan.pieces[: seq.sampled]
        # NOTE: a call aborted before it was scheduled (or before its first token) reports
        # those instants as its end, so every field stays a number on the engine clock.
        return GenerateResult(
            request_id=seq.request.request_id,
            text="".join(shown),
            prompt_tokens=seq.prompt_len,
            output_tokens=seq.sampled,
            cached_prompt_tokens=max(0, seq.cached_prompt_tokens),
            finish_reason=reason,
            arrived_at=seq.arrived_at,
            first_scheduled_at=now if seq.first_scheduled_at is None else seq.first_scheduled_at,
            first_token_at=now if seq.first_token_at is None else seq.first_token_at,
            finished_at=now,
            preemptions=seq.preemptions,
            engine_id=self.engine_id,
        )

    # -- the step loop --------------------------------------------------------------------

    async def _step_loop(self) -> None:
        assert self._wake is not None
        try:
            while True:
                plan = self._schedule()
                if not plan.tokens:
                    assert not self._waiting, "an idle pool must admit the head of the queue"
                    self._wake.clear()
                    await self._wake.wait()
                    continue
                step_s = self.profile.step_cost(plan.work()).total_s
                await self.clock.sleep(step_s)
                self._busy.append((self.clock.now(), step_s))
                self._busy_s += step_s
                self._apply(plan)
        except Exception as exc:
            # NOTE: a bug in the simulator fails the calls in flight instead of hanging them.
            self._failure = exc
            for seq in self._seqs.values():
                seq.chunks.put_nowait(None)
            raise

    def _schedule(self) -> _StepPlan:
        plan = _StepPlan(self.profile.scheduler.max_num_batched_tokens)
        preempted = self._preemptions
        self._schedule_running(plan)
        # NOTE: as in vLLM v1, a step that had to preempt admits nothing new (no thrashing),
        # unless nothing else would run.
        if self._preemptions == preempted or not plan.tokens:
            self._schedule_waiting(plan)
        now = self.clock.now()
        for seq in plan.tokens:
            if seq.first_scheduled_at is None:
                seq.first_scheduled_at = now
        return plan

    def _schedule_running(self, plan: _StepPlan) -> None:
        # Decodes first, then prefill chunks; the stable sort keeps admission order.
        for seq in sorted(self._running, key=lambda s: s.remaining > 1):
            if plan.budget == 0:
                break
            if seq.state != RUNNING:
                continue  # preempted earlier in this step
            n = min(seq.remaining, plan.budget)
            if self._grow(seq, seq.num_computed + n, plan):
                plan.add(seq, n)

    def _grow(self, seq: _Seq, tokens: int, plan: _StepPlan) -> bool:
        """Give ``seq`` blocks for ``tokens`` tokens, preempting others if the pool is full.

        Returns False when ``seq`` itself had to be preempted.
        """
        need = kv_blocks_for(tokens, self._block_size) - len(seq.blocks)
        while need > self.block_pool.num_free:
            # Lowest priority (largest number) first, then the latest arrival (vLLM v1).
            victim = max(self._running, key=lambda s: (s.priority, s.arrival))
            self._preempt(victim, plan)
            if victim is seq:
                return False
        seq.blocks += self.block_pool.allocate(max(0, need))
        return True

    def _preempt(self, seq: _Seq, plan: _StepPlan) -> None:
        """Recompute-mode preemption: free the blocks, requeue at the front of its class."""
        plan.drop(seq)
        self._running.remove(seq)
        self.block_pool.release(seq.blocks)
        seq.blocks, seq.num_computed, seq.state = [], 0, WAITING
        seq.preemptions += 1
        self._preemptions += 1
        self._front -= 1
        seq.queue_key = (seq.priority, self._front)
        bisect.insort(self._waiting, seq, key=lambda s: s.queue_key)

    def _schedule_waiting(self, plan: _StepPlan) -> None:
        limit = self.profile.scheduler.max_num_seqs
        while self._waiting and plan.budget > 0 and len(self._running) < limit:
            # NOTE: strict queue order: a head that does not fit blocks those behind it, so
            # small fills never overtake a canonical request waiting for memory.
            if not self._admit(self._waiting[0], plan):
                break

    def _admit(self, seq: _Seq, plan: _StepPlan) -> bool:
        """Move the queue head to running with its cached prefix and a first chunk."""
        bs = self._block_size
        hits: list[int] = []
        if self.block_pool.caching:
            # NOTE: the last token is always computed: its logits give the next token.
            hashes = seq.full_block_hashes((len(seq.token_ids) - 1) // bs, bs)
            hits = self.block_pool.lookup(hashes)
        cached = len(hits) * bs
        n = min(len(seq.token_ids) - cached, plan.budget)
        need = kv_blocks_for(cached + n, bs) - len(hits)
        if need > self.block_pool.num_free - self.block_pool.free_among(hits):
            return False
        self.block_pool.touch(hits)
        seq.blocks = hits + self.block_pool.allocate(need)
        seq.num_computed = cached
        if seq.cached_prompt_tokens < 0:
            seq.cached_prompt_tokens = cached
        self._waiting.pop(0)
        self._running.append(seq)
        seq.state = RUNNING
        plan.add(seq, n)
        return True

    def _apply(self, plan: _StepPlan) -> None:
        """The step has run: its KV is written and finished prefills/decodes sample."""
        now = self.clock.now()
        for seq, n in plan.tokens.items():
            if seq.state != RUNNING:
                continue  # aborted while the step ran
            self._commit(seq, seq.num_computed + n)
            if seq.remaining == 0:
                self._sample(seq, now)

    def _commit(self, seq: _Seq, computed: int) -> None:
        """Advance ``seq`` to ``computed`` tokens and publish its newly full blocks."""
        first, last = seq.num_computed // self._block_size, computed // self._block_size
        if self.block_pool.caching and last > first:
            keys = seq.full_block_hashes(last, self._block_size)
            for i in range(first, last):
                self.block_pool.cache(seq.blocks[i], keys[i])
        seq.num_computed = computed

    def _sample(self, seq: _Seq, now: float) -> None:
        k = seq.sampled
        seq.token_ids.append(seq.plan.token_ids[k])
        seq.sampled += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
        delta = seq.plan.pieces[k] if k < len(seq.plan.pieces) else ""
        if seq.sampled == len(seq.plan.token_ids):
            self._end(seq, seq.plan.finish_reason, delta)
        else:
            seq.chunks.put_nowait(GenerateChunk(seq.request.request_id, delta))
