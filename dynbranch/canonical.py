"""Canonical, unambiguous serialisation for fingerprints and reuse names.

Values are encoded with msgpack after a normalisation that makes equal values encode to
equal bytes: mapping keys are sorted by their own encoding, tuples become lists, and every
encoding starts with a schema version. Types that have no single canonical form (sets,
NaN, arbitrary objects) are refused rather than guessed; pickle is never used.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from typing import Any

import msgpack

SCHEMA_VERSION = 1


def _normal(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str, bytes)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            raise TypeError("NaN has no canonical encoding")
        return value
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, Mapping):
        items = [(_normal(k), _normal(v)) for k, v in value.items()]
        # NOTE: sort by the encoded key so mixed key types still order deterministically.
        items.sort(key=lambda kv: msgpack.packb(kv[0], use_bin_type=True))
        return {"__map__": [[k, v] for k, v in items]}
    canonical = getattr(value, "canonical", None)
    if callable(canonical):
        return _normal(canonical())
    raise TypeError(f"{type(value).__name__} has no canonical encoding")


def canonical_bytes(value: Any) -> bytes:
    """The canonical encoding of ``value`` (schema version first)."""
    return msgpack.packb([SCHEMA_VERSION, _normal(value)], use_bin_type=True)


def digest(value: Any) -> str:
    """SHA-256 hex digest of the canonical encoding of ``value``."""
    return hashlib.sha256(canonical_bytes(value)).hexdigest()


def value_digest(value: Any) -> str:
    """Digest of a stage's output: canonical when it has a canonical form, else of its repr.

    Used only to compare outputs (the splice checker), never to name anything.
    """
    try:
        return digest(value)
    except TypeError:
        return digest(repr(value))
