"""The calibration solver: bounded Levenberg–Marquardt over log knobs (no SciPy here)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from dynbranch.engines.profile import (
    Profile,
)

STEP_KNOBS = ("bandwidth_efficiency", "mfu", "step_overhead_ms", "seq_overhead_us")
"""The calibration knobs that enter a step's time (``non_kv_memory_gib`` sizes the pool)."""
KNOB_BOUNDS = {
    "bandwidth_efficiency": (1e-4, 1.0),
    "mfu": (1e-4, 1.0),
    "step_overhead_ms": (1e-4, 1e4),
    "seq_overhead_us": (1e-3, 1e6),
}
CONTENTION_KNOBS = ("seq_overhead_us", "mfu")
"""What the contention fit moves by default (see :func:`fit_contention` for why)."""
MAX_CONTENTION_TARGETS = 2
"""DESIGN.md §5: fit on at most two of the paper's Fig. 5b points, report all."""


# -- the solver ------------------------------------------------------------------------------


@dataclass(frozen=True)
class LsqResult:
    """Where :func:`least_squares` stopped."""

    x: tuple[float, ...]
    residuals: tuple[float, ...]
    evaluations: int
    iterations: int
    converged: bool


def least_squares(
    fun: Callable[[Sequence[float]], Sequence[float]],
    x0: Sequence[float],
    bounds: Sequence[tuple[float, float]],
    *,
    rel_step: float = 0.05,
    max_iter: int = 20,
    xtol: float = 2e-3,
    ftol: float = 1e-8,
) -> LsqResult:
    """Minimise ``sum(fun(x)**2)`` over positive ``x`` within ``bounds`` (Levenberg–Marquardt).

    NOTE: steps are taken in ``log x``: knobs span decades (µs to ms, 1e-3 to 1) and must stay
    positive. The Jacobian is a forward difference of ``rel_step`` (backward at an upper
    bound): coarse on purpose, since a simulated p50 is only piecewise smooth in the knobs.
    """
    lo, hi = np.log([b[0] for b in bounds]), np.log([b[1] for b in bounds])
    y = np.clip(np.log(np.asarray(x0, dtype=float)), lo, hi)
    evaluations = 0

    def residuals(at: np.ndarray) -> np.ndarray:
        nonlocal evaluations
        evaluations += 1
        return np.asarray(fun(tuple(map(float, np.exp(at)))), dtype=float)

    r, lam, converged, iterations = residuals(y), 1e-2, False, 0
    h = math.log1p(rel_step)
    while iterations < max_iter:
        iterations += 1
        if float(r @ r) < ftol:
            converged = True
            break
        jac = np.empty((r.size, y.size))
        for j in range(y.size):
            step = h if y[j] + h <= hi[j] else -h
            probe = y.copy()
            probe[j] += step
            jac[:, j] = (residuals(probe) - r) / step
        a, g = jac.T @ jac, jac.T @ r
        for _ in range(6):
            dy = np.linalg.solve(a + lam * np.diag(np.diag(a)) + 1e-12 * np.eye(y.size), -g)
            trial = np.clip(y + dy, lo, hi)
            r_trial = residuals(trial)
            if float(r_trial @ r_trial) < float(r @ r):
                moved = float(np.max(np.abs(trial - y)))
                y, r, lam = trial, r_trial, max(lam / 3, 1e-6)
                break
            lam *= 4
        else:
            converged = True  # no direction lowers the cost: a (bounded) minimum
            break
        if moved < xtol:
            converged = True
            break
    return LsqResult(
        tuple(map(float, np.exp(y))), tuple(map(float, r)), evaluations, iterations, converged
    )


def _knob_values(profile: Profile, knobs: Sequence[str]) -> list[float]:
    unknown = [k for k in knobs if k not in KNOB_BOUNDS]
    if unknown:
        raise ValueError(f"unknown calibration knob {unknown[0]!r}; fit one of {STEP_KNOBS}")
    return [getattr(profile.calibration, k) for k in knobs]


