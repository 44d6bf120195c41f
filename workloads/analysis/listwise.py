"""A listwise softmax fit: linear feature weights that make the chosen candidate likely.

Each *group* is one branch: its candidates' feature values and which candidate was chosen.
The fit maximises the mean log-probability of the chosen candidates under a softmax over
each group's linear scores, minus ``l2 / 2 · |w|²``, by full-batch gradient ascent from
zero for a fixed number of iterations — deterministic, so a fit on the same groups always
gives the same weights. Groups whose chosen candidate is not among their candidates carry no
signal and are skipped. Used on the ``train`` split only, to set the predictors' weights.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

Group = tuple[Mapping[str, Mapping[str, float]], str]
"""``(candidate → feature → value, chosen candidate)``."""


def listwise_fit(
    groups: Sequence[Group],
    features: Sequence[str],
    l2: float = 0.1,
    iterations: int = 3000,
    rate: float = 0.1,
) -> dict[str, float]:
    """The weights (one per feature) the fit of the module docstring reaches."""
    if l2 < 0 or iterations < 0 or rate <= 0:
        raise ValueError(f"l2={l2}, iterations={iterations} must be >= 0 and rate={rate} > 0")
    matrices = []
    for candidates, chosen in groups:
        if chosen not in candidates:
            continue
        names = list(candidates)
        x = np.array([[candidates[c].get(f, 0.0) for f in features] for c in names], float)
        matrices.append((x, names.index(chosen)))
    w = np.zeros(len(features))
    if not matrices:
        return dict.fromkeys(features, 0.0)
    for _ in range(iterations):
        grad = -l2 * w
        for x, gold in matrices:
            s = x @ w
            p = np.exp(s - s.max())
            p /= p.sum()
            grad += (x[gold] - p @ x) / len(matrices)
        w += rate * grad
    return {f: float(v) for f, v in zip(features, w, strict=True)}


def top_k_hits(ranked: Sequence[str], chosen: str, ks: Sequence[int]) -> dict[int, bool]:
    """Whether ``chosen`` is in the first ``k`` of ``ranked``, for each ``k``."""
    return {k: chosen in ranked[:k] for k in ks}
