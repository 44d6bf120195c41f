"""Open-loop arrival schedules, precomputed from a seed.

Arrivals do not wait for earlier requests to finish (open loop), so queueing shows up in
latency the way it does for real clients. The schedule is fixed before the run starts, so
every arm replays the same one.
"""

from __future__ import annotations

import numpy as np

PROCESSES = ("poisson", "gamma")


def arrival_times(n: int, rate: float, seed: int, process: str = "poisson",
                  cv: float = 1.0) -> np.ndarray:
    """``n`` arrival times in seconds from 0, at mean ``rate`` requests per second.

    ``poisson``: exponential gaps. ``gamma``: gamma gaps with coefficient of variation
    ``cv`` (``cv > 1`` is burstier than Poisson, ``cv = 1`` is Poisson, ``cv < 1`` smoother),
    as in ``vllm bench serve --burstiness`` (whose burstiness is ``1 / cv**2``).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not rate > 0:
        raise ValueError(f"rate must be > 0, got {rate}")
    rng = np.random.default_rng(seed)
    if process == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n)
    elif process == "gamma":
        if not cv > 0:
            raise ValueError(f"cv must be > 0, got {cv}")
        shape = 1.0 / cv**2
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n)
    else:
        raise ValueError(f"unknown arrival process {process!r}; known: {', '.join(PROCESSES)}")
    return np.cumsum(gaps)
