"""The sub-topic predictor: Sub-Agent's research sub-topics from the question and history.

At the plan branch (multi-valued: every sub-topic named is kept) the predictor proposes
sub-topic strings exactly as the planner writes them (``"<entity> >> <ask>"``), since a fill
is promoted only on an exact reuse-name match. It sees the branch's evidence — the
``question`` and ``history``, the plans of questions answered before (a tuple of
:class:`~dynbranch.predictors.plans.KnownPlan`, the workload's ``train`` split) — plus the
plans of branches already resolved (:meth:`SubtopicPredictor.observe`; a question the
history already holds, as when a run first replays the train split's branches, is not
counted twice), never the branch it ranks.

**Candidates** (:func:`subtopic_features`):

* *remembered*: the :data:`RECALL_DEPTH` sub-topics of the memory whose content words the
  question covers best (MuSiQue questions reuse single-hop steps verbatim);
* *written*: ``"<name> >> <relation>"`` for the question's maximal name spans and the
  relations its words cue (:meth:`~dynbranch.predictors.plans.PlanMemory.relations`), the
  form of a first knowledge-base step (``"Green >> performer"``);
* *chained*: a later step's entity is an earlier step's answer. For the best-scored
  candidates whose answer the history records (``"Green >> performer"`` →
  ``Steve Hillage``), the remembered sub-topics of that answer and ``"<answer> >>
  <relation>"`` for the cued relations, with ``chained`` the parent's probability.

**Plans written with references** (evidence ``plan`` = ``"references"``): a later step is
written ``"#1 >> spouse"`` and cannot be filled while the plan is open, so no chained
candidate is formed (the history's steps are remembered as written, ``#k`` and all).

**Score.** Linear over :data:`FEATURES`, ties by first occurrence, fitted on the ``train``
split with each question left out of the memory it is ranked against
(:func:`workloads.analysis.subtopic_accuracy.fit_weights`).

**A sub-agent's search.** Each sub-agent's ``search[<entity>]`` is a branch too (evidence
``subtopic``: the sub-topic the sub-agent was given); the predictor hands it to its
:class:`~dynbranch.predictors.search.SearchRanker`, which ranks the entities the sub-topic
names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dynbranch.predictors.base import BranchContext, Predictor
from dynbranch.predictors.plans import (
    SEPARATOR,
    KnownPlan,
    KnownStep,
    PlanMemory,
    content_words,
    split_subtopic,
)
from dynbranch.predictors.search import SearchRanker
from dynbranch.predictors.spans import title_phrases, words_of

FEATURES = (
    "cover",
    "ask_cover",
    "ask_match",
    "entity_in_question",
    "foreign",
    "foreign_seen",
    "entity_cover",
    "seen",
    "relation_step",
    "written",
    "relation_score",
    "relation_rank",
    "near",
    "adjacent",
    "name_rank",
    "chained",
)
"""``cover``: IDF-weighted share of the sub-topic's content words in the question;
``ask_cover``: the same for its ask without the entity's words, ``ask_match`` the IDF sum
of those found / 10; ``entity_in_question``; ``foreign``: remembered, unchained, with an
entity the question does not name;
``entity_cover``; ``seen``: log(1 + times remembered); ``relation_step``: a knowledge-base
step; ``written``: not remembered, written from a name and a relation; ``relation_score``
and ``relation_rank`` (1/(1 + rank)) of its relation; ``near``: 1/(1 + words between the
name and its relation's words in the question); ``adjacent``: a relation word modifies the
name directly (:func:`_adjacent`); ``foreign_seen``: ``foreign`` × ``seen``; ``name_rank``: 1/(1 + the name's place
among the question's title phrases); ``chained``: its parent's probability."""

# NOTE: fitted on train (fit_weights in workloads/analysis/subtopic_accuracy.py), rounded.
FITTED = {
    "cover": 1.57,
    "ask_cover": 0.88,
    "ask_match": 1.07,
    "entity_in_question": 0.15,
    "foreign": -0.49,
    "foreign_seen": 0.82,
    "entity_cover": 1.96,
    "seen": 0.43,
    "relation_step": -1.13,
    "written": -3.41,
    "relation_score": 0.04,
    "relation_rank": 1.18,
    "near": 1.75,
    "adjacent": 0.77,
    "name_rank": 1.71,
    "chained": 3.38,
}
RECALL_DEPTH = 40
RELATIONS = 4
NAMES = 6
PARENTS = 5
RELATION_WORDS = 6
_REFERENCE = re.compile(r"#\d+")


@dataclass(frozen=True)
class SubtopicWeights:
    """One weight per feature; how many candidates of each kind are formed."""

    features: Mapping[str, float] = field(default_factory=lambda: dict(FITTED))
    recall_depth: int = RECALL_DEPTH
    relations: int = RELATIONS
    names: int = NAMES
    parents: int = PARENTS

    def __post_init__(self) -> None:
        if set(self.features) != set(FEATURES):
            raise ValueError(f"weights {sorted(self.features)} != features {sorted(FEATURES)}")
        bad = [f for f, w in self.features.items() if not math.isfinite(w)]
        if bad:
            raise ValueError(f"weights of {bad} are not finite")
        for name in ("recall_depth", "relations", "names", "parents"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} {getattr(self, name)} must be >= 0")


Features = dict[str, dict[str, float]]


class SubtopicPredictor(Predictor):
    """Ranks sub-topics for a plan branch and, through :attr:`search`, a sub-agent's search
    (see the module docstring)."""

    name = "subtopic"
    in_sample_on_train = False
    """NOTE: its 16 weights were fitted on the train split, but a train request carries no
    history (:meth:`~workloads.subagent.SubAgentWorkload.requests`): each train branch is
    ranked against the plans observed before it, out of sample but for those weights, so
    C3's selection rates start from the train split (:meth:`FillPolicy.learn_history`).
    Measured on ``table2``'s Sub-Agent c2 cell (300 requests at 1 req/s, 4 engines): 30.70 s
    without that start, 30.72 s with it (900 → 882 fills); with ``plan="references"`` (100
    requests) 45.91 → 44.47 s (283 → 96 fills, 26 → 32 consumed)."""

    def __init__(self, weights: SubtopicWeights | None = None) -> None:
        self.weights = weights or SubtopicWeights()
        self._history: Sequence[KnownPlan] | None = None
        self._observed: list[KnownPlan] = []
        self._known: set[str] = set()
        self._memory = PlanMemory()
        self.search = SearchRanker()

    def memory(self, evidence: Mapping[str, Any]) -> PlanMemory:
        """The memory for ``evidence``: its ``history`` and the plans observed since."""
        history = evidence.get("history")
        if history is not None and history is not self._history:
            # NOTE: built once per history object; the history itself is never mutated.
            self._history = history
            self._known = {plan.question for plan in history}
            self._observed = [p for p in self._observed if p.question not in self._known]
            self._memory = PlanMemory([*history, *self._observed])
        return self._memory

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        if _is_search(ctx):
            return self.search.rank(ctx, k)
        return rank_subtopics(ctx.evidence, self.memory(ctx.evidence), k, self.weights)

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        if _is_search(ctx):
            self.search.observe(ctx, chosen)
            return
        memory = self.memory(ctx.evidence)
        question = str(ctx.evidence.get("question", ""))
        if question in self._known:
            return  # NOTE: the history already holds this plan, with its answers
        plan = observed_plan(question, chosen, memory)
        if plan.steps:
            self._observed.append(plan)
            memory.add(plan)


def _is_search(ctx: BranchContext) -> bool:
    """Whether ``ctx`` is a sub-agent's search branch (its evidence is the sub-topic)."""
    return "subtopic" in ctx.evidence


def observed_plan(question: str, chosen: Sequence[str], memory: PlanMemory) -> KnownPlan:
    """A resolved branch as a plan. A step is a knowledge-base step when
    ``memory`` remembers it as one or, if new, when its ask is a phrase of at most
    :data:`RELATION_WORDS` words without a question mark (``"spouse"``, not ``"Who is the
    spouse of X?"``). Outcomes in angle brackets (``<none>``) are not sub-topics.

    NOTE: a step's answer is taken to be the next step's entity when the question does not
    name that entity (a chain's bridge): right for 782 of the 892 such pairs of the train
    split's plans.
    """
    kept = [s for s in chosen if s.strip() and not (s.startswith("<") and s.endswith(">"))]
    entities = [split_subtopic(s)[0] for s in kept]
    steps = []
    for i, subtopic in enumerate(kept):
        ask = split_subtopic(subtopic)[1]
        known = memory.steps.get(subtopic)
        relation = (
            known.relation
            if known
            else SEPARATOR in subtopic and "?" not in ask and len(ask.split()) <= RELATION_WORDS
        )
        bridge = entities[i + 1] if i + 1 < len(kept) else ""
        if _REFERENCE.fullmatch(bridge):
            bridge = ""  # NOTE: a plan written with references: the bridge is not known
        answer = bridge if bridge and bridge.lower() not in question.lower() else ""
        steps.append(KnownStep(subtopic, entities[i], ask, answer, relation))
    return KnownPlan(question, tuple(steps))


def rank_subtopics(
    evidence: Mapping[str, Any],
    memory: PlanMemory,
    k: int,
    weights: SubtopicWeights | None = None,
) -> list[str]:
    """Up to ``k`` sub-topics for the question in ``evidence``, best first."""
    w = weights or SubtopicWeights()
    if evidence.get("plan") == "references" and w.parents:
        w = replace(w, parents=0)
    scored = score(subtopic_features(str(evidence.get("question", "")), memory, w), w)
    order = sorted(range(len(scored)), key=lambda i: -scored[i][1])
    return [scored[i][0] for i in order[: max(k, 0)]]


def score(features: Features, weights: SubtopicWeights) -> list[tuple[str, float]]:
    """``(candidate, Σ weight · value)`` in the order of ``features``."""
    w = weights.features
    return [(c, sum(w[f] * v for f, v in values.items())) for c, values in features.items()]


def subtopic_features(question: str, memory: PlanMemory, weights: SubtopicWeights) -> Features:
    """Every candidate for ``question`` and its :data:`FEATURES` (module docstring)."""
    found: Features = {}
    present = set(content_words(question))
    relations = memory.relations(question)[: weights.relations]
    _remembered(found, question, present, memory, weights.recall_depth)
    for i, name in enumerate(title_phrases(question)[: weights.names]):
        for rank, relation in enumerate(relations):
            f = _at(found, f"{name}{SEPARATOR}{relation.name}", question, present, memory)
            f["relation_score"], f["relation_rank"] = relation.score, 1.0 / (1.0 + rank)
            f["near"] = _near(question, name, relation.words)
            f["adjacent"] = _adjacent(question, name, relation.words)
            f["name_rank"] = 1.0 / (1.0 + i)
    first = score(found, weights)
    for parent, p in _parents(first, memory, weights.parents):
        answer = memory.answer(parent)
        for subtopic in sorted(memory.of_entity(answer)):
            f = _at(found, subtopic, question, present, memory)
            f["chained"], f["foreign"] = max(f["chained"], p), 0.0
        for rank, relation in enumerate(relations):
            f = _at(found, f"{answer}{SEPARATOR}{relation.name}", question, present, memory)
            f["relation_score"], f["relation_rank"] = relation.score, 1.0 / (1.0 + rank)
            f["chained"] = max(f["chained"], p)
    return found


def _remembered(
    found: Features, question: str, present: set[str], memory: PlanMemory, depth: int
) -> None:
    pool = memory.sharing(present)
    cover = {s: memory.coverage(content_words(s), present) for s in pool}
    for subtopic in sorted(pool, key=lambda s: (-cover[s], s))[:depth]:
        _at(found, subtopic, question, present, memory)


def _at(
    found: Features, subtopic: str, question: str, present: set[str], memory: PlanMemory
) -> dict[str, float]:
    """``subtopic``'s features, made on first sight from its text and the memory."""
    if subtopic in found:
        return found[subtopic]
    entity, ask = split_subtopic(subtopic)
    entity_words = content_words(entity)
    known = memory.steps.get(subtopic)
    f = dict.fromkeys(FEATURES, 0.0)
    f["cover"] = memory.coverage(content_words(subtopic), present)
    asked = [w for w in content_words(ask) if w not in set(entity_words)]
    f["ask_cover"] = memory.coverage(asked, present)
    f["ask_match"] = sum(memory.idf(w) for w in set(asked) & present) / 10
    f["entity_in_question"] = float(entity.lower() in question.lower())
    f["foreign"] = float(known is not None and not f["entity_in_question"])
    f["entity_cover"] = memory.coverage(entity_words, present)
    f["seen"] = math.log1p(memory.count.get(subtopic, 0))
    f["foreign_seen"] = f["foreign"] * f["seen"]
    f["relation_step"] = float(known.relation if known else True)
    f["written"] = float(known is None)
    found[subtopic] = f
    return f


def _near(question: str, name: str, cues: frozenset[str]) -> float:
    """1/(1 + words between ``name`` and the nearest of the question's words ``cues`` (that
    name or cue a relation); 0 when there is none."""
    words = [w.lower() for w, _, _ in words_of(question)]
    at = [i for i, w in enumerate(words) if w in cues]
    start = question.find(name)
    if not at or start < 0:
        return 0.0
    first = len(words_of(question[:start]))
    last = first + len(words_of(name)) - 1
    gap = min(max(first - i, i - last, 0) for i in at)
    return 1.0 / (1.0 + gap)


def _adjacent(question: str, name: str, cues: frozenset[str]) -> float:
    """1 when a word of ``cues`` modifies ``name`` directly: ``<cue> of [the] <name>``,
    ``<name>'s <cue>`` or ``<name> <cue>`` (the first step's relation, the innermost)."""
    start = question.find(name)
    if start < 0 or not cues:
        return 0.0
    before = [w.lower() for w, _, _ in words_of(question[:start])][-3:]
    if before[-1:] == ["the"]:
        before = before[:-1]
    after = [w.lower() for w, _, _ in words_of(question[start + len(name) :])][:1]
    of = len(before) >= 2 and before[-1] in ("of", "by", "for") and before[-2] in cues
    return float(of or bool(after and after[0] in cues))


def _parents(
    first: Sequence[tuple[str, float]], memory: PlanMemory, n: int
) -> list[tuple[str, float]]:
    """The ``n`` best-scored candidates with a recorded answer and their probability."""
    if not first or n <= 0:
        return []
    top = max(s for _, s in first)
    exp = [(c, math.exp(s - top)) for c, s in first]
    total = sum(e for _, e in exp)
    ranked = sorted(range(len(exp)), key=lambda i: -exp[i][1])
    out = []
    for i in ranked:
        candidate, e = exp[i]
        if memory.answer(candidate):
            out.append((candidate, e / total))
        if len(out) >= n:
            break
    return out
