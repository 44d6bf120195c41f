"""Early fill (C2), the policy side: at each branch, which candidates become fills.

:class:`Speculator` is the C2 arms' :class:`~dynbranch.fill.hook.BranchHook`. When a branch
opens it asks its :class:`FillPolicy` whether to generate candidates at all (Action 0), has
the predictor rank them from branch-time evidence only, asks the policy which to admit
(Action 1), and starts those as fills. When the branch resolves it teaches the predictor
what was chosen, cancels exclusive losers (engine abort; their shadows are dropped) and
keeps every fill of a multi-valued branch that was chosen. The fills themselves run in
:mod:`dynbranch.fill.runner`.

Policies are small objects: :class:`TopK` fills the ``fanout`` best-ranked candidates with
no pricing (the fixed-threshold end of the spectrum); the load-priced gate of C3
(:class:`~dynbranch.gate.priced.PricedPolicy`) and the baselines' policies plug in the
same way.

A :class:`~dynbranch.predictors.DraftingPredictor` (the drafter) drafts on the run's
``drafter`` engines when the session offers them (:attr:`BranchSession.draft`), *beside*
the canonical decision rather than before it, so the branch's own stage is never delayed:
its fills start when the draft is done, the drafting time is the entry's setup time
(``session.setup_s``, Action 0's ``T_setup``), and a draft still running when its branch
resolves is cancelled (its engine calls aborted). Without drafter engines it ranks
synchronously like any predictor.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import pickle
from abc import ABC, abstractmethod
from collections import OrderedDict
from collections.abc import Hashable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from dynbranch.fill.hook import BranchHook
from dynbranch.fill.model import Fill, FillChoice, Ranked
from dynbranch.fill.runner import BranchSession
from dynbranch.predictors import BranchContext, DraftingPredictor, Predictor
from dynbranch.runtime.offline import precompute
from dynbranch.runtime.run import RunContext

if TYPE_CHECKING:
    from dynbranch.workflow import BranchPoint
    from dynbranch.workload import DataConfig, RequestInstance, Workload

TRAIN_REQUESTS = 1024
"""Train-split requests a predictor learns from before a run, however long the run (one
pass over a smaller split): as many as InstCache pre-populates from
(:data:`~dynbranch.baselines.instcache.DEFAULT_TRAIN_REQUESTS`), so both learn from the same
amount of earlier traffic.

NOTE: it was 500, which left half of Routing's train split (1,085 records) unread while
every other workload's fits (ReAct 81, HCI 532, Sub-Agent 583). Routing's multi-turn
functions are learnt from their words, so the router needs the records: over the same 958
test branches (``scripts/predictor_accuracy.py``), multi-turn fillable top-1 went 0.618 →
0.748 and top-3 0.841 → 0.909 (single-turn 0.904 → 0.898), and ``table2``'s Routing c2
captured 0.76 / 0.73 / 0.75 of the oracle's reduction over seeds 0–2 instead of 0.65 / 0.64 /
0.68. Part of that was BFCL's make-up: its four multi-turn categories are variants of the
same 200 scenarios, and the split then went record by record, so a test record whose
scenario had a variant among the train records ranked its first choice right at 0.88 of its
multi-turn branches, one without at 0.64 (0.58 learning 500). Since 2026-12-07 a scenario's
variants share a side (:func:`workloads.routing.scenario_of`), so none of the test records'
turns is learnt from a variant: learning 1,024 of the 1,106 train records, the router's
fillable top-1 / top-3 over a 300-request draw of the test split is 0.711 / 0.883 (429
branches), against 0.819 / 0.945 (475) with the split record by record
(``scripts/predictor_accuracy.py --workloads routing``, both on 2026-12-07).

NOTE: it was as many as the run had, up to 500, so a short run's predictor learnt from a
handful of requests while InstCache pre-populates from 1,024 whatever the run's length: on
``fig8``'s quick commodity Routing cell (24 requests at 0.536 req/s, 8B/4090 over the WAN)
c2 (with C3's selection rates warm-started, :meth:`FillPolicy.learn_history`) went from
19.86 s (−4.9 % against the floor, 4.0 % behind InstCache) to 17.25 s (−17.3 %), 35 of 80
fills consumed instead of 18 of 150; without the warm start 19.75 → 18.12 s."""


HistoryBranch = tuple["BranchPoint", Sequence[Ranked], tuple[str, ...]]
"""One train-split branch for :meth:`FillPolicy.learn_history`: its point, the fillable
candidates the predictor ranked while it was open (best first), and what it chose."""

TRAINED_KEPT = 4
"""Learnt train splits :func:`keeping_train_splits` keeps by default, each a predictor's state
and its ranked train branches (Routing's, measured when it learnt 500 requests rather than
today's 1,024: a 4 MB predictor pickle and 1,602 branches, 21 MB pickled)."""
_TRAINED: OrderedDict[Hashable, tuple[bytes, list[HistoryBranch], int]] = OrderedDict()
_kept = 0  # how many _TRAINED holds at most; 0 outside keeping_train_splits()


@contextlib.contextmanager
def keeping_train_splits(n: int = TRAINED_KEPT) -> Iterator[None]:
    """Within the block, runs whose predictors learn the same train split from the same
    start learn it once (:meth:`Speculator._training_key`); what was kept goes at its end.

    NOTE: for a process that runs many replays (an experiment's cells). A lone replay keeps
    nothing: the kept split would only raise its peak memory (a 10,000-request Routing
    replay's by about 70 MB).
    """
    global _kept
    before, _kept = _kept, n
    try:
        yield
    finally:
        _kept = before
        if not _kept:
            _TRAINED.clear()


class FillPolicy(ABC):
    """Decides, per branch entry, whether to predict and which candidates to fill."""

    name: str

    decides_at_once = False
    """Whether :meth:`decide` is cheaper than ``generation`` then ``choose`` (a remote gate:
    one round trip instead of two); the speculator then ranks first and asks once."""

    async def generation(self, session: BranchSession) -> bool:
        """Action 0: run the predictor for this branch at all (default: always)."""
        return True

    async def decide(self, session: BranchSession,
                     ranked: Sequence[Ranked]) -> list[FillChoice] | None:
        """Actions 0 and 1 at once on a ranking made beforehand: ``None`` when Action 0
        closes the entry, else :meth:`choose`'s answer (this default: the two in turn)."""
        if not await self.generation(session):
            return None
        return await self.choose(session, ranked)

    @abstractmethod
    async def choose(self, session: BranchSession,
                     ranked: Sequence[Ranked]) -> list[FillChoice]:
        """Action 1: which of the fillable ranked candidates (best first) become fills."""

    def settled(self, session: BranchSession, chosen: tuple[str, ...]) -> None:
        """The branch resolved: learn from it (default: nothing)."""

    learns_history = False
    """Whether :meth:`learn_history` learns anything (the speculator ranks the train split's
    branches only for a policy that does)."""

    async def learn_history(self, branches: Sequence[HistoryBranch]) -> None:
        """What the train split's branches, ranked before the run, teach (default:
        nothing)."""

    async def request_done(self, request_id: str, fills: Sequence[Fill]) -> None:
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

    async def choose(self, session: BranchSession,
                     ranked: Sequence[Ranked]) -> list[FillChoice]:
        return [FillChoice(c.name, c.rank) for c in ranked[: self.fanout]]


class Speculator(BranchHook):
    """Predict → admit → fill at every branch; resolve → learn, cancel losers."""

    name = "c2"

    def __init__(self, run: RunContext, predictor: Predictor, policy: FillPolicy) -> None:
        self.run, self.predictor, self.policy = run, predictor, policy
        self.fanout = run.fill.fanout
        self.counts = {"branches": 0, "generated": 0, "candidates": 0, "train_branches": 0,
                       "decided_first": 0}
        self._drafts: dict[BranchSession, asyncio.Task] = {}
        # NOTE: a draft is marked admitting without an await after its draft returns, so
        # resolution knows whether it may still cancel it (drafting) or must let it record
        # the reservations the gate granted (admitting).
        self._admitting: set[BranchSession] = set()
        self.drafting = {"drafts": 0, "samples": 0, "late": 0, "failed": 0, "drafting_s": 0.0}

    async def prepopulate(self, workload: Workload, data: DataConfig | None, seed: int, *,
                          split: str, requests: int) -> None:
        """Teach the predictor the branches of the train split's requests, run offline, as it
        would have learnt them serving earlier traffic. NOTE: only when the run is measured
        on the test split: the two never share a record, so nothing measured is seen."""
        if data is None or split != "test":
            return
        # NOTE: a drafter ranks on an engine, which the run has not started, and a predictor
        # fitted on the train split ranks it in-sample: those only learn.
        ranks = self.policy.learns_history and not (
            isinstance(self.predictor, DraftingPredictor) or self.predictor.in_sample_on_train)
        size = workload.split_size(data, "train")
        n = TRAIN_REQUESTS if size is None else min(TRAIN_REQUESTS, size)
        key = self._training_key(seed, n, ranks) if _kept else None
        learnt = _TRAINED.get(key) if key is not None else None
        if learnt is None:
            history = await self._learn_train_split(workload, data, seed, n, ranks)
            if key is not None:
                _TRAINED[key] = (pickle.dumps(self.predictor, pickle.HIGHEST_PROTOCOL),
                                 history, self.counts["train_branches"])
                while len(_TRAINED) > _kept:
                    _TRAINED.popitem(last=False)
        else:
            _TRAINED.move_to_end(key)
            blob, history, branches = learnt
            vars(self.predictor).update(vars(pickle.loads(blob)))
            self.counts["train_branches"] += branches
        if ranks:
            await self.policy.learn_history(history)

    async def _learn_train_split(self, workload: Workload, data: DataConfig, seed: int, n: int,
                                 ranks: bool) -> list[HistoryBranch]:
        """Run ``n`` train requests offline; the predictor learns each branch (ranking it
        first when ``ranks``). Returns the branches with what was ranked at each."""
        history: list[HistoryBranch] = []
        for instance in workload.requests(data, n, seed, "train"):
            ranked: list[list[Ranked]] = []

            def opened(point: BranchPoint, instance: RequestInstance = instance,
                       ranked: list[list[Ranked]] = ranked) -> None:
                ranked.append(self._ranked(instance, point) if ranks else [])

            try:
                run = await precompute(instance, opened=opened)
            except Exception:  # NOTE: a train request that cannot run teaches nothing
                continue
            for (point, chosen), before in zip(run.branches, ranked, strict=True):
                self.predictor.observe(BranchContext.of(instance.request_id, point), chosen)
                history.append((point, before, chosen))
            self.counts["train_branches"] += len(run.branches)
        return history

    def _training_key(self, seed: int, n: int, ranks: bool) -> Hashable | None:
        """Equal for two runs whose predictors learn the same train split from the same
        start (``None``: not known, learn it again).

        NOTE: an experiment replays many cells of one workload, and each cell's predictor
        learnt the same train split from scratch, ~3 s of offline runs and learning steps on
        Routing (500 requests), a sizeable share of a short cell. Learning is deterministic
        (no clock, no engines, no shared random state), so a predictor equal before it (its
        pickle) ends equal after it: the next cell takes the learnt state and the ranked
        branches as the first one left them (inside :func:`keeping_train_splits`, which
        ``experiments.common.run_cells`` opens). A drafter ranks on engines and learns again.
        """
        if (self.run.workload_key is None or isinstance(self.predictor, DraftingPredictor)
                or not hasattr(self.predictor, "__dict__")):
            return None
        try:
            start = pickle.dumps(self.predictor, pickle.HIGHEST_PROTOCOL)
        except Exception:  # NOTE: a predictor holding live objects learns again
            return None
        return (self.run.workload_key, seed, n, ranks, self.fanout,
                hashlib.sha256(start).hexdigest())

    def _ranked(self, instance: RequestInstance, point: BranchPoint) -> list[Ranked]:
        """The fillable candidates the predictor ranks at an open train branch, as
        :meth:`_fill` forms them at a live one."""
        ctx = BranchContext.of(instance.request_id, point)
        k = len(point.candidates) or max(self.fanout, 1) * 4
        ranking = self.predictor.rank(ctx, k)
        probs = self.predictor.confidences(ctx)
        return [Ranked(c, r, None if probs is None else probs.get(c))
                for r, c in enumerate(ranking) if instance.fillable(point, c)]

    async def opened(self, session: BranchSession) -> None:
        self.counts["branches"] += 1
        if session.decided:
            # NOTE: the canonical path decided before C2 could begin (its deciding stage was
            # served from the store or a shadow without waiting): there is no window, so
            # the gate is not asked and nothing is filled. Such entries were fully priced and
            # their fills started, then discarded at once: on 10,000 Routing requests at
            # 4 req/s (repeats served from C1), 69 % of branch entries, and 54,065 fills
            # issued for 2,467 consumed; skipped, 3,282 for 2,636, mean latency 10.27 ->
            # 10.05 s and the replay 255 -> 112 s wall.
            self.counts["decided_first"] += 1
            return
        ctx = BranchContext.of(session.request_id, session.point)
        k = len(session.point.candidates) or max(self.fanout, 1) * 4
        drafts = isinstance(self.predictor, DraftingPredictor) and session.draft is not None
        if self.policy.decides_at_once and not drafts:
            # NOTE: ranking is synchronous and cheap, so it runs before Action 0 and the
            # gate answers both actions in one round trip; a closed entry's ranking is
            # simply not used (a drafter's ranking costs an engine call: it waits).
            await self._fill(session, ctx, self.predictor.rank(ctx, k), at_once=True)
            return
        if not await self.policy.generation(session):
            return
        self.counts["generated"] += 1
        if drafts:
            self._drafts[session] = asyncio.create_task(
                self._draft_and_fill(session, ctx, k), name=f"draft-{session.request_id}")
            return
        await self._fill(session, ctx, self.predictor.rank(ctx, k))

    async def _fill(self, session: BranchSession, ctx: BranchContext, ranking: Sequence[str],
                    *, at_once: bool = False) -> None:
        probs = self.predictor.confidences(ctx)
        ranked = [Ranked(c, r, None if probs is None else probs.get(c))
                  for r, c in enumerate(ranking) if session.fillable(c)]
        if at_once:
            choices = await self.policy.decide(session, ranked)
            if choices is None:
                return
            self.counts["generated"] += 1
        else:
            choices = await self.policy.choose(session, ranked)
        self.counts["candidates"] += len(ranked)
        for choice in choices:
            session.start(choice)
        # NOTE: T_setup is what the entry spent on the run's clock before its fills could
        # start: prediction, drafting and admission (a gate round trip on Ray).
        session.setup_s = session.now() - session.opened_at

    async def _draft_and_fill(self, session: BranchSession, ctx: BranchContext,
                              k: int) -> None:
        assert isinstance(self.predictor, DraftingPredictor) and session.draft is not None
        start = session.now()
        try:
            draft = await self.predictor.draft(ctx, k, session.draft, now=session.now)
        except Exception:  # NOTE: a failed draft is a branch without fills, not a failure
            self.drafting["failed"] += 1
            return
        finally:
            session.setup_s = session.now() - start
            self.drafting["drafting_s"] += session.setup_s
        self._admitting.add(session)
        self.drafting["drafts"] += 1
        self.drafting["samples"] += len(draft.samples)
        await self._fill(session, ctx, draft.ranked)

    async def _stop_draft(self, session: BranchSession) -> asyncio.Task | None:
        """End ``session``'s draft: cancel it while it drafts, let it finish admitting (so
        the reservations the gate granted reach their fills). The ended task, if any."""
        task = self._drafts.pop(session, None)
        if task is None:
            return None
        if not task.done() and session not in self._admitting:
            self.drafting["late"] += 1
            task.cancel()
        self._admitting.discard(session)
        await asyncio.wait([task])
        return task

    async def resolved(self, session: BranchSession, chosen: tuple[str, ...]) -> None:
        task = await self._stop_draft(session)
        if task is not None and not task.cancelled() and task.exception() is not None:
            raise task.exception()  # admission failed: as it would have inline
        self.predictor.observe(BranchContext.of(session.request_id, session.point), chosen)
        for fill in session.fills:
            if fill.candidate not in chosen:
                await session.discard(fill)  # an exclusive loser: abort, drop its shadows
        self.policy.settled(session, chosen)

    async def request_ending(self, request_id: str) -> None:
        for session in [s for s in self._drafts if s.request_id == request_id]:
            await self._stop_draft(session)  # a request that failed inside its branch

    async def request_done(self, request_id: str, fills: Sequence[Fill]) -> None:
        await self.policy.request_done(request_id, fills)

    def stats(self) -> dict[str, Any]:
        drafting = {"drafting": dict(self.drafting)} if any(self.drafting.values()) else {}
        return {**self.counts, "policy": self.policy.name, "predictor": self.predictor.name,
                **drafting, **self.policy.stats()}

    async def snapshot(self) -> dict[str, Any]:
        return {**self.stats(), **await self.policy.snapshot()}

    def close(self) -> None:
        for task in self._drafts.values():
            task.cancel()
        self.policy.close()
