"""Early fill (C2), the mechanism: open branches, and the fills that run while they decide.

:class:`FillRunner` owns every fill of a run. The orchestrator opens a
:class:`BranchSession` per branch entry through it; a policy starts fills on the session
(:meth:`BranchSession.start`), each running the request's
:meth:`~dynbranch.workload.RequestInstance.speculate` for one candidate through a
:class:`~dynbranch.fill.context.FillContext`. The runner cancels losers (engine abort),
drops the shadows nobody consumed, records which canonical stage consumed which fill, and
counts issued / consumed / discarded (executed work nobody was served) / covered (ran to
its end executing nothing: the store already held every stage it reached). Which
candidates to fill is policy (:mod:`dynbranch.fill.speculator`), not decided here.

Ownership: a session owns its fills; the runner indexes sessions by request and fills by
the reuse names they executed under, so a canonical stage of *any* request that is served a
fill's shadow (or waits on it) credits that fill.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from dynbranch.engines.protocol import GenerateRequest, GenerateResult, LoadSnapshot
from dynbranch.errors import NotSpeculable
from dynbranch.fill.context import FillContext
from dynbranch.fill.model import Consumption, DepthBudget, Fill, FillChoice
from dynbranch.reuse.hook import ReuseHook
from dynbranch.runtime.execution import RequestState, StageExecutor
from dynbranch.workflow import BranchPoint

Generate = Callable[[GenerateRequest], Awaitable[GenerateResult]]


class BranchSession:
    """An open branch as C2 sees it: what it is, and the services to decide and fill it.

    One per branch entry. ``setup_s`` is the prediction time the entry spent (Action 0's
    ``T_setup``); ``fills`` the fills started on it, in start order; ``decided`` whether the
    canonical path has already reached its decision (see :meth:`decide`).
    """

    def __init__(self, runner: FillRunner, state: RequestState, point: BranchPoint) -> None:
        self._runner, self._state = runner, state
        self.request_id, self.point = state.request_id, point
        self.opened_at = runner.executor.clock.now()
        self.setup_s = 0.0
        self.fills: list[Fill] = []
        self.decided = False

    def decide(self) -> None:
        """The canonical path has decided: nothing started from now on can hide any of it."""
        self.decided = True

    def now(self) -> float:
        """The run clock."""
        return self._runner.executor.clock.now()

    def fillable(self, candidate: str) -> bool:
        """Whether the request has anything to fill for ``candidate``."""
        return self._state.instance.fillable(self.point, candidate)

    async def loads(self) -> list[LoadSnapshot]:
        """The load snapshot of every engine that serves stages and fills."""
        return await self._runner.executor.pool.serving_loads()

    @property
    def load_reader(self) -> Callable[[], Awaitable[list[LoadSnapshot]]]:
        """:meth:`loads` without the session, for what outlives its request (a load probe
        holding the session would keep the request's whole state alive)."""
        return self._runner.executor.pool.serving_loads

    @property
    def draft(self) -> Generate | None:
        """One prediction call on the run's drafter engines (``None``: the run has none)."""
        pool = self._runner.executor.pool
        return pool.draft if pool.drafts else None

    def start(self, choice: FillChoice) -> Fill:
        """Start a fill of ``choice`` for this branch."""
        fill = self._runner.start(self, self._state, choice)
        self.fills.append(fill)
        return fill

    async def discard(self, fill: Fill) -> None:
        """Cancel ``fill`` (engine abort) and drop the shadows nobody consumed."""
        await self._runner.discard(fill)


class FillRunner:
    """Starts, tracks and tears down the fills of one run."""

    def __init__(self, executor: StageExecutor, reuse: ReuseHook, depth: int) -> None:
        self.executor, self.reuse = executor, reuse
        self.depth = DepthBudget(depth)
        self._sessions: dict[str, list[BranchSession]] = {}
        self._by_name: dict[str, Fill] = {}
        self._seq = 0
        self.counts = {"issued": 0, "consumed": 0, "discarded": 0, "covered": 0,
                       "cancelled": 0, "stopped": 0, "failed": 0}

    def open_branch(self, state: RequestState, point: BranchPoint) -> BranchSession:
        """A session for a branch ``state``'s request just opened."""
        session = BranchSession(self, state, point)
        self._sessions.setdefault(state.request_id, []).append(session)
        return session

    def start(self, session: BranchSession, state: RequestState, choice: FillChoice) -> Fill:
        """Start a fill of ``choice`` for ``session`` (use :meth:`BranchSession.start`)."""
        if not self.reuse.keeps_shadows:
            raise NotSpeculable(f"the {self.reuse.name} reuse hook keeps no shadows; "
                                "fills need them")
        self._seq += 1
        fill = Fill(f"fill{self._seq}", state.request_id, str(session.point.coordinate),
                    choice.candidate, choice.rank, self.executor.rel(),
                    budgets=(self.depth, *choice.budgets), reservation=choice.reservation,
                    on_end=choice.on_end)
        fill.task = asyncio.create_task(self._run(fill, state, session.point),
                                        name=f"{state.request_id}/{fill.fill_id}")
        self.counts["issued"] += 1
        return fill

    async def _run(self, fill: Fill, state: RequestState, point: BranchPoint) -> None:
        ctx = FillContext(state, fill, self.executor, self.reuse, self._claimed)
        try:
            await state.instance.speculate(ctx, point, fill.candidate)
            fill.state = "done"
        except NotSpeculable:
            fill.state = "stopped"
        except asyncio.CancelledError:
            fill.state = "cancelled"
            raise
        except Exception as e:  # a fill's failure is a miss, never the request's failure
            fill.state, fill.error = "failed", f"{type(e).__name__}: {e}"
        finally:
            await self._ended(fill)

    async def _ended(self, fill: Fill) -> None:
        """Account a fill's end once, however it ended (its task may never have run)."""
        if fill.ended_at is not None:
            return
        if fill.state == "running":
            fill.state = "cancelled"  # cancelled before its task took its first step
        fill.ended_at = self.executor.rel()
        if fill.state in ("stopped", "failed", "cancelled"):
            self.counts[fill.state] += 1
        if fill.on_end is not None:
            # NOTE: shielded: a cancelled fill must still hand its receipt back.
            await asyncio.shield(fill.on_end(fill))

    def _claimed(self, fill: Fill, name: str) -> None:
        self._by_name[name] = fill

    def consumed(self, request_id: str, name: str, how: str, waited_s: float) -> None:
        """A canonical stage of ``request_id`` was served ``name`` (``how``: ``shadow`` or
        ``join``), or waited ``waited_s`` on its execution and was not served (``expired``):
        credit the fill that executed it, of whichever request."""
        fill = self._by_name.get(name)
        if fill is None:
            return
        served = how in ("shadow", "join")
        if served and not fill.consumed:
            self.counts["consumed"] += 1
        fill.consumptions.append(Consumption(name, request_id, how, self.executor.rel(),
                                             waited_s))

    async def discard(self, fill: Fill) -> None:
        """Cancel a fill (engine abort) and drop every shadow it left that nobody consumed."""
        if fill.task is not None and not fill.task.done():
            fill.task.cancel()
            await asyncio.gather(fill.task, return_exceptions=True)
        await self._ended(fill)
        if not fill.consumed:
            for name in fill.names:
                await self.reuse.drop_shadow(name)

    async def request_done(self, request_id: str) -> list[Fill]:
        """Nothing of a finished request's speculation outlives it: every fill of it is
        ended and its unconsumed shadows dropped. Returns the request's fills."""
        fills = [f for s in self._sessions.pop(request_id, []) for f in s.fills]
        for fill in fills:
            await self.discard(fill)
            if not fill.consumed:
                # NOTE: a fill that executed nothing wasted nothing: it is counted apart
                self.counts["covered" if fill.covered else "discarded"] += 1
            for name in fill.names:
                if self._by_name.get(name) is fill:
                    del self._by_name[name]
        return fills

    @property
    def running(self) -> int:
        """Fills still running (0 at teardown, or something leaked)."""
        return sum(f.running for sessions in self._sessions.values() for s in sessions
                   for f in s.fills)

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "running": self.running}
