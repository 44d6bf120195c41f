"""Function schemas of BFCL's single-turn records: validate calls, invent plausible ones, check.

BFCL ships no implementations of the ``multiple`` / ``parallel_multiple`` functions, so the
executor *validates* a call against the function's schema (every required parameter
present, no unknown one, types as declared — one level into arrays and dicts; like BFCL's
checker it leaves enums unchecked) and returns the normalised call instead of a result.

:func:`plausible_call` fills a function's required parameters with type-correct values
derived from a hash: what a replayed handler emits for a function the trace did not call
next (speculation asks for such inputs). :func:`matches_answer` is BFCL's AST check of one
call against a ``possible_answer`` entry.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Mapping, Sequence
from typing import Any

from workloads.routing.calls import ParsedCall, format_call

_STRING = frozenset({"string", "any", "char", "String", "Any"})
_INTEGER = frozenset({"integer", "int", "long", "short", "byte", "Bigint"})
_FLOAT = frozenset({"float", "number", "double"})
_BOOLEAN = frozenset({"boolean", "bool", "Boolean"})
_ARRAY = frozenset({"array", "tuple", "list", "ArrayList", "Array"})
_OBJECT = frozenset({"dict", "object", "HashMap"})


class SchemaViolation(ValueError):
    """A call whose arguments do not satisfy the function's schema."""


def validate_call(doc: Mapping[str, Any], call: ParsedCall) -> dict[str, Any]:
    """The normalised call ``{"name", "arguments"}`` if ``call`` satisfies ``doc``'s schema.

    Positional arguments bind to the parameters in declaration order; ints become floats
    for ``float`` parameters and tuples become lists. Raises :class:`SchemaViolation`.
    """
    if call.name != doc["name"]:
        raise SchemaViolation(f"call names {call.name!r}, the schema is {doc['name']!r}")
    params = doc["parameters"]
    properties: Mapping[str, Any] = params["properties"]
    names = list(properties)
    if len(call.args) > len(names):
        raise SchemaViolation(f"{call.name} takes {len(names)} arguments, got {len(call.args)}")
    given = dict(zip(names, call.args, strict=False))
    for key, value in call.kwargs.items():
        if key in given:
            raise SchemaViolation(f"{call.name}: argument {key!r} given twice")
        given[key] = value
    unknown = [k for k in given if k not in properties]
    if unknown:
        raise SchemaViolation(f"{call.name}: unknown parameters {unknown}")
    missing = [r for r in params.get("required", []) if r not in given]
    if missing:
        raise SchemaViolation(f"{call.name}: missing required parameters {missing}")
    arguments = {k: _check(properties[k], v, f"{call.name}.{k}") for k, v in given.items()}
    return {"name": call.name, "arguments": arguments}


def is_variable_reference(value: Any) -> bool:
    """Whether ``value`` is text naming a variable (``data``, ``data['sales']``, ``cfg.x``).

    BFCL's answers pass variables as such text where the schema wants another type, and
    its checker accepts them; so does :func:`validate_call`.
    """
    if not isinstance(value, str):
        return False
    try:
        node = ast.parse(value.strip(), mode="eval").body
    except SyntaxError:
        return False
    while isinstance(node, (ast.Attribute, ast.Subscript)):
        node = node.value
    return isinstance(node, ast.Name)


def _check(schema: Mapping[str, Any], value: Any, where: str, depth: int = 0) -> Any:
    kind = schema.get("type")
    if kind not in _STRING and is_variable_reference(value):
        return value
    if kind in _STRING:
        # NOTE: BFCL's type check accepts a value of the possible answer's type where it
        # differs from the schema's (a "variable"), and live answers give booleans and
        # integers for string parameters (live_multiple_552-153-1), null for a date
        # (live_multiple_1038-265-0): scalars and None pass here.
        if kind in ("string", "char", "String") and not (
            value is None or isinstance(value, (str, int, float))
        ):
            raise SchemaViolation(f"{where}: expected a string, got {value!r}")
        out = value
    elif kind in _INTEGER:
        if not isinstance(value, int) or isinstance(value, bool):
            raise SchemaViolation(f"{where}: expected an integer, got {value!r}")
        out = value
    elif kind in _FLOAT:
        if not isinstance(value, (int, float)) or isinstance(value, bool):
            raise SchemaViolation(f"{where}: expected a number, got {value!r}")
        out = float(value)
    elif kind in _BOOLEAN:
        if not isinstance(value, bool):
            raise SchemaViolation(f"{where}: expected a boolean, got {value!r}")
        out = value
    elif kind in _ARRAY:
        if not isinstance(value, (list, tuple)):
            raise SchemaViolation(f"{where}: expected an array, got {value!r}")
        items = schema.get("items")
        out = [
            _check(items, v, f"{where}[{i}]", depth + 1)
            if isinstance(items, Mapping) and depth == 0
            else v
            for i, v in enumerate(value)
        ]
    elif kind in _OBJECT:
        if not isinstance(value, dict):
            raise SchemaViolation(f"{where}: expected a dict, got {value!r}")
        props = schema.get("properties")
        if isinstance(props, Mapping) and depth == 0:
            missing = [r for r in schema.get("required", []) if r not in value]
            if missing:
                raise SchemaViolation(f"{where}: missing keys {missing}")
            out = {
                k: _check(props[k], v, f"{where}.{k}", depth + 1) if k in props else v
                for k, v in value.items()
            }
        else:
            out = dict(value)
    else:
        raise SchemaViolation(f"{where}: unsupported schema type {kind!r}")
    # NOTE: enums are not checked: BFCL's checker ignores them, and its live answers break
    # them (live_multiple_87-38-4 answers 'openai' where the enum offers 'openapi').
    return out


# -- plausible calls --------------------------------------------------------------------------


def plausible_call(doc: Mapping[str, Any], key: str) -> str:
    """A type-correct call of ``doc`` with its required parameters derived from ``key``."""
    params = doc["parameters"]
    args = {
        p: plausible_value(params["properties"][p], f"{key}/{p}", p) for p in params.get("required", [])
    }
    return format_call(doc["name"], args)


def plausible_value(schema: Mapping[str, Any], key: str, name: str) -> Any:
    """A value of ``schema``'s type (an enum member if it has one) derived from ``key``."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")
    enum = schema.get("enum")
    if enum:
        return enum[h % len(enum)]
    kind = schema.get("type")
    if kind in _INTEGER:
        return 1 + h % 100
    if kind in _FLOAT:
        return round(1 + (h % 10_000) / 100, 2)
    if kind in _BOOLEAN:
        return bool(h & 1)
    if kind in _ARRAY:
        items = schema.get("items")
        return [plausible_value(items, f"{key}/0", name)] if isinstance(items, Mapping) else []
    if kind in _OBJECT:
        props = schema.get("properties")
        if not isinstance(props, Mapping):
            return {}
        return {
            p: plausible_value(props[p], f"{key}/{p}", p)
            for p in schema.get("required", [])
            if isinstance(props.get(p), Mapping)
        }
    return f"{name}_{h % 16**6:06x}"


# -- BFCL's AST check -------------------------------------------------------------------------


def _std(text: str) -> str:
    """BFCL's string standardisation: no spaces or ``,./-_*^``, lower case, ``'`` → ``"``."""
    return re.sub(r"[ ,./\-_*^]", "", text).lower().replace("'", '"')


def _std_list(values: Sequence) -> list:
    return [_std(v) if isinstance(v, str) else v for v in values]


def matches_answer(
    doc: Mapping[str, Any], call: Mapping[str, Any], answer: Mapping[str, Mapping[str, list]]
) -> bool:
    """BFCL's AST check: does the normalised ``call`` satisfy one possible-answer entry?

    The name must match, every required parameter be present, every given value be one
    of the allowed values (strings compared after BFCL's standardisation, dicts key by
    key), and every allowed parameter left out must allow ``""`` (optional).
    """
    ((name, allowed),) = answer.items()
    if call["name"] != name:
        return False
    given = call["arguments"]
    if any(r not in given for r in doc["parameters"].get("required", [])):
        return False
    for param, value in given.items():
        if param not in allowed or not _value_ok(value, allowed[param]):
            return False
    return all(p in given or "" in values for p, values in allowed.items())


def _value_ok(value: Any, allowed: list) -> bool:
    if isinstance(value, str):
        return _std(value) in [_std(a) for a in allowed if isinstance(a, str)]
    if isinstance(value, dict):
        return any(isinstance(a, dict) and _dict_ok(value, a) for a in allowed)
    if isinstance(value, list):
        if value and all(isinstance(v, dict) for v in value):
            return any(
                isinstance(a, list)
                and len(a) == len(value)
                and all(_dict_ok(v, d) for v, d in zip(value, a, strict=True))
                for a in allowed
            )
        return _std_list(value) in [_std_list(a) for a in allowed if isinstance(a, list)]
    # NOTE: numbers compare by value (5 == 5.0, as in BFCL) but a bool never equals a number.
    return any(
        value == a and isinstance(value, bool) == isinstance(a, bool) for a in allowed if a != ""
    )


def _dict_ok(value: Mapping, allowed: Mapping) -> bool:
    for key, v in value.items():
        if key not in allowed:
            return False
        options = [_std(a) if isinstance(a, str) else a for a in allowed[key]]
        if (_std(v) if isinstance(v, str) else v) not in options:
            return False
    return all(k in value or "" in opts for k, opts in allowed.items())


def matches_answers(
    docs: Mapping[str, Mapping[str, Any]],
    calls: Sequence[Mapping[str, Any]],
    answers: Sequence[Mapping[str, Mapping[str, list]]],
) -> bool:
    """BFCL's order-free parallel check: each answer matched by a distinct call."""
    if len(calls) != len(answers):
        return False
    free = list(range(len(calls)))
    for answer in answers:
        name = next(iter(answer))
        hit = next((i for i in free if matches_answer(docs[name], calls[i], answer)), None)
        if hit is None:
            return False
        free.remove(hit)
    return True
