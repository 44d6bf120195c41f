"""The statistics every report shares: spreads over seeds and Welch's t-test."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from experiments.stats import (
    Spread,
    fmt,
    group_spreads,
    incomplete_beta,
    pct,
    pct_spread,
    spread,
    student_t_two_sided,
    welch,
)


def test_one_seed_has_no_standard_deviation_and_prints_none():
    s = spread([0.25])
    assert s == Spread(0.25, None, 1)
    assert fmt(s) == "0.250" and "±" not in pct_spread(s)
    assert pct_spread(s) == "+25.0 %"


def test_several_seeds_print_the_sample_standard_deviation():
    s = spread([1.0, 2.0, 3.0, None])
    assert (s.mean, s.n) == (2.0, 3) and s.sd == pytest.approx(1.0)
    assert fmt(s) == "2.000 ± 1.000"
    assert pct_spread(spread([-0.1, -0.12])) == "−11.0 % ± 1.4"


def test_nothing_to_spread_is_a_dash():
    assert fmt(spread([])) == "—" and fmt(spread([None, float("nan")])) == "—"


def test_pct_uses_a_true_minus_sign():
    assert pct(-0.118) == "−11.8 %" and pct(0.05) == "+5.0 %"


@pytest.mark.parametrize(
    ("t", "df", "p"),
    [
        (2.228138851986, 10, 0.05),  # the tabulated 97.5 % quantiles
        (2.570581835636, 5, 0.05),
        (12.70620473617, 1, 0.05),
        (1.0, 1, 0.5),  # Cauchy: P(|T| > 1) = 1/2
        (0.0, 7, 1.0),
    ],
)
def test_student_t_tail_matches_tabulated_values(t, df, p):
    assert student_t_two_sided(t, df) == pytest.approx(p, abs=1e-9)


def test_welch_matches_a_known_result():
    # R: t.test(c(1,2,3,4,5), c(2,4,6,8,10)) -> t = -1.8974, df = 5.8824, p = 0.1075
    w = welch([1, 2, 3, 4, 5], [2, 4, 6, 8, 10])
    assert w.t == pytest.approx(-1.8973666, abs=1e-6)
    assert w.df == pytest.approx(5.8823529, abs=1e-6)
    assert w.p == pytest.approx(0.1075312, abs=1e-6)
    assert w.significant() is False


def test_welch_without_spread_or_samples_has_no_p_value():
    assert welch([1.0], [2.0, 3.0]).p is None
    assert welch([1.0, 1.0], [1.0, 1.0]).p is None


def test_incomplete_beta_edges_and_symmetry():
    assert incomplete_beta(2.0, 3.0, 0.0) == 0.0 and incomplete_beta(2.0, 3.0, 1.0) == 1.0
    assert incomplete_beta(2.0, 3.0, 0.3) == pytest.approx(1 - incomplete_beta(3.0, 2.0, 0.7))
    with pytest.raises(ValueError):
        incomplete_beta(1.0, 1.0, 1.5)


@given(st.floats(0.0, 50.0), st.floats(0.5, 200.0))
def test_t_tail_is_a_probability_falling_in_t(t, df):
    p = student_t_two_sided(t, df)
    assert 0.0 <= p <= 1.0
    assert student_t_two_sided(-t, df) == pytest.approx(p)
    assert student_t_two_sided(t + 1.0, df) <= p + 1e-12


@given(st.lists(st.floats(-1e3, 1e3), min_size=2, max_size=20))
def test_spread_agrees_with_the_textbook_formula(xs):
    s = spread(xs)
    mean = sum(xs) / len(xs)
    var = sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    assert s.mean == pytest.approx(mean, abs=1e-9) and s.sd == pytest.approx(
        math.sqrt(var), abs=1e-6
    )


def test_group_spreads_groups_by_keys():
    rows = [{"arm": "a", "x": 1.0}, {"arm": "a", "x": 3.0}, {"arm": "b", "x": 5.0}]
    g = group_spreads(rows, ("arm",), ("x",))
    assert g[("a",)]["x"].mean == 2.0 and g[("b",)]["x"] == Spread(5.0, None, 1)
