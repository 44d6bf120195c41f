"""A conditional-logit next-stage model: the frequency model's tokens, weighed by learning.

:class:`~dynbranch.predictors.frequency.FrequencyPredictor` scores a candidate by the sum of
its tokens' pick rates. That sum cannot weigh one token against another: at a Routing
router branch the end of the turn is offered at every decision and chosen at about half of
them, so its own token alone outscores every function whose name was seen rarely, and the
frequency model ranks the end first at 88 % of the test split's branches that go on to call
a function.

This model reads the same tokens (a candidate's own token and the features the workflow
lists for it under :data:`~dynbranch.predictors.frequency.FEATURES_KEY`) and learns one
weight per token and coordinate stage by maximising the likelihood of what was chosen under
a softmax over the branch's candidates (McFadden's conditional logit, the model of a choice
among offered alternatives). Each observed branch is one stochastic-gradient step, scaled
per weight by AdaGrad so rare tokens (a function's own name) still move; a small L2 term
keeps weights of tokens that stop appearing from growing. A multi-valued branch (parallel
calls) spreads its target evenly over the chosen candidates.

Like every predictor it learns only from :meth:`observe` (the train split before a run, then
the run's own resolved branches), never from the branch being ranked. Pure Python.
"""

from __future__ import annotations

import math
from collections.abc import Hashable
from itertools import repeat
from typing import Any

from dynbranch.predictors.base import BranchContext, softmax
from dynbranch.predictors.frequency import FEATURES_KEY, FrequencyPredictor

LEARNING_RATE = 0.2
"""AdaGrad's step size."""
L2 = 1e-2
"""Weight decay per step: it keeps the many per-word tokens of Routing's evidence from
overfitting the train split. Measured on Routing's router branches (500 train requests, then
958 branches of 300 test requests, learning online), fillable top-1 / top-3 where a function
is called, and the decile calibration (share chosen in the top decile): lr 0.5, L2 1e-4:
0.691 / 0.865, 0.76; lr 0.3, L2 1e-4: 0.707 / 0.880, 0.79; lr 0.5, L2 1e-2: 0.697 / 0.861,
0.75; lr 0.2, L2 1e-2: 0.712 / 0.888, 0.87 (with the end of turn's word tokens added since,
0.718 / 0.895, and top-1 over every branch 0.744; learning 1,024 train requests with the
verb features since, 0.819 / 0.945, and 0.811 over every branch)."""


class LogitPredictor(FrequencyPredictor):
    """Ranks a branch's candidates by learned token weights at the same stage."""

    name = "logit"

    def __init__(self, per_step: bool = False, features_key: str = FEATURES_KEY,
                 learning_rate: float = LEARNING_RATE, l2: float = L2) -> None:
        super().__init__(per_step=per_step, features_key=features_key)
        if not learning_rate > 0 or not l2 >= 0:
            raise ValueError(f"learning_rate {learning_rate} must be > 0 and l2 {l2} >= 0")
        self.learning_rate, self.l2 = learning_rate, l2
        self._weights: dict[Hashable, dict[str, float]] = {}  # stage -> token -> weight
        self._squares: dict[Hashable, dict[str, float]] = {}  # AdaGrad's sums of squares
        self._version = 0  # bumped by every learning step
        # NOTE: the last branch scored, so C2's rank and confidences calls on one branch
        # score it once; held by its evidence object (compared by identity) and version.
        self._last: tuple[Any, Hashable, int, list[str], list[float]] | None = None

    def _scored(self, ctx: BranchContext) -> tuple[list[str], list[float]]:
        stage = self._stage(ctx)
        last = self._last
        if (last is not None and last[0] is ctx.evidence and last[1] == (ctx.request_id, stage,
                ctx.coordinate, tuple(ctx.candidates)) and last[2] == self._version):
            return last[3], last[4]
        candidates = list(dict.fromkeys(ctx.candidates))
        scores = _scores(self._weights.get(stage, {}), [self.tokens(ctx, c) for c in candidates])
        self._last = (ctx.evidence, (ctx.request_id, stage, ctx.coordinate,
                                     tuple(ctx.candidates)), self._version, candidates, scores)
        return candidates, scores

    def score(self, ctx: BranchContext, candidate: str) -> float:
        """The sum of the candidate's token weights at this stage (0.0 before learning)."""
        return _scores(self._weights.get(self._stage(ctx), {}), [self.tokens(ctx, candidate)])[0]

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        if k <= 0:
            return []
        candidates, scores = self._scored(ctx)
        order = sorted(range(len(candidates)), key=lambda i: (-scores[i], i))
        return [candidates[i] for i in order[:k]]

    def probabilities(self, ctx: BranchContext) -> dict[str, float]:
        """The model's choice probabilities over the branch's candidates (sum to 1)."""
        candidates, scores = self._scored(ctx)
        return dict(zip(candidates, softmax(scores), strict=True))

    def confidences(self, ctx: BranchContext) -> dict[str, float]:
        """:meth:`probabilities`: learnt by maximum likelihood, so they are calibrated on
        the branches it learnt from (C3 keys its selection rates by their decile)."""
        return self.probabilities(ctx)

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        """One gradient step towards what was chosen."""
        self.observed += 1
        stage = self._stage(ctx)
        candidates = list(dict.fromkeys(ctx.candidates))
        taken = [c for c in dict.fromkeys(chosen) if c in candidates]
        if not taken:
            return  # nothing offered was chosen: no likelihood to raise
        weights = self._weights.setdefault(stage, {})
        tokens = [self.tokens(ctx, c) for c in candidates]
        target = 1.0 / len(taken)
        gradient: dict[str, float] = {}
        gget = gradient.get
        for candidate, toks, p in zip(candidates, tokens, softmax(_scores(weights, tokens)),
                                      strict=True):
            residual = (target if candidate in taken else 0.0) - p
            for token in toks:
                gradient[token] = gget(token, 0.0) + residual
        squares = self._squares.setdefault(stage, {})
        rate, l2, sqrt = self.learning_rate, self.l2, math.sqrt
        wget, sget = weights.get, squares.get
        for token, g in gradient.items():
            w = wget(token, 0.0)
            g -= l2 * w
            sq = squares[token] = sget(token, 1e-8) + g * g
            weights[token] = w + rate * g / sqrt(sq)
        self._version += 1


def _scores(weights: dict[str, float], tokens: list[tuple[str, ...]]) -> list[float]:
    """Each candidate's summed token weights (0.0 for a token never learnt), summed in
    token order; the lookups are mapped at C speed (every branch scores every candidate)."""
    get = weights.get
    return [sum(map(get, toks, repeat(0.0, len(toks)))) for toks in tokens]
