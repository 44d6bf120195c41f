"""Loading and validating BFCL records (``bfcl_eval/data`` of an extracted wheel, or a fixture).

Three categories are used:

* ``multi_turn_base`` — multi-turn conversations over the executable API classes; the
  ground truth is, per user turn, the calls in BFCL's python syntax;
* ``multiple`` and ``parallel_multiple`` — single-turn requests offering several functions;
  the ground truth (``possible_answer``) lists, per expected call, each parameter's allowed
  values. BFCL ships no implementations of these functions, so their calls are validated
  against the function's JSON schema instead of executed (:mod:`workloads.routing.schema`).

Every record is checked when it is loaded; the first malformed one raises
:class:`~dynbranch.errors.MalformedRecordError` naming the file, the record and the problem,
before any request runs.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from dynbranch.datasets import read_jsonl
from dynbranch.errors import MalformedRecordError
from workloads.routing.apis import ApiSuite, load_api_suite
from workloads.routing.calls import CallSyntaxError, format_call, parse_call

MULTI_TURN = ("multi_turn_base",)
SINGLE_TURN = ("multiple", "parallel_multiple")
CATEGORIES = (*MULTI_TURN, *SINGLE_TURN)
DATA_DIR = Path("bfcl_eval/data")
DOC_DIR = DATA_DIR / "multi_turn_func_doc"


@dataclass(frozen=True)
class Record:
    """A BFCL record: its user turns, the functions it offers, and the recorded calls.

    ``recorded`` holds, per turn, the calls the trace makes in BFCL's python syntax (the
    ground truth for multi-turn; for single-turn, one concrete call per expected call built
    from the allowed values). ``parallel`` records make all of a turn's calls at once.
    """

    id: str
    category: str
    turns: tuple[str, ...]
    functions: tuple[Mapping[str, Any], ...]
    recorded: tuple[tuple[str, ...], ...]
    parallel: bool = False
    classes: tuple[str, ...] = ()
    initial_config: Mapping[str, Any] = field(default_factory=dict)
    possible_answer: tuple[Mapping[str, Mapping[str, list]], ...] = ()

    @property
    def multi_turn(self) -> bool:
        return self.category in MULTI_TURN

    @property
    def function_names(self) -> tuple[str, ...]:
        return tuple(f["name"] for f in self.functions)

    def doc(self, name: str) -> Mapping[str, Any] | None:
        return next((f for f in self.functions if f["name"] == name), None)


@dataclass(frozen=True)
class BFCLData:
    """The loaded records of one BFCL tree, by category, and its API classes (if any)."""

    root: Path
    records: Mapping[str, tuple[Record, ...]]
    suite: ApiSuite | None

    def all(self) -> Iterator[Record]:
        for category in CATEGORIES:
            yield from self.records.get(category, ())


def load_bfcl(root: Path, categories: tuple[str, ...] = CATEGORIES) -> BFCLData:
    """Load and validate ``categories`` from the BFCL tree at ``root``."""
    root = Path(root)
    unknown = [c for c in categories if c not in CATEGORIES]
    if unknown:
        raise ValueError(f"unknown BFCL categories {unknown}; known: {list(CATEGORIES)}")
    suite = load_api_suite(root) if any(c in MULTI_TURN for c in categories) else None
    docs = _load_docs(root, suite) if suite else {}
    records = {}
    for category in categories:
        questions = root / DATA_DIR / f"BFCL_v4_{category}.json"
        answers = root / DATA_DIR / "possible_answer" / f"BFCL_v4_{category}.json"
        truth = {}
        for n, raw in _jsonl(answers):
            rid = _field(answers, n, raw, "id", str)
            truth[rid] = _field(answers, rid, raw, "ground_truth", list)
        loaded, seen = [], set()
        for n, raw in _jsonl(questions):
            rid = _field(questions, n, raw, "id", str)
            if rid in seen:
                raise MalformedRecordError(str(questions), rid, "duplicate id")
            seen.add(rid)
            if rid not in truth:
                raise MalformedRecordError(str(questions), rid, f"no ground truth in {answers}")
            if category in MULTI_TURN:
                loaded.append(_multi_turn(questions, answers, category, raw, truth[rid], docs))
            else:
                loaded.append(_single_turn(questions, answers, category, raw, truth[rid]))
        records[category] = tuple(loaded)
    return BFCLData(root, MappingProxyType(records), suite)


# -- helpers ----------------------------------------------------------------------------------


def _jsonl(path: Path) -> Iterator[tuple[int, dict]]:
    """BFCL's ``.json`` files are JSON Lines: one record (or function doc) per line."""
    return read_jsonl(path, "bfcl", "Run `dynbranch data bfcl`.")


def _field(path: Path, record: str | int, raw: Mapping, name: str, kind: type) -> Any:
    if name not in raw:
        raise MalformedRecordError(str(path), _rid(record), f"missing field {name!r}")
    value = raw[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedRecordError(
            str(path),
            _rid(record),
            f"field {name!r} is {type(value).__name__}, expected {kind.__name__}",
        )
    return value


def _rid(record: str | int) -> str | int:
    return f"line {record}" if isinstance(record, int) else record


def _turns(path: Path, rid: str, question: list) -> tuple[str, ...]:
    turns = []
    for t, turn in enumerate(question):
        if not isinstance(turn, list) or not turn:
            raise MalformedRecordError(str(path), rid, f"turn {t} is not a list of messages")
        texts = []
        for message in turn:
            if (
                not isinstance(message, dict)
                or message.get("role") != "user"
                or not isinstance(message.get("content"), str)
            ):
                raise MalformedRecordError(
                    str(path), rid, f"turn {t}: messages must be user messages with text"
                )
            texts.append(message["content"])
        turns.append("\n".join(texts))
    if not turns:
        raise MalformedRecordError(str(path), rid, "no turns")
    return tuple(turns)


def _check_doc(path: Path, rid: str | int, doc: Any) -> Mapping[str, Any]:
    if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
        raise MalformedRecordError(str(path), rid, "a function doc needs a name")
    params = doc.get("parameters")
    if not isinstance(params, dict) or not isinstance(params.get("properties"), dict):
        raise MalformedRecordError(
            str(path), rid, f"function {doc['name']!r}: parameters need properties"
        )
    required = params.get("required", [])
    if not isinstance(required, list) or any(r not in params["properties"] for r in required):
        raise MalformedRecordError(
            str(path), rid, f"function {doc['name']!r}: required names unknown parameters"
        )
    for pname, schema in params["properties"].items():
        if not isinstance(schema, dict) or not isinstance(schema.get("type"), str):
            raise MalformedRecordError(
                str(path), rid, f"function {doc['name']!r}: parameter {pname!r} has no type"
            )
    return doc


def _load_docs(root: Path, suite: ApiSuite) -> dict[str, tuple[Mapping[str, Any], ...]]:
    docs = {}
    for cls, file in suite.doc_files.items():
        path = root / DOC_DIR / file
        docs[cls] = tuple(_check_doc(path, f"line {n}", raw) for n, raw in _jsonl(path))
    return docs


def _multi_turn(
    path: Path, answers: Path, category: str, raw: dict, truth: list, docs: Mapping[str, tuple]
) -> Record:
    rid = raw["id"]
    turns = _turns(path, rid, _field(path, rid, raw, "question", list))
    config = _field(path, rid, raw, "initial_config", dict)
    classes = tuple(_field(path, rid, raw, "involved_classes", list))
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
    if len(truth) != len(turns):
        raise MalformedRecordError(
            str(answers), rid, f"ground truth has {len(truth)} turns, the question has {len(turns)}"
        )
    recorded = []
    for t, calls in enumerate(truth):
        if not isinstance(calls, list) or not all(isinstance(c, str) for c in calls):
            raise MalformedRecordError(str(answers), rid, f"turn {t}: not a list of call texts")
        for call in calls:
            try:
                name = parse_call(call).name
            except CallSyntaxError as e:
                raise MalformedRecordError(
                    str(answers), rid, f"turn {t}: unparseable ground-truth call {call!r}: {e}"
                ) from None
            if name not in names:
                raise MalformedRecordError(
                    str(answers),
                    rid,
                    f"turn {t}: ground-truth call {call!r} names no offered function",
                )
        recorded.append(tuple(c.strip() for c in calls))
    return Record(
        rid,
        category,
        turns,
        functions,
        tuple(recorded),
        parallel=False,
        classes=classes,
        initial_config=MappingProxyType(config),
    )


def _single_turn(path: Path, answers: Path, category: str, raw: dict, truth: list) -> Record:
    rid = raw["id"]
    turns = _turns(path, rid, _field(path, rid, raw, "question", list))
    if len(turns) != 1:
        raise MalformedRecordError(str(path), rid, f"{len(turns)} turns in a single-turn record")
    functions = tuple(_check_doc(path, rid, d) for d in _field(path, rid, raw, "function", list))
    if not functions:
        raise MalformedRecordError(str(path), rid, "no functions")
    by_name = {f["name"]: f for f in functions}
    if len(by_name) != len(functions):
        raise MalformedRecordError(str(path), rid, "two functions share a name")
    if not truth or (category == "multiple" and len(truth) != 1):
        raise MalformedRecordError(
            str(answers), rid, f"{len(truth)} expected calls in a {category} record"
        )
    calls = []
    for i, entry in enumerate(truth):
        if not isinstance(entry, dict) or len(entry) != 1:
            raise MalformedRecordError(
                str(answers), rid, f"expected call {i} is not {{name: args}}"
            )
        ((name, allowed),) = entry.items()
        if name not in by_name or not isinstance(allowed, dict):
            raise MalformedRecordError(
                str(answers), rid, f"expected call {i} names no offered function: {name!r}"
            )
        calls.append(format_call(name, _chosen_args(answers, rid, by_name[name], allowed)))
    return Record(
        rid,
        category,
        turns,
        functions,
        (tuple(calls),),
        parallel=category == "parallel_multiple",
        possible_answer=tuple(truth),
    )


def _chosen_args(path: Path, rid: str, doc: Mapping, allowed: Mapping) -> dict[str, Any]:
    """The recorded call's arguments: each parameter's first allowed value, optional omitted."""
    params = doc["parameters"]
    required = set(params.get("required", []))
    args = {}
    for pname, values in allowed.items():
        if not isinstance(values, list) or not values:
            raise MalformedRecordError(
                str(path), rid, f"{doc['name']}: no allowed values for {pname!r}"
            )
        concrete = [v for v in values if v != ""]
        if "" in values and pname not in required:
            # NOTE: "" marks an optional parameter that may be omitted. BFCL's answers
            # sometimes list such a parameter that the schema lacks (parallel_multiple_12):
            # harmless, since the recorded call omits it.
            continue
        if pname not in params["properties"]:
            raise MalformedRecordError(
                str(path), rid, f"{doc['name']}: unknown parameter {pname!r}"
            )
        if not concrete:
            raise MalformedRecordError(
                str(path), rid, f"{doc['name']}: required {pname!r} has no allowed value"
            )
        args[pname] = _concrete(params["properties"][pname], concrete[0])
    missing = required - allowed.keys()
    if missing:
        raise MalformedRecordError(
            str(path), rid, f"{doc['name']}: no allowed values for required {sorted(missing)}"
        )
    return args


def _concrete(schema: Mapping[str, Any], allowed: Any) -> Any:
    """One concrete value from an allowed value: BFCL writes a dict parameter's allowed value
    as ``{key: [allowed values]}`` (and a list of dicts as a list of those)."""
    kind = schema.get("type")
    items = schema.get("items") if isinstance(schema.get("items"), Mapping) else {}
    if kind == "dict" and _is_allowed_map(allowed):
        return {k: v[0] for k, v in allowed.items() if v and "" not in v}
    if (
        kind in ("array", "tuple")
        and items.get("type") == "dict"
        and isinstance(allowed, list)
        and allowed
        and all(_is_allowed_map(d) for d in allowed)
    ):
        return [_concrete(items, d) for d in allowed]
    return allowed


def _is_allowed_map(value: Any) -> bool:
    return isinstance(value, dict) and all(isinstance(v, list) for v in value.values())
