"""Offline checks of the HCI workload: a predictor's top-k match, and the overlap share.

* :func:`top_k_match` learns a predictor on the train requests' resolved picks, then ranks
  each test request's pick branch (built exactly as the request opens it, with the recorded
  offer) and counts how often the pick is in the top ``k``. With ``online=True`` the
  predictor keeps learning from each test pick *after* ranking it, as it does in a run.
* :func:`overlap_share` is DESIGN.md §3 eq. (2) for HCI measured on a floor replay's stage
  log: per request, ``min(T_gen, T_exec)`` with ``T_gen`` the user's think time (the human
  stage) and ``T_exec`` the downstream execution the pick gates, summed over requests and
  divided by the summed request wall time (first stage start to last stage end). It is the
  most of each request's wall time early fill could hide; the same overlap divided by the
  summed post-click execution is the most of the post-click latency it could hide.
  By default ``T_exec`` is everything from the click to the end of the request (the gross
  bound, as if every downstream stage could be filled). With ``fillable``, ``T_exec`` is
  only what a fill can run before the click: those stages' canonical durations plus, per
  request, ``extra_s`` (e.g. the part of the reply's prefill a warm-up can take over). For
  HCI that is the lookup and the reply's known prefix: the reply itself reads the user's
  utterance, so no fill can run it.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
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


def overlap_share(
    stages: pd.DataFrame,
    human_stage: str = "pick",
    fillable: Collection[str] | None = None,
    extra_s: Mapping[str, float] | None = None,
) -> OverlapShare:
    """The overlap share of the requests in ``stages`` (a ``stages.parquet`` frame).

    Only canonical executions count (``speculative`` false): in a floor replay that is every
    row. Requests without a ``human_stage`` row contribute their wall time and no overlap.
    ``fillable`` / ``extra_s`` narrow ``T_exec`` to what a fill can run (module docstring);
    ``exec_s`` still sums the whole post-click execution.
    """
    rows = stages
    if "speculative" in rows.columns:
        rows = rows[~rows["speculative"].astype(bool)]
    think = exec_ = overlap = wall = 0.0
    requests = 0
    for request_id, r in rows.groupby("request_id", sort=True):
        requests += 1
        wall += float(r["end"].max() - r["start"].min())
        human = r[r["stage"] == human_stage]
        if human.empty:
            continue
        t_gen = float((human["end"] - human["start"]).sum())
        click = float(human["end"].max())
        after = max(0.0, float(r["end"].max()) - click)
        t_exec = after
        if fillable is not None:
            hidden = r[r["stage"].isin(list(fillable)) & (r["start"] >= click)]
            t_exec = float((hidden["end"] - hidden["start"]).sum())
            t_exec += (extra_s or {}).get(str(request_id), 0.0)
        think, exec_ = think + t_gen, exec_ + after
        overlap += min(t_gen, t_exec)
    return OverlapShare(requests, think, exec_, overlap, wall)
