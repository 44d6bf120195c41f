"""Early fill (C2), the policy side: at each branch, which candidates become fills.

:class:`Speculator` is the arm's :class:`~dynbranch.hooks.BranchHook`. When a branch opens
it asks its :class:`FillPolicy` whether to generate candidates at all (Action 0), has the
predictor rank them from branch-time evidence only, asks the policy which to admit (Action
1), and starts those as fills. When the branch resolves it teaches the predictor what was
chosen, cancels exclusive losers (engine abort; their shadows are dropped) and keeps every
fill of a multi-valued branch that was chosen. The fills themselves run in
:mod:`dynbranch.fills`.

Policies are small objects: :class:`TopK` fills the ``fanout`` best-ranked candidates with
no pricing (the fixed-threshold end of the spectrum); the load-priced gate of C3 plugs in
the same way.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dynbranch.hooks import BranchHook, BranchSession, RunContext
from dynbranch.predictors import BranchContext, Predictor


@dataclass(frozen=True)
class FillChoice:
    """A candidate the policy admitted, with the gate's reservation (if any)."""

    candidate: str
    rank: int
    reservation: Any = None


class FillPolicy(ABC):
    """Decides, per branch entry, whether to predict and which candidates to fill."""

    name: str

    async def generation(self, session: BranchSession) -> bool:
        """Action 0: run the predictor for this branch at all (default: always)."""
        return True

    @abstractmethod
    async def choose(self, session: BranchSession, ranked: Sequence[str]) -> list[FillChoice]:
        """Action 1: which ranked candidates become fills."""

    def settled(self, session: BranchSession, chosen: tuple[str, ...]) -> None:
        """The branch resolved: learn from it (default: nothing)."""

    async def request_done(self, request_id: str, fills: Sequence[Any]) -> None:
        """Every fill of the request has ended: release their receipts and learn from the
        request's branch entries (default: nothing)."""

    def stats(self) -> dict[str, Any]:
        return {}

    async def snapshot(self) -> dict[str, Any]:
        """Counters plus what the policy holds at the end of a run."""
        return self.stats()

    def close(self) -> None:
        """Stop background work (default: none)."""


class TopK(FillPolicy):
    """Fill the ``fanout`` best-ranked candidates, unpriced."""

    name = "topk"

    def __init__(self, fanout: int) -> None:
        if fanout < 0:
            raise ValueError(f"fanout must be >= 0, got {fanout}")
        self.fanout = fanout

    async def choose(self, session: BranchSession, ranked: Sequence[str]) -> list[FillChoice]:
        return [FillChoice(c, r) for r, c in enumerate(ranked[: self.fanout])]


class Speculator(BranchHook):
    """Predict → admit → fill at every branch; resolve → learn, cancel losers."""

    name = "c2"

    def __init__(self, run: RunContext, predictor: Predictor, policy: FillPolicy) -> None:
        self.run, self.predictor, self.policy = run, predictor, policy
        self.fanout = int(run.options.get("fanout", 2))
        self._open: dict[str, list[BranchSession]] = {}
        self.counts = {"branches": 0, "generated": 0, "candidates": 0}

    async def opened(self, session: BranchSession) -> None:
        self.counts["branches"] += 1
        self._open.setdefault(session.request_id, []).append(session)
        if not await self.policy.generation(session):
            return
        self.counts["generated"] += 1
        ctx = BranchContext.of(session.request_id, session.point)
        ranked = [c for c in self.predictor.rank(ctx, len(session.point.candidates) or
                                                 max(self.fanout, 1) * 4)
                  if session.fillable(c)]
        self.counts["candidates"] += len(ranked)
        for choice in await self.policy.choose(session, ranked):
            fill = session.start_fill(choice.candidate, rank=choice.rank,
                                      reservation=choice.reservation)
            session.fills.append(fill)

    async def resolved(self, session: BranchSession, chosen: tuple[str, ...]) -> None:
        self.predictor.observe(BranchContext.of(session.request_id, session.point), chosen)
        for fill in session.fills:
            if fill.candidate not in chosen:
                await session.discard(fill)  # an exclusive loser: abort, drop its shadows
        self.policy.settled(session, chosen)

    async def request_done(self, request_id: str) -> None:
        fills = [f for s in self._open.pop(request_id, []) for f in s.fills]
        await self.policy.request_done(request_id, fills)

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "policy": self.policy.name, "predictor": self.predictor.name,
                **self.policy.stats()}

    async def snapshot(self) -> dict[str, Any]:
        return {**self.stats(), **await self.policy.snapshot()}

    def close(self) -> None:
        self.policy.close()
