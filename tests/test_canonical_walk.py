"""The canonical encoding's fast paths and shared walk give the bytes of the plain rules."""

import math
from collections import OrderedDict
from collections.abc import Mapping
from enum import IntEnum
from types import MappingProxyType

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.canonical import SCHEMA_VERSION, canonical_bytes, digest, normalise
from dynbranch.errors import UnnameableInputError
from dynbranch.reuse import ReuseKey, key_for
from dynbranch.workflow import SamplingParams, StageSpec, Template


def _reference(value):
    """The encoding rules written plainly (no fast paths, no caches)."""

    def normal(v):
        if v is None or isinstance(v, (bool, int, str, bytes)):
            return v
        if isinstance(v, float):
            if math.isnan(v):
                raise TypeError("NaN")
            return v
        if isinstance(v, (list, tuple)):
            return [normal(x) for x in v]
        if isinstance(v, Mapping):
            items = [(normal(k), normal(x)) for k, x in v.items()]
            items.sort(key=lambda kv: msgpack.packb(kv[0], use_bin_type=True))
            return {"__map__": [[k, x] for k, x in items]}
        return normal(v.canonical())

    return msgpack.packb([SCHEMA_VERSION, normal(value)], use_bin_type=True)


class Level(IntEnum):
    LOW = 1


class Label(str):
    pass


leaf = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=4),
    st.just(Level.LOW),
    st.just(Label("x")),
)
key = st.one_of(
    st.text(max_size=40), st.integers(-5, 5), st.binary(max_size=3), st.tuples(st.integers(0, 2))
)
tree = st.recursive(
    leaf,
    lambda c: (
        st.lists(c, max_size=3)
        | st.tuples(c, c)
        | st.dictionaries(key, c, max_size=4)
        | st.dictionaries(key, c, max_size=3).map(MappingProxyType)
        | st.dictionaries(key, c, max_size=3).map(OrderedDict)
    ),
    max_leaves=16,
)


@settings(max_examples=400, deadline=None)
@given(tree)
def test_the_bytes_are_those_of_the_plain_rules(value):
    assert canonical_bytes(value) == _reference(value)
    assert canonical_bytes({"nested": normalise(value)}) == _reference({"nested": value})
    assert canonical_bytes(normalise(value)) == _reference(value)
    # the canonical form is read back from the kept encoding: the plain rules' form
    assert normalise(value).value == msgpack.unpackb(_reference(value), raw=False,
                                                     strict_map_key=False)[1]
    assert canonical_bytes([normalise(value)]) == _reference([value])


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.text(max_size=12), st.tuples(tree, st.booleans()), max_size=20))
def test_kept_encodings_spliced_into_a_mapping_give_its_bytes(items):
    # a mapping with string keys whose values are partly normalised (their encoding kept
    # and spliced in whole), up to 20 items (msgpack's 16-bit array header from 16)
    mixed = {k: normalise(v) if kept else v for k, (v, kept) in items.items()}
    plain = {k: v for k, (v, _kept) in items.items()}
    assert canonical_bytes(mixed) == canonical_bytes(mixed) == _reference(plain)


def _stage():
    sampling = SamplingParams(temperature=0.0, top_p=1.0, max_tokens=8, seed=1)
    t = Template(
        "w",
        "1",
        [
            StageSpec(
                "s", "llm", ("q", "docs"), prompt="{q}{docs}", model="target", sampling=sampling
            )
        ],
    )
    return t, t.stage("s")


def test_a_rendered_input_is_walked_once_and_names_as_before():
    t, stage = _stage()
    rendered = stage.render({"q": "hi", "docs": [{"b": 1, "a": [1.5, None]}]})
    assert rendered.input_digest == digest(dict(rendered.fields))
    assert rendered.normal_fields is rendered.normal_fields  # cached
    key = key_for(stage, t.fingerprint("s"), rendered, model="m", revision="r", tenant="t")
    plain = ReuseKey(t.fingerprint("s"), dict(rendered.fields), "m", "r", stage.sampling, None, "t")
    assert key.normal_fields is rendered.normal_fields and key.key_bytes() == plain.key_bytes()


def test_an_unnameable_rendered_input_is_still_a_typed_error():
    t, stage = _stage()
    rendered = stage.render({"q": "hi", "docs": [math.nan]})
    with pytest.raises(UnnameableInputError):
        key_for(stage, t.fingerprint("s"), rendered, model="m", revision="r", tenant="t")


json_like = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=10), c, max_size=4),
    max_leaves=25,
)


@settings(max_examples=200, deadline=None)
@given(json_like)
def test_a_frozen_value_encodes_renders_and_compares_as_the_value(value):
    import copy
    import json
    import pickle

    from dynbranch.canonical import freeze

    frozen = freeze(value)
    assert frozen == value
    assert canonical_bytes(frozen) == _reference(value)
    # its kept form, read again and from inside plain containers, is the same bytes
    assert canonical_bytes(frozen) == _reference(value)
    assert canonical_bytes({"k": [frozen, frozen]}) == _reference({"k": [value, value]})
    assert json.dumps(frozen, sort_keys=True) == json.dumps(value, sort_keys=True)
    thawed = pickle.loads(pickle.dumps(frozen))
    assert thawed == value and canonical_bytes(thawed) == _reference(value)
    assert copy.deepcopy(frozen) is frozen


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(json_like, st.sampled_from(("frozen", "plain", "normalised"))),
                max_size=18), st.text(max_size=8))
def test_kept_encodings_composed_at_any_depth_give_the_plain_bytes(parts, name):
    # frozen, normalised and plain values side by side in plain lists and dicts, at two
    # depths, encoded (so their kept encodings are composed) and encoded again
    from dynbranch.canonical import freeze

    def kept(value, how):
        return freeze(value) if how == "frozen" else normalise(value) if how == "normalised" \
            else value

    mixed = [kept(v, how) for v, how in parts]
    plain = [v for v, _how in parts]
    value = {name: mixed, "inner": {"list": mixed[:3], "one": mixed[-1] if mixed else None}}
    expected = _reference({name: plain, "inner": {"list": plain[:3],
                                                  "one": plain[-1] if plain else None}})
    assert canonical_bytes(value) == canonical_bytes(value) == expected
    assert canonical_bytes(normalise(value)) == expected
    assert canonical_bytes(mixed) == _reference(plain)


def test_a_frozen_value_refuses_every_change_at_every_depth():
    from dynbranch.canonical import freeze

    frozen = freeze({"a": [1, {"b": [2]}], "c": {"d": 3}})
    before = canonical_bytes(frozen)
    changes = [
        lambda: frozen.__setitem__("x", 1), lambda: frozen.update(x=1), lambda: frozen.pop("a"),
        lambda: frozen["a"].append(4), lambda: frozen["a"].__setitem__(0, 9),
        lambda: frozen["a"][1]["b"].extend([5]), lambda: frozen["c"].setdefault("e", 1),
        lambda: frozen["a"].sort(), lambda: frozen.clear(),
    ]
    for change in changes:
        with pytest.raises(TypeError):
            change()
    assert canonical_bytes(frozen) == before == _reference({"a": [1, {"b": [2]}], "c": {"d": 3}})
    # a copy is a plain, changeable value again
    copied = dict(frozen)
    copied["x"] = 1
    assert canonical_bytes(copied) != before


def test_freezing_refuses_what_it_cannot_vouch_for():
    from dynbranch.canonical import freeze

    with pytest.raises(TypeError):
        freeze({"a": {1, 2}})
    class Named:
        def canonical(self):
            return "named"

    with pytest.raises(TypeError):
        freeze([Named()])  # encodable, but it could change after its form was kept


@settings(max_examples=200, deadline=None)
@given(st.lists(json_like, max_size=4), st.lists(st.booleans(), min_size=4, max_size=4))
def test_a_value_with_frozen_parts_renders_the_text_of_the_plain_value(items, frozen_at):
    import json

    from dynbranch.canonical import freeze
    from dynbranch.workflow import as_text

    mixed = [freeze(v) if f else v for v, f in zip(items, frozen_at, strict=False)]
    plain = json.dumps(items, sort_keys=True, ensure_ascii=False, separators=(", ", ": "))
    assert as_text(mixed) == as_text(tuple(mixed)) == as_text(items) == plain
    assert as_text(mixed) == plain  # the kept texts, read a second time
    assert as_text(freeze(items)) == plain
