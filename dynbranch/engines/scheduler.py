"""The sim engine's scheduler: which requests run in a step, and what a finished step does.

Each step is scheduled the way vLLM v1 does it — running decodes first (one token each),
then chunks of unfinished prefills, then new requests from the waiting queue, within
``max_num_batched_tokens`` and ``max_num_seqs`` — and applied when the step's time is up:
KV blocks fill, finished prefills and decodes sample their next token. Text is not
generated: a request's recorded ``replay_text`` is emitted one tokenizer piece per sampled
token (:class:`ReplayPlan`).

When a running request needs a block and none is free, the lowest-priority, latest-arrived
running request is preempted in recompute mode: its blocks are freed and it rejoins the
front of its priority class in the waiting queue.

Pure state: no clock and no asyncio. Times are passed in, and what a step does for a
request's caller is reported to a :class:`Listener` (the engine).
"""

from __future__ import annotations

import bisect
import hashlib
import struct
import sys
from array import array
from dataclasses import dataclass, field
from typing import Any, Protocol

from dynbranch.engines.blocks import BlockPool, root_hash
from dynbranch.engines.profile import Profile, attention_pairs, kv_blocks_for
from dynbranch.engines.protocol import CANONICAL, SPECULATIVE, GenerateRequest, GenerateResult
from dynbranch.engines.queued import DONE, RUNNING, WAITING
from dynbranch.engines.tokenizer import encode, tokenize
from dynbranch.errors import EngineError
from dynbranch.prefix_memo import RecentPrefixesByKey

_LITTLE_INT32 = sys.byteorder == "little" and array("i").itemsize == 4
"""Whether an ``array('i')`` of token ids (all in ``[0, 2**31)``) is already laid out as
``struct``'s ``"<I"`` packs them, so a block key hashes its bytes directly."""

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
    text_pieces, ids = tokenize(request.replay_text)
    if len(text_pieces) < limit:
        return ReplayPlan(tuple(text_pieces), (*ids, EOS_TOKEN_ID), "stop")
    return ReplayPlan(tuple(text_pieces[:limit]), tuple(ids[:limit]), "length")


def replayed_text(prompt: str, replay_text: str, max_tokens: int,
                  context_limit: int | None = None) -> str:
    """The text a replay engine returns for ``replay_text`` after ``prompt``: cut at
    ``max_tokens`` and, with a ``context_limit`` (the sim engine's ``max_model_len``), at
    what is left of the context after the prompt — what the splice checker compares a
    served LLM stage with."""
    # NOTE: a token covers at least one character, so a prompt of c characters leaves at
    # least ``context_limit - c`` tokens, and a text of fewer characters than that limit has
    # fewer pieces: nothing is cut, and the prompt need not be encoded. (The audit checks
    # every served LLM stage; encoding its prompt was 12.6 % of a profile of 10,000 Routing
    # requests, and later still 4 % of the requests served from C1, for prompts of 33,000 to
    # 41,000 characters in a 40,960-token context.)
    least_room = None if context_limit is None else context_limit - len(prompt)
    if len(replay_text) < (max_tokens if least_room is None else min(max_tokens, least_room)):
        return replay_text  # fewer pieces than the limit, whatever they are: nothing is cut
    room = None
    if least_room is not None and least_room < max_tokens:  # the context may cut: count
        assert context_limit is not None  # least_room is counted from it
        room = context_limit - len(encode(prompt))
        if len(replay_text) < min(max_tokens, room):
            return replay_text
    request = GenerateRequest("replayed", prompt, max_tokens=max_tokens, replay_text=replay_text)
    return "".join(replay_plan(request, room).pieces)


# -- block keys shared between prompts --------------------------------------------------------

CHAIN_MEMO_PROMPTS = 256
"""Prompts per cache salt whose block keys are remembered, so that a prompt sharing a prefix
with a recent one takes the keys of the shared blocks instead of hashing them again (as the
tokenizer keeps recent prompts' pieces; as many)."""
CHAIN_MEMO_SALTS = 64
"""Cache salts (and block sizes) with a memory of their own (all are forgotten when one more
comes)."""
_CHAINS: RecentPrefixesByKey[bytes, tuple[bytes, ...]] = RecentPrefixesByKey(
    CHAIN_MEMO_PROMPTS, CHAIN_MEMO_SALTS)


def first_block_hashes(cache_salt: str | None, packed: bytes, width: int) -> list[bytes]:
    """The chained keys of the blocks of ``packed`` (token ids as little-endian uint32, a
    whole number of ``width``-byte blocks), from the root of ``cache_salt``.

    A key depends only on the salt and the bytes up to its block's end, so the keys of the
    blocks a recent prompt of the same salt shares are that prompt's keys: a Routing router
    prompt shares its system prompt and tool schemas (a few hundred blocks) with an earlier
    one, and a later stage of a request its whole conversation so far.
    """
    memo = _CHAINS[cache_salt, width]  # NOTE: engines may differ in block size
    seen, shared = memo.nearest(packed)
    hashes = list(seen[: shared // width]) if seen else []
    start = len(hashes) * width
    _chain(hashes, hashes[-1] if hashes else root_hash(cache_salt), packed[start:], width)
    memo.add(packed, tuple(hashes))
    return hashes


def _chain(hashes: list[bytes], parent: bytes, packed: bytes, width: int) -> None:
    """Append to ``hashes`` the keys of ``packed``'s ``width``-byte blocks, chained from
    ``parent`` (:func:`~dynbranch.engines.blocks.block_hash`'s, over one packing of them all:
    a long prompt has hundreds, and a call per block was a tenth of a replay's time)."""
    sha256 = hashlib.sha256
    for offset in range(0, len(packed), width):
        parent = sha256(parent + packed[offset : offset + width]).digest()
        hashes.append(parent)


# -- one request inside the engine ----------------------------------------------------------


@dataclass(eq=False)
class Seq:
    """A request's state in the engine (``token_ids`` = prompt + tokens sampled so far).

    ``waiter``, ``streaming`` and ``sent`` belong to the engine's caller side: the future a
    caller waits on, whether it wants every token (a stream) or only the end, and how many
    chunks its stream has been handed.
    """

    request: GenerateRequest
    plan: ReplayPlan
    prompt_len: int
    token_ids: list[int] | array[int]
    arrival: int  # arrival order, for FCFS within a priority and for victim choice
    arrived_at: float
    queue_key: tuple[int, int]
    state: str = WAITING
    num_computed: int = 0
    blocks: list[int] = field(default_factory=list)
    hashes: list[bytes] = field(default_factory=list)
    sampled: int = 0
    cached_prompt_tokens: int = -1
    preemptions: int = 0
    first_scheduled_at: float | None = None
    first_token_at: float | None = None
    admitted: int = 0  # admission order among running requests (batch order)
    result: GenerateResult | None = None
    waiter: Any = None
    streaming: bool = False
    sent: int = 0
    promoted: bool = False  # a speculative call a canonical stage now waits on
    _positions: dict[bytes, int] | None = field(default=None, repr=False)

    @property
    def priority(self) -> int:
        return CANONICAL if self.promoted else self.request.priority

    @property
    def speculative(self) -> bool:
        return not self.promoted and self.request.priority >= SPECULATIVE

    @property
    def remaining(self) -> int:
        """Tokens whose KV is not computed yet (1 for a decode)."""
        return len(self.token_ids) - self.num_computed

    def ensure_hashes(self, n: int, block_size: int) -> None:
        """Compute the keys of this request's first ``n`` full blocks (once, then kept)."""
        hashes = self.hashes
        have = len(hashes)
        if have >= n:
            return
        start, end = have * block_size, n * block_size
        assert end <= len(self.token_ids), "only full blocks have keys"
        ids = self.token_ids
        if type(ids) is array and _LITTLE_INT32:
            packed = ids[start:end].tobytes()  # the same bytes as packing them "<I"
        else:
            packed = struct.pack(f"<{end - start}I", *ids[start:end])
        width = 4 * block_size
        if hashes:
            _chain(hashes, hashes[-1], packed, width)
        else:
            hashes.extend(first_block_hashes(self.request.cache_salt, packed, width))

    def key_positions(self) -> dict[bytes, int]:
        """Where each of its block keys computed so far sits in its chain (kept)."""
        positions = self._positions
        if positions is None:
            positions = self._positions = {}
        for i in range(len(positions), len(self.hashes)):
            positions[self.hashes[i]] = i
        return positions


class StepPlan:
    """The batch of one step: tokens per scheduled request, within the token budget."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.tokens: dict[Seq, int] = {}
        self.context: dict[Seq, int] = {}
        self.preempted = False  # whether scheduling it preempted a request

    def add(self, seq: Seq, n: int) -> None:
        self.tokens[seq] = n
        self.context[seq] = seq.num_computed
        self.budget -= n

    def drop(self, seq: Seq) -> None:
        if seq in self.tokens:
            self.budget += self.tokens.pop(seq)
            del self.context[seq]

    def totals(self) -> tuple[int, int, int, int]:
        """(sequences, new tokens, context tokens read, attention pairs): the step's cost inputs."""
        tokens = kv_read = pairs = 0
        context = self.context
        for seq, n in self.tokens.items():
            c = context[seq]
            tokens += n
            kv_read += c
            pairs += attention_pairs(c, n)
        return len(self.tokens), tokens, kv_read, pairs


class Listener(Protocol):
    """What the scheduler tells its engine about a request as steps apply."""

    def sampled(self, seq: Seq) -> None:
        """``seq`` sampled a token that is not its last."""

    def ended(self, seq: Seq) -> None:
        """``seq`` ended (``seq.result`` is set) and holds nothing any more."""


# -- the scheduler --------------------------------------------------------------------------


class Scheduler:
    """The waiting queue, the running batch and the KV pool of one simulated engine."""

    def __init__(self, profile: Profile, pool: BlockPool, engine_id: str, listener: Listener):
        self.pool, self.engine_id, self.listener = pool, engine_id, listener
        self.block_size = profile.scheduler.block_size
        self.max_num_seqs = profile.scheduler.max_num_seqs
        self.max_num_batched_tokens = profile.scheduler.max_num_batched_tokens
        self.waiting: list[Seq] = []  # sorted by queue_key
        self.running: list[Seq] = []  # in admission order
        self.arrivals = 0
        self.preemptions = 0
        self.spec_running = self.spec_waiting = 0
        self._front = 0  # queue keys below every arrival: the front of a priority class
        self._spec_refs: dict[int, int] = {}  # block -> references by running speculative work
        self.schedules = 0  # steps scheduled so far
        self.admissions = 0
        # The queue head that failed to fit, with its cached prefix, in step ``schedules``.
        self.blocked: tuple[Seq, list[int], int] | None = None

    @property
    def spec_kv_blocks(self) -> int:
        """Distinct KV blocks that running speculative requests hold."""
        return len(self._spec_refs)

    def add(self, seq: Seq) -> None:
        """Queue a new request."""
        bisect.insort(self.waiting, seq, key=lambda s: s.queue_key)
        self.spec_waiting += seq.speculative

    def end(self, seq: Seq, reason: str, now: float) -> None:
        """Finish ``seq`` (done or aborted) at ``now``: free its blocks, report its result."""
        if seq.state == RUNNING:
            self.running.remove(seq)
            self.spec_running -= seq.speculative
            self._unhold(seq)
        elif seq.state == WAITING:
            self.waiting.remove(seq)
            self.spec_waiting -= seq.speculative
        self.pool.release(seq.blocks)
        seq.blocks, seq.state = [], DONE
        seq.result = self._result(seq, reason, now)
        self.listener.ended(seq)

    def promote(self, seq: Seq) -> bool:
        """Serve speculative ``seq`` (waiting or running) as canonical from now on: waiting,
        it queues among canonical requests by its arrival; running, it is no longer the first
        victim of a preemption, and its blocks stop counting as speculative."""
        if not seq.speculative:
            return False
        if seq.state == WAITING:
            self.waiting.remove(seq)
            self.spec_waiting -= 1
            seq.promoted = True
            seq.queue_key = (CANONICAL, seq.queue_key[1])
            bisect.insort(self.waiting, seq, key=lambda s: s.queue_key)
        elif seq.state == RUNNING:
            self._unhold(seq)
            self.spec_running -= 1
            seq.promoted = True
        else:
            return False
        return True

    def hold(self, seq: Seq, blocks: list[int]) -> None:
        """``seq`` (running) took ``blocks``; speculative holdings are counted for load."""
        seq.blocks += blocks
        if seq.speculative:
            refs = self._spec_refs
            for b in blocks:
                refs[b] = refs.get(b, 0) + 1

    def _unhold(self, seq: Seq) -> None:
        if seq.speculative:
            refs = self._spec_refs
            for b in seq.blocks:
                if refs[b] == 1:
                    del refs[b]
                else:
                    refs[b] -= 1

    def _result(self, seq: Seq, reason: str, now: float) -> GenerateResult:
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

    # -- scheduling a step ------------------------------------------------------------------

    def schedule(self, now: float) -> StepPlan:
        """The batch of the step that starts at ``now`` (KV blocks are taken for it)."""
        self.schedules += 1
        plan = StepPlan(self.max_num_batched_tokens)
        preempted = self.preemptions
        self._schedule_running(plan)
        # NOTE: as in vLLM v1, a step that had to preempt admits nothing new (no thrashing),
        # unless nothing else would run.
        plan.preempted = self.preemptions != preempted
        if not plan.preempted or not plan.tokens:
            self.admit_waiting(plan)
        for seq in plan.tokens:
            if seq.first_scheduled_at is None:
                seq.first_scheduled_at = now
        return plan

    def _schedule_running(self, plan: StepPlan) -> None:
        # Decodes first, then prefill chunks, each in admission order (vLLM v1's stable sort).
        decodes: list[Seq] = []
        prefills: list[Seq] = []
        for seq in self.running:
            (prefills if len(seq.token_ids) - seq.num_computed > 1 else decodes).append(seq)
        bs, pool, tokens, context = self.block_size, self.pool, plan.tokens, plan.context
        for seq in decodes + prefills if prefills else decodes:
            budget = plan.budget
            if budget == 0:
                break
            if seq.state != RUNNING:
                continue  # preempted earlier in this step
            computed = seq.num_computed
            n = min(len(seq.token_ids) - computed, budget)
            need = -(-(computed + n) // bs) - len(seq.blocks)
            if need > pool.num_free:
                if not self._grow(seq, computed + n, plan):
                    continue
            elif need > 0:
                self.hold(seq, pool.allocate(need))
            tokens[seq], context[seq], plan.budget = n, computed, budget - n

    def _grow(self, seq: Seq, tokens: int, plan: StepPlan) -> bool:
        """Give ``seq`` blocks for ``tokens`` tokens, preempting others if the pool is full.

        Returns False when ``seq`` itself had to be preempted.
        """
        need = kv_blocks_for(tokens, self.block_size) - len(seq.blocks)
        while need > self.pool.num_free:
            # Lowest priority (largest number) first, then the latest arrival (vLLM v1).
            victim = max(self.running, key=lambda s: (s.priority, s.arrival))
            self._preempt(victim, plan)
            if victim is seq:
                return False
        if need > 0:
            self.hold(seq, self.pool.allocate(need))
        return True

    def _preempt(self, seq: Seq, plan: StepPlan) -> None:
        """Recompute-mode preemption: free the blocks, requeue at the front of its class."""
        plan.drop(seq)
        self.running.remove(seq)
        self.spec_running -= seq.speculative
        self._unhold(seq)
        self.pool.release(seq.blocks)
        seq.blocks, seq.num_computed, seq.state = [], 0, WAITING
        seq.preemptions += 1
        self.preemptions += 1
        self._front -= 1
        seq.queue_key = (seq.priority, self._front)
        self.add(seq)

    def admit_waiting(self, plan: StepPlan) -> None:
        """Admit queue heads into ``plan`` while they fit (its budget, the batch limit)."""
        limit = self.max_num_seqs
        while self.waiting and plan.budget > 0 and len(self.running) < limit:
            # NOTE: strict queue order: a head that does not fit blocks those behind it, so
            # small fills never overtake a canonical request waiting for memory.
            if not self._admit(self.waiting[0], plan):
                break

    def head_hits(self, seq: Seq) -> list[int]:
        """The cached blocks of ``seq``'s prompt prefix (never its last token's block)."""
        blocked = self.blocked
        if blocked is not None and blocked[0] is seq and blocked[2] == self.schedules:
            return blocked[1]  # looked up in this very step
        if not self.pool.caching:
            return []
        # NOTE: the last token is always computed: its logits give the next token.
        bs = self.block_size
        n = (len(seq.token_ids) - 1) // bs
        seq.ensure_hashes(n, bs)
        return self.pool.lookup(seq.hashes, n)

    def _admit(self, seq: Seq, plan: StepPlan) -> bool:
        """Move the queue head to running with its cached prefix and a first chunk."""
        bs = self.block_size
        hits = self.head_hits(seq)
        cached = len(hits) * bs
        n = min(len(seq.token_ids) - cached, plan.budget)
        need = kv_blocks_for(cached + n, bs) - len(hits)
        if need > self.pool.num_free - self.pool.free_among(hits):
            self.blocked = (seq, hits, self.schedules)
            return False
        self.pool.touch(hits)
        seq.num_computed = cached
        if seq.cached_prompt_tokens < 0:
            seq.cached_prompt_tokens = cached
        self.waiting.pop(0)
        self.spec_waiting -= seq.speculative
        self.admissions += 1
        seq.admitted = self.admissions
        self.running.append(seq)
        self.spec_running += seq.speculative
        seq.state = RUNNING
        self.hold(seq, hits + self.pool.allocate(need))
        plan.add(seq, n)
        return True

    # -- applying a step --------------------------------------------------------------------

    def apply(self, plan: StepPlan, now: float) -> None:
        """The step has run (at ``now``): its KV is written and finished prefills/decodes sample."""
        bs, pool = self.block_size, self.pool
        caching = pool.caching
        for seq, n in plan.tokens.items():
            if seq.state != RUNNING:
                continue  # aborted while the step ran
            before = seq.num_computed
            computed = before + n
            # Publish the blocks this step filled.
            first, last = before // bs, computed // bs
            if caching and last > first:
                seq.ensure_hashes(last, bs)
                for i in range(first, last):
                    pool.cache(seq.blocks[i], seq.hashes[i])
            seq.num_computed = computed
            if len(seq.token_ids) == computed:
                self.sample(seq, now)

    def sample(self, seq: Seq, now: float) -> None:
        """``seq`` (all its tokens computed) samples its next token at ``now``."""
        k = seq.sampled
        seq.token_ids.append(seq.plan.token_ids[k])
        seq.sampled += 1
        if seq.first_token_at is None:
            seq.first_token_at = now
        if seq.sampled == len(seq.plan.token_ids):
            self.end(seq, seq.plan.finish_reason, now)
        else:
            self.listener.sampled(seq)
