"""The search ranker: which entity a research sub-agent searches for its sub-topic.

A Sub-Agent sub-agent is a ReAct episode of its own: it thinks over its sub-topic, then
decodes ``search[<entity>]``. That decision is a branch with an open vocabulary, like
ReAct's; its candidates come from the one text the sub-agent has read, the sub-topic
(evidence ``subtopic``), never from the trace's future.

**Candidates**, by *kind*, in this order: ``head``, the text before the sub-topic's
``" >> "`` (the planner writes each sub-topic as ``<entity> >> <what to find out>``, so the
entity it names comes first; the whole text when there is no separator); ``ask``, the
maximal name spans of the part after it, in order (:func:`~dynbranch.predictors.spans.name_spans`);
``inner``, the maximal name spans inside a head that is not itself one name (a sub-topic
written as a question). Each distinct text is proposed once, under
its first kind.

**Score.** Each kind (``head``, ``ask1``, ``ask2``…, ``inner1``…) keeps a Beta(1, 1)
posterior of "chosen, given proposed", learnt from every resolved branch
(:meth:`SearchRanker.observe`: the train split's offline replay first, then the run's own
resolved branches); candidates rank by its mean, ties in the order above. So the ranking is
learnt from what sub-agents searched before, not written in.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dynbranch.predictors.base import BranchContext, Predictor
from dynbranch.predictors.spans import name_spans

SEPARATOR = " >> "
MAX_SPANS = 3
"""How many ``ask`` and ``inner`` spans are proposed at most (a sub-topic names few)."""


def search_candidates(subtopic: str) -> list[tuple[str, str]]:
    """``(candidate, kind)`` for ``subtopic``, in the order of the module docstring."""
    head, sep, ask = subtopic.partition(SEPARATOR)
    head = head.strip()
    out: list[tuple[str, str]] = []
    seen: set[str] = set()

    def add(text: str, kind: str) -> None:
        text = text.strip()
        if text and text not in seen:
            seen.add(text)
            out.append((text, kind))

    add(head, "head")
    if sep:
        maximal = [s for s, _, whole in name_spans(ask) if whole]
        for j, span in enumerate(maximal[:MAX_SPANS]):
            add(span, f"ask{j + 1}")
    inner = [s for s, _, whole in name_spans(head) if whole and s.strip() != head]
    for j, span in enumerate(inner[:MAX_SPANS]):
        add(span, f"inner{j + 1}")
    return out


class SearchRanker(Predictor):
    """Ranks the entities a sub-agent may search for its sub-topic (module docstring)."""

    name = "search"

    def __init__(self) -> None:
        self.proposed: dict[str, int] = {}
        self.chosen: dict[str, int] = {}

    def rate(self, kind: str) -> float:
        """The posterior mean of ``kind`` being the one searched, given it was proposed."""
        return (self.chosen.get(kind, 0) + 1) / (self.proposed.get(kind, 0) + 2)

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        found = search_candidates(_subtopic(ctx.evidence))
        order = sorted(range(len(found)), key=lambda i: (-self.rate(found[i][1]), i))
        return [found[i][0] for i in order[: max(k, 0)]]

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        for candidate, kind in search_candidates(_subtopic(ctx.evidence)):
            self.proposed[kind] = self.proposed.get(kind, 0) + 1
            if candidate in chosen:
                self.chosen[kind] = self.chosen.get(kind, 0) + 1


def _subtopic(evidence: Mapping[str, Any]) -> str:
    return str(evidence.get("subtopic", ""))
