"""The entity ranker: ReAct's next ``search[entity]`` from the passages the last hop read.

An open-vocabulary branch has no candidate list, so candidates come from context already
read (the paper's §2 "Predictability determines coverage cost"). The ranker sees only the
branch's evidence — ``passages`` (the previous hop's retrieved passages, best first),
``question`` and ``searched`` (the entities searched so far) — never the trace's future.

**Candidates.** Every *name span* in a passage's text: a maximal run of capitalised words
(letters, digits, ``'’.&-`` inside; an initial's or a title's full stop allowed), joined by
single lower-case name connectors (``of``, ``the``, ``de``, ``von``, …), without a leading
sentence word (``The``, ``In``, ``He``…), plus its shorter sub-spans (``"Count of
Barcelona"`` also yields ``"Barcelona"``); optionally the passages' titles. Spans already
searched (or inside a searched entity) and spans of sentence words alone are skipped.

**Score** (higher is better), summed over a candidate's occurrences; an occurrence in
passage ``r`` (0 = best) at character offset ``c`` adds

    ``w_rank ** r / (1 + c / char_scale) · part · page · (1 + question_context · o)``

* ``w_rank ** r / (1 + c / char_scale)`` (**position**): the best passage, early, counts most;
  repeated mentions add up (**frequency**);
* ``part`` is 1 for a maximal span, ``part_factor`` for a sub-span;
* ``page`` is ``page_bonus`` in the passage whose title is the entity just searched (that
  entity's own page names the bridge), else 1;
* ``o`` (**overlap with the question**) counts the question's content words, other than the
  searched entities' and the span's own, in the same sentence: the passage sentence that
  speaks of what the question asks is where the next entity is named.

A passage title adds ``title_bonus · w_rank ** r`` (0 by default: on train the best title
is almost always the entity just searched). A multi-word name is finally multiplied by
``1 + multiword_bonus``.

Ties break by first occurrence. The defaults were set on the ``train`` split of the ReAct
questions only, by coordinate search (top-3 coverage 39 % there). On ``test``
(:func:`workloads.analysis.recurrence.entity_ranker_top3`, 308 branches at 3 passages per
search) the next hop's entity is in the top 3 for 40 % (top 1: 22 %, top 5: 49 %; the
paper reports 61 %); it occurs in the passages at all for 72 %, the ceiling of any ranker
over this evidence, because BM25 on the entity alone finds the hop's supporting paragraph
in its top 3 for 71 % of searches.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynbranch.predictors.base import BranchContext, Predictor


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# NOTE: only connectors that occur inside names; "and", "in", "on", "at" more often join two
# names ("Natalie Wood and Edmund Gwenn", "Golestan Province in Iran") than form one.
CONNECTORS = _words("""of the de du des la le von van der den di da del""")
# Words that start sentences in capitals but do not start names on their own.
STOP_STARTS = _words(
    """a an the in on at of for from by to as it its he she his her they their this that
    these those there after before during when while where which who whom whose what
    with within however although though but and or if since until also both each many
    most some such one two three four five six seven eight nine ten first second third
    january february march april may june july august september october november
    december i we you our is was are were be being been has have had not no yes"""
)
ABBREVIATIONS = _words("""St Mt Dr Mr Mrs Ms Jr Sr Co Inc Ltd Gen Col Lt Sgt Capt Rev""")
_WORD = re.compile(r"[\w'’.&\-]+", re.UNICODE)
_SENTENCE_END = re.compile(r"[.!?]\s")
# Question words that say nothing about what is asked.
QUESTION_STOPWORDS = STOP_STARTS | _words(
    """how many much did does do name named called known into are then will"""
)


@dataclass(frozen=True)
class RankerWeights:
    """The scoring constants (see the module docstring); the defaults are tuned on train."""

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


def name_spans(text: str) -> list[tuple[str, int, bool]]:
    """The name spans of ``text``: ``(span, offset, maximal)`` in order of occurrence.

    Each maximal span comes first, then its shorter sub-spans (``maximal`` false) that start
    and end on a capitalised word: ``"Count of Barcelona"`` also yields ``"Barcelona"``.
    """
    spans: list[tuple[str, int, bool]] = []
    for words in _runs(text):
        n = len(words)
        for length in range(n, 0, -1):
            for i in range(n - length + 1):
                part = words[i : i + length]
                if not (_capitalised(part[0][0]) and _capitalised(part[-1][0])):
                    continue
                if length > 1 and part[0][0].lower() in STOP_STARTS:
                    continue
                if all(w.lower() in STOP_STARTS for w, _, _ in part):
                    continue
                spans.append((text[part[0][1] : part[-1][2]], part[0][1], length == n))
    return spans


def _runs(text: str) -> list[list[tuple[str, int, int]]]:
    """Maximal runs of capitalised words joined by spaces and single connectors."""
    words = [_strip(m) for m in _WORD.finditer(text)]
    runs, i = [], 0
    while i < len(words):
        if not _capitalised(words[i][0]):
            i += 1
            continue
        j = i + 1
        while j < len(words) and not _closes(text, words[j - 1]):
            if _capitalised(words[j][0]) and _adjacent(text, words[j - 1], words[j]):
                j += 1
            elif (
                words[j][0] in CONNECTORS
                and j + 1 < len(words)
                and _capitalised(words[j + 1][0])
                and _adjacent(text, words[j - 1], words[j])
                and _adjacent(text, words[j], words[j + 1])
                and not _closes(text, words[j])
            ):
                j += 2
            else:
                break
        start = i + 1 if words[i][0].lower() in STOP_STARTS and j - i > 1 else i
        if start < j:
            runs.append(words[start:j])
        i = j
    return runs


def _strip(match: re.Match[str]) -> tuple[str, int, int]:
    """A word without trailing punctuation or a possessive ``'s``."""
    word, start = match.group(0), match.start()
    for suffix in ("'s", "’s"):
        if word.endswith(suffix) and len(word) > 2:
            word = word[: -len(suffix)]
            break
    word = word.rstrip(".'’-&")
    return word, start, start + len(word)


def _closes(text: str, word: tuple[str, int, int]) -> bool:
    """Whether the span must end after ``word`` (a possessive or a sentence end follows)."""
    after = text[word[2] : word[2] + 2]
    if after[:1] in ("'", "’"):
        return True
    initial = len(word[0]) == 1 or word[0] in ABBREVIATIONS
    return after[:1] == "." and not initial


def _capitalised(word: str) -> bool:
    return word[:1].isupper() or (word[:1].isdigit() and any(c.isalpha() for c in word))


def _adjacent(text: str, a: tuple[str, int, int], b: tuple[str, int, int]) -> bool:
    """Two words separated by spaces only, or by the full stop of an initial or a title
    (``Glenn L. Martin``, ``St. Louis``); a comma, bracket or sentence end separates."""
    gap = text[a[2] : b[1]].strip()
    return gap == "" or (gap == "." and (len(a[0]) == 1 or a[0] in ABBREVIATIONS))


def _norm(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))


class EntityRanker(Predictor):
    """Ranks entities named in the previous hop's passages (see the module docstring)."""

    name = "entity"

    def __init__(self, weights: RankerWeights | None = None) -> None:
        self.weights = weights or RankerWeights()

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        return rank_entities(ctx.evidence, k, self.weights)


def rank_entities(
    evidence: Mapping[str, Any], k: int, weights: RankerWeights | None = None
) -> list[str]:
    """Up to ``k`` entities from ``evidence`` (``passages``, ``question``, ``searched``)."""
    w = weights or RankerWeights()
    passages: Sequence[Mapping[str, Any]] = evidence.get("passages") or ()
    searched = [_norm(s) for s in evidence.get("searched") or ()]
    question = set(_norm(str(evidence.get("question", ""))).split())
    searched_words = {x for s in searched for x in s.split()}
    asked = question - QUESTION_STOPWORDS - searched_words
    scores: dict[str, float] = {}
    first: dict[str, tuple[int, int]] = {}

    def add(name: str, value: float, where: tuple[int, int]) -> None:
        key = _norm(name)
        if not key or any(f" {key} " in f" {s} " for s in searched):
            return
        scores[name] = scores.get(name, 0.0) + value
        first.setdefault(name, where)

    for r, passage in enumerate(passages):
        decay = w.w_rank**r
        title, text = str(passage.get("title", "")).strip(), str(passage.get("text", ""))
        if title and w.title_bonus:
            add(title, w.title_bonus * decay, (r, -1))
        page = w.page_bonus if searched and _same_page(_norm(title), searched[-1]) else 1.0
        sentences = _sentences(text)
        for span, offset, maximal in name_spans(text):
            context = set(_norm(_sentence_at(sentences, offset)).split())
            overlap = len((asked - set(_norm(span).split())) & context)
            part = 1.0 if maximal else w.part_factor
            value = decay / (1.0 + offset / w.char_scale) * part * page
            add(span, value * (1.0 + w.question_context * overlap), (r, offset))
    ranked = []
    for name, score in scores.items():
        if len(_norm(name).split()) > 1:
            score *= 1.0 + w.multiword_bonus
        ranked.append((-score, first[name], name))
    ranked.sort()
    return [name for _, _, name in ranked[: max(k, 0)]]


def _same_page(title: str, entity: str) -> bool:
    return bool(title and entity) and (
        title == entity or f" {entity} " in f" {title} " or f" {title} " in f" {entity} "
    )


def _sentences(text: str) -> list[tuple[int, str]]:
    """``(start offset, sentence)`` pairs, split after ``.``, ``!`` or ``?`` and a space."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append((start, text[start : m.end()]))
        start = m.end()
    out.append((start, text[start:]))
    return out


def _sentence_at(sentences: list[tuple[int, str]], offset: int) -> str:
    found = sentences[0][1]
    for start, sentence in sentences:
        if start > offset:
            break
        found = sentence
    return found
