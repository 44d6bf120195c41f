"""Canonical, unambiguous serialisation for fingerprints and reuse names.

Values are encoded with msgpack after a normalisation that makes equal values encode to
equal bytes: mapping keys are sorted by their own encoding, tuples become lists, and every
encoding starts with a schema version. Types that have no single canonical form (sets,
NaN, arbitrary objects) are refused rather than guessed; pickle is never used.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

import msgpack

SCHEMA_VERSION = 1


_PACKED_KEYS: dict[str, bytes] = {}
"""Encoded string keys, by key: map keys repeat across values (schemas, messages)."""

_PACKED_KEYS_MAX = 1 << 16


def _key_order(item: tuple[Any, Any]) -> bytes:
    """The sort key of one normalised map item: its key's encoding."""
    key = item[0]
    if type(key) is not str:
        return msgpack.packb(key, use_bin_type=True)
    packed = _PACKED_KEYS.get(key)
    if packed is None:
        if len(_PACKED_KEYS) >= _PACKED_KEYS_MAX:
            _PACKED_KEYS.clear()  # NOTE: bounded; open-vocabulary keys must not grow it forever
        packed = _PACKED_KEYS[key] = msgpack.packb(key, use_bin_type=True)
    return packed


def _normal(value: Any) -> Any:
    # NOTE: exact-type fast paths first (the hot path of every reuse name and input digest);
    # subclasses and other types fall through to the general rules below, unchanged.
    t = type(value)
    if t is str or t is int or t is bool or value is None or t is bytes:
        return value
    if t is Normalised:
        return value.value
    if t is FrozenMap or t is FrozenList:
        return value.normal()
    if t is dict or t is MappingProxyType:
        return _normal_map(value)
    if t is list or t is tuple:
        return [_normal(v) for v in value]
    if isinstance(value, (bool, int, str, bytes)):
        return value
    if isinstance(value, float):
        if math.isnan(value):
            raise TypeError("NaN has no canonical encoding")
        return value
    if isinstance(value, (list, tuple)):
        return [_normal(v) for v in value]
    if isinstance(value, Mapping):
        return _normal_map(value)
    canonical = getattr(value, "canonical", None)
    if callable(canonical):
        return _normal(canonical())
    raise TypeError(f"{type(value).__name__} has no canonical encoding")


def _normal_map(value: Mapping[Any, Any]) -> dict[str, list[list[Any]]]:
    items = [(_normal(k), _normal(v)) for k, v in value.items()]
    # NOTE: sort by the encoded key so mixed key types still order deterministically.
    items.sort(key=_key_order)
    return {"__map__": [[k, v] for k, v in items]}


class Normalised:
    """A value already in canonical form (:func:`normalise`), encoded as is when nested.

    Lets a caller that encodes the same value inside several keys (a stage's rendered
    fields: its input digest and its reuse key) walk it once, and pack it once: its
    encoding is kept (:meth:`packed`) and spliced whole into the encoding of a mapping that
    holds it (:func:`canonical_bytes`).

    NOTE: the encoding is made first (:func:`normalise`), and the canonical form itself
    (:attr:`value`) only when something asks for it, read back from those bytes: a
    rendered input's fields are encoded into its digest and its reuse key, and nothing
    reads their normal form, so walking them into it as well was a second walk (3 % of a
    10,000-request Routing replay's time under cProfile, which inflates many small calls;
    with the kept BFCL state copies, the pair ran 0.968-0.987 of the CPU seconds, rows
    identical: ``scripts/BENCHMARKS.md``). msgpack gives back exactly what
    it encoded from a normal form (lists, maps, strings, bytes, ints, 64-bit floats,
    booleans and ``None``).
    """

    __slots__ = ("_packed", "_value")

    def __init__(self, value: Any = None, *, packed: bytes | None = None) -> None:
        if packed is None:
            packed = msgpack.packb(value, use_bin_type=True)
        self._packed = packed
        self._value = value

    @property
    def value(self) -> Any:
        """The canonical form (read back from the encoding on first use)."""
        if self._value is None and self._packed != b"\xc0":
            self._value = msgpack.unpackb(self._packed, raw=False, strict_map_key=False)
        return self._value

    def packed(self) -> bytes:
        """The msgpack encoding of the value."""
        return self._packed


class _Frozen:
    """What :class:`FrozenMap` and :class:`FrozenList` share: refusing change, a kept prompt
    text, and being their own copy (they cannot change, so a copy could only waste memory)."""

    __slots__ = ()

    def text(self, render: Callable[[Any], str]) -> str:
        """``render(self)``, kept for the next call with the same ``render``."""
        return _kept_text(self, render)  # type: ignore[arg-type]

    def _refuse(self, *args: Any, **kwargs: Any) -> None:
        plain = "dict" if isinstance(self, dict) else "list"
        raise TypeError(f"a {type(self).__name__} cannot be changed; copy it with {plain}(...) first")

    def __copy__(self) -> Any:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> Any:
        return self

    def __hash__(self) -> int:
        raise TypeError(f"unhashable type: {type(self).__name__!r}")


class FrozenMap(_Frozen, dict):
    """A deeply immutable mapping that walks itself into canonical form once.

    A ``dict`` to every reader (JSON rendering, equality, ``in``, iteration), but it refuses
    to be changed and keeps its canonical form: a value that recurs inside many rendered
    inputs (a function's schema, a message of a conversation) is walked once, not once per
    stage. Build it with :func:`freeze`, which freezes every value inside too; that is what
    makes the kept form safe to reuse.
    """

    __slots__ = ("_normal", "_packed", "_text")

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        dict.__init__(self, *args, **kwargs)
        self._normal = None
        self._packed: bytes | None = None
        self._text: tuple[Any, str] | None = None

    def normal(self) -> Any:
        if self._normal is None:
            self._normal = _normal_map(self)
        return self._normal

    def packed(self) -> bytes:
        """The encoding of :meth:`normal`, kept (composed from the values' own)."""
        if self._packed is None:
            self._packed = (_pack_map(self) if any(map(_keeps, self.values()))
                            else msgpack.packb(self.normal(), use_bin_type=True))
        return self._packed

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = _Frozen._refuse  # type: ignore[assignment]
    __ior__ = _Frozen._refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenMap, (dict(self),))


class FrozenList(_Frozen, list):
    """A deeply immutable sequence that keeps its canonical form (see :class:`FrozenMap`);
    a ``list`` to every reader, so it compares equal to the list it was frozen from."""

    __slots__ = ("_normal", "_packed", "_text")

    def __init__(self, *args: Any) -> None:
        list.__init__(self, *args)
        self._normal = None
        self._packed: bytes | None = None
        self._text: tuple[Any, str] | None = None

    def normal(self) -> Any:
        if self._normal is None:
            self._normal = [_normal(v) for v in self]
        return self._normal

    def packed(self) -> bytes:
        """The encoding of :meth:`normal`, kept (composed from the items' own)."""
        if self._packed is None:
            self._packed = (_array_head(len(self)) + b"".join(map(_pack, self))
                            if any(map(_keeps, self))
                            else msgpack.packb(self.normal(), use_bin_type=True))
        return self._packed

    __setitem__ = __delitem__ = append = extend = insert = pop = remove = _Frozen._refuse  # type: ignore[assignment]
    sort = reverse = clear = __iadd__ = __imul__ = _Frozen._refuse  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        return (FrozenList, (list(self),))


def _kept_text(frozen: FrozenMap | FrozenList, render: Callable[[Any], str]) -> str:
    kept = frozen._text
    if kept is None or kept[0] is not render:
        kept = frozen._text = (render, render(frozen))
    return kept[1]


def freeze(value: Any) -> Any:
    """``value`` made deeply immutable: mappings become :class:`FrozenMap`, lists and tuples
    :class:`FrozenList`, recursively; scalars are returned as they are.

    Values of other types are refused (``TypeError``): their immutability cannot be
    vouched for, and a kept canonical form over a value that changes would name the wrong
    input.
    """
    t = type(value)
    if t is FrozenMap or t is FrozenList:
        return value
    if t is str or t is int or t is bool or t is float or t is bytes or value is None:
        return value
    if isinstance(value, Mapping):
        return FrozenMap({k: freeze(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return FrozenList(freeze(v) for v in value)
    if isinstance(value, (bool, int, str, bytes, float)):
        return value
    raise TypeError(f"{type(value).__name__} cannot be frozen")


def normalise(value: Any) -> Normalised:
    """``value`` in canonical form; raises ``TypeError`` where :func:`canonical_bytes` would.

    Encoded at once (composed from the kept encodings of the frozen values inside it, see
    :func:`_pack`); its canonical form is read back only if asked for."""
    return Normalised(packed=_pack(value))


def _keeps(value: Any) -> bool:
    """Whether ``value`` keeps its own encoding."""
    t = type(value)
    return t is FrozenMap or t is FrozenList or t is Normalised


def _holds_kept(value: Any) -> bool:
    """Whether ``value`` keeps its own encoding or is a plain list or mapping holding one."""
    if _keeps(value):
        return True
    t = type(value)
    if t is list or t is tuple:
        return any(map(_keeps, value))
    if t is dict or t is MappingProxyType:
        return any(map(_keeps, value.values()))
    return False


def _pack(value: Any) -> bytes:
    """``msgpack.packb(_normal(value))``, composed where it pays: a frozen value's kept
    encoding is used whole, and a plain list or dict holding frozen values (directly or one
    level down: a stage's fields map to lists of frozen schemas and messages) is encoded as
    its header and its items' encodings (how msgpack encodes them), so a record's function
    schemas, carried by every stage input of its requests, are encoded once. Anything else
    is packed by msgpack whole, at C speed."""
    t = type(value)
    if t is FrozenMap or t is FrozenList or t is Normalised:
        return value.packed()
    if t is list or t is tuple:
        if any(map(_holds_kept, value)):
            return _array_head(len(value)) + b"".join(map(_pack, value))
    elif (t is dict or t is MappingProxyType) and any(map(_holds_kept, value.values())):
        return _pack_map(value)
    return msgpack.packb(_normal(value), use_bin_type=True)


def _pack_map(value: Mapping[Any, Any]) -> bytes:
    """A mapping's encoding in canonical form (:func:`_normal_map`), composed by
    :func:`_pack`."""
    items = [(_normal(k), v) for k, v in value.items()]
    items.sort(key=_key_order)
    parts = [_MAP_HEAD, _array_head(len(items))]
    for k, v in items:
        parts.append(b"\x92" + _key_order((k, v)))
        parts.append(_pack(v))
    return b"".join(parts)


_HEAD = b"\x92" + msgpack.packb(SCHEMA_VERSION)
"""The encoding's start: a two-item array, then the schema version."""
_MAP_HEAD = b"\x81" + msgpack.packb("__map__")
"""How a normalised mapping starts: a one-key map, its key."""


def _array_head(n: int) -> bytes:
    """msgpack's header of an array of ``n`` items."""
    if n < 16:
        return bytes((0x90 | n,))
    if n < 1 << 16:
        return b"\xdc" + n.to_bytes(2, "big")
    return b"\xdd" + n.to_bytes(4, "big")


def canonical_bytes(value: Any) -> bytes:
    """The canonical encoding of ``value`` (schema version first).

    NOTE: a frozen or :class:`Normalised` value, alone or inside a plain ``dict`` (a reuse
    key's fields), is spliced in as its kept encoding rather than packed again (see
    :func:`_pack`): msgpack encodes an array or map as a header and then its items'
    encodings, so the bytes are those of packing the whole (tests compare the two).
    """
    if _keeps(value) or type(value) is dict:
        return _HEAD + _pack(value)
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
