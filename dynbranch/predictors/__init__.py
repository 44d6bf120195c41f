"""Predictors: rank a branch's candidates from what is known at branch time only.

Only the ordering a predictor returns is used (its scores are uncalibrated); C3 learns a
consumption rate per rank online. A predictor sees a :class:`BranchContext` built from the
workflow's :class:`~dynbranch.workflow.BranchPoint` and, after the branch resolves, is told
what was chosen so it can learn for later branches (never for this one).

Built: ``frequency`` (next-stage frequency model over a coordinate's history; HCI),
``logit`` (the same tokens weighed by a conditional logit learned online; Routing),
``entity`` (the entities the question, the previous hop's observation and passages name;
ReAct), ``subtopic`` (sub-topics remembered, written from the question's names and
relations, and chained through remembered answers; Sub-Agent) and ``recall`` (earlier
outcomes of the same decision that the evidence mentions); ``drafter`` (a draft LM sampled
N times, candidates ranked by vote; any workload, drafting on the run's ``drafter`` engines
when it has them).
"""

from __future__ import annotations

import importlib

from dynbranch.errors import NotBuiltError, UnknownNameError
from dynbranch.predictors.base import BranchContext, DraftingPredictor, Predictor

PREDICTORS = {
    "frequency": ("dynbranch.predictors.frequency", "FrequencyPredictor"),
    "logit": ("dynbranch.predictors.logit", "LogitPredictor"),
    "entity": ("dynbranch.predictors.entity", "EntityRanker"),
    "recall": ("dynbranch.predictors.recall", "RecallPredictor"),
    "drafter": ("dynbranch.predictors.drafter", "DrafterPredictor"),
    "subtopic": ("dynbranch.predictors.subtopic", "SubtopicPredictor"),
}
PLANNED: tuple[str, ...] = ()


def make_predictor(name: str, **options) -> Predictor:
    """A new predictor called ``name``."""
    if name in PREDICTORS:
        module, cls = PREDICTORS[name]
        return getattr(importlib.import_module(module), cls)(**options)
    if name in PLANNED:
        raise NotBuiltError("predictor", name, list(PREDICTORS))
    raise UnknownNameError("predictor", name, [*PREDICTORS, *PLANNED])


__all__ = ["PREDICTORS", "BranchContext", "DraftingPredictor", "Predictor", "make_predictor"]
