"""Predictors: rank a branch's candidates from what is known at branch time only.

Only the ordering a predictor returns is used (its scores are uncalibrated); C3 learns a
consumption rate per rank online. A predictor sees a :class:`BranchContext` built from the
workflow's :class:`~dynbranch.workflow.BranchPoint` and, after the branch resolves, is told
what was chosen so it can learn for later branches (never for this one).
"""

from dynbranch.predictors.base import BranchContext, Predictor

__all__ = ["BranchContext", "Predictor"]
