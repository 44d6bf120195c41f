"""Statistics every experiment reports the same way: mean ± s.d. over seeds, Welch's t-test.

The paper's error bars are ±1 standard deviation over seeds and its significance tests are
Welch's unequal-variance t-test (Welch, 1947). Both live here so every report and plot
computes them alike:

* :func:`spread` — the mean and the sample standard deviation of a cell over its seeds;
  with one seed there is no standard deviation (``None``), and :func:`fmt` then prints the
  mean alone, never "± 0.000".
* :func:`welch` — Welch's two-sided t-test of two samples (no SciPy here: the Student t
  tail comes from the regularised incomplete beta function, evaluated by its continued
  fraction as in Numerical Recipes §6.4).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    """A cell over its seeds: ``n`` values, their mean and sample s.d. (``None`` for n < 2)."""

    mean: float | None
    sd: float | None
    n: int


def spread(values: Iterable[float | None]) -> Spread:
    """Mean and sample standard deviation (ddof 1) of the values that are not ``None``."""
    xs = [float(v) for v in values if v is not None and not math.isnan(float(v))]
    if not xs:
        return Spread(None, None, 0)
    mean = sum(xs) / len(xs)
    if len(xs) < 2:
        return Spread(mean, None, 1)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return Spread(mean, math.sqrt(var), len(xs))


def fmt(s: Spread, number: Callable[[float], str] = "{:.3f}".format) -> str:
    """``mean ± sd`` with ``number`` formatting each; the mean alone for one seed; ``—``
    when there is nothing."""
    if s.mean is None:
        return "—"
    if s.sd is None:
        return number(s.mean)
    return f"{number(s.mean)} ± {number(s.sd)}"


def pct(x: float) -> str:
    """A signed percentage with one decimal (fractions in, ``−12.3 %`` out)."""
    return f"{100 * x:+.1f} %".replace("-", "−")


def pct_spread(s: Spread) -> str:
    """A spread of fractions as signed percentages (``−12.3 % ± 1.1``)."""
    if s.mean is None:
        return "—"
    if s.sd is None:
        return pct(s.mean)
    return f"{pct(s.mean)} ± {100 * s.sd:.1f}"


@dataclass(frozen=True)
class Welch:
    """Welch's two-sided t-test: the statistic, its Welch–Satterthwaite degrees of freedom
    and the p-value. ``p`` is ``None`` when either sample has fewer than two values or both
    have no variance."""

    t: float | None
    df: float | None
    p: float | None
    n_a: int
    n_b: int

    def significant(self, alpha: float = 0.05) -> bool | None:
        """Whether ``p < alpha`` (``None`` when there is no p-value)."""
        return None if self.p is None else self.p < alpha


def welch(a: Sequence[float], b: Sequence[float]) -> Welch:
    """Welch's t-test of mean(a) ≠ mean(b)."""
    sa, sb = spread(a), spread(b)
    if sa.sd is None or sb.sd is None:
        return Welch(None, None, None, sa.n, sb.n)
    va, vb = sa.sd**2 / sa.n, sb.sd**2 / sb.n
    if va + vb == 0.0:
        return Welch(None, None, None, sa.n, sb.n)
    t = (sa.mean - sb.mean) / math.sqrt(va + vb)
    df = (va + vb) ** 2 / (va**2 / (sa.n - 1) + vb**2 / (sb.n - 1))
    return Welch(t, df, student_t_two_sided(t, df), sa.n, sb.n)


def student_t_two_sided(t: float, df: float) -> float:
    """P(|T| ≥ |t|) for Student's t with ``df`` degrees of freedom."""
    if df <= 0:
        raise ValueError(f"degrees of freedom must be > 0, got {df}")
    x = df / (df + t * t)
    return min(1.0, max(0.0, incomplete_beta(df / 2.0, 0.5, x)))


def incomplete_beta(a: float, b: float, x: float) -> float:
    """The regularised incomplete beta function I_x(a, b), 0 ≤ x ≤ 1."""
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = (
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    # NOTE: the continued fraction converges fast for x < (a + 1) / (a + b + 2); above it,
    # the symmetry I_x(a, b) = 1 − I_{1−x}(b, a) keeps it there.
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(log_front) * _beta_fraction(a, b, x) / a
    return 1.0 - math.exp(log_front) * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float, eps: float = 1e-14, tiny: float = 1e-300) -> float:
    """The continued fraction of I_x(a, b) (modified Lentz's method)."""
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for num in (
            m * (b - m) * x / ((qam + m2) * (a + m2)),
            -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2)),
        ):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + num / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def ratio(numerator: float | None, denominator: float | None) -> float | None:
    """``numerator / denominator``, ``None`` when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator


def group_spreads(
    rows: Iterable[dict], by: Sequence[str], metrics: Sequence[str]
) -> dict[tuple, dict[str, Spread]]:
    """Per group of ``by`` values, the spread over its rows (its seeds) of each metric."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault(tuple(r.get(k) for k in by), []).append(r)
    return {key: {m: spread(r.get(m) for r in rs) for m in metrics} for key, rs in groups.items()}
