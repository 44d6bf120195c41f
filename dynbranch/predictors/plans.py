"""What a research planner has seen: earlier plans' sub-topics, their answers, relations.

Sub-Agent's plan branch names sub-topics ``"<entity> >> <ask>"`` (or an ask alone), and a
fill is promoted only when its sub-topic is reproduced exactly. MuSiQue composes its
questions from shared single-hop steps, so the best branch-time knowledge is history: the
plans of questions answered before. A :class:`PlanMemory` holds

* every sub-topic seen, how often, its entity and ask, and (where the history records it)
  its answer — a later step's entity is an earlier step's answer, so a remembered answer
  lets a predictor write the next step's sub-topic;
* an inverted index from content words to sub-topics, and sub-topics by entity;
* the knowledge-base relations (the ask of an ``"<entity> >> <relation>"`` step) and, per
  question word, how often a question with that word used each relation
  (:meth:`PlanMemory.relations`).

Plans enter as :class:`KnownPlan` (the history a workload hands its branches, built from
its ``train`` split) or, after a branch resolves, as the sub-topics it chose (no answers).
:meth:`PlanMemory.remove` takes a plan out again (a leave-one-out fit). Pure Python.
"""

from __future__ import annotations

import math
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dynbranch.predictors.spans import words

SEPARATOR = " >> "
_STOP = words(
    """a an the of in on at to for from by with is was are were be been what who whom whose
    which when where why how did does do that this as and or its it his her their s one"""
)


def content_words(text: str) -> list[str]:
    """Lower-case word tokens of ``text`` without function words."""
    return [w for w in re.findall(r"\w+", text.lower()) if w not in _STOP]


@dataclass(frozen=True)
class KnownStep:
    """One step of a known plan: its sub-topic, entity, ask, answer (``""``: unknown) and
    whether it is a knowledge-base step (``"<entity> >> <relation>"``)."""

    subtopic: str
    entity: str
    ask: str
    answer: str = ""
    relation: bool = False


@dataclass(frozen=True)
class KnownPlan:
    """A question and the steps its plan named, in order."""

    question: str
    steps: tuple[KnownStep, ...]


@dataclass(frozen=True)
class Relation:
    """A relation scored for a question, and the question's words that name or cue it."""

    name: str
    score: float
    words: frozenset[str]


def split_subtopic(subtopic: str) -> tuple[str, str]:
    """``(entity, ask)`` of ``"<entity> >> <ask>"``; an ask alone is its own entity."""
    if SEPARATOR in subtopic:
        entity, ask = subtopic.split(SEPARATOR, 1)
        return entity.strip(), ask.strip()
    return subtopic.strip(), subtopic.strip()


class PlanMemory:
    """Sub-topics, answers and relation statistics of the plans added (module docstring)."""

    def __init__(self, plans: Iterable[KnownPlan] = ()) -> None:
        self.count: Counter[str] = Counter()
        self.steps: dict[str, KnownStep] = {}
        self._answers: dict[str, Counter[str]] = defaultdict(Counter)
        self._by_word: dict[str, set[str]] = defaultdict(set)
        self._by_entity: dict[str, set[str]] = defaultdict(set)
        self.questions = 0
        self._question_df: Counter[str] = Counter()
        self._relations: Counter[str] = Counter()
        self._cue: dict[str, Counter[str]] = defaultdict(Counter)
        for plan in plans:
            self.add(plan)

    def add(self, plan: KnownPlan) -> None:
        """Remember ``plan``."""
        self._apply(plan, 1)

    def remove(self, plan: KnownPlan) -> None:
        """Forget ``plan`` (which must have been added)."""
        self._apply(plan, -1)

    def _apply(self, plan: KnownPlan, sign: int) -> None:
        self.questions += sign
        words = set(content_words(plan.question))
        for w in words:
            self._question_df[w] += sign
        relations = {s.ask for s in plan.steps if s.relation}
        for r in relations:
            self._relations[r] += sign
            for w in words:
                self._cue[w][r] += sign
        for step in {s.subtopic: s for s in plan.steps}.values():
            self._step(step, sign)

    def _step(self, step: KnownStep, sign: int) -> None:
        key = step.subtopic
        self.count[key] += sign
        if step.answer:
            self._answers[key][step.answer] += sign
        if self.count[key] > 0:
            self.steps.setdefault(key, step)
            for w in set(content_words(key)):
                self._by_word[w].add(key)
            self._by_entity[step.entity].add(key)
            return
        del self.count[key]
        self.steps.pop(key, None)
        self._answers.pop(key, None)
        for w in set(content_words(key)):
            self._by_word[w].discard(key)
        self._by_entity[step.entity].discard(key)

    # -- reading -----------------------------------------------------------------------------

    def idf(self, word: str) -> float:
        """Inverse question frequency of ``word`` (1 for a word no question used)."""
        return math.log((self.questions + 1) / (self._question_df[word] + 1)) + 1.0

    def coverage(self, words: Sequence[str], present: set[str]) -> float:
        """The IDF-weighted share of ``words`` that are in ``present`` (0 for none)."""
        total = sum(self.idf(w) for w in words)
        return sum(self.idf(w) for w in words if w in present) / total if total else 0.0

    def sharing(self, words: Iterable[str]) -> set[str]:
        """Sub-topics with at least one of ``words``."""
        found: set[str] = set()
        for w in words:
            found |= self._by_word.get(w, set())
        return found

    def of_entity(self, entity: str) -> set[str]:
        """Sub-topics whose entity is ``entity``."""
        return set(self._by_entity.get(entity, ()))

    def answer(self, subtopic: str) -> str:
        """The answer most often recorded for ``subtopic`` (``""``: none recorded)."""
        answers = +self._answers.get(subtopic, Counter())
        return answers.most_common(1)[0][0] if answers else ""

    def relations(self, question: str, smoothing: float = 2.0) -> list[Relation]:
        """Every known relation with its score for ``question``, best first: the share of
        its words in the question, plus the strongest cue — over the question's words seen
        in at least 2 questions, ``co-occurrences / (questions with the word + smoothing)``
        — plus a small prior (1 % of log(1 + uses)); ties by name. Each carries the
        question words that name or cue it."""
        words = set(content_words(question))
        scored = []
        for relation, uses in self._relations.items():
            if uses <= 0:
                continue
            own = [w for w in content_words(relation) if w in words]
            lexical = len(own) / len(content_words(relation)) if own else 0.0
            cues = [
                (self._cue[w][relation] / (self._question_df[w] + smoothing), w)
                for w in sorted(words)
                if self._question_df[w] >= 2
            ]
            cue, word = max(cues, default=(0.0, ""))
            named = frozenset([*own, word] if word else own)
            scored.append(Relation(relation, lexical + cue + 0.01 * math.log1p(uses), named))
        scored.sort(key=lambda r: (-r.score, r.name))
        return scored
