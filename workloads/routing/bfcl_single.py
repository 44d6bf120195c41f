"""Single-turn BFCL records: the AST categories and the irrelevance ones.

A record's recorded call per expected call is built from its possible answer: each
parameter's first allowed value, optional ones (those allowing ``""``) omitted. An
irrelevance record records no call.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynbranch.errors import MalformedRecordError
from workloads.routing.bfcl_fields import check_doc, field_of, turn_texts
from workloads.routing.calls import format_call
from workloads.routing.categories import is_irrelevance, is_parallel
from workloads.routing.record import Record
from workloads.routing.schema import plausible_value


def single_turn(path: Path, answers: Path, category: str, raw: dict, truth: list) -> Record:
    """The record ``raw`` of a single-turn category, with its ground truth ``truth``."""
    rid = raw["id"]
    turns = turn_texts(path, rid, field_of(path, rid, raw, "question", list))
    if len(turns) != 1:
        raise MalformedRecordError(str(path), rid, f"{len(turns)} turns in a single-turn record")
    functions = tuple(check_doc(path, rid, d) for d in field_of(path, rid, raw, "function", list))
    if not functions and not is_irrelevance(category):
        raise MalformedRecordError(str(path), rid, "no functions")
    by_name = {f["name"]: f for f in functions}
    if len(by_name) != len(functions):
        raise MalformedRecordError(str(path), rid, "two functions share a name")
    if is_irrelevance(category):
        return Record(rid, category, turns, functions, ((),))
    if not truth or ("parallel" not in category and len(truth) != 1):
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
        parallel=is_parallel(category),
        possible_answer=tuple(truth),
    )


def _chosen_args(path: Path, rid: str, doc: Mapping, allowed: Mapping) -> dict[str, Any]:
    """The recorded call's arguments: each parameter's first allowed value, optional omitted."""
    params = doc["parameters"]
    required = set(params.get("required", []))
    args = {}
    for pname, values in allowed.items():
        if not isinstance(values, list):
            raise MalformedRecordError(
                str(path), rid, f"{doc['name']}: no allowed values for {pname!r}"
            )
        concrete = [v for v in values if v != ""]
        if pname in required and not concrete:
            args[pname] = _unsatisfiable(path, rid, doc, pname, values)
            continue
        if "" in values and pname not in required:
            # NOTE: "" marks an optional parameter that may be omitted. BFCL's answers
            # sometimes list such a parameter that the schema lacks (parallel_multiple_12):
            # harmless, since the recorded call omits it.
            continue
        if pname not in params["properties"]:
            # NOTE: an answer naming a parameter the schema lacks, not marked optional
            # (live_multiple_862-181-3): BFCL's checker accepts no call (with it the call
            # has an unexpected parameter, without it a missing one). The recorded call
            # omits it, and the record scores 0 here as under BFCL.
            continue
        if not concrete:
            raise MalformedRecordError(
                str(path), rid, f"{doc['name']}: no allowed values for {pname!r}"
            )
        args[pname] = _concrete(params["properties"][pname], concrete[0])
    for pname in sorted(required - allowed.keys()):
        # NOTE: a required parameter the answer lacks (live_multiple_964-207-0): BFCL's
        # checker accepts no call (the parameter is either missing or unexpected). The
        # recorded call gives it a plausible value so that it validates; the record
        # scores 0 here as under BFCL.
        args[pname] = plausible_value(params["properties"][pname], f"{rid}/{pname}", pname)
    return args


def _unsatisfiable(path: Path, rid: str, doc: Mapping, pname: str, values: list) -> Any:
    """The recorded value of a required parameter whose answer allows no concrete value.

    NOTE: BFCL's live data has two shapes of this. ``[""]`` on a required string
    (``live_multiple_507-149-4``): BFCL's checker then accepts only the empty string, so
    the recorded call passes ``""``. ``[]`` on a required array (``live_simple_106-63-0``,
    ``live_simple_112-68-0``): BFCL's checker accepts no value at all, so every model
    scores 0 there; the recorded call passes ``[]`` (what the answer evidently meant) and
    :func:`~workloads.routing.schema.matches_answer` scores it 0 as BFCL does.
    """
    kind = doc["parameters"]["properties"][pname].get("type")
    if values == [""] and kind == "string":
        return ""
    if values == [] and kind in ("array", "tuple"):
        return []
    raise MalformedRecordError(
        str(path), rid, f"{doc['name']}: required {pname!r} has no allowed value"
    )


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
