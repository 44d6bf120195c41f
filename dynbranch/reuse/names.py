"""Reuse names: what makes two stage executions interchangeable, and its digest.

A :class:`ReuseKey` holds everything that can change a self-contained subgraph's output:
the subgraph fingerprint (stage definition, template version, nested children), the
complete rendered input fields, the model id and revision, the sampling/execution
parameters, the tool schema version, the tenant scope, and optional *extra keys* (as in
vLLM's block hashes: anything else the caller knows the output depends on, e.g. the
identity of per-request state a tool stage reads). Its :meth:`ReuseKey.key_bytes`
are the canonical msgpack encoding (:mod:`dynbranch.canonical`, never pickle), so equal keys
encode to equal bytes whatever the order of their mapping keys. The *reuse name* is a digest
of those bytes under an injectable hash function (as vLLM's block hashes are).

A name only finds a record; the full key bytes decide whether it is the right one. The
store keeps every record's key bytes and compares them on every hit, so a name collision
reads as a miss, never as a wrong value.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from dynbranch.canonical import Normalised, canonical_bytes
from dynbranch.errors import UnnameableInputError
from dynbranch.workflow import RenderedInput, SamplingParams, StageSpec

KEY_SCHEMA_VERSION = 1

HashFn = Callable[[bytes], str]


def sha256hex(data: bytes) -> str:
    """The default name hash: SHA-256 of ``data`` as 64 hex digits."""
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True, eq=False)
class ReuseKey:
    """The complete identity of one subgraph execution; equal keys mean equal outputs.

    ``fields`` is the rendered input (:attr:`RenderedInput.fields`); ``params`` the
    sampling/execution parameters (a :class:`SamplingParams` or a mapping); ``extra`` any
    further output-affecting context the fields do not carry. Equality and
    hashing are by :meth:`key_bytes`. Raises :class:`UnnameableInputError` when a part has
    no canonical encoding (a set, NaN, an arbitrary object): such a stage is not reusable.
    """

    fingerprint: str
    fields: Mapping[str, Any]
    model: str
    revision: str
    params: SamplingParams | Mapping[str, Any]
    tool_schema_version: str | None
    tenant: str
    extra: Mapping[str, Any] = field(default_factory=dict)
    schema: int = KEY_SCHEMA_VERSION
    normal_fields: Normalised | None = field(default=None, repr=False)
    """``fields`` already in canonical form (:attr:`RenderedInput.normal_fields`), if at hand."""
    _bytes: bytes = field(init=False, repr=False)

    def __post_init__(self) -> None:
        # NOTE: encoded once, here: the bytes are the key's identity, so a caller mutating
        # ``fields`` afterwards cannot make the name and the compared bytes disagree.
        try:
            canonical = self.canonical()
            if self.normal_fields is not None:
                canonical["fields"] = self.normal_fields  # the same bytes, walked once
            encoded = canonical_bytes(canonical)
        except TypeError as e:
            raise UnnameableInputError(f"fingerprint {self.fingerprint[:12]}", str(e)) from e
        object.__setattr__(self, "_bytes", encoded)

    def canonical(self) -> dict[str, Any]:
        """The key as a plain mapping (what is encoded)."""
        return {
            "schema": self.schema, "fingerprint": self.fingerprint, "fields": self.fields,
            "model": self.model, "revision": self.revision, "params": self.params,
            "tool_schema_version": self.tool_schema_version, "tenant": self.tenant,
            "extra": self.extra,
        }

    def key_bytes(self) -> bytes:
        """The canonical encoding of the whole key."""
        return self._bytes

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ReuseKey) and self._bytes == other._bytes

    def __hash__(self) -> int:
        return hash(self._bytes)


def reuse_name(key: ReuseKey, hash_fn: HashFn = sha256hex) -> str:
    """The reuse name of ``key``: ``hash_fn`` over its key bytes."""
    return hash_fn(key.key_bytes())


def key_for(stage: StageSpec, fingerprint: str, rendered: RenderedInput, *, model: str,
            revision: str, tenant: str, extra: Mapping[str, Any] | None = None) -> ReuseKey:
    """The reuse key of ``stage`` rendered to ``rendered``.

    ``fingerprint`` is ``Template.fingerprint(stage.name)`` (or of the subgraph rooted at
    it). ``model``/``revision`` name the concrete weights that serve the stage's model role;
    for tool stages pass the tool's implementation id and version (or ``""``). ``extra``
    carries output-affecting context outside the rendered input (see :class:`ReuseKey`).
    """
    if rendered.stage != stage.name:
        raise ValueError(f"rendered input of {rendered.stage!r} given for stage {stage.name!r}")
    # NOTE: sampling parameters are keyed for every stage kind, not only LLM stages: one rule,
    # and a tool stage's defaults are constant, so they never split names that should match.
    try:
        normal = rendered.normal_fields
    except TypeError:
        normal = None  # the key's own encoding raises the typed error
    return ReuseKey(fingerprint=fingerprint, fields=rendered.fields, model=model,
                    revision=revision, params=stage.sampling,
                    tool_schema_version=stage.tool_schema_version, tenant=tenant,
                    extra=dict(extra or {}), normal_fields=normal)
