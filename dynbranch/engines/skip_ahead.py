"""How a sim engine steps: one scheduled batch at a time, or skipping ahead.

:class:`Stepper` owns the step in flight. With ``skip_ahead=False`` every step is planned
and applied by the scheduler (:mod:`dynbranch.engines.scheduler`), touching every request:
the reference. With ``skip_ahead=True`` the decoding requests live in a
:class:`~dynbranch.engines.lazy_decodes.LazyDecodes` set and a step touches only what
changes in it: the few requests that take or fill a KV block, those that end, prefill
chunks and admissions (through the scheduler's own code), so a step costs O(its events)
however large the batch. Where the scheduler would preempt (or the token budget would
skip decodes) the step falls back to the reference for that step.

Steps are applied when someone looks (the engine catches up on every entry), so the engine
needs to wake on its own only where something observable happens: a request ends, a
stream's next token, or where the future is not known yet. :meth:`Stepper.horizon` plans
ahead over *pure* steps (everyone decoding, nothing to admit) — each step's time a closed
form of the batch's total context — up to the next end, the first step the pool could not
feed, or where the waiting head could start to fit. Every pool operation happens in the
order the reference does it and every float is the same sum, so results are identical.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Callable, Iterator
from math import fsum

from dynbranch.engines.lazy_decodes import LazyDecodes, Member
from dynbranch.engines.profile import Profile, kv_blocks_for
from dynbranch.engines.queued import RUNNING
from dynbranch.engines.scheduler import Scheduler, Seq, StepPlan

FIRST_HORIZON = 16
"""Pure steps planned at first; each extension doubles it (a plan cut short wastes little)."""

_NEVER = 1 << 62
"""A step no plan reaches: the last step when no member ends (a step number, like the rest)."""


class BusyWindow:
    """Step time within the last ``window_s`` seconds: the engine's recent utilisation.

    NOTE: the window's sum is taken with ``math.fsum`` (exactly rounded), so it does not
    depend on when old steps are dropped; steps are dropped as new ones arrive, which keeps
    memory flat however long a run is.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        # NOTE: ends and durations apart, so a sum is one C-level fsum over the durations
        # (a generator over pairs was a twentieth of a replay: engines report load often)
        self._ends: deque[float] = deque()
        self._seconds: deque[float] = deque()

    def add(self, end: float, seconds: float) -> None:
        """A step of ``seconds`` ended at ``end``."""
        self._drop_before(end - self.window_s)
        self._ends.append(end)
        self._seconds.append(seconds)

    def fraction(self, now: float) -> float:
        """Share of the window before ``now`` spent in steps."""
        self._drop_before(now - self.window_s)
        busy = fsum(self._seconds)
        return min(1.0, max(0.0, busy / self.window_s))

    def mean_s(self, now: float) -> float:
        """Mean duration of the steps in the window before ``now`` (0 without any)."""
        self._drop_before(now - self.window_s)
        seconds = self._seconds
        return fsum(seconds) / len(seconds) if seconds else 0.0

    def _drop_before(self, horizon: float) -> None:
        ends, seconds = self._ends, self._seconds
        while ends and ends[0] < horizon:
            ends.popleft()
            seconds.popleft()


class Stepper:
    """The step in flight of one engine, and how the next ones are made (see module doc).

    ``streams`` is the engine's set of requests whose stream waits for a token and
    ``wake`` wakes one; the stepper calls it, in batch order, for decoding members.
    """

    def __init__(
        self,
        sched: Scheduler,
        profile: Profile,
        skip_ahead: bool,
        streams: set[Seq],
        wake: Callable[[Seq], None],
    ) -> None:
        self.sched, self.pool, self.profile = sched, sched.pool, profile
        self.skip_ahead, self.streams, self.wake = skip_ahead, streams, wake
        self.block_size = sched.block_size
        self.lazy = LazyDecodes(self.block_size)
        self.prefilling: list[Seq] = []  # running requests that are not members, batch order
        self.step = 0  # the step in flight (= steps applied)
        self.busy = False
        self.end = self.cost = 0.0
        self.extras: StepPlan | None = None  # the step's requests besides the members
        self.plain: StepPlan | None = None  # the step, when the scheduler planned all of it
        self.allocations = 0  # blocks members took so far
        self._head_checked = -1  # a step whose schedule found the waiting head not fitting
        self._plan: Lookahead | None = None

    # -- the step in flight -----------------------------------------------------------------

    def start(self, now: float) -> None:
        """An idle engine got work: schedule its first step at ``now``."""
        assert not self.busy
        self._schedule(now)

    def boundary(self, busy: BusyWindow) -> None:
        """The step in flight has ended: apply it and schedule the next."""
        t, k = self.end, self.step
        busy.add(t, self.cost)
        if self.plain is not None:
            plan, self.plain = self.plain, None
            self.sched.apply(plan, t)
            self.step = k + 1
            if self.skip_ahead:
                self._rebuild()
        else:
            self._apply_members(k, t)
            extras, self.extras = self.extras, None
            if extras is not None and extras.tokens:
                self.sched.apply(extras, t)
            self.step = k + 1
            self.lazy.context += self.lazy.n  # every member computed one more token
            if extras is not None and extras.tokens:
                self._join(extras)
        self._schedule(t)

    def changed(self) -> None:
        """Something came from outside (a request, an abort): replan after the step in flight."""
        self._plan, self._head_checked = None, -1

    def forget(self, seq: Seq) -> None:
        """``seq`` ended (or was aborted): it is no longer stepped."""
        m = self.lazy.members.get(seq)
        if m is not None:
            self.lazy.leave(m, self.step)
        elif seq in self.prefilling:
            self.prefilling.remove(seq)
        self._plan, self._head_checked = None, -1

    def settle(self, seq: Seq) -> None:
        """Bring a member's own fields up to the steps applied (before it is ended)."""
        m = self.lazy.members.get(seq)
        if m is not None:
            self.lazy.settle(m, self.step)

    def sampled(self, seq: Seq) -> int:
        """Tokens ``seq`` has sampled so far."""
        m = self.lazy.members.get(seq)
        return seq.sampled if m is None else self.lazy.sampled(m, self.step)

    def is_member(self, seq: Seq) -> bool:
        return seq in self.lazy.members

    # -- applying ---------------------------------------------------------------------------

    def _apply_members(self, k: int, t: float) -> None:
        """Apply step ``k`` to the members: publish filled blocks, end the finished ones and
        wake waiting streams, in batch order (as the scheduler's apply would)."""
        lazy, pool, bs = self.lazy, self.pool, self.block_size
        if pool.caching:
            for m in lazy.buckets[(k + 1) % bs]:
                full = (lazy.computed(m, k) + 1) // bs
                lazy.settle(m, k)
                m.seq.ensure_hashes(full, bs)
                pool.cache(m.seq.blocks[full - 1], m.seq.hashes[full - 1])
        if lazy.first:
            for m in lazy.first:
                if m.alive:
                    m.seq.first_token_at = t
            lazy.first = []
        # NOTE: publishing blocks commutes with ending requests (a release keeps blocks
        # cached), so all blocks are published first and the rest follows batch order.
        ending = lazy.ending(k)
        waking: list[Member] = ending
        if self.streams:
            members = lazy.members
            waiting = [members[s] for s in self.streams if s in members and members[s].end != k]
            waking = sorted(ending + waiting, key=lambda m: m.rank)
        for m in waking:
            seq = m.seq
            if m.end == k:
                lazy.settle(m, k)
                lazy.leave(m, k)
                seq.num_computed += 1
                self.sched.sample(seq, t)  # its last token: it ends
            else:
                self.wake(seq)
        if ending:
            self._plan = None

    def _join(self, extras: StepPlan) -> None:
        """Requests of ``extras`` that sampled their first token decode from now on."""
        for seq in extras.tokens:
            if seq.state == RUNNING and len(seq.token_ids) - seq.num_computed == 1:
                self.prefilling.remove(seq)
                self.lazy.join(seq, self.step)
                self._plan = None

    def _rebuild(self) -> None:
        """After a step the scheduler planned whole: its decodes become members again."""
        for seq in self.sched.running:
            if len(seq.token_ids) - seq.num_computed == 1:
                self.lazy.join(seq, self.step)
            else:
                self.prefilling.append(seq)

    # -- scheduling -------------------------------------------------------------------------

    def _schedule(self, now: float) -> None:
        """Schedule step ``self.step`` at ``now`` exactly as the scheduler would."""
        if not self.skip_ahead:
            self._schedule_plain(now)
            return
        sched, pool, lazy, bs = self.sched, self.pool, self.lazy, self.block_size
        n, s = lazy.n, self.step
        if n > sched.max_num_batched_tokens:
            self._schedule_plain(now)  # the budget would leave decodes out
            return
        # Decodes first (one token each), then prefill chunks, all in batch order.
        budget = sched.max_num_batched_tokens - n
        taking = lazy.buckets[s % bs]
        need, chunks = len(taking), []
        for seq in self.prefilling:
            if budget == 0:
                break
            chunk = min(len(seq.token_ids) - seq.num_computed, budget)
            need += max(0, kv_blocks_for(seq.num_computed + chunk, bs) - len(seq.blocks))
            chunks.append((seq, chunk))
            budget -= chunk
        if need > pool.num_free:
            self._schedule_plain(now)  # the scheduler would preempt
            return
        sched.schedules += 1
        for m in taking:
            sched.hold(m.seq, pool.allocate(1))
        self.allocations += len(taking)
        plan = StepPlan(budget)
        for seq, chunk in chunks:
            grow = kv_blocks_for(seq.num_computed + chunk, bs) - len(seq.blocks)
            if grow > 0:
                sched.hold(seq, pool.allocate(grow))
            plan.tokens[seq], plan.context[seq] = chunk, seq.num_computed
        self._admit(plan, s)
        for seq in plan.tokens:
            if seq.first_scheduled_at is None:
                seq.first_scheduled_at = now
        if n == 0 and not plan.tokens:
            assert not sched.waiting, "an idle pool must admit the head of the queue"
            self.busy = False
            return
        e_seqs, e_tokens, e_ctx, e_pairs = plan.totals()
        ctx = lazy.context
        cost = self.profile.step_time(n + e_seqs, n + e_tokens, ctx + e_ctx, ctx + n + e_pairs)
        self.busy, self.extras, self.cost, self.end = True, plan, cost, now + cost
        if self._plan is not None:
            self._plan.scheduled(s, self.end)

    def _admit(self, plan: StepPlan, s: int) -> None:
        """Admit waiting requests into ``plan`` (unless a plan proved the head cannot fit)."""
        sched = self.sched
        if not sched.waiting:
            return
        if self._plan is None or s > self._plan.head_blocked_through:
            before = len(plan.tokens)
            sched.admit_waiting(plan)
            admitted = list(plan.tokens)[before:]
            self.prefilling.extend(admitted)
            if admitted:
                self._plan = None
        if sched.waiting:
            self._head_checked = s

    def _schedule_plain(self, now: float) -> None:
        """The scheduler plans the whole step (the reference; and skip-ahead's fallback)."""
        self.lazy.drain(self.step)
        self.prefilling, self._plan = [], None
        plan = self.sched.schedule(now)
        if not plan.tokens:
            assert not self.sched.waiting, "an idle pool must admit the head of the queue"
            self.busy = False
            return
        cost = self.profile.step_time(*plan.totals())
        self.busy, self.plain, self.cost, self.end = True, plan, cost, now + cost

    # -- planning ahead ---------------------------------------------------------------------

    def horizon(self) -> float:
        """When the engine must next wake on its own: the end of the step in flight, or of
        the last pure step planned after it."""
        if not self._pure():
            return self.end
        if self._plan is None or self._plan.behind():
            self._plan = Lookahead(self)
        return self._plan.horizon()

    def _pure(self) -> bool:
        """Whether the step in flight is members only, with nothing to admit next."""
        if not self.skip_ahead or not self.busy or self.plain is not None or self.prefilling:
            return False
        if not self.lazy.n:
            return False
        if self.extras is not None and self.extras.tokens:
            return False
        return not self.sched.waiting or self._head_checked == self.step


class Lookahead:
    """Pure steps after the one in flight: their ends, and where planning had to stop.

    Planned steps take blocks from the free list in order; a plan stops before a step the
    pool could not feed (the scheduler would preempt), after the first step that ends a
    member, and where the waiting head's admission could change (see :meth:`_watch_head`).
    """

    def __init__(self, stepper: Stepper) -> None:
        self.stepper = s = stepper
        self.first = s.step  # the step in flight when planned
        self.ends = [s.end]  # ends of steps first, first + 1, ...
        self.done = False  # planning found its last step
        self.free_left = s.pool.num_free
        self.taken = 0  # blocks the planned steps take
        self.allocations_at = s.allocations
        nxt = s.lazy.next_end()
        self.last_step: int = _NEVER if nxt is None else nxt
        self.head_keys: dict[bytes, int] | None = None
        self.head_hits = 0
        self.head_blocked_through = s.step
        if s.sched.waiting:
            self._watch_head()
        if self.last_step <= self.first:
            self.done = True

    def behind(self) -> bool:
        """Whether the step in flight is past every planned step (plan afresh)."""
        return self.stepper.step >= self.first + len(self.ends)

    def scheduled(self, step: int, end: float) -> None:
        """The stepper scheduled ``step``: a planned one must end where planned."""
        i = step - self.first
        if i < len(self.ends):
            assert self.ends[i] == end, "a planned step ends where it was planned"

    def horizon(self) -> float:
        s = self.stepper
        if not self.done and s.step + 1 >= self.first + len(self.ends):
            self._extend()
        return self.ends[-1]

    def _extend(self) -> None:
        s, lazy, bs = self.stepper, self.stepper.lazy, self.stepper.block_size
        n, ctx0 = lazy.n, lazy.context
        start = self.first + len(self.ends)
        stop = min(self.last_step + 1, start + max(FIRST_HORIZON, len(self.ends)))
        free: Iterator[int] | None = None
        if self.head_keys is not None:
            skip = self.taken - (s.allocations - self.allocations_at)
            free = itertools.islice(s.pool.free_order(), skip, None)
        t, step_time = self.ends[-1], s.profile.step_time
        for j in range(start, int(stop)):
            take = len(lazy.buckets[j % bs])
            if take:
                if take > self.free_left or (free is not None and self._evicts_head(free, take)):
                    self.done = True
                    return
                self.free_left -= take
                self.taken += take
            # NOTE: context as of step j: the in-flight step's plus one token per member per
            # step since (members only change where a plan stops).
            kv = ctx0 + n * (j - s.step)
            t = t + step_time(n, n, kv, kv + n)
            self.ends.append(t)
            if s.sched.waiting:
                self.head_blocked_through = j
        if stop == self.last_step + 1:
            self.done = True

    # -- the waiting head -------------------------------------------------------------------

    def _watch_head(self) -> None:
        """Bound the plan where the waiting head's admission could change (vLLM admits in
        strict queue order, so only the head matters).

        With its cached prefix unchanged the head only gets harder to admit as free blocks
        are used, so a head that did not fit at the step in flight keeps not fitting unless
        its prefix hits change. They shrink when a member's new block evicts a free block
        among them; with a step budget below the prompt, what the head needs then stays the
        same while the free hits it no longer claims come back, and it can fit (a test has
        such a case). They grow when a member publishes the block that extends them.

        NOTE: growth is guarded for completeness: the member that publishes a block takes
        its next one at the same boundary, so the two cancel unless the new hit also joins
        further cached blocks (duplicate prefixes); no search has found a case.
        """
        s = self.stepper
        sched, pool, bs = s.sched, s.pool, s.block_size
        if not pool.caching:
            return  # without caching the hits stay empty
        if len(sched.running) >= sched.max_num_seqs or sched.max_num_batched_tokens <= s.lazy.n:
            return  # nothing can be admitted while the batch stays as it is
        head = sched.waiting[0]
        hits = sched.head_hits(head)  # NOTE: the lookup of this step's failed admission
        h = len(hits)
        if h:
            self.head_keys, self.head_hits = head.key_positions(), h
        if h == (len(head.token_ids) - 1) // bs:
            return  # every full prompt block is a hit already
        for m in s.lazy.members.values():
            # The step whose apply fills the member's block h.
            j = (h + 1) * bs - 1 - s.lazy.computed(m, s.step) + s.step
            if j >= s.step and _may_share(m.seq, head, h):
                self.last_step = min(self.last_step, j)

    def _evicts_head(self, free: Iterator[int], take: int) -> bool:
        """Whether the next ``take`` free blocks include one of the head's hits."""
        keys, hits, key_of = self.head_keys, self.head_hits, self.stepper.pool.key_of
        assert keys is not None
        for block in itertools.islice(free, take):
            key = key_of(block)
            if key is not None and keys.get(key, hits) < hits:
                return True
        return False


def _may_share(seq: Seq, head: Seq, h: int) -> bool:
    """Whether ``seq``'s block ``h`` could be the head's (its blocks before agree)."""
    if h == 0:
        return seq.request.cache_salt == head.request.cache_salt
    if len(seq.hashes) < h:
        return True  # NOTE: not known yet; assume it could (only ends the plan early)
    return seq.hashes[h - 1] == head.hashes[h - 1]
