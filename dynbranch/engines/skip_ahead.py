"""Skip-ahead for the sim engine: runs of decode steps whose batch cannot change.

Once every running request is decoding (one token a step) and nothing can be admitted,
the next steps are known in advance until something changes the batch: a request ends, a
decode needs a block the pool does not have (a preemption), or the waiting queue's head
could be admitted. Between those points each step's time is a closed-form function of the
batch's total context (:meth:`Profile.step_time`), a request's KV grows one token a step,
and the only pool operations are a new block every ``block_size`` steps per request (and
publishing the block it filled). A :class:`DecodeRun` plans such a stretch and applies
each of its steps in O(1) plus those sparse block operations, in the same order and with
the same floating-point sums as stepping one by one, so results are identical.

The run's last step is applied by the ordinary scheduler (it is where the batch changes),
and anything that arrives from outside — a new request, an abort — ends the run after the
step in flight, exactly when a step-by-step engine would next schedule.
"""

from __future__ import annotations

import itertools
from collections import deque
from collections.abc import Iterator
from math import fsum, inf

from dynbranch.engines.profile import Profile
from dynbranch.engines.queued import RUNNING
from dynbranch.engines.scheduler import Scheduler, Seq, StepPlan

FIRST_HORIZON = 16
"""Steps a run plans at first; each extension doubles it (a run cut short wastes little)."""


class BusyWindow:
    """Step time within the last ``window_s`` seconds: the engine's recent utilisation.

    NOTE: the window's sum is taken with ``math.fsum`` (exactly rounded), so it does not
    depend on when old steps are dropped; steps are dropped as new ones arrive, which keeps
    memory flat however long a run is.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self._steps: deque[tuple[float, float]] = deque()  # (step end, step seconds)

    def add(self, end: float, seconds: float) -> None:
        """A step of ``seconds`` ended at ``end``."""
        self._drop_before(end - self.window_s)
        self._steps.append((end, seconds))

    def fraction(self, now: float) -> float:
        """Share of the window before ``now`` spent in steps."""
        self._drop_before(now - self.window_s)
        busy = fsum(s for _, s in self._steps)
        return min(1.0, max(0.0, busy / self.window_s))

    def _drop_before(self, horizon: float) -> None:
        steps = self._steps
        while steps and steps[0][0] < horizon:
            steps.popleft()


class DecodeRun:
    """A planned stretch of pure-decode steps (see the module doc).

    Step 0 is the step the scheduler just planned; steps ``0 .. limit - 2`` are applied here
    (:meth:`advance`), step ``limit - 1`` by the scheduler (:meth:`last_plan`). ``limit``
    stays ``None`` while the run has not yet found where it ends.
    """

    def __init__(self, sched: Scheduler, profile: Profile, plan: StepPlan, end: float, cost: float):
        self.sched, self.pool, self.profile = sched, sched.pool, profile
        self.seqs = list(plan.tokens)
        self.index = {seq: i for i, seq in enumerate(self.seqs)}
        self.ctx = [plan.context[seq] for seq in self.seqs]  # context at step 0
        self.base = [seq.sampled for seq in self.seqs]  # tokens sampled before step 0
        self.n, self.total_ctx = len(self.seqs), sum(self.ctx)
        self.ends, self.costs = [end], [cost]
        self.done = 0  # steps applied
        self.limit: int | None = None
        self.min_left = min(len(s.plan.token_ids) - s.sampled for s in self.seqs)
        self.first = [seq for seq in self.seqs if seq.first_token_at is None]
        bs = sched.block_size
        # Step j >= 1 takes a block for request i iff (ctx_i + j) % bs == 0; the apply of
        # step j fills request i's last block iff (ctx_i + j + 1) % bs == 0.
        self.alloc_at: list[list[int]] = [[] for _ in range(bs)]
        self.fill_at: list[list[int]] = [[] for _ in range(bs)]
        for i, c in enumerate(self.ctx):
            self.alloc_at[-c % bs].append(i)
            self.fill_at[(-c - 1) % bs].append(i)
        self.free_left = self.pool.num_free
        self.allocs = self.allocs_done = 0  # blocks the planned / applied steps take
        self.unsafe_from: float = inf  # the first step that would be scheduled on new hits
        # The waiting head's block keys and hit count, while its hits could be evicted.
        self.head_keys: dict[bytes, int] | None = None
        self.head_hits = 0
        self._watch_head()

    @classmethod
    def plan(
        cls, sched: Scheduler, profile: Profile, plan: StepPlan, end: float, cost: float
    ) -> DecodeRun | None:
        """A run that starts with ``plan`` (just scheduled), or None when it cannot."""
        if plan.preempted or len(plan.tokens) != len(sched.running):
            return None
        if any(n != 1 for n in plan.tokens.values()):
            return None
        if min(len(s.plan.token_ids) - s.sampled for s in plan.tokens) < 2:
            return None  # a request ends with step 0
        return cls(sched, profile, plan, end, cost)

    # -- where the run must stop ------------------------------------------------------------

    def _watch_head(self) -> None:
        """Bound the run where the waiting head's admission could change (vLLM admits in
        strict queue order, so only the head matters).

        With its cached prefix unchanged the head only gets harder to admit as free blocks
        are used, so a head that failed at step 0 keeps failing unless its prefix hits
        change. They shrink when a decode's new block evicts a free block among them; with
        a step budget below the prompt, what the head needs then stays the same while the
        free hits it no longer claims come back, and it can fit (a test has such a case).
        They grow when a decode publishes the block that extends them.

        NOTE: growth is guarded for completeness: the decode that publishes a block takes
        its next one at the same boundary, so the two cancel unless the new hit also joins
        further cached blocks (duplicate prefixes); no search has found a case.
        """
        sched, pool, bs = self.sched, self.pool, self.sched.block_size
        if not sched.waiting or not pool.caching:
            return  # without caching the hits stay empty
        if len(sched.running) >= sched.max_num_seqs or sched.max_num_batched_tokens <= self.n:
            return  # nothing can be admitted while the batch stays as it is
        head = sched.waiting[0]
        hits = sched.head_hits(head)  # NOTE: the lookup of this step's failed admission
        h = len(hits)
        if h:
            self.head_keys, self.head_hits = head.key_positions(), h
        if h == (len(head.token_ids) - 1) // bs:
            return  # every full prompt block is a hit already
        for i, seq in enumerate(self.seqs):
            j = (h + 1) * bs - self.ctx[i] - 1  # the step whose apply fills its block h
            if j >= 0 and self._may_share(seq, head, h):
                self.unsafe_from = min(self.unsafe_from, j + 1)

    @staticmethod
    def _may_share(seq: Seq, head: Seq, h: int) -> bool:
        """Whether ``seq``'s block ``h`` could be the head's (its blocks before agree)."""
        if h == 0:
            return seq.request.cache_salt == head.request.cache_salt
        if len(seq.hashes) < h:
            return True  # NOTE: not known yet; assume it could (only ends the run early)
        return seq.hashes[h - 1] == head.hashes[h - 1]

    def _extend(self) -> None:
        """Plan more steps (doubling), or find the run's last step."""
        start = len(self.ends)
        stop = min(self.min_left, self.unsafe_from, start + max(FIRST_HORIZON, start))
        n, bs, total, step_time = (
            self.n,
            self.sched.block_size,
            self.total_ctx,
            self.profile.step_time,
        )
        # The blocks the planned allocations will take, in order (nothing allocates while
        # this iterates): the free list from where the planned ones end.
        free = None
        if self.head_keys is not None:
            free = itertools.islice(self.pool.free_order(), self.allocs - self.allocs_done, None)
        t = self.ends[-1]
        for j in range(start, int(stop)):
            take = len(self.alloc_at[j % bs])
            if take:
                if take > self.free_left or (free is not None and self._evicts_head(free, take)):
                    self.limit = j
                    return
                self.free_left -= take
                self.allocs += take
            kv = total + n * j
            cost = step_time(n, n, kv, kv + n)
            t = t + cost
            self.ends.append(t)
            self.costs.append(cost)
        if stop == self.min_left or stop == self.unsafe_from:
            self.limit = int(stop)

    def _evicts_head(self, free: Iterator[int], take: int) -> bool:
        """Whether the next ``take`` free blocks include one of the head's hits."""
        keys, hits, key_of = self.head_keys, self.head_hits, self.pool.key_of
        assert keys is not None
        for block in itertools.islice(free, take):
            key = key_of(block)
            if key is not None and keys.get(key, hits) < hits:
                return True
        return False

    # -- stepping ---------------------------------------------------------------------------

    @property
    def step_end(self) -> float:
        """When the step in flight ends."""
        return self.ends[self.done]

    @property
    def step_cost(self) -> float:
        return self.costs[self.done]

    def in_last_step(self) -> bool:
        """Whether the step in flight is the run's last."""
        if self.limit is None and self.done + 1 >= len(self.ends):
            self._extend()
        return self.limit is not None and self.done + 1 >= self.limit

    def horizon(self) -> float:
        """When the furthest planned step ends: where the engine next needs to look."""
        if self.limit is None and self.done + 1 >= len(self.ends):
            self._extend()
        last = len(self.ends) if self.limit is None else self.limit
        return self.ends[last - 1]

    def cut(self) -> None:
        """Something came from outside: the step in flight is the last."""
        self.limit = self.done + 1

    def advance(self, busy: BusyWindow) -> None:
        """Apply the step in flight (not the last) and schedule the next one."""
        j, bs, pool, sched = self.done, self.sched.block_size, self.pool, self.sched
        busy.add(self.ends[j], self.costs[j])
        if pool.caching:
            for i in self.fill_at[j % bs]:
                seq = self.seqs[i]
                q = (self.ctx[i] + j + 1) // bs  # full blocks after this step
                self._sync_tokens(seq, self.base[i] + j)
                seq.ensure_hashes(q, bs)
                pool.cache(seq.blocks[q - 1], seq.hashes[q - 1])
        if j == 0:
            for seq in self.first:
                seq.first_token_at = self.ends[0]
        taking = self.alloc_at[(j + 1) % bs]
        for i in taking:
            sched.hold(self.seqs[i], pool.allocate(1))
        self.allocs_done += len(taking)
        self.done = j + 1

    def sampled(self, seq: Seq) -> int:
        """Tokens ``seq`` has sampled so far (it is one of the run's requests)."""
        if seq.state != RUNNING:
            return seq.sampled
        return self.base[self.index[seq]] + self.done

    def settle(self, seq: Seq) -> None:
        """Bring ``seq``'s own fields up to the steps applied (before it leaves the run)."""
        i = self.index[seq]
        if seq.state == RUNNING:
            seq.sampled = self.base[i] + self.done
            seq.num_computed = self.ctx[i] + self.done
            self._sync_tokens(seq, seq.sampled)

    def last_plan(self) -> StepPlan:
        """Settle every request and hand back the last step's batch for the scheduler."""
        plan = StepPlan(self.sched.max_num_batched_tokens - self.n)
        for seq in self.seqs:
            self.settle(seq)
            # NOTE: an aborted request stays in the batch it was scheduled in (its tokens
            # were paid for); applying the step skips it.
            plan.tokens[seq] = 1
            plan.context[seq] = self.ctx[self.index[seq]] + self.done
        return plan

    @staticmethod
    def _sync_tokens(seq: Seq, sampled: int) -> None:
        """Make ``seq.token_ids`` the prompt and its first ``sampled`` tokens."""
        have = len(seq.token_ids) - seq.prompt_len
        if have < sampled:
            seq.token_ids.extend(seq.plan.token_ids[have:sampled])
