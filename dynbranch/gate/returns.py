"""Action 0's learning target: one aggregate return per branch entry (DESIGN.md §3, eq. 4).

``R_b = sum of consumed fills' saved execution - setup - cost of the fills enabled - waits``
arrives once per branch entry, after the branch settles. Per branch coordinate we keep the
count, mean and sum of squared deviations of those returns (Welford) and read an
optimistic estimate: the mean plus a UCB bonus ``sd * sqrt(2 ln t / n)`` over ``n``
returns and ``t`` entries. One bonus per coordinate, never one per candidate: summing
optimism over mutually exclusive candidates would overvalue the branch.

The coordinate's returns are shrunk towards its *stage*'s (every step of one decision
point, ``workflow/stage``) by one pseudo-return with the stage's mean and spread: a
coordinate seen twice inherits what its stage has learnt instead of a fixed prior, so two
unlucky entries cannot close a step whose stage pays on average (returns are bimodal: most
entries save nothing, a consumed fill saves seconds).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class BranchReturn:
    """One settled branch entry's full-path return, in milliseconds.

    ``saved_ms``: execution the consumed fills saved after C1 lookup (``sum G^Δ``);
    ``setup_ms``: prediction and expansion time; ``fill_cost_ms``: the cost of the fills
    the entry enabled (engine time or their contention price); ``wait_ms``: expired or
    uncovered waits.
    """

    saved_ms: float
    setup_ms: float = 0.0
    fill_cost_ms: float = 0.0
    wait_ms: float = 0.0

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if not math.isfinite(value):
                raise ValueError(f"BranchReturn.{name} must be finite, got {value!r}")

    @property
    def value_ms(self) -> float:
        return self.saved_ms - self.setup_ms - self.fill_cost_ms - self.wait_ms


@dataclass(frozen=True)
class Observation:
    """What one ranked candidate of a settled branch entry turned out to be: whether the
    branch chose it (the rank posterior) and, if chosen and filled, whether its fill was
    used in time (the usability posterior; ``None`` when it says nothing about usability)."""

    stage_key: str
    rank: int
    selected: bool
    usable: bool | None = None
    confidence: float | None = None  # the predictor's own probability, if it reported one


@dataclass(frozen=True)
class Settlement:
    """One settled branch entry's return, for Action 0 at its coordinate."""

    coordinate: str
    ret: BranchReturn


@dataclass(frozen=True)
class GenerationDecision:
    """Action 0's answer for one branch entry: run the predictor or not."""

    open: bool
    estimate: float  # the optimistic return estimate (ms; +inf for an unseen coordinate)
    audit: bool = False  # opened only because a seeded audit drew it


@dataclass
class ReturnStats:
    """Returns seen at one branch coordinate, and how often it was entered."""

    entries: int = 0  # branch entries (generation decisions), t
    n: int = 0  # settled returns
    mean: float = 0.0
    m2: float = 0.0  # sum of squared deviations from the mean

    def add(self, value: float) -> None:
        """Welford's update with one return."""
        self.n += 1
        delta = value - self.mean
        self.mean += delta / self.n
        self.m2 += delta * (value - self.mean)

    @property
    def variance(self) -> float:
        return self.m2 / self.n if self.n else 0.0

    def merge(self, other: ReturnStats) -> None:
        """Fold ``other``'s returns into these (Chan et al.'s pairwise update)."""
        if other.n == 0:
            return
        n = self.n + other.n
        delta = other.mean - self.mean
        self.m2 += other.m2 + delta * delta * self.n * other.n / n
        self.mean += delta * other.n / n
        self.n = n
        self.entries += other.entries

    def optimistic(self, prior_scale_ms: float, prior: ReturnStats | None = None) -> float:
        """Mean plus a UCB bonus; +inf before any return (new coordinates start open).

        NOTE: one pseudo-return blends in ``prior`` (the stage's returns: its mean and
        spread), or a zero-mean return of spread ``prior_scale_ms`` when the stage has too
        few, so that a coordinate with a few identical returns still gets a finite,
        nonzero bonus and starts from what its stage has learnt.
        """
        if self.n == 0:
            return math.inf
        if prior is not None and prior.n >= 2:
            prior_mean, prior_var = prior.mean, max(prior.variance, prior_scale_ms**2)
        else:
            prior_mean, prior_var = 0.0 if prior is not None else self.mean, prior_scale_ms**2
        mean = (self.n * self.mean + prior_mean) / (self.n + 1)
        sd = math.sqrt((self.m2 + prior_var) / (self.n + 1))
        t = max(self.entries, self.n, 2)
        return mean + sd * math.sqrt(2.0 * math.log(t) / self.n)

    def to_state(self) -> dict[str, Any]:
        return asdict(self)
