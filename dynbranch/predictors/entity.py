"""The entity ranker: ReAct's next ``search[entity]`` from what the branch has read.

An open-vocabulary branch has no candidate list, so candidates come from context already
read (the paper's §2 "Predictability determines coverage cost"). The ranker sees only the
branch's evidence — ``question``, ``searched`` (the entities searched so far),
``passages`` (the previous hop's, best first), ``observation`` (what the previous hop's
``read`` wrote) and ``index`` (the passage index the workload's ``retrieve`` searches, a
:class:`~dynbranch.predictors.titles.PassageIndex`) — never the trace's future.

**Candidates.**

* *from the question* (every hop): its name spans (:mod:`~dynbranch.predictors.spans`),
  the page titles its phrases name (:class:`~dynbranch.predictors.titles.TitleIndex`:
  ``"Miracle on 34th street"`` → ``"Miracle on 34th Street"``, ``"A Dog's Purpose"`` →
  ``"A Dog's Purpose (film)"``) and the titles of the passages a search of the question
  itself finds (``search_depth`` of them). NOTE: that search runs on the workload's
  local BM25 index (well under a millisecond of CPU), which the run's clock does not charge;
  against a hosted search API it would add a call (~0.4 s) to the branch's setup. Hop 0
  without it: see ``search_depth=0`` in :mod:`workloads.analysis.entity_accuracy`;
* *after a hop*: the name spans of the observation and its answer clause (the words after
  its last ``is``/``was``/``?``/``:``), and the passages' name spans ranked by
  :func:`passage_ranking` (position, frequency, the searched entity's own page, sentences
  that speak of what the question asks).

A candidate that is, or is inside, an entity already searched is never proposed; nor is one
whose softmax probability is under ``min_probability`` (the best always is). After the
searches a question's hop-count model (:mod:`~dynbranch.predictors.hops`) says are its
last, with probability above ``finish_above``, nothing is proposed: a finish has nothing to
fill.

**Score.** A linear score over named features (:data:`QUESTION_FEATURES` at hop 0,
:data:`FOLLOW_FEATURES` after), ties by first occurrence. At later hops the question's
candidates enter through ``question``, their softmax probability under the hop-0 model.
The weights were fitted on the ``train`` split only, by a listwise softmax with L2 0.1
(:func:`workloads.analysis.entity_accuracy.fit_weights`); the top-k accuracy they give on
``test`` is in that module's docstring.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynbranch.predictors.base import BranchContext, Predictor, softmax
from dynbranch.predictors.hops import FITTED_HOPS, HOP_FEATURES, finish_probability
from dynbranch.predictors.spans import (
    STOP_STARTS,
    name_spans,
    norm,
    sentence_at,
    sentences,
    words,
)
from dynbranch.predictors.titles import PassageIndex, TitleIndex, titles_of

QUESTION_FEATURES = ("span", "maximal", "verbatim", "title", "named", "search", "stop_start")
"""Hop 0: a name span of the question, a maximal one, the candidate's exact text is in the
question, it is a page title, a phrase of the question names it, Σ decay^rank over the
question search's passages titled so, its first word is a sentence word (``The``)."""
FOLLOW_FEATURES = ("observed", "answer", "late", "passage", "in_question", "question", "title")
"""Later hops: a name span of the observation, its answer clause, where its last mention
ends in the observation (0 start … 1 end), 1/(1+rank) in :func:`passage_ranking`, named in
the question, the hop-0 model's probability, a page title."""

# NOTE: fitted on train (fit_weights in workloads/analysis/entity_accuracy.py), rounded.
FITTED_QUESTION = {
    "span": 0.16,
    "maximal": 0.97,
    "verbatim": 0.94,
    "title": 0.63,
    "named": 1.14,
    "search": 1.44,
    "stop_start": 0.12,
}
FITTED_FOLLOW = {
    "observed": 1.08,
    "answer": 2.5,
    "late": 1.14,
    "passage": 0.3,
    "in_question": 0.05,
    "question": 0.02,
    "title": 0.07,
}
__all__ = [
    "FOLLOW_FEATURES",
    "QUESTION_FEATURES",
    "EntityRanker",
    "PassageWeights",
    "RankerWeights",
    "answer_clause",
    "follow_features",
    "name_spans",
    "passage_ranking",
    "question_features",
    "rank_entities",
]
MIN_PROBABILITY = 0.1
"""A candidate below this softmax probability is not proposed (the best always is). NOTE:
set by c2 replays of the train split (81 questions, 0.5 req/s, finish gate 0.7): mean
latency 30.30 / 30.50 / 30.18 / 29.74 / 30.03 s at 0 / 0.02 / 0.05 / 0.1 / 0.2."""
FINISH_ABOVE = 0.7
"""A later hop proposes nothing when the chain is done with more than this probability.
NOTE: set by c2 replays of the train split (81 questions, 0.5 req/s, no probability cut):
mean latency 30.77 s with the gate off (1.0), 30.59 / 30.30 / 30.50 / 30.75 s at 0.8 / 0.7
/ 0.6 / 0.5 (floor 38.65 s)."""
_ANSWER_AFTER = (" is ", " was ", " are ", " were ", "? ", ": ")
MAX_ANSWER_WORDS = 12
PASSAGE_DEPTH = 20
"""How far down :func:`passage_ranking` a passage candidate is still a candidate."""


@dataclass(frozen=True)
class PassageWeights:
    """The constants of :func:`passage_ranking` (tuned on train by coordinate search).

    An occurrence in passage ``r`` (0 = best) at character offset ``c`` adds
    ``w_rank ** r / (1 + c / char_scale) · part · page · (1 + question_context · o)``:
    ``part`` is 1 for a maximal span, ``part_factor`` for a sub-span; ``page`` is
    ``page_bonus`` in the passage whose title is the entity just searched; ``o`` counts the
    question's content words in the same sentence. A passage title adds ``title_bonus ·
    w_rank ** r``; a multi-word name is multiplied by ``1 + multiword_bonus``.
    """

    w_rank: float = 0.7
    char_scale: float = 200.0
    part_factor: float = 0.5
    page_bonus: float = 5.0
    question_context: float = 0.25
    title_bonus: float = 0.0
    multiword_bonus: float = 1.0

    def __post_init__(self) -> None:
        if not 0.0 < self.w_rank <= 1.0:
            raise ValueError(f"w_rank {self.w_rank} outside (0, 1]")
        if self.char_scale <= 0.0 or self.page_bonus <= 0.0:
            raise ValueError("char_scale and page_bonus must be > 0")
        for name in ("question_context", "title_bonus", "multiword_bonus"):
            if getattr(self, name) < 0.0:
                raise ValueError(f"{name} {getattr(self, name)} must be >= 0")
        if not 0.0 <= self.part_factor <= 1.0:
            raise ValueError(f"part_factor {self.part_factor} outside [0, 1]")


@dataclass(frozen=True)
class RankerWeights:
    """The entity ranker's weights: one per feature of each model, the passage scorer's
    constants, the question search's depth and per-rank decay, and the hop-count model with
    the finish probability above which a later hop proposes nothing (1: always propose)."""

    question: Mapping[str, float] = field(default_factory=lambda: dict(FITTED_QUESTION))
    follow: Mapping[str, float] = field(default_factory=lambda: dict(FITTED_FOLLOW))
    passages: PassageWeights = field(default_factory=PassageWeights)
    search_depth: int = 10
    search_decay: float = 0.7
    hops: Mapping[int, Mapping[str, float]] = field(default_factory=lambda: FITTED_HOPS)
    finish_above: float = FINISH_ABOVE
    min_probability: float = MIN_PROBABILITY

    def __post_init__(self) -> None:
        for name, names in (("question", QUESTION_FEATURES), ("follow", FOLLOW_FEATURES)):
            weights = getattr(self, name)
            if set(weights) != set(names):
                raise ValueError(f"{name} weights {sorted(weights)} != features {sorted(names)}")
            bad = [f for f, w in weights.items() if not math.isfinite(w)]
            if bad:
                raise ValueError(f"{name} weights of {bad} are not finite")
        if self.search_depth < 0:
            raise ValueError(f"search_depth {self.search_depth} must be >= 0")
        if not 0.0 < self.search_decay <= 1.0:
            raise ValueError(f"search_decay {self.search_decay} outside (0, 1]")
        if not 0.0 <= self.min_probability <= 1.0:
            raise ValueError(f"min_probability {self.min_probability} outside [0, 1]")
        if not 0.0 <= self.finish_above <= 1.0:
            raise ValueError(f"finish_above {self.finish_above} outside [0, 1]")
        for n, weights in self.hops.items():
            if set(weights) != set(HOP_FEATURES):
                raise ValueError(f"hop {n} weights {sorted(weights)} != {sorted(HOP_FEATURES)}")


Features = dict[str, dict[str, float]]
"""Candidate → feature → value, in order of first occurrence."""


class EntityRanker(Predictor):
    """Ranks the entities the question and the last hop name (see the module docstring)."""

    name = "entity"
    in_sample_on_train = True  # NOTE: its weights were fitted on the train split

    def __init__(self, weights: RankerWeights | None = None) -> None:
        self.weights = weights or RankerWeights()

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        return rank_entities(ctx.evidence, k, self.weights)


def rank_entities(
    evidence: Mapping[str, Any], k: int, weights: RankerWeights | None = None
) -> list[str]:
    """Up to ``k`` entities from ``evidence``, best first (see the module docstring)."""
    w = weights or RankerWeights()
    searched = evidence.get("searched") or ()
    hop0 = not searched
    question = str(evidence.get("question", ""))
    if not hop0 and finish_probability(question, len(searched), w.hops) > w.finish_above:
        return []  # NOTE: the chain is likely done: a finish has nothing to fill
    features = question_features(evidence, w) if hop0 else follow_features(evidence, w)
    scores = score(features, w.question if hop0 else w.follow)
    order = sorted(range(len(scores)), key=lambda i: -scores[i][1])
    ranked = [scores[i][0] for i in order[: max(k, 0)]]
    if not ranked or w.min_probability <= 0.0:
        return ranked
    p = _softmax(scores)
    # NOTE: a candidate far less likely than the best only costs a fill that loses.
    return [c for i, c in enumerate(ranked) if i == 0 or p[c] >= w.min_probability]


def score(features: Features, weights: Mapping[str, float]) -> list[tuple[str, float]]:
    """``(candidate, Σ weight · value)`` in the order of ``features``."""
    return [(c, sum(weights[f] * v for f, v in values.items())) for c, values in features.items()]


def question_features(evidence: Mapping[str, Any], weights: RankerWeights) -> Features:
    """The question's candidates and their :data:`QUESTION_FEATURES`."""
    question = str(evidence.get("question", ""))
    index: PassageIndex | None = evidence.get("index")
    titles = titles_of(index) if index is not None else TitleIndex(())
    found: Features = {}

    def at(candidate: str) -> dict[str, float]:
        return found.setdefault(candidate, dict.fromkeys(QUESTION_FEATURES, 0.0))

    for span, _, maximal in name_spans(question):
        f = at(span)
        f["span"], f["maximal"] = 1.0, max(f["maximal"], float(maximal))
    for title, phrase, _ in titles.mentioned(question):
        # NOTE: the phrase itself too: a knowledge-base step names its entity in the
        # question's own words ("Pacem in Terris"), where the page is "Pacem in terris".
        at(title)["named"] = at(phrase)["named"] = 1.0
    if index is not None and weights.search_depth:
        for r, passage in enumerate(index.search(question, weights.search_depth)):
            if passage.title.strip():
                at(passage.title)["search"] += weights.search_decay**r
    for candidate, f in found.items():
        f["verbatim"] = float(candidate in question)
        f["title"] = float(candidate in titles)
        f["stop_start"] = float(candidate.split()[0].lower() in STOP_STARTS)
    return _unsearched(found, evidence)


def follow_features(evidence: Mapping[str, Any], weights: RankerWeights) -> Features:
    """A later hop's candidates and their :data:`FOLLOW_FEATURES`."""
    question = str(evidence.get("question", ""))
    index: PassageIndex | None = evidence.get("index")
    titles = titles_of(index) if index is not None else TitleIndex(())
    found: Features = {}

    def at(candidate: str) -> dict[str, float]:
        return found.setdefault(candidate, dict.fromkeys(FOLLOW_FEATURES, 0.0))

    observation = str(evidence.get("observation") or "")
    answer = answer_clause(observation)
    if answer:
        at(answer)["answer"] = 1.0
    for span, offset, _ in name_spans(observation):
        f = at(span)
        f["observed"], f["late"] = 1.0, (offset + len(span)) / len(observation)
    for r, name in enumerate(passage_ranking(evidence, PASSAGE_DEPTH, weights.passages)):
        at(name)["passage"] = 1.0 / (1.0 + r)
    asked = question_features(evidence, weights)
    for candidate, p in _softmax(score(asked, weights.question)).items():
        at(candidate)["question"] = p
    lowered = question.lower()
    for candidate, f in found.items():
        f["in_question"] = float(candidate.lower() in lowered)
        f["title"] = float(candidate in titles)
    return _unsearched(found, evidence)


def answer_clause(observation: str) -> str:
    """The words after the observation's last ``is``/``was``/``are``/``were``/``?``/``:``
    (all of it without one), when they are a short phrase; else ``""``."""
    text = observation.strip().rstrip(".").strip()
    cut = max((text.rfind(s) + len(s) for s in _ANSWER_AFTER if s in text), default=0)
    answer = text[cut:].strip()
    return answer if 0 < len(answer.split()) <= MAX_ANSWER_WORDS else ""


def _softmax(scored: Sequence[tuple[str, float]]) -> dict[str, float]:
    return dict(zip((c for c, _ in scored), softmax([s for _, s in scored]), strict=True))


def _unsearched(found: Features, evidence: Mapping[str, Any]) -> Features:
    """``found`` without candidates that are, or are inside, an entity already searched."""
    searched = [norm(str(s)) for s in evidence.get("searched") or ()]
    return {
        c: f
        for c, f in found.items()
        if (key := norm(c)) and not any(f" {key} " in f" {s} " for s in searched)
    }


# -- the passage scorer -----------------------------------------------------------------------

# Question words that say nothing about what is asked.
QUESTION_STOPWORDS = STOP_STARTS | words(
    """how many much did does do name named called known into are then will"""
)


def passage_ranking(
    evidence: Mapping[str, Any], k: int, weights: PassageWeights | None = None
) -> list[str]:
    """Up to ``k`` name spans of ``evidence["passages"]``, best first (the scoring of
    :class:`PassageWeights`), skipping spans inside an entity already searched."""
    w = weights or PassageWeights()
    passages: Sequence[Mapping[str, Any]] = evidence.get("passages") or ()
    searched = [norm(s) for s in evidence.get("searched") or ()]
    question = set(norm(str(evidence.get("question", ""))).split())
    searched_words = {x for s in searched for x in s.split()}
    asked = question - QUESTION_STOPWORDS - searched_words
    scores: dict[str, float] = {}

    def add(name: str, value: float) -> None:
        key = norm(name)
        if key and not any(f" {key} " in f" {s} " for s in searched):
            scores[name] = scores.get(name, 0.0) + value

    for r, passage in enumerate(passages):
        decay = w.w_rank**r
        title, text = str(passage.get("title", "")).strip(), str(passage.get("text", ""))
        if title and w.title_bonus:
            add(title, w.title_bonus * decay)
        page = w.page_bonus if searched and _same_page(norm(title), searched[-1]) else 1.0
        found = sentences(text)
        for span, offset, maximal in name_spans(text):
            context = set(norm(sentence_at(found, offset)).split())
            overlap = len((asked - set(norm(span).split())) & context)
            part = 1.0 if maximal else w.part_factor
            value = decay / (1.0 + offset / w.char_scale) * part * page
            add(span, value * (1.0 + w.question_context * overlap))
    for name in scores:
        if len(norm(name).split()) > 1:
            scores[name] *= 1.0 + w.multiword_bonus
    # NOTE: sorted is stable and the dict keeps first occurrence: ties break by it.
    return sorted(scores, key=lambda n: -scores[n])[: max(k, 0)]


def _same_page(title: str, entity: str) -> bool:
    return bool(title and entity) and (
        title == entity or f" {entity} " in f" {title} " or f" {title} " in f" {entity} "
    )
