"""Recall predictor: propose what was chosen before, when the branch's evidence mentions it.

For open-vocabulary branches whose outcomes recur across requests (Sub-Agent's research
sub-topics, e.g. ``"Steve Hillage >> spouse"``), the best branch-time evidence is history:
candidates chosen at the same coordinate stage in earlier, resolved branches. A remembered
candidate is proposed when its *anchor* — the text before ``" >> "`` (the entity), or the
whole candidate — occurs in the branch's evidence text (``evidence["question"]`` or
``evidence["text"]``), ranked by how often it was chosen, ties by first sighting. It learns
only from :meth:`observe` (resolved branches), never from the branch it ranks.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable

from dynbranch.predictors.base import BranchContext, Predictor

ANCHOR_SEP = " >> "
MIN_ANCHOR = 3
"""Anchors shorter than this (``"US"``) match too much text to mean anything."""


class RecallPredictor(Predictor):
    """Remembered candidates whose anchor the evidence mentions, most chosen first."""

    name = "recall"

    def __init__(self, max_memory: int = 100_000) -> None:
        self.max_memory = max_memory
        self._chosen: dict[Hashable, Counter[str]] = {}
        self._order: dict[Hashable, dict[str, int]] = {}

    @staticmethod
    def _stage(ctx: BranchContext) -> Hashable:
        return (ctx.coordinate.workflow, ctx.coordinate.stage)

    @staticmethod
    def anchor(candidate: str) -> str:
        return candidate.split(ANCHOR_SEP, 1)[0].strip()

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        text = str(ctx.evidence.get("question") or ctx.evidence.get("text") or "").lower()
        chosen = self._chosen.get(self._stage(ctx))
        if not text or not chosen:
            return []
        order = self._order[self._stage(ctx)]
        hits = [c for c in chosen if len(a := self.anchor(c)) >= MIN_ANCHOR and a.lower() in text]
        hits.sort(key=lambda c: (-chosen[c], order[c]))
        return hits[:k]

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        stage = self._stage(ctx)
        counts = self._chosen.setdefault(stage, Counter())
        order = self._order.setdefault(stage, {})
        for c in chosen:
            if len(order) >= self.max_memory and c not in order:
                continue  # NOTE: bounded memory: new candidates stop being remembered
            counts[c] += 1
            order.setdefault(c, len(order))
