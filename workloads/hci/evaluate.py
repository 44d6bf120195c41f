"""Offline checks of the HCI workload: a predictor's top-k match, and the overlap share.

* :func:`top_k_match` learns a predictor on the train requests' resolved picks, then ranks
  each test request's pick branch (built exactly as the request opens it, with the recorded
  offer) and counts how often the pick is in the top ``k``. With ``online=True`` the
  predictor keeps learning from each test pick *after* ranking it, as it does in a run.
* :func:`overlap_share` is DESIGN.md §3 eq. (2) for HCI measured on a floor replay's stage
  log: per request, ``min(T_gen, T_exec)`` with ``T_gen`` the user's think time (the human
  stage) and ``T_exec`` the downstream execution the pick gates (from the click to the end
  of the request: lookup + respond on the critical path), summed over requests and divided
  by the summed request wall time (first stage start to last stage end). It is the most of
  each request's wall time early fill could hide; the same overlap divided by the summed
  ``T_exec`` is the most of the post-click latency it could hide.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from dynbranch.predictors.base import BranchContext, Predictor
from workloads.hci.request import HCIRequest


@dataclass(frozen=True)
class MatchReport:
    """How often a predictor's top ``k`` held the user's pick."""

    k: int
    branches: int
    matched: int
    learned_from: int

    @property
    def rate(self) -> float:
        return self.matched / self.branches if self.branches else float("nan")


def _context(request: HCIRequest) -> BranchContext:
    return BranchContext.of(request.request_id, request.branch_point(request.episode.offer))


def top_k_match(
    predictor: Predictor,
    train: Sequence[HCIRequest],
    test: Sequence[HCIRequest],
    k: int = 1,
    online: bool = True,
) -> MatchReport:
    """Learn on ``train``'s picks, then count test picks in the predictor's top ``k``."""
    for request in train:
        predictor.observe(_context(request), (request.chosen,))
    matched = 0
    for request in test:
        ctx = _context(request)
        matched += request.chosen in predictor.rank(ctx, k)
        if online:
            predictor.observe(ctx, (request.chosen,))
    return MatchReport(k, len(test), matched, len(train))


@dataclass(frozen=True)
class OverlapShare:
    """Eq. (2)'s overlap for HCI, summed over the requests of a floor replay (seconds)."""

    requests: int
    think_s: float
    exec_s: float
    overlap_s: float
    wall_s: float

    @property
    def share(self) -> float:
        """Overlap ÷ request wall time: the workload's overlap share."""
        return self.overlap_s / self.wall_s if self.wall_s else float("nan")

    @property
    def post_click_share(self) -> float:
        """Overlap ÷ post-click execution: the most of the felt latency fill could hide."""
        return self.overlap_s / self.exec_s if self.exec_s else float("nan")


def overlap_share(stages: pd.DataFrame, human_stage: str = "pick") -> OverlapShare:
    """The overlap share of the requests in ``stages`` (a ``stages.parquet`` frame).

    Only canonical executions count (``speculative`` false): in a floor replay that is every
    row. Requests without a ``human_stage`` row contribute their wall time and no overlap.
    """
    rows = stages
    if "speculative" in rows.columns:
        rows = rows[~rows["speculative"].astype(bool)]
    think = exec_ = overlap = wall = 0.0
    requests = 0
    for _, r in rows.groupby("request_id", sort=True):
        requests += 1
        wall += float(r["end"].max() - r["start"].min())
        human = r[r["stage"] == human_stage]
        if human.empty:
            continue
        t_gen = float((human["end"] - human["start"]).sum())
        click = float(human["end"].max())
        t_exec = max(0.0, float(r["end"].max()) - click)
        think, exec_ = think + t_gen, exec_ + t_exec
        overlap += min(t_gen, t_exec)
    return OverlapShare(requests, think, exec_, overlap, wall)
