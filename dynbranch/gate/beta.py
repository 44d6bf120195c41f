"""Beta posteriors and their upper quantiles (Bayes-UCB), in pure Python.

The fill gate's selection probability is a rank-conditioned Beta posterior read at an
upper quantile (Kaufmann, Cappé and Garivier, "On Bayesian Upper Confidence Bounds for
Bandit Problems", AISTATS 2012). The quantile inverts the regularized incomplete beta
function ``I_x(a, b)``, evaluated by its continued fraction (modified Lentz) and inverted
by Newton steps kept inside a shrinking bisection bracket. No SciPy: the gate must import
with the standard library only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

_EPS = 1e-15
_TINY = 1e-300
_CF_MAX_TERMS = 500
_QUANTILE_MAX_STEPS = 400
_X_TOL = 1e-14
_SMALLEST = 5e-324  # the smallest positive double


def log_beta(a: float, b: float) -> float:
    """``log B(a, b)``."""
    return math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)


def _beta_cf(a: float, b: float, x: float) -> float:
    """The continued fraction of ``I_x(a, b)`` (Numerical Recipes' ``betacf``, Lentz)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, _CF_MAX_TERMS + 1):
        m2 = 2 * m
        aa = m * (b - m) * x / ((qam + m2) * (a + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        aa = -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))
        d = 1.0 + aa * d
        d = 1.0 / (d if abs(d) > _TINY else _TINY)
        c = 1.0 + aa / c
        c = c if abs(c) > _TINY else _TINY
        step = d * c
        h *= step
        if abs(step - 1.0) < _EPS:
            return h
    raise ArithmeticError(f"incomplete beta did not converge for a={a}, b={b}, x={x}")


def _tails(a: float, b: float, x: float) -> tuple[float, float]:
    """``(I_x(a, b), 1 - I_x(a, b))``, each computed directly where it is the small one."""
    _check_shape(a, b)
    if x <= 0.0:
        return 0.0, 1.0
    if x >= 1.0:
        return 1.0, 0.0
    front = math.exp(a * math.log(x) + b * math.log1p(-x) - log_beta(a, b))
    # NOTE: the fraction converges fast only left of the mean; use the symmetry
    # I_x(a, b) = 1 - I_{1-x}(b, a) on the other side.
    if x < (a + 1.0) / (a + b + 2.0):
        lower = front * _beta_cf(a, b, x) / a
        return lower, 1.0 - lower
    upper = front * _beta_cf(b, a, 1.0 - x) / b
    return 1.0 - upper, upper


def betainc(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function ``I_x(a, b)`` (the Beta(a, b) CDF at x)."""
    return _tails(a, b, x)[0]


def betaincc(a: float, b: float, x: float) -> float:
    """The upper tail ``1 - I_x(a, b)``, accurate even where it is tiny."""
    return _tails(a, b, x)[1]


def beta_pdf(a: float, b: float, x: float) -> float:
    """The Beta(a, b) density at ``x`` (0 outside (0, 1))."""
    if x <= 0.0 or x >= 1.0:
        return 0.0
    return math.exp((a - 1.0) * math.log(x) + (b - 1.0) * math.log1p(-x) - log_beta(a, b))


def beta_quantile(a: float, b: float, q: float) -> float:
    """The ``q``-quantile of Beta(a, b): the ``x`` with ``I_x(a, b) = q``.

    Accurate to about 1e-14 relative to ``min(x, 1 - x)``, for any ``q`` a double holds.
    """
    # NOTE: remembered: the gate reads the same posteriors' quantiles at every candidate
    # until they next learn, and each read is a Newton solve (a twentieth of a replay).
    return _beta_quantile(float(a), float(b), float(q))


@lru_cache(maxsize=1 << 14)
def _beta_quantile(a: float, b: float, q: float) -> float:
    _check_shape(a, b)
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"quantile level must be in [0, 1], got {q}")
    if q == 0.0:
        return 0.0
    if q == 1.0:
        return 1.0
    # NOTE: floats resolve small numbers finely and numbers near 1 coarsely, so solve for
    # whichever of x and 1 - x is at most 1/2 (I_{1-x}(b, a) = 1 - q), and match whichever
    # of the lower and upper tail is at most 1/2 (q >= 1/2 makes 1 - q exact).
    # NOTE: which side of 1/2 the root lies on is decided on the smaller tail too: for q near
    # 1, q and I_{1/2} can round to neighbouring doubles in the wrong order while their upper
    # tails (1 - q exact, and I^c_{1/2}) still compare right (hypothesis found a = 0.203,
    # b = 44, q = 1 - 1e-15 solved on the wrong side, 5 % off in the upper tail).
    if q >= 0.5:
        if 1.0 - q >= betaincc(a, b, 0.5):
            return _solve(a, b, 1.0 - q, upper=True)
        return 1.0 - _solve(b, a, 1.0 - q, upper=False)
    if q <= betainc(a, b, 0.5):
        return _solve(a, b, q, upper=False)
    return 1.0 - _solve(b, a, q, upper=True)


def quantile_upper_bound(a: float, b: float, q: float) -> float:
    """A cheap number never below the ``q``-quantile of Beta(a, b) (at most 1).

    ``mean + min(Cantelli, sub-Gaussian)``: Cantelli's inequality gives
    ``x_q <= mu + sigma sqrt(q / (1 - q))``, and Beta(a, b) is sub-Gaussian with variance
    proxy ``1 / (4 (a + b + 1))`` (Marchal and Arbel, "On the sub-Gaussianity of the Beta and
    Dirichlet distributions", 2017), so ``x_q <= mu + sqrt(log(1 / (1 - q)) / (2 (a + b +
    1)))``. Both hold for every a, b > 0; widened by a relative 1e-9 against rounding. A
    test checks it against :func:`beta_quantile` across shapes and levels.
    """
    _check_shape(a, b)
    if not q < 1.0:
        return 1.0
    if q <= 0.0:
        return 0.0
    n = a + b
    tail = 1.0 - q
    cantelli = math.sqrt(a * b / (n * n * (n + 1.0)) * q / tail)
    sub_gaussian = math.sqrt(math.log(1.0 / tail) / (2.0 * (n + 1.0)))
    return min(1.0, (a / n + min(cantelli, sub_gaussian)) * (1.0 + 1e-9) + 1e-15)


def _initial_guess(a: float, b: float, p: float, pc: float) -> float:
    """A starting point for ``I_x(a, b) = p`` with ``pc = 1 - p`` (NR's ``invbetai``).

    For a, b >= 1, Abramowitz and Stegun 26.5.22 (a normal approximation refined for the
    Beta's skew); otherwise the power-law tails ``I_x ~ x^a`` near 0 and
    ``1 - I_x ~ (1 - x)^b`` near 1, accurate exactly where the quantiles are extreme.
    """
    if a >= 1.0 and b >= 1.0:
        pp = p if p < 0.5 else pc
        t = math.sqrt(-2.0 * math.log(max(pp, _SMALLEST)))
        z = (2.30753 + t * 0.27061) / (1.0 + t * (0.99229 + t * 0.04481)) - t
        if p < 0.5:
            z = -z
        al = (z * z - 3.0) / 6.0
        h = 2.0 / (1.0 / (2.0 * a - 1.0) + 1.0 / (2.0 * b - 1.0))
        w = z * math.sqrt(al + h) / h - (1.0 / (2.0 * b - 1.0) - 1.0 / (2.0 * a - 1.0)) * (
            al + 5.0 / 6.0 - 2.0 / (3.0 * h)
        )
        # NOTE: clamped: at extreme levels the guess only has to land inside (0, 1).
        return a / (a + b * math.exp(max(-700.0, min(700.0, 2.0 * w))))
    lna, lnb = math.log(a / (a + b)), math.log(b / (a + b))
    t, u = math.exp(a * lna) / a, math.exp(b * lnb) / b
    w = t + u
    if p < t / w:
        return (a * w * p) ** (1.0 / a)
    return 1.0 - (b * w * pc) ** (1.0 / b)


def _solve(a: float, b: float, target: float, *, upper: bool) -> float:
    """The root in ``(0, 1/2]`` of ``I_x(a, b) = target`` (or ``1 - I_x = target`` if
    ``upper``), by Newton steps safeguarded with bisection (Numerical Recipes' ``rtsafe``).
    """
    lo, hi = 0.0, 0.5
    p, pc = (1.0 - target, target) if upper else (target, 1.0 - target)
    x = _initial_guess(a, b, p, pc)
    if not 0.0 < x < hi:
        x = min(a / (a + b), 0.25)
    sign = -1.0 if upper else 1.0  # the residual's slope: +pdf, or -pdf for the upper tail
    step_before = 1.0
    for _ in range(_QUANTILE_MAX_STEPS):
        lower_tail, upper_tail = _tails(a, b, x)
        err = (upper_tail if upper else lower_tail) - target
        if err == 0.0:
            return x
        if sign * err > 0.0:
            hi = x
        else:
            lo = x
        slope = sign * beta_pdf(a, b, x)
        newton = x - err / slope if slope != 0.0 else -1.0
        inside = lo <= newton <= hi
        if inside and abs(newton - x) <= _X_TOL * newton:
            return newton  # converged: the correction is below float resolution
        # NOTE: bisect when Newton leaves the bracket or does not at least halve the
        # previous step: on power-law tails (I_x ~ x^a, a large) raw Newton creeps by
        # ~x/a per step; bisection guarantees convergence, Newton its speed near the root.
        if inside and abs(2.0 * err) <= abs(step_before * slope):
            nxt = newton
        elif hi > 4.0 * lo:  # a bracket spanning magnitudes: bisect the exponent
            nxt = math.exp(0.5 * (math.log(max(lo, _SMALLEST)) + math.log(hi)))
        else:
            nxt = 0.5 * (lo + hi)
        if hi - lo <= _X_TOL * hi or nxt == x:
            return nxt
        step_before, x = nxt - x, nxt
    return x


def bayes_ucb_level(t: int, c: float = 0.0, horizon: int | None = None) -> float:
    """Kaufmann et al.'s quantile level ``1 - 1 / (t * (log T)^c)`` at decision ``t >= 1``.

    ``c = 0`` (the default, and what the paper's experiments found best) gives
    ``1 - 1/t``. With ``c > 0``, ``T`` is ``horizon`` when known, else ``t`` itself (the
    anytime form); ``log T`` is floored at 1 so small ``T`` never raises the level above
    ``1 - 1/t``.
    """
    if t < 1:
        raise ValueError(f"decision index must be >= 1, got {t}")
    if c < 0.0:
        raise ValueError(f"Bayes-UCB exponent c must be >= 0, got {c}")
    factor = 1.0
    if c > 0.0:
        factor = max(1.0, math.log(horizon if horizon is not None else t)) ** c
    return 1.0 - 1.0 / (t * factor)


def _check_shape(a: float, b: float) -> None:
    if not (a > 0.0 and b > 0.0 and math.isfinite(a) and math.isfinite(b)):
        raise ValueError(f"Beta shape parameters must be finite and > 0, got a={a}, b={b}")


@dataclass
class BetaPosterior:
    """A Beta(alpha, beta) posterior over a success probability, updated by observations."""

    alpha: float = 1.0
    beta: float = 1.0

    def __post_init__(self) -> None:
        _check_shape(self.alpha, self.beta)

    def update(self, success: bool, weight: float = 1.0) -> None:
        """Add one (possibly fractional) success or failure."""
        if not (weight >= 0.0 and math.isfinite(weight)):
            raise ValueError(f"observation weight must be finite and >= 0, got {weight}")
        if success:
            self.alpha += weight
        else:
            self.beta += weight

    @property
    def mean(self) -> float:
        return self.alpha / (self.alpha + self.beta)

    @property
    def observations(self) -> float:
        """Total observation weight on top of a Beta(1, 1)-sized prior (for reports)."""
        return self.alpha + self.beta

    def upper_quantile(self, q: float) -> float:
        """The ``q``-quantile of the posterior (Bayes-UCB reads it at q close to 1)."""
        return beta_quantile(self.alpha, self.beta, q)

    def upper_quantile_bound(self, q: float) -> float:
        """A cheap number never below :meth:`upper_quantile` (:func:`quantile_upper_bound`)."""
        return quantile_upper_bound(self.alpha, self.beta, q)

    def to_state(self) -> list[float]:
        return [self.alpha, self.beta]

    @classmethod
    def from_state(cls, state: list[float]) -> BetaPosterior:
        alpha, beta = state
        return cls(float(alpha), float(beta))
