"""User think time between an offered menu and the user's pick: seeded, paired, log-normal.

**Distribution.** Log-normal, ``T = median · exp(σ · Z)`` with ``Z`` standard normal.

* ``median = 2.65 s`` is the Keystroke-Level Model's time for one menu pick with a mouse:
  ``M + P + K = 1.35 + 1.10 + 0.20 s`` — mentally prepare (M = 1.35 s), point at the item
  (P = 1.10 s, the average of Fitts'-law pointing times 0.8–1.5 s) and press the button
  (K = 0.20 s, an average skilled user) — from S. K. Card, T. P. Moran and A. Newell, "The
  Keystroke-Level Model for User Performance Time with Interactive Systems", *Communications
  of the ACM* 23(7):396–410, July 1980 (operator table).
* ``σ = 0.21`` is that paper's validation error: over its 28 users, 10 systems and 14
  tasks the model predicted individual task times with a root-mean-square error of 21 % of
  the average predicted execution time. A log-normal with σ = 0.21 puts observed/predicted at a relative
  spread of about 21 % around the model (for small σ the relative RMS deviation ≈ σ), and
  keeps times positive and right-skewed, as human decision times are. Mean
  ``2.65 · exp(0.21²/2) ≈ 2.71 s``; 5th–95th percentile ≈ 1.88–3.74 s.

Why this source: the paper grounds HCI think time in Card, Moran & Newell (1980) and
Doherty & Thadhani (1982); of the two, only the KLM gives operator times for a menu pick
and a published spread around them. It models a user who knows what they want from a
short menu; reading a long menu or deliberating takes longer, so these are conservative
(short) windows for early fill. Both parameters are options of the workload.

**Pairing.** A think time is a pure function of ``(seed, request id, turn)``: SHA-256 of
those three gives a uniform in (0, 1), mapped through the normal quantile. Every arm (and
every instance built for the same request) sees the same gap; different requests see
independent ones. No random-number generator state is involved.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from statistics import NormalDist

KLM_MENTAL_S = 1.35
KLM_POINT_S = 1.10
KLM_BUTTON_S = 0.20
KLM_MENU_PICK_S = KLM_MENTAL_S + KLM_POINT_S + KLM_BUTTON_S
KLM_RMS_ERROR = 0.21

_STANDARD_NORMAL = NormalDist()


@dataclass(frozen=True)
class ThinkTime:
    """A log-normal think-time distribution, sampled as a pure function of its key."""

    median_s: float = KLM_MENU_PICK_S
    sigma: float = KLM_RMS_ERROR

    def __post_init__(self) -> None:
        if not (math.isfinite(self.median_s) and self.median_s > 0):
            raise ValueError(f"think-time median {self.median_s} s must be > 0")
        if not (math.isfinite(self.sigma) and 0 <= self.sigma <= 3):
            raise ValueError(f"think-time sigma {self.sigma} outside [0, 3]")

    @property
    def mean_s(self) -> float:
        return self.median_s * math.exp(self.sigma**2 / 2)

    def quantile(self, q: float) -> float:
        """The ``q`` quantile of the distribution, in seconds."""
        return self.median_s * math.exp(self.sigma * _STANDARD_NORMAL.inv_cdf(q))

    def seconds(self, seed: int, request_id: str, turn: int) -> float:
        """The think time of ``request_id`` at ``turn`` under ``seed``."""
        return self.quantile(uniform(seed, request_id, turn))


def uniform(seed: int, request_id: str, turn: int) -> float:
    """A uniform in (0, 1) that depends only on its arguments."""
    key = f"dynbranch/hci/think/{seed}/{request_id}/{turn}".encode()
    head = int.from_bytes(hashlib.sha256(key).digest()[:8], "big")
    return (head + 0.5) / 2.0**64
