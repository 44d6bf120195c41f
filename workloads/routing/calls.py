"""BFCL's python call syntax: parse with :mod:`ast` (never ``eval``), format, and make JSON-able.

A call is ``name(arg, key=value, ...)`` where ``name`` may be dotted (``math.hypot``) and
every argument is a Python literal. Parsing goes through :func:`ast.literal_eval` per
argument, so a call text can never run code.
"""

from __future__ import annotations

import ast
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class CallSyntaxError(ValueError):
    """A call text that is not one call of literal arguments."""


@dataclass(frozen=True)
class ParsedCall:
    """One parsed call: the function name, positional and keyword literal arguments."""

    name: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


_SCALARS = (str, int, float, bool, type(None))
_PARSED: dict[str, ParsedCall] = {}
"""Calls already parsed whose arguments are all immutable scalars, by text."""
_PARSED_MAX = 1 << 14


def parse_call(text: str) -> ParsedCall:
    """Parse one call in BFCL's python syntax; :class:`CallSyntaxError` says what is wrong.

    NOTE: a replay parses the same calls again and again (every router output, every
    lookup of a handler's input, every record repeated in a long stream), so a call whose
    arguments are all scalars is kept by its text and handed out with its own ``kwargs``
    dict; one with a list or dict argument (which a tool may change) is parsed each time.
    """
    if not isinstance(text, str):
        raise CallSyntaxError(f"a call must be text, got {type(text).__name__}")
    kept = _PARSED.get(text)
    if kept is not None:
        return ParsedCall(kept.name, kept.args, dict(kept.kwargs))
    parsed = _parse(text)
    if all(type(v) in _SCALARS for v in (*parsed.args, *parsed.kwargs.values())):
        if len(_PARSED) >= _PARSED_MAX:
            _PARSED.clear()  # NOTE: bounded; a long stream of new calls must not grow it
        _PARSED[text] = ParsedCall(parsed.name, parsed.args, dict(parsed.kwargs))
    return parsed


def _parse(text: str) -> ParsedCall:
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError as e:
        raise CallSyntaxError(f"not python call syntax ({e.msg})") from None
    if not isinstance(node, ast.Call):
        raise CallSyntaxError("not a function call")
    name = _dotted_name(node.func)
    args = []
    for a in node.args:
        if isinstance(a, ast.Starred):
            raise CallSyntaxError("*args are not allowed")
        args.append(_literal(a, name))
    kwargs: dict[str, Any] = {}
    for k in node.keywords:
        if k.arg is None:
            raise CallSyntaxError("**kwargs are not allowed")
        if k.arg in kwargs:
            raise CallSyntaxError(f"argument {k.arg!r} given twice")
        kwargs[k.arg] = _literal(k.value, name)
    return ParsedCall(name, tuple(args), kwargs)


def _dotted_name(node: ast.expr) -> str:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        raise CallSyntaxError("the called object must be a (dotted) name")
    parts.append(node.id)
    return ".".join(reversed(parts))


def _literal(node: ast.expr, name: str) -> Any:
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        raise CallSyntaxError(
            f"argument of {name} is not a literal: {ast.unparse(node)[:80]}"
        ) from None


def format_call(name: str, kwargs: Mapping[str, Any]) -> str:
    """``name(k=v, ...)`` with ``repr`` values, in ``kwargs`` order; parses back equal."""
    return f"{name}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"


def to_jsonable(value: Any) -> Any:
    """A fresh JSON-able copy of a tool value (no aliasing of the API's own objects).

    Mapping keys become strings; tuples and sets become lists (sets sorted by ``repr``);
    ``Decimal``, ``mpmath`` numbers and non-finite floats become their text, which keeps the
    precision the call asked for and keeps the value canonically encodable.
    """
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else repr(value)
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return [to_jsonable(v) for v in sorted(value, key=repr)]
    return str(value)
