"""MuSiQue for the ReAct and Sub-Agent workloads: records, hop chains, the split, EM/F1.

Three files of ``<data dir>/musique/`` (data/README.md §1) hold questions:

* ``dev_200_full.jsonl`` — 200 dev questions in the original schema, 20 paragraphs each;
* ``hipporag_train_100.json`` — 100 train questions, same schema, as one JSON array;
* ``dev_2417_decompositions.json`` — all 2,417 dev questions without paragraphs; each
  decomposition step carries ``document_id`` (``"<title>_<n>"``) instead.

Every record is checked on load; the first malformed one raises
:class:`~dynbranch.errors.MalformedRecordError` naming the file, the record and the problem.

**Hop chains.** A record's ``question_decomposition`` is its chain of single-hop steps in a
valid order (a step refers to earlier answers as ``#k``). Each step is resolved into the
entity it names (what a ReAct hop searches and a sub-agent retrieves for) and what it asks:

* knowledge-base form ``"X >> relation"``: the entity is ``X`` with ``#k`` replaced by step
  k's answer (``"#1 >> spouse"`` → ``Steve Hillage``), the ask is ``relation``;
* a natural-language sub-question that refers to earlier answers: the ask is the question
  with ``#k`` substituted, the entity is the referenced answer whose words overlap most with
  the supporting paragraph's title (the first one mentioned on a tie);
* a natural-language sub-question without references: the entity is the title of the
  step's supporting paragraph (``"What company makes Nirbhay?"`` → ``Nirbhay``), since the
  record marks no span; the ask is the question. When that title names the step's own
  answer (``"who was the king of england in 1950"`` → page ``George VI``), searching it
  would leak the answer, so the search is the sub-question's words instead (8 % of such
  steps in the 2,417 dev questions).

A step's **sub-topic** is ``"<entity> >> <ask>"`` (MuSiQue's own notation), or the ask
alone when the ask is itself the search.

**Split.** A question is ``train`` when the first 8 bytes of SHA-256 of its id, read as a
big-endian integer, are divisible by 4 (25 % in expectation), else ``test`` — the same rule
as Routing, on the MuSiQue id alone, so a question is on the same side in every workload and
file. Predictor tuning (the entity ranker) reads ``train`` only.

MuSiQue composes its questions from shared single-hop steps, so a test question often meets
a step a train question asked: the recurrence the paper measures (Fig. 5a), which a running
service's history holds too. The workloads' ``split_by="step"`` option measures the
pessimistic case instead: questions connected through a shared step (the same resolved
sub-topic, normalised) form one group (:func:`step_groups`), and a group takes the side
its smallest id has by the rule above, so no test question shares a step with a train one.
The groups are taken over every MuSiQue question of the data directory, so a question is on
the same side in every workload under that option too.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
import string
from collections import Counter
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from dynbranch.datasets import MISSING_FILE, read_jsonl
from dynbranch.errors import DataMissingError, MalformedRecordError

DEV_FULL = "dev_200_full.jsonl"
TRAIN_FULL = "hipporag_train_100.json"
DEV_DECOMPOSITIONS = "dev_2417_decompositions.json"
SPLITS = ("train", "test")
KINDS = {"2hop": 2, "3hop1": 3, "3hop2": 3, "4hop1": 4, "4hop2": 4, "4hop3": 4}
SUBTOPIC_SEP = " >> "
_REF = re.compile(r"#(\d+)")
_DOCUMENT_ID = re.compile(r"(.+)_\d+")


@dataclass(frozen=True)
class Step:
    """One resolved single-hop step of a decomposition (see the module docstring)."""

    index: int
    question: str
    answer: str
    support_title: str
    entity: str
    ask: str
    refs: tuple[int, ...] = ()
    line: str = ""

    @property
    def plan_line(self) -> str:
        """The sub-topic as a planner writes it before any step is researched: each earlier
        answer it names written as that step's ``#k`` (``"#1 >> spouse"``); the sub-topic
        itself for a step without references. :func:`substitute_refs` with the earlier
        steps' answers gives back :attr:`subtopic`."""
        return self.line or self.subtopic

    @property
    def subtopic(self) -> str:
        """``"<entity> >> <ask>"`` (the ask alone when it is its own search): what a
        sub-agent researches for this step."""
        if self.entity == self.ask:
            return self.ask
        return f"{self.entity}{SUBTOPIC_SEP}{self.ask}"


@dataclass(frozen=True)
class MusiqueRecord:
    """A MuSiQue question with its resolved hop chain and gold answers."""

    id: str
    question: str
    answer: str
    aliases: tuple[str, ...]
    steps: tuple[Step, ...]
    source: str

    @property
    def kind(self) -> str:
        """``2hop``, ``3hop1``, … (the id's prefix)."""
        return self.id.split("__", 1)[0]

    @property
    def answers(self) -> tuple[str, ...]:
        return (self.answer, *self.aliases)

    @property
    def chain(self) -> tuple[str, ...]:
        """The entity each hop searches, in order."""
        return tuple(s.entity for s in self.steps)


# -- loading ----------------------------------------------------------------------------------


def load_full(path: Path, source: str) -> tuple[MusiqueRecord, ...]:
    """Records in the original schema (with ``paragraphs``): JSONL or one JSON array."""
    path = Path(path)
    records, seen = [], set()
    for where, raw in _items(path):
        rid = _rid(path, where, raw)
        _unique(path, rid, seen)
        titles = _paragraph_titles(path, rid, raw)

        def title(step: Mapping[str, Any], i: int, rid: str = rid, titles=titles) -> str:
            idx = _get(path, rid, step, "paragraph_support_idx", int, f"step {i + 1}")
            if idx not in titles:
                raise MalformedRecordError(
                    str(path), rid, f"step {i + 1}: paragraph_support_idx {idx} names no paragraph"
                )
            return titles[idx]

        records.append(_record(path, rid, raw, title, source))
    return tuple(records)


def load_decompositions(path: Path, source: str = "dev2417") -> tuple[MusiqueRecord, ...]:
    """``dev_2417_decompositions.json``: records whose steps name their ``document_id``."""
    path = Path(path)
    records, seen = [], set()
    for where, raw in _items(path):
        rid = _rid(path, where, raw)
        _unique(path, rid, seen)

        def title(step: Mapping[str, Any], i: int, rid: str = rid) -> str:
            doc = _get(path, rid, step, "document_id", str, f"step {i + 1}")
            match = _DOCUMENT_ID.fullmatch(doc)
            if match is None:
                raise MalformedRecordError(
                    str(path), rid, f"step {i + 1}: document_id {doc!r} is not '<title>_<n>'"
                )
            return match.group(1)

        records.append(_record(path, rid, raw, title, source))
    return tuple(records)


def _items(path: Path) -> Iterator[tuple[str, Any]]:
    """``(where, raw)`` per record: ``line n`` of a JSONL file, ``item n`` of a JSON array."""
    if path.suffix == ".jsonl":
        for n, raw in read_jsonl(path, path.parent.name):
            yield f"line {n}", raw
        return
    if not path.is_file():
        raise DataMissingError(path.parent.name, [str(path)], MISSING_FILE)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise MalformedRecordError(str(path), "file", f"not JSON: {e}") from None
    if not isinstance(data, list):
        raise MalformedRecordError(str(path), "file", "not a JSON array of records")
    for n, raw in enumerate(data):
        yield f"item {n}", raw


def _rid(path: Path, where: str, raw: Any) -> str:
    if not isinstance(raw, dict):
        raise MalformedRecordError(str(path), where, "not a JSON object")
    rid = raw.get("id")
    if not isinstance(rid, str) or not rid:
        raise MalformedRecordError(str(path), where, "missing or empty field 'id'")
    return rid


def _unique(path: Path, rid: str, seen: set[str]) -> None:
    if rid in seen:
        raise MalformedRecordError(str(path), rid, "duplicate id")
    seen.add(rid)


T = TypeVar("T")


def _get(path: Path, rid: str, raw: Mapping, name: str, kind: type[T], where: str = "") -> T:
    prefix = f"{where}: " if where else ""
    if name not in raw:
        raise MalformedRecordError(str(path), rid, f"{prefix}missing field {name!r}")
    value = raw[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedRecordError(
            str(path),
            rid,
            f"{prefix}field {name!r} is {type(value).__name__}, expected {kind.__name__}",
        )
    if kind is str and not value.strip():
        raise MalformedRecordError(str(path), rid, f"{prefix}field {name!r} is empty")
    return value


def _paragraph_titles(path: Path, rid: str, raw: Mapping) -> dict[int, str]:
    titles = {}
    for i, p in enumerate(_get(path, rid, raw, "paragraphs", list)):
        where = f"paragraph {i}"
        if not isinstance(p, dict):
            raise MalformedRecordError(str(path), rid, f"{where} is not an object")
        idx = _get(path, rid, p, "idx", int, where)
        titles[idx] = _get(path, rid, p, "title", str, where)
        _get(path, rid, p, "paragraph_text", str, where)
    return titles


def _record(
    path: Path,
    rid: str,
    raw: Mapping,
    title: Callable[[Mapping[str, Any], int], str],
    source: str,
) -> MusiqueRecord:
    question = _get(path, rid, raw, "question", str)
    answer = _get(path, rid, raw, "answer", str)
    aliases = _get(path, rid, raw, "answer_aliases", list)
    if not all(isinstance(a, str) for a in aliases):
        raise MalformedRecordError(str(path), rid, "answer_aliases must be a list of strings")
    if raw.get("answerable", True) is not True:
        raise MalformedRecordError(str(path), rid, "not answerable (no gold answer to replay)")
    decomposition = _get(path, rid, raw, "question_decomposition", list)
    kind = rid.split("__", 1)[0]
    if kind in KINDS and len(decomposition) != KINDS[kind]:
        raise MalformedRecordError(
            str(path), rid, f"a {kind} question with {len(decomposition)} decomposition steps"
        )
    if not decomposition:
        raise MalformedRecordError(str(path), rid, "empty question_decomposition")
    steps: list[Step] = []
    for i, raw_step in enumerate(decomposition):
        if not isinstance(raw_step, dict):
            raise MalformedRecordError(str(path), rid, f"step {i + 1} is not an object")
        where = f"step {i + 1}"
        text = _get(path, rid, raw_step, "question", str, where).strip()
        step_answer = _get(path, rid, raw_step, "answer", str, where).strip()
        try:
            steps.append(resolve_step(i, text, step_answer, title(raw_step, i), steps))
        except ValueError as e:
            raise MalformedRecordError(str(path), rid, f"{where}: {e}") from None
    return MusiqueRecord(rid, question, answer, tuple(aliases), tuple(steps), source)


# -- hop chains -------------------------------------------------------------------------------


def resolve_step(
    index: int, question: str, answer: str, support_title: str, earlier: Sequence[Step]
) -> Step:
    """Resolve one step's entity and ask against the ``earlier`` steps' answers.

    Raises ``ValueError`` for a ``#k`` that names no earlier step.
    """
    refs = tuple(dict.fromkeys(int(k) - 1 for k in _REF.findall(question)))
    bad = [k + 1 for k in refs if not 0 <= k < index]
    if bad:
        raise ValueError(f"{question!r} refers to #{bad[0]}, not an earlier step")

    def substitute(text: str) -> str:
        return _REF.sub(lambda m: earlier[int(m.group(1)) - 1].answer, text).strip()

    line = ""
    if SUBTOPIC_SEP.strip() in question:
        left, _, relation = question.partition(SUBTOPIC_SEP.strip())
        entity, ask = substitute(left), relation.strip()
        if not entity or not ask:
            raise ValueError(f"{question!r} is not '<entity> >> <relation>'")
        if refs:
            line = f"{left.strip()}{SUBTOPIC_SEP}{ask}"
    elif refs:
        ask = substitute(question)
        title_words = set(normalize_answer(support_title).split())
        bridge = max(
            refs, key=lambda k: len(title_words & set(normalize_answer(earlier[k].answer).split()))
        )
        entity = earlier[bridge].answer
        line = f"#{bridge + 1}{SUBTOPIC_SEP}{question}"
    elif _names_answer(support_title, answer):
        entity = ask = question  # the supporting page is the answer's own: search the words
    else:
        entity, ask = support_title.strip(), question
    return Step(index, question, answer, support_title, entity, ask, refs, line)


def line_refs(line: str) -> tuple[int, ...]:
    """The steps (0-based, in order of first mention) a plan line's ``#k`` refer to."""
    return tuple(dict.fromkeys(int(k) - 1 for k in _REF.findall(line)))


def substitute_refs(line: str, answers: Mapping[int, str]) -> str:
    """``line`` with each ``#k`` whose step ``k - 1`` is in ``answers`` written as that answer
    (a reference to a step not in ``answers`` stays as written), stripped."""

    def answer(m: re.Match[str]) -> str:
        return answers.get(int(m.group(1)) - 1, m.group(0))

    return _REF.sub(answer, line).strip()


def _names_answer(title: str, answer: str) -> bool:
    title, answer = normalize_answer(title), normalize_answer(answer)
    return bool(title and answer) and (answer in title or title in answer)


def subtopic_entity(subtopic: str) -> str:
    """The entity of a sub-topic ``"<entity> >> <ask>"`` (the whole text if it has no ask)."""
    return subtopic.split(SUBTOPIC_SEP, 1)[0].strip()


# -- split and drawing ------------------------------------------------------------------------


def split_of(question_id: str) -> str:
    """``train`` or ``test``: the question's fixed side of the split (module docstring)."""
    head = int.from_bytes(hashlib.sha256(question_id.encode("utf-8")).digest()[:8], "big")
    return "train" if head % 4 == 0 else "test"


SPLIT_BY = ("question", "step")
"""How questions are split: each by its own id, or by the group of questions it shares
single-hop steps with (module docstring)."""


def step_groups(records: Sequence[MusiqueRecord]) -> dict[str, str]:
    """Each record's group, named by its smallest id: records are connected when they share a
    single-hop step (the same normalised resolved sub-topic), directly or through others.
    A record listed twice (the same id in two files) is one question."""
    parent = {r.id: r.id for r in records}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    owner: dict[str, str] = {}
    for r in records:
        for step in r.steps:
            key = normalize_answer(step.subtopic)
            first = owner.setdefault(key, r.id)
            a, b = root(first), root(r.id)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {rid: root(rid) for rid in parent}


def in_split(records: Sequence[MusiqueRecord], split: str,
             groups: Mapping[str, str] | None = None) -> list[MusiqueRecord]:
    """The records of ``split`` (``train``, ``test`` or ``all``), in their given order; with
    ``groups`` (:func:`step_groups`) a record takes its group's side."""
    if split == "all":
        return list(records)
    if split not in SPLITS:
        raise ValueError(f"split {split!r}: choose from {[*SPLITS, 'all']}")
    if groups is None:
        return [r for r in records if split_of(r.id) == split]
    return [r for r in records if split_of(groups.get(r.id, r.id)) == split]


def draw(pool: Sequence[T], n: int, seed: int) -> list[T]:
    """``n`` items from ``pool``: seeded permutations, re-shuffled each further cycle."""
    rng = random.Random(seed)
    out: list[T] = []
    while len(out) < n and pool:
        cycle = list(pool)
        rng.shuffle(cycle)
        out.extend(cycle[: n - len(out)])
    return out


# -- answer scoring (SQuAD-style, as MuSiQue's official evaluation) ---------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)
_PUNCTUATION = frozenset(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lower-case, drop punctuation and the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str | None, answers: Sequence[str]) -> float:
    """1.0 when the normalised prediction equals a normalised gold answer or alias."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(a) for a in answers))


def f1_score(prediction: str | None, answers: Sequence[str]) -> float:
    """The best token-level F1 of the normalised prediction against any gold answer."""
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction).split()
    best = 0.0
    for answer in answers:
        gold = normalize_answer(answer).split()
        common = sum((Counter(pred) & Counter(gold)).values())
        if not pred or not gold:
            best = max(best, float(pred == gold))
        elif common:
            precision, recall = common / len(pred), common / len(gold)
            best = max(best, 2 * precision * recall / (precision + recall))
    return best
