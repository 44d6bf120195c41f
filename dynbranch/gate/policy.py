"""The gate's policies: how Action 0 opens and how Action 1 scores a candidate.

The :class:`~dynbranch.gate.gate.Gate` owns the loop (greedy admission, reservations,
audits, learning); a policy only answers three small questions. ``priced`` is DynBranch's
two-level gate; ``fixed_threshold`` is the attribution baseline of Fig. 13 (Action 0
always open, Action 1 admits iff ``p~ > p*``, nothing priced, no audits). Fig. 13's
attribution also needs one level priced and the other not: ``priced_a1_only`` (Action 0
always open, Action 1 priced, with audits) and ``priced_a0_fixed`` (Action 0 opened by the
learned return, Action 1 ``p~ > p*``, with audits). :func:`make_policy` builds each by name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

from dynbranch.errors import UnknownNameError
from dynbranch.gate.load import LoadView
from dynbranch.gate.price import ContentionModel, FillShape

NEGATIVE_UTILITY = "negative_utility"
BELOW_THRESHOLD = "below_threshold"


@dataclass(frozen=True)
class Score:
    """A candidate's value at one projected load."""

    price_ms: float
    utility_ms: float
    passes: bool


class AdmissionPolicy(ABC):
    """What a gate policy decides; the mechanism is the gate's."""

    name: str
    audits: bool
    """Whether seeded audits may reopen what this policy refuses."""
    refusal: str
    """The reason recorded for a candidate this policy does not pass."""

    @abstractmethod
    def generation_open(self, estimate_ms: float) -> bool:
        """Action 0: open for this optimistic return estimate?"""

    @abstractmethod
    def score(
        self, p: float, gain_ms: float, shape: FillShape, view: LoadView, model: ContentionModel
    ) -> Score:
        """Action 1: price and utility of a candidate with optimistic probability ``p``."""


class Priced(AdmissionPolicy):
    """DynBranch: ``u = p~ G - (1 - p~) C_s(V)`` (eq. 5); admit while ``u > 0``."""

    name = "priced"
    audits = True
    refusal = NEGATIVE_UTILITY

    def generation_open(self, estimate_ms: float) -> bool:
        return estimate_ms > 0.0

    def score(
        self, p: float, gain_ms: float, shape: FillShape, view: LoadView, model: ContentionModel
    ) -> Score:
        price = model.price_ms(shape, view)
        utility = p * gain_ms - (1.0 - p) * price
        return Score(price, utility, utility > 0.0)


class FixedThreshold(AdmissionPolicy):
    """Attribution baseline: Action 0 always open; Action 1 admits iff ``p~ > p*``."""

    audits = False
    refusal = BELOW_THRESHOLD

    def __init__(self, p_star: float) -> None:
        if not 0.0 <= p_star <= 1.0:
            raise ValueError(f"fixed threshold p* must be in [0, 1], got {p_star}")
        self.p_star = p_star
        self.name = f"fixed_threshold(p*={p_star:g})"

    def generation_open(self, estimate_ms: float) -> bool:
        return True

    def score(
        self, p: float, gain_ms: float, shape: FillShape, view: LoadView, model: ContentionModel
    ) -> Score:
        # NOTE: no pricing: the utility is the unpriced expected saving, used only to order
        # the candidates that pass.
        return Score(0.0, p * gain_ms, p > self.p_star)


class PricedAlwaysOpen(Priced):
    """Attribution: Action 0 off (the predictor runs at every branch), Action 1 priced."""

    name = "priced_a1_only"

    def generation_open(self, estimate_ms: float) -> bool:
        return True


class FixedWithGeneration(FixedThreshold):
    """Attribution: Action 0 priced (learned returns), Action 1 a fixed threshold ``p*``."""

    audits = True

    def __init__(self, p_star: float) -> None:
        super().__init__(p_star)
        self.name = f"priced_a0_fixed(p*={p_star:g})"

    def generation_open(self, estimate_ms: float) -> bool:
        return estimate_ms > 0.0


POLICIES = ("priced", "fixed_threshold", "priced_a1_only", "priced_a0_fixed")
"""``priced`` is DynBranch (both levels priced); the other three switch one or both levels
to their unpriced baseline for Fig. 13's two-level attribution."""


def make_policy(name: str, p_star: float = 0.5) -> AdmissionPolicy:
    """The policy called ``name``."""
    if name == "priced":
        return Priced()
    if name == "fixed_threshold":
        return FixedThreshold(p_star)
    if name == "priced_a1_only":
        return PricedAlwaysOpen()
    if name == "priced_a0_fixed":
        return FixedWithGeneration(p_star)
    raise UnknownNameError("gate policy", name, list(POLICIES))
