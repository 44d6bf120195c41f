"""The predictor interface."""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dynbranch.workflow import BranchCoordinate, BranchPoint

if TYPE_CHECKING:
    from dynbranch.engines.protocol import GenerateRequest, GenerateResult


def softmax(scores: Sequence[float]) -> list[float]:
    """Choice probabilities of ``scores``, in order (shifted by their maximum; empty for
    none): what every predictor that learns scores reads as probabilities."""
    if not scores:
        return []
    top = max(scores)
    exps = [math.exp(s - top) for s in scores]
    total = sum(exps)
    return [e / total for e in exps]


EVIDENCE_KEY = "evidence_key"
"""An optional evidence entry: a hashable value naming everything the rest of the evidence
was built from. A workload that sets it promises that two branches at the same coordinate
stage with equal keys carry equal evidence, so a predictor may remember what it derived from
one branch's evidence and reuse it for the other without reading the evidence again
(:class:`~dynbranch.predictors.logit.LogitPredictor` does). A predictor never learns from the
key itself."""


@dataclass(frozen=True)
class BranchContext:
    """What a predictor may see: the branch's identity, candidates and evidence."""

    request_id: str
    coordinate: BranchCoordinate
    candidates: tuple[str, ...]
    evidence: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, request_id: str, point: BranchPoint) -> BranchContext:
        return cls(request_id, point.coordinate, point.candidates, point.evidence)


class Predictor(ABC):
    """Ranks candidates for a branch, best first."""

    name: str

    in_sample_on_train = False
    """Whether ranking a train-split branch is in-sample: the predictor was fitted on the
    train split or reads it as evidence, so its hit rates there overstate held-out ones
    (C3 then learns nothing from its rankings of the train split)."""

    @abstractmethod
    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        """Up to ``k`` candidates, best first, from ``ctx`` alone."""

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        """Learn from a resolved branch (default: nothing to learn)."""

    def confidences(self, ctx: BranchContext) -> Mapping[str, float] | None:
        """The predictor's own choice probability per candidate, for a predictor whose
        scores are probabilities it learnt (default: ``None``, only the ordering counts).

        C3 does not read them as probabilities: it keys its learnt selection rates by
        their decile instead of by rank (:func:`dynbranch.gate.gate.selection_arm`)."""
        return None


class DraftingPredictor(Predictor):
    """A predictor that drafts on engines: it ranks by sampling a draft model through
    ``generate`` (the run's drafter engines), beside the canonical decision."""

    @abstractmethod
    async def draft(self, ctx: BranchContext, k: int,
                    generate: Callable[[GenerateRequest], Awaitable[GenerateResult]],
                    now: Callable[[], float] | None = None) -> Any:
        """Draft, then rank: an object with ``ranked`` (best first) and ``samples``."""
