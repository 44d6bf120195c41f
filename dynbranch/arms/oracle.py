"""The ``oracle`` arm: a bound, not a system — early fill with perfect prediction.

It is the one arm allowed to see the trace's future. Before the clock starts it runs fresh
copies of the run's own requests to their end offline
(:func:`~dynbranch.runtime.offline.precompute`: replayed LLM text, real tools on each
copy's own state) and keeps, per request and branch coordinate, what every branch resolved
to. At each branch its predictor is handed those resolved candidates, best first; everything
else is the real stack — the same request-scoped shadows as ``c2``, the same load-priced
gate (C3), engines and contention. What ``c2`` gains over the floor, divided by what the
oracle gains, is the share of the reachable early-fill saving the real predictors capture
(``captured`` in every experiment row).

Only replay engines (``sim``, ``zero``) produce the trace's outcomes; a real model may
decide otherwise, so the driver refuses the oracle with ``hf`` and ``vllm``.
"""

from __future__ import annotations

from collections import defaultdict, deque
from typing import Any

from dynbranch.arms.base import Arm
from dynbranch.arms.dynbranch_arms import fill_policy, request_scoped_reuse
from dynbranch.fill import BranchHook, Speculator
from dynbranch.predictors import BranchContext, Predictor
from dynbranch.reuse.hook import ReuseHook
from dynbranch.runtime.affinity import AffinityPlacement
from dynbranch.runtime.offline import precompute
from dynbranch.runtime.run import RunContext
from dynbranch.workflow import BranchPoint
from dynbranch.workload import DataConfig, Workload

ORACLE_DESCRIPTION = ("BOUND, not a system: c2 whose predictor is handed each branch's "
                      "resolved candidates (the trace's future); real gate and engines")


class BranchOutcomes:
    """What each branch of each request resolved to, in the order the branches open."""

    def __init__(self) -> None:
        self._chosen: dict[tuple[str, str], deque[tuple[str, ...]]] = defaultdict(deque)
        self.requests = 0

    def add(self, request_id: str, branches: list[tuple[BranchPoint, tuple[str, ...]]]) -> None:
        self.requests += 1
        for point, chosen in branches:
            self._chosen[(request_id, str(point.coordinate))].append(chosen)

    def peek(self, request_id: str, coordinate: str) -> tuple[str, ...]:
        """The resolution of the next entry of this branch (``()`` when none is known)."""
        queue = self._chosen.get((request_id, coordinate))
        return queue[0] if queue else ()

    def advance(self, request_id: str, coordinate: str) -> None:
        """The entry resolved: the next one's outcome is next."""
        queue = self._chosen.get((request_id, coordinate))
        if queue:
            queue.popleft()


class OraclePredictor(Predictor):
    """Ranks a branch's resolved candidates first (it reads the trace's future)."""

    name = "oracle"

    def __init__(self, outcomes: BranchOutcomes) -> None:
        self.outcomes = outcomes

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        return list(self.outcomes.peek(ctx.request_id, str(ctx.coordinate)))[:k]

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        # NOTE: every resolved entry advances, generated or not (Action 0 may close one),
        # so a coordinate entered twice in a request reads its second outcome second.
        self.outcomes.advance(ctx.request_id, str(ctx.coordinate))


class OracleSpeculator(Speculator):
    """C2 with the oracle predictor; learns the outcomes before the clock starts."""

    name = "oracle"

    def __init__(self, run: RunContext) -> None:
        self.outcomes = BranchOutcomes()
        super().__init__(run, OraclePredictor(self.outcomes), fill_policy(run))

    async def prepopulate(self, workload: Workload, data: DataConfig | None, seed: int, *,
                          split: str, requests: int) -> None:
        if data is None:
            return
        for instance in workload.requests(data, requests, seed, split):
            try:
                run = await precompute(instance)
            except Exception:  # NOTE: a request whose program fails gets no outcomes
                continue
            self.outcomes.add(instance.request_id, list(run.branches))

    def stats(self) -> dict[str, Any]:
        return {**super().stats(), "oracle_requests": self.outcomes.requests}


def oracle_branch(run: RunContext, reuse: ReuseHook) -> BranchHook:
    """The ``oracle`` arm's branch hook."""
    return OracleSpeculator(run)


ORACLE = Arm("oracle", ORACLE_DESCRIPTION, request_scoped_reuse, oracle_branch,
             AffinityPlacement)
