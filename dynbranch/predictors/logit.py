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
the run's own resolved branches), never from the branch being ranked.

Each stage's weights live in arrays indexed by a token's number (:class:`_Table`), so a
learning step is a few array operations over the branch's tokens rather than a Python loop
over them (a Routing router branch carries 400-1,000 tokens: its turn's words crossed with
18 candidates). The arithmetic is the per-token loop's, operation for operation, so the
weights are the same to the bit (``tests/test_logit_predictor.py`` compares the two).

A branch whose evidence is named (:data:`~dynbranch.predictors.base.EVIDENCE_KEY`) is
remembered after it is learnt as numbers only (:class:`_Numbered`): a later branch with the
same name, stage and candidates (a repeated request, or one served from the store, which is
learnt without having been ranked) is scored and learnt without reading its tokens again.
Its tokens are all numbered by then, so the numbers are the ones a fresh reading would give
and the arithmetic is unchanged.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from itertools import accumulate, chain, repeat
from typing import Any

import numpy as np

from dynbranch.predictors.base import EVIDENCE_KEY, BranchContext, softmax
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
verb features since, 0.819 / 0.945, and 0.811 over every branch).

Those were read on the test split, which DESIGN §4 keeps out of tuning, and before the split
kept a multi-turn scenario's variants together. Checked again on 2026-12-07 on a held-out
quarter of the train split's scenarios (``scripts/predictor_accuracy.py --workloads routing
--validation --test 1000 --option learning_rate=LR --option l2=L2``: 831 train requests
learnt, 1,097 branches of 275 held-out ones ranked, 580 of them calling a function), fillable
top-1 / top-3: lr 0.2: L2 1e-4 0.838 / 0.948, 1e-2 0.847 / 0.955, 3e-2 0.843 / 0.959; lr 0.3:
0.841 / 0.948, 0.841 / 0.953, 0.833 / 0.957; lr 0.5: 0.840 / 0.940, 0.822 / 0.940, 0.810 /
0.938. lr 0.2 with L2 1e-2 stays the best."""


KEPT_BRANCHES = 4096
"""Ranked branches whose token numbers are kept for learning (more than a replay holds open
at once; the oldest leave first)."""

NAMED_BRANCHES = 16_384
"""Learnt branches remembered by their evidence's name (the oldest leave first). Routing's
3,184 requests open about 10,000 distinct router branches, each about 500 tokens (about 3 KB
remembered: the 10,000-request replay's peak RSS grew by 50-55 MB)."""

_UNSEEN = 0
"""The number every stage's table gives tokens it has never learnt: its weight stays 0.0."""


class _Table:
    """One stage's learnt tokens: token -> number, and per number the weight and AdaGrad's
    sum of squared gradients (number 0 is every token not learnt yet)."""

    __slots__ = ("numbers", "squares", "weights")

    def __init__(self) -> None:
        self.numbers: dict[str, int] = {}
        self.weights = np.zeros(64)
        self.squares = np.full(64, 1e-8)

    def lookup(self, tokens: Sequence[str]) -> np.ndarray:
        """The tokens' numbers, :data:`_UNSEEN` for those never learnt (learns nothing)."""
        # NOTE: a list first: np.fromiter converts each int on a slow path (4x the time)
        return np.array(list(map(self.numbers.get, tokens, repeat(_UNSEEN, len(tokens)))),
                        dtype=np.intp)

    def number(self, tokens: Sequence[str], numbers: np.ndarray) -> np.ndarray:
        """``numbers`` with every :data:`_UNSEEN` one replaced by a new number of its own."""
        unseen = np.flatnonzero(numbers == _UNSEEN)
        if not len(unseen):
            return numbers
        known = self.numbers
        for at in unseen.tolist():
            token = tokens[at]
            n = known.get(token)
            if n is None:
                n = known[token] = len(known) + 1
            numbers[at] = n
        size = len(known) + 1
        if size > len(self.weights):
            grown = max(size, 2 * len(self.weights))
            self.weights = np.concatenate([self.weights, np.zeros(grown - len(self.weights))])
            self.squares = np.concatenate(
                [self.squares, np.full(grown - len(self.squares), 1e-8)])
        return numbers

    def learnt(self) -> dict[str, float]:
        """Token -> weight for every token learnt."""
        return dict(zip(self.numbers, self.weights[1:len(self.numbers) + 1].tolist(),
                        strict=True))


class _Branch:
    """A branch's candidates and their tokens, flattened in candidate order, with the
    tokens' numbers at one stage (refreshed where a token was learnt since)."""

    __slots__ = ("bounds", "candidates", "evidence", "numbers", "tokens")

    def __init__(self, evidence: Any, candidates: list[str],
                 per_candidate: list[tuple[str, ...]], table: _Table) -> None:
        self.evidence, self.candidates = evidence, candidates
        # NOTE: tuples: the collector stops tracking a tuple of strings or ints, so the
        # branches kept between ranking and learning do not lengthen every collection.
        self.tokens = tuple(chain.from_iterable(per_candidate))
        ends = tuple(accumulate(map(len, per_candidate)))
        self.bounds = tuple(zip((0, *ends[:-1]), ends, strict=True))
        self.numbers = table.lookup(self.tokens)

    def scores(self, table: _Table) -> list[float]:
        """Each candidate's summed token weights, summed in token order (Python's float
        sum, one candidate at a time, as a per-token loop would)."""
        unseen = np.flatnonzero(self.numbers == _UNSEEN)
        if len(unseen):  # NOTE: tokens another branch taught since this one was ranked
            known, tokens = table.numbers, self.tokens
            for at in unseen.tolist():
                self.numbers[at] = known.get(tokens[at], _UNSEEN)
        values = table.weights[self.numbers].tolist()
        return [sum(values[a:b]) for a, b in self.bounds]


class _Numbered:
    """A learnt branch as numbers alone: its candidates, how many tokens each carries, and
    the branch's distinct token numbers with, per token in order, where its number sits among
    them. Every token was numbered when it was learnt, so nothing here changes afterwards.

    NOTE: small, as thousands are kept: a token's number is ``unique[inverse[i]]`` rather
    than a third array, and positions fit 16 bits (a branch has a few thousand tokens)."""

    __slots__ = ("candidates", "ends", "inverse", "lengths", "unique")

    def __init__(self, candidates: Sequence[str], bounds: tuple[tuple[int, int], ...],
                 unique: np.ndarray, inverse: np.ndarray) -> None:
        self.candidates = tuple(candidates)
        self.unique = unique.astype(np.int32)
        self.inverse = inverse.astype(np.uint16 if len(unique) <= 1 << 16 else np.int32)
        self.lengths = np.array([b - a for a, b in bounds], dtype=np.int32)
        self.ends = tuple(b for _, b in bounds)

    def scores(self, table: _Table) -> list[float]:
        values = table.weights[self.unique][self.inverse].tolist()
        ends = self.ends
        return [sum(values[a:b]) for a, b in zip((0, *ends[:-1]), ends, strict=True)]


class LogitPredictor(FrequencyPredictor):
    """Ranks a branch's candidates by learned token weights at the same stage."""

    name = "logit"

    def __init__(self, per_step: bool = False, features_key: str = FEATURES_KEY,
                 learning_rate: float = LEARNING_RATE, l2: float = L2) -> None:
        super().__init__(per_step=per_step, features_key=features_key)
        if not learning_rate > 0 or not l2 >= 0:
            raise ValueError(f"learning_rate {learning_rate} must be > 0 and l2 {l2} >= 0")
        self.learning_rate, self.l2 = learning_rate, l2
        self._tables: dict[Hashable, _Table] = {}  # stage -> its learnt tokens
        self._version = 0  # bumped by every learning step
        # NOTE: the last branch scored, so C2's rank and confidences calls on one branch
        # score it once; held by its evidence object (compared by identity) and version.
        self._last: tuple[Any, Hashable, int, Sequence[str], list[float]] | None = None
        # NOTE: the branches ranked and not yet learnt: learning reads their tokens again.
        self._kept: dict[Hashable, _Branch] = {}
        # NOTE: learnt branches by their evidence's name, stage and candidates
        self._named: dict[Hashable, _Numbered] = {}

    def __getstate__(self) -> dict[str, Any]:
        # NOTE: what was ranked and not learnt refers to live evidence: not part of what
        # the model has learnt (the train split's model is pickled and reused).
        return {**vars(self), "_last": None, "_kept": {}, "_named": {}}

    def learnt(self) -> dict[Hashable, dict[str, float]]:
        """Stage -> token -> weight, for every token learnt."""
        return {stage: table.learnt() for stage, table in self._tables.items()}

    def _table(self, stage: Hashable) -> _Table:
        table = self._tables.get(stage)
        if table is None:
            table = self._tables[stage] = _Table()
        return table

    def _branch(self, ctx: BranchContext, stage: Hashable, table: _Table,
                keep: bool) -> _Branch:
        """The branch's tokens and numbers: kept from when it was ranked (same evidence
        object: a branch is ranked when it opens and learnt when it resolves, and its tokens
        cannot change in between), else read now."""
        key = (ctx.request_id, stage, ctx.coordinate, tuple(ctx.candidates))
        kept = self._kept.pop(key, None)
        if kept is None or kept.evidence is not ctx.evidence:
            candidates = list(dict.fromkeys(ctx.candidates))
            kept = _Branch(ctx.evidence, candidates,
                           [self.tokens(ctx, c) for c in candidates], table)
        if keep:
            self._kept[key] = kept
            if len(self._kept) > KEPT_BRANCHES:
                del self._kept[next(iter(self._kept))]
        return kept

    @staticmethod
    def _name(ctx: BranchContext, stage: Hashable) -> Hashable | None:
        """What a learnt branch is remembered by: its evidence's name, stage and candidates
        (``None``: the evidence is not named)."""
        named = ctx.evidence.get(EVIDENCE_KEY)
        if named is None:
            return None
        name = (stage, named, tuple(ctx.candidates))
        try:
            hash(name)
        except TypeError:  # NOTE: a name that cannot key a dict: the branch is read afresh
            return None
        return name

    def _scored(self, ctx: BranchContext) -> tuple[Sequence[str], list[float]]:
        stage = self._stage(ctx)
        last = self._last
        if (last is not None and last[0] is ctx.evidence and last[1] == (ctx.request_id, stage,
                ctx.coordinate, tuple(ctx.candidates)) and last[2] == self._version):
            return last[3], last[4]
        table = self._tables.get(stage) or _Table()
        name = self._name(ctx, stage)
        numbered = None if name is None else self._named.get(name)
        branch: _Branch | _Numbered = (
            self._branch(ctx, stage, table, keep=stage in self._tables)
            if numbered is None else numbered)
        scores = branch.scores(table)
        self._last = (ctx.evidence, (ctx.request_id, stage, ctx.coordinate,
                                     tuple(ctx.candidates)), self._version, branch.candidates,
                      scores)
        return branch.candidates, scores

    def score(self, ctx: BranchContext, candidate: str) -> float:
        """The sum of the candidate's token weights at this stage (0.0 before learning)."""
        table = self._tables.get(self._stage(ctx))
        if table is None:
            return 0.0
        return sum(table.weights[table.lookup(self.tokens(ctx, candidate))].tolist())

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
        taken = set(chosen) & set(candidates)
        if not taken:
            return  # nothing offered was chosen: no likelihood to raise
        table = self._table(stage)
        name = self._name(ctx, stage)
        numbered = None if name is None else self._named.get(name)
        if numbered is None:
            branch = self._branch(ctx, stage, table, keep=False)
            scores = branch.scores(table)
            numbers = table.number(branch.tokens, branch.numbers)
            unique, inverse = np.unique(numbers, return_inverse=True)
            candidates, lengths = branch.candidates, [b - a for a, b in branch.bounds]
            if name is not None:
                self._named[name] = _Numbered(candidates, branch.bounds, unique, inverse)
                if len(self._named) > NAMED_BRANCHES:
                    del self._named[next(iter(self._named))]
        else:
            # NOTE: ranked when it opened, before a branch of the same name was learnt
            self._kept.pop((ctx.request_id, stage, ctx.coordinate, tuple(ctx.candidates)), None)
            self._named[name] = self._named.pop(name)  # the most recent leaves last
            scores = numbered.scores(table)
            candidates, lengths = numbered.candidates, numbered.lengths
            unique, inverse = numbered.unique, numbered.inverse
        target = 1.0 / len(taken)
        residuals = [(target if c in taken else 0.0) - p
                     for c, p in zip(candidates, softmax(scores), strict=True)]
        # NOTE: a token's gradient is the sum of the residuals of the candidates carrying
        # it, added in candidate order from 0.0 (bincount adds its weights in input order);
        # then the AdaGrad step with its L2 term, elementwise, in the per-token loop's order
        # of operations: g - l2*w; s + g*g; w + (rate*g)/sqrt(s).
        spread = np.repeat(residuals, lengths)
        g = np.bincount(inverse, weights=spread, minlength=len(unique))
        w = table.weights[unique]
        g -= self.l2 * w
        sq = table.squares[unique] + g * g
        table.squares[unique] = sq
        table.weights[unique] = w + self.learning_rate * g / np.sqrt(sq)
        self._version += 1
