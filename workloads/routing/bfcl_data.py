"""Loading and validating BFCL records (``bfcl_eval/data`` of an extracted wheel, or a fixture).

The categories are :data:`~workloads.routing.categories.CATEGORIES`:

* multi-turn — conversations over the executable API classes; the ground truth is, per
  user turn, the calls in BFCL's python syntax. ``miss_func`` records hold functions out
  until a later turn (``missed_function``), whose empty user turn gets BFCL's
  :data:`ADDITIONAL_FUNCTION_PROMPT`; ``long_context`` records load their classes' long
  scenario;
* single-turn AST — requests offering one or more functions; the ground truth
  (``possible_answer``) lists, per expected call, each parameter's allowed values. BFCL
  ships no implementations of these functions, so their calls are validated against the
  function's JSON schema instead of executed (:mod:`workloads.routing.schema`);
* irrelevance — no possible-answer file: the record is right when no call is made.

A turn's text is its messages' contents joined by newlines, a non-user message (the live
categories' system prompts, an earlier assistant turn) prefixed with its role.

Every record is checked when it is loaded; the first malformed one raises
:class:`~dynbranch.errors.MalformedRecordError` naming the file, the record and the problem,
before any request runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dynbranch.errors import MalformedRecordError
from dynbranch.workflow import as_text
from workloads.routing.apis import ApiSuite, load_api_suite
from workloads.routing.bfcl_fields import check_doc, field_of, read_records, turn_texts
from workloads.routing.bfcl_single import single_turn
from workloads.routing.calls import CallSyntaxError, parse_call
from workloads.routing.categories import (
    CATEGORIES,
    MULTI_TURN,
    SINGLE_TURN,
    is_irrelevance,
    resolve_categories,
)
from workloads.routing.record import Record

# NOTE: BFCL's DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC
# (bfcl_eval/constants/default_prompts.py): the user turn of a miss_func turn that only
# offers the held-out functions.
ADDITIONAL_FUNCTION_PROMPT = (
    "I have updated some more functions you can choose from. What about now?"
)
DATA_DIR = Path("bfcl_eval/data")
DOC_DIR = DATA_DIR / "multi_turn_func_doc"

__all__ = ["ADDITIONAL_FUNCTION_PROMPT", "CATEGORIES", "MULTI_TURN", "SINGLE_TURN", "BFCLData",
           "Record", "load_bfcl"]


@dataclass(frozen=True)
class BFCLData:
    """The loaded records of one BFCL tree, by category, and its API classes (if any)."""

    root: Path
    records: Mapping[str, tuple[Record, ...]]
    suite: ApiSuite | None

    def all(self) -> Iterator[Record]:
        """Every loaded record, categories in :data:`CATEGORIES` order, records in file order."""
        for category in CATEGORIES:
            yield from self.records.get(category, ())


def load_bfcl(root: Path, categories: tuple[str, ...] = CATEGORIES) -> BFCLData:
    """Load and validate ``categories`` from the BFCL tree at ``root``."""
    root = Path(root)
    categories = resolve_categories(categories)
    suite = load_api_suite(root) if any(c in MULTI_TURN for c in categories) else None
    docs = _load_docs(root, suite) if suite else {}
    records = {}
    for category in categories:
        questions = root / DATA_DIR / f"BFCL_v4_{category}.json"
        truth = _ground_truth(root, category)
        loaded, seen = [], set()
        for n, raw in read_records(questions):
            rid = field_of(questions, n, raw, "id", str)
            if rid in seen:
                raise MalformedRecordError(str(questions), rid, "duplicate id")
            seen.add(rid)
            answers = root / DATA_DIR / "possible_answer" / questions.name
            if truth is not None and rid not in truth:
                raise MalformedRecordError(str(questions), rid, f"no ground truth in {answers}")
            gt = truth[rid] if truth is not None else []
            if category in MULTI_TURN:
                loaded.append(_multi_turn(questions, answers, category, raw, gt, docs))
            else:
                loaded.append(single_turn(questions, answers, category, raw, gt))
        records[category] = tuple(loaded)
    return BFCLData(root, MappingProxyType(records), suite)


def _ground_truth(root: Path, category: str) -> dict[str, list] | None:
    """Record id → ground truth from the category's possible-answer file (``None``: an
    irrelevance category, which ships none)."""
    if is_irrelevance(category):
        return None
    answers = root / DATA_DIR / "possible_answer" / f"BFCL_v4_{category}.json"
    truth = {}
    for n, raw in read_records(answers):
        rid = field_of(answers, n, raw, "id", str)
        truth[rid] = field_of(answers, rid, raw, "ground_truth", list)
    return truth


# -- multi-turn -------------------------------------------------------------------------------


def _load_docs(root: Path, suite: ApiSuite) -> dict[str, tuple[Mapping[str, Any], ...]]:
    docs = {}
    for cls, file in suite.doc_files.items():
        path = root / DOC_DIR / file
        docs[cls] = tuple(_registered(check_doc(path, f"line {n}", raw))
                          for n, raw in read_records(path))
    return docs


def _registered(doc: Any) -> Any:
    """An API class's function doc (frozen) with its canonical encoding and prompt text made
    now, as a server makes them when it registers a tool.

    NOTE: every multi-turn record of the class shares this doc, so each is encoded and
    rendered once per process; made lazily, that once fell on the first stage to offer the
    class, 0.5-2 ms of one stage's overhead (the tail of ``scripts/bench_overhead.py``).
    """
    doc.packed()
    as_text(doc)
    return doc


def _held_out(path: Path, rid: str, raw: dict, names: set[str]) -> dict[int, tuple[str, ...]]:
    """``missed_function``: turn index → the names first offered at that turn."""
    missed = raw.get("missed_function", {})
    if not isinstance(missed, dict):
        raise MalformedRecordError(str(path), rid, "missed_function must map turns to names")
    held = {}
    for turn, fns in missed.items():
        if not (isinstance(turn, str) and turn.isdigit() and isinstance(fns, list)
                and all(isinstance(f, str) and f in names for f in fns)):
            raise MalformedRecordError(
                str(path), rid, f"missed_function[{turn!r}] must name offered functions")
        held[int(turn)] = tuple(fns)
    return held


def _multi_turn(
    path: Path, answers: Path, category: str, raw: dict, truth: list, docs: Mapping[str, tuple]
) -> Record:
    rid = raw["id"]
    config = field_of(path, rid, raw, "initial_config", dict)
    classes = tuple(field_of(path, rid, raw, "involved_classes", list))
    excluded = raw.get("excluded_function", [])
    if not isinstance(excluded, list) or not all(isinstance(e, str) for e in excluded):
        raise MalformedRecordError(str(path), rid, "excluded_function must be a list of names")
    missing = [c for c in classes if c not in docs]
    if missing or not classes:
        raise MalformedRecordError(str(path), rid, f"unknown involved classes {missing or classes}")
    functions = tuple(d for c in classes for d in docs[c] if d["name"] not in excluded)
    names = {f["name"] for f in functions}
    if len(names) != len(functions):
        raise MalformedRecordError(str(path), rid, "two involved classes offer the same function")
    held = _held_out(path, rid, raw, names)
    turns = turn_texts(path, rid, field_of(path, rid, raw, "question", list),
                       fill_empty=dict.fromkeys(held, ADDITIONAL_FUNCTION_PROMPT))
    if len(truth) != len(turns):
        raise MalformedRecordError(
            str(answers), rid, f"ground truth has {len(truth)} turns, the question has {len(turns)}"
        )
    record = Record(rid, category, turns, functions, (), classes=classes,
                    initial_config=MappingProxyType(config), held_out=MappingProxyType(held),
                    long_context="long_context" in category)
    recorded = tuple(_turn_calls(answers, rid, t, calls, record) for t, calls in enumerate(truth))
    return Record(rid, category, turns, functions, recorded, classes=classes,
                  initial_config=record.initial_config, held_out=record.held_out,
                  long_context=record.long_context)


def _turn_calls(answers: Path, rid: str, t: int, calls: Any, record: Record) -> tuple[str, ...]:
    """One turn's ground-truth calls, each naming a function of the record.

    NOTE: not necessarily one offered at that turn: ``multi_turn_miss_func_49`` calls
    ``tail`` in turn 1 although it is held out until turn 3. BFCL executes its ground truth
    as it is, so the replay does too (the router may name any of the record's functions).
    """
    if not isinstance(calls, list) or not all(isinstance(c, str) for c in calls):
        raise MalformedRecordError(str(answers), rid, f"turn {t}: not a list of call texts")
    offered = set(record.function_names)
    for call in calls:
        try:
            name = parse_call(call).name
        except CallSyntaxError as e:
            raise MalformedRecordError(
                str(answers), rid, f"turn {t}: unparseable ground-truth call {call!r}: {e}"
            ) from None
        if name not in offered:
            raise MalformedRecordError(
                str(answers), rid, f"turn {t}: ground-truth call {call!r} names no offered "
                "function")
    return tuple(c.strip() for c in calls)
