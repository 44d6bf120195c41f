"""Checked reads of BFCL's JSON Lines files: fields, turns and function docs.

Every failure is a :class:`~dynbranch.errors.MalformedRecordError` naming the file, the
record (its id, or its line) and the problem.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from dynbranch.canonical import freeze
from dynbranch.datasets import read_jsonl
from dynbranch.errors import MalformedRecordError

ROLES = ("user", "system", "assistant")


def read_records(path: Path) -> Iterator[tuple[int, dict]]:
    """BFCL's ``.json`` files are JSON Lines: one record (or function doc) per line."""
    return read_jsonl(path, "bfcl", "Run `dynbranch data bfcl`.")


def field_of(path: Path, record: str | int, raw: Mapping, name: str, kind: type) -> Any:
    """``raw[name]``, checked to be a ``kind``."""
    if name not in raw:
        raise MalformedRecordError(str(path), record_name(record), f"missing field {name!r}")
    value = raw[name]
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        raise MalformedRecordError(
            str(path),
            record_name(record),
            f"field {name!r} is {type(value).__name__}, expected {kind.__name__}",
        )
    return value


def record_name(record: str | int) -> str | int:
    """A record's id, or ``line N`` for a record read before its id was known."""
    return f"line {record}" if isinstance(record, int) else record


def turn_texts(
    path: Path, rid: str, question: list, fill_empty: Mapping[int, str] | None = None
) -> tuple[str, ...]:
    """One text per turn: its messages' contents, a non-user message prefixed by its role.

    A turn with no message is an error unless ``fill_empty`` gives its text (BFCL's
    ``miss_func`` turns that only offer new functions).
    """
    turns = []
    for t, turn in enumerate(question):
        if isinstance(turn, list) and not turn and fill_empty and t in fill_empty:
            turns.append(fill_empty[t])
            continue
        if not isinstance(turn, list) or not turn:
            raise MalformedRecordError(str(path), rid, f"turn {t} is not a list of messages")
        texts = []
        for message in turn:
            if (
                not isinstance(message, dict)
                or message.get("role") not in ROLES
                or not isinstance(message.get("content"), str)
            ):
                raise MalformedRecordError(
                    str(path),
                    rid,
                    f"turn {t}: messages must be {'/'.join(ROLES)} messages with text",
                )
            role, content = message["role"], message["content"]
            texts.append(content if role == "user" else f"[{role}] {content}")
        turns.append("\n".join(texts))
    if not turns:
        raise MalformedRecordError(str(path), rid, "no turns")
    return tuple(turns)


def check_doc(path: Path, rid: str | int, doc: Any) -> Mapping[str, Any]:
    """``doc``, deeply frozen (:func:`~dynbranch.canonical.freeze`), if it is a function doc:
    a name, and parameters with a typed property each."""
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
    return freeze(doc)
