"""Drafter variants for Fig. 11b: real drafting cost per size, accuracy as an explicit sweep.

No drafter LM runs here, so a drafter's *choice accuracy* cannot be measured from a model;
it is set. What is real is everything else: each branch is drafted by N calls on the run's
drafter engine, whose profile is the size's (``qwen3-0.6b@h200`` … ``qwen3-8b@h200``), so
drafting takes what that model takes on the H200, and a draft still running when the
branch resolves is late (its fills never start).

:class:`SweptDrafter` is the shipped :class:`~dynbranch.predictors.drafter.DrafterPredictor`
(choice model learned online, N samples, ranked by vote) with one change: each sample names
the branch's resolved candidate with probability ``vote_accuracy`` (and is the choice
model's own sample otherwise). The resolved candidates come from the same offline run of
the stream's requests the ``oracle`` arm uses, so this is a **sweep**, not a system: it sets
how often a draft is right, and the run measures what that accuracy buys once drafting
takes time. Top-1 accuracy is measured per drafted branch before the drafter learns the
branch's outcome (prequential: every scored branch is held out from what the drafter has
seen), and reported beside fills issued and consumed.
"""

from __future__ import annotations

import random
from typing import Any

from dynbranch.arms.base import Arm
from dynbranch.arms.dynbranch_arms import c1_reuse
from dynbranch.arms.oracle import BranchOutcomes, OracleSpeculator
from dynbranch.fill import BranchHook
from dynbranch.predictors import BranchContext
from dynbranch.predictors.drafter import DrafterPredictor
from dynbranch.reuse.hook import ReuseHook
from dynbranch.runtime.affinity import AffinityPlacement
from dynbranch.runtime.run import RunContext


class SweptDrafter(DrafterPredictor):
    """A drafter whose votes are right with a set probability (see the module docstring)."""

    name = "drafter"

    def __init__(self, outcomes: BranchOutcomes, vote_accuracy: float, **options: Any) -> None:
        if not 0.0 <= vote_accuracy <= 1.0:
            raise ValueError(f"vote_accuracy must be in [0, 1], got {vote_accuracy}")
        super().__init__(**options)
        self.outcomes, self.vote_accuracy = outcomes, vote_accuracy
        self._top1: dict[tuple[str, str], str] = {}
        self.scored = self.top1_hits = 0

    def sample(self, ctx: BranchContext) -> tuple[tuple[str, ...], list[float], list[str]]:
        pool, p, samples = super().sample(ctx)
        truth = [c for c in self.outcomes.peek(ctx.request_id, str(ctx.coordinate)) if c in pool]
        if not truth:
            return pool, p, samples
        rng = random.Random(f"sweep|{self.config.seed}|{ctx.request_id}|{ctx.coordinate}")
        return (
            pool,
            p,
            [rng.choice(truth) if rng.random() < self.vote_accuracy else s for s in samples],
        )

    async def draft(self, ctx: BranchContext, k: int, generate: Any, now: Any = None) -> Any:
        out = await super().draft(ctx, k, generate, now)
        if out.ranked:
            self._top1[(ctx.request_id, str(ctx.coordinate))] = out.ranked[0]
        return out

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        key = (ctx.request_id, str(ctx.coordinate))
        top = self._top1.pop(key, None)
        if top is not None:
            self.scored += 1
            self.top1_hits += top in chosen
        self.outcomes.advance(*key)
        super().observe(ctx, chosen)


class SweptSpeculator(OracleSpeculator):
    """C2 with a :class:`SweptDrafter`; learns the outcomes before the clock starts (as the
    oracle does) and hands them only to the sweep's votes."""

    name = "drafter-sweep"

    def __init__(self, run: RunContext, vote_accuracy: float, think_tokens: int) -> None:
        super().__init__(run)
        options = {**run.fill.predictor_options, "think_tokens": think_tokens}  # the sweep's
        self.predictor = SweptDrafter(self.outcomes, vote_accuracy, **options)

    def stats(self) -> dict[str, Any]:
        p = self.predictor
        return {
            **super().stats(),
            "vote_accuracy": p.vote_accuracy,
            "scored_branches": p.scored,
            "top1_hits": p.top1_hits,
        }


SWEEP_ARM = "full-sweep"
"""The swept arm's name, in its summaries and rows: ``full``'s mechanisms with a drafter
that reads the trace's outcomes, so never to be read as the ``full`` system."""


def swept_arm(vote_accuracy: float, think_tokens: int) -> Arm:
    """``full`` (C1 and C2) with the swept drafter as C2's predictor, named
    :data:`SWEEP_ARM`."""

    def branch(run: RunContext, reuse: ReuseHook) -> BranchHook:
        return SweptSpeculator(run, vote_accuracy, think_tokens)

    return Arm(
        SWEEP_ARM,
        f"full with a drafter sweep (vote accuracy {vote_accuracy:g}; "
        "a SWEEP that reads the trace's outcomes, not a system)",
        c1_reuse,
        branch,
        AffinityPlacement,
    )
