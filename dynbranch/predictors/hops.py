"""How many hops a multi-hop question takes, from its words: when a ReAct chain is done.

A ReAct ``think`` after the last hop finishes, and a finish has nothing to fill, so fills
the entity ranker proposes there only contend. MuSiQue questions take 2, 3 or 4 hops, and
longer chains read longer: more words, more ``of``, more question words and names. A
softmax over the hop counts :data:`HOP_COUNTS` with one weight per count and feature of
:func:`hop_features` gives ``P(n)``; after ``h`` searches the chain is done with
``P(n = h | n ≥ h)`` (:func:`finish_probability`). The weights were fitted on the ``train``
split's questions only (:func:`workloads.analysis.entity_accuracy.fit_hop_weights`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

from dynbranch.predictors.spans import name_spans

HOP_COUNTS = (2, 3, 4)
HOP_FEATURES = ("bias", "words", "of", "wh", "names", "and")
"""A constant; words/10; `` of ``/2; question words/2; maximal name spans/2; an ``and``."""
_WH = frozenset(("who", "whom", "whose", "what", "which", "where", "when", "how"))

# NOTE: fitted on train (fit_hop_weights in workloads/analysis/entity_accuracy.py), rounded.
FITTED_HOPS: Mapping[int, Mapping[str, float]] = {
    2: {"bias": 2.89, "words": -0.79, "of": -0.16, "wh": -0.44, "names": 0.2, "and": 0.12},
    3: {"bias": -1.58, "words": 0.1, "of": 1.08, "wh": 0.37, "names": 0.73, "and": 0.39},
    4: {"bias": -1.31, "words": 0.68, "of": -0.92, "wh": 0.07, "names": -0.93, "and": -0.51},
}


def hop_features(question: str) -> dict[str, float]:
    """The question's :data:`HOP_FEATURES`."""
    lowered = question.lower()
    tokens = re.findall(r"\w+", lowered)
    return {
        "bias": 1.0,
        "words": len(tokens) / 10,
        "of": lowered.count(" of ") / 2,
        "wh": sum(t in _WH for t in tokens) / 2,
        "names": sum(maximal for _, _, maximal in name_spans(question)) / 2,
        "and": float(" and " in lowered),
    }


def hop_distribution(
    question: str, weights: Mapping[int, Mapping[str, float]] = FITTED_HOPS
) -> dict[int, float]:
    """``P(n)`` for each hop count ``n`` of ``weights``."""
    features = hop_features(question)
    scores = {n: sum(w[f] * v for f, v in features.items()) for n, w in weights.items()}
    top = max(scores.values())
    exp = {n: math.exp(s - top) for n, s in scores.items()}
    total = sum(exp.values())
    return {n: e / total for n, e in exp.items()}


def finish_probability(
    question: str, searches: int, weights: Mapping[int, Mapping[str, float]] = FITTED_HOPS
) -> float:
    """``P(n = searches | n ≥ searches)``: the chain is done after ``searches`` hops
    (0 before the shortest chain's last hop, 1 past the longest)."""
    p = hop_distribution(question, weights)
    rest = sum(q for n, q in p.items() if n >= searches)
    if rest <= 0.0:
        return 1.0
    return p.get(searches, 0.0) / rest
