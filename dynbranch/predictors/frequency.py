"""A next-stage frequency model: rank candidates by how often they were picked when offered.

A user's (or a router's) next choice follows a frequency prior over what was offered before
(Fitchett and Cockburn, 2012; Davison and Hirsh, 1998). This predictor keeps that prior per
coordinate **stage** — ``(workflow, stage)``, pooling the steps of one decision point, or
``(workflow, stage, step)`` with ``per_step=True`` — and learns it online from
:meth:`~dynbranch.predictors.base.Predictor.observe`, never from the branch being ranked.

What it counts: *tokens*. Every candidate has its own token (the candidate text, e.g. a
function name or a menu index) plus any features the workflow lists for it in the branch's
evidence under :data:`FEATURES_KEY` (``{candidate: [feature, ...]}``; HCI lists the offer
position, the service and the entity's slot value). For each token, ``offered`` counts how
many candidates carrying it were offered in resolved branches, and ``picked`` how many of
those were chosen. A candidate's score is the sum over its tokens of the token's pick rate
``picked / (offered + 1)`` (one pseudo-offer shrinks rare tokens towards zero, so a token
seen once and picked once counts 0.5, not certainty). With no features this is the
candidate's own pick rate at that stage. Candidates rank by score, ties (the cold start
included) in candidate order, so a workflow's own order is the fallback prior.

Pure Python; no clock, no engines. Only the ordering is used downstream (DESIGN.md §2).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Mapping, Sequence

from dynbranch.predictors.base import BranchContext, Predictor

FEATURES_KEY = "candidate_features"
_OWN = "candidate="  # NOTE: prefixes a candidate's own token so no feature text can equal it


_is_str = str.__instancecheck__  # isinstance(x, str), mapped at C speed


class FrequencyPredictor(Predictor):
    """Ranks a branch's candidates by their tokens' past pick rates at the same stage."""

    name = "frequency"

    def __init__(self, per_step: bool = False, features_key: str = FEATURES_KEY) -> None:
        self.per_step, self.features_key = per_step, features_key
        self._picked: dict[Hashable, Counter[str]] = {}
        self._offered: dict[Hashable, Counter[str]] = {}
        self.observed = 0

    def _stage(self, ctx: BranchContext) -> Hashable:
        c = ctx.coordinate
        return (c.workflow, c.stage, c.step) if self.per_step else (c.workflow, c.stage)

    def tokens(self, ctx: BranchContext, candidate: str) -> tuple[str, ...]:
        """What is counted for ``candidate``: its own token, then its listed features."""
        features = ctx.evidence.get(self.features_key)
        # NOTE: exact types first: the ABC checks below cost more than the rest of a call,
        # and learning reads every candidate's tokens at every branch (same result).
        if type(features) is dict or isinstance(features, Mapping):
            listed = features.get(candidate, ())
        else:
            listed = ()
        if type(listed) is list or type(listed) is tuple:
            if all(map(_is_str, listed)):
                return (f"{_OWN}{candidate}", *dict.fromkeys(listed))
        elif isinstance(listed, str) or not isinstance(listed, Sequence):
            listed = ()
        return (f"{_OWN}{candidate}", *dict.fromkeys(f for f in listed if isinstance(f, str)))

    def score(self, ctx: BranchContext, candidate: str) -> float:
        """Sum of the candidate's token pick rates at this stage (0.0 before any learning)."""
        stage = self._stage(ctx)
        picked, offered = self._picked.get(stage), self._offered.get(stage)
        if picked is None or offered is None:
            return 0.0
        return sum(picked[t] / (offered[t] + 1) for t in self.tokens(ctx, candidate))

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        if k <= 0:
            return []
        candidates = list(dict.fromkeys(ctx.candidates))
        scores = [self.score(ctx, c) for c in candidates]
        order = sorted(range(len(candidates)), key=lambda i: (-scores[i], i))
        return [candidates[i] for i in order[:k]]

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        """Count the branch's offered candidates and which of them were chosen."""
        stage = self._stage(ctx)
        picked = self._picked.setdefault(stage, Counter())
        offered = self._offered.setdefault(stage, Counter())
        taken = set(chosen)
        for candidate in dict.fromkeys(ctx.candidates):
            tokens = self.tokens(ctx, candidate)
            offered.update(tokens)
            if candidate in taken:
                picked.update(tokens)
        self.observed += 1
