"""Analyses over workload data that feed the paper's figures (no plotting here).

:mod:`~workloads.analysis.trace` runs request programs without engines and keeps what they
render; :mod:`~workloads.analysis.recurrence` measures recurrence (Fig. 5a) and the entity
ranker's coverage; :mod:`~workloads.analysis.drafter` measures the drafter predictor's
top-1 accuracy on held-out branches (Fig. 11b).
"""
