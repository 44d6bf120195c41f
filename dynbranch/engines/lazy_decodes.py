"""The decoding requests of a sim engine, stepped together without touching each one.

Every step, each decoding request computes one token, its context grows by one, and it
samples one token. So a member's state at any step is a closed form of where it joined:
``computed = ctx + (step - joined)`` and ``sampled = base + (step - joined)``. The only
per-request events are sparse and known in advance: a request takes a new KV block every
``block_size`` steps and publishes the block it filled one step before; it ends when its
replay runs out. :class:`LazyDecodes` keeps members in buckets by the step residue at which
those block events happen (each bucket in batch order) and a heap of end steps, plus the
batch totals a step's cost needs, so a step costs O(1) plus its events.

A member's own fields (``num_computed``, ``sampled``, ``token_ids``) are brought up to date
only when something reads them (:meth:`LazyDecodes.settle`).
"""

from __future__ import annotations

import bisect
import heapq

from dynbranch.engines.scheduler import Seq


class Member:
    """A decoding request as of the step it joined the lazy set."""

    __slots__ = ("alive", "base", "ctx", "end", "joined", "rank", "seq")

    def __init__(self, seq: Seq, joined: int) -> None:
        self.seq, self.rank, self.joined = seq, seq.admitted, joined
        self.ctx, self.base = seq.num_computed, seq.sampled
        # The step whose apply samples its last token.
        self.end = joined + len(seq.plan.token_ids) - seq.sampled - 1
        self.alive = True


def _rank(member: Member) -> int:
    return member.rank


class LazyDecodes:
    """The decoding members, in batch order (admission order) within each bucket."""

    def __init__(self, block_size: int) -> None:
        self.block_size = block_size
        self.members: dict[Seq, Member] = {}
        # Bucket r: members that take a block when scheduled for a step s with s % bs == r,
        # and publish a full block when the step s - 1 is applied.
        self.buckets: list[list[Member]] = [[] for _ in range(block_size)]
        self._ends: list[tuple[int, int, Member]] = []  # (end step, rank, member)
        self.context = 0  # computed tokens of all members as of the step in flight
        # Members that have not sampled yet (their prompt's last token is still to be
        # computed): their first step samples their first token.
        self.first: list[Member] = []

    @property
    def n(self) -> int:
        return len(self.members)

    def join(self, seq: Seq, step: int) -> None:
        """``seq`` (settled, decoding) is a member from step ``step`` on."""
        m = Member(seq, step)
        self.members[seq] = m
        bisect.insort(self.buckets[(step - m.ctx) % self.block_size], m, key=_rank)
        heapq.heappush(self._ends, (m.end, m.rank, m))
        self.context += m.ctx
        if seq.first_token_at is None:
            self.first.append(m)

    def leave(self, m: Member, step: int) -> None:
        """``m`` is no longer stepped (it ended, or was aborted in step ``step``)."""
        m.alive = False
        del self.members[m.seq]
        self.buckets[(m.joined - m.ctx) % self.block_size].remove(m)
        self.context -= self.computed(m, step)

    def computed(self, m: Member, step: int) -> int:
        """Tokens ``m`` has computed before step ``step``."""
        return m.ctx + step - m.joined

    def sampled(self, m: Member, step: int) -> int:
        """Tokens ``m`` has sampled before step ``step`` is applied."""
        return m.base + step - m.joined

    def next_end(self) -> int | None:
        """The first step whose apply ends a member."""
        ends = self._ends
        while ends and not ends[0][2].alive:
            heapq.heappop(ends)
        return ends[0][0] if ends else None

    def ending(self, step: int) -> list[Member]:
        """Members whose last token step ``step`` samples (batch order)."""
        out, ends = [], self._ends
        while ends and (ends[0][0] <= step or not ends[0][2].alive):
            m = heapq.heappop(ends)[2]
            if m.alive:
                assert m.end == step, "members end where planned"
                out.append(m)
        return sorted(out, key=_rank)

    def settle(self, m: Member, step: int) -> None:
        """Bring ``m.seq``'s own fields to what they are before step ``step`` is applied."""
        seq = m.seq
        seq.num_computed, seq.sampled = self.computed(m, step), self.sampled(m, step)
        sync_tokens(seq)

    def drain(self, step: int) -> list[Seq]:
        """Settle every member and empty the set (batch order)."""
        out = sorted(self.members.values(), key=_rank)
        for m in out:
            self.settle(m, step)
            m.alive = False
        self.members.clear()
        self.buckets = [[] for _ in range(self.block_size)]
        self._ends, self.context, self.first = [], 0, []
        return [m.seq for m in out]


def sync_tokens(seq: Seq) -> None:
    """Make ``seq.token_ids`` its prompt and the tokens it has sampled."""
    have = len(seq.token_ids) - seq.prompt_len
    if have < seq.sampled:
        seq.token_ids.extend(seq.plan.token_ids[have : seq.sampled])
