"""Open-loop arrival schedules."""

import numpy as np
import pytest

from dynbranch.arrivals import arrival_times


def test_same_seed_same_schedule_and_increasing():
    a = arrival_times(200, 2.0, seed=7)
    b = arrival_times(200, 2.0, seed=7)
    assert np.array_equal(a, b)
    assert np.all(np.diff(a) > 0)
    assert not np.array_equal(a, arrival_times(200, 2.0, seed=8))


@pytest.mark.parametrize("process,cv", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_mean_rate_and_dispersion(process, cv):
    gaps = np.diff(arrival_times(40_000, 4.0, seed=1, process=process, cv=cv))
    assert gaps.mean() == pytest.approx(0.25, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="rate"):
        arrival_times(5, 0.0, seed=0)
    with pytest.raises(ValueError, match="unknown arrival process"):
        arrival_times(5, 1.0, seed=0, process="uniform")
