"""Reuse names: every output-affecting part changes the name, key order does not, and a
name collision (16-bit hash) reads as a miss because full key bytes are compared."""

import hashlib
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.canonical import canonical_bytes
from dynbranch.errors import UnnameableInputError
from dynbranch.reuse import (
    Hit,
    Miss,
    MissReason,
    Provenance,
    Record,
    ReuseKey,
    SubgraphStore,
    key_for,
    reuse_name,
    sha256hex,
)
from dynbranch.workflow import SamplingParams, StageSpec, Template

SAMPLING = SamplingParams(temperature=0.0, top_p=0.9, max_tokens=64, seed=7)
FIELDS = {"q": "who wrote it", "docs": [{"title": "A", "score": 1}, {"title": "B"}]}


def _key(**kw):
    args = dict(fingerprint="fp-1", fields=FIELDS, model="qwen3-32b", revision="r1",
                params=SAMPLING, tool_schema_version="3", tenant="acme")
    args.update(kw)
    return ReuseKey(**args)


def _bits16(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:4]


def test_default_name_is_sha256_of_key_bytes():
    key = _key()
    assert reuse_name(key) == hashlib.sha256(key.key_bytes()).hexdigest()
    assert key.key_bytes() == canonical_bytes(key.canonical())
    assert reuse_name(key, _bits16) == reuse_name(key)[:4]
    assert sha256hex(b"") == hashlib.sha256(b"").hexdigest()


def test_every_output_affecting_part_changes_the_name():
    variants = {
        "base": _key(),
        "fingerprint": _key(fingerprint="fp-2"),
        "input value": _key(fields={**FIELDS, "q": "who wrote it?"}),
        "nested input": _key(fields={**FIELDS, "docs": [{"title": "A", "score": 2},
                                                       {"title": "B"}]}),
        "extra input": _key(fields={**FIELDS, "k": 3}),
        "int vs float": _key(fields={**FIELDS, "docs": [{"title": "A", "score": 1.0},
                                                       {"title": "B"}]}),
        "model": _key(model="qwen3-8b"),
        "revision": _key(revision="r2"),
        "temperature": _key(params=SamplingParams(0.5, 0.9, 64, 7)),
        "top_p": _key(params=SamplingParams(0.0, 1.0, 64, 7)),
        "max_tokens": _key(params=SamplingParams(0.0, 0.9, 65, 7)),
        "seed": _key(params=SamplingParams(0.0, 0.9, 64, None)),
        "params as mapping": _key(params={**SAMPLING.canonical(), "stop": ["\n"]}),
        "tool schema": _key(tool_schema_version="4"),
        "no tool schema": _key(tool_schema_version=None),
        "tenant": _key(tenant="globex"),
        "extra key": _key(extra={"state": "routing-00042#1"}),
        "key schema": _key(schema=2),
    }
    names = {what: reuse_name(k) for what, k in variants.items()}
    assert len(set(names.values())) == len(variants), names


def test_reordering_mapping_keys_does_not_change_the_name():
    reordered = {"docs": [{"score": 1, "title": "A"}, {"title": "B"}], "q": "who wrote it"}
    params = dict(reversed(list(SAMPLING.canonical().items())))
    a, b = _key(), _key(fields=reordered, params=params)
    assert a == b and hash(a) == hash(b)
    assert reuse_name(a) == reuse_name(b)
    # a tuple and a list encode alike, as they render alike
    assert reuse_name(_key(fields={"q": (1, 2)})) == reuse_name(_key(fields={"q": [1, 2]}))


def test_key_is_frozen_at_construction():
    fields = {"q": "x"}
    key = _key(fields=fields)
    before = key.key_bytes()
    fields["q"] = "y"
    assert key.key_bytes() == before


@pytest.mark.parametrize("bad", [{"q": {1, 2}}, {"q": math.nan}, {"q": object()}])
def test_input_without_canonical_encoding_is_unnameable(bad):
    with pytest.raises(UnnameableInputError, match="cannot name reuse key"):
        _key(fields=bad)


def _template(**kw):
    args = dict(name="router", kind="llm", inputs=("q",), prompt="Q: {q}", model="target",
                sampling=SAMPLING, speculable=True, tool_schema_version="3")
    args.update(kw)
    return Template("routing", "1", [StageSpec(**args)])


def test_key_for_takes_fingerprint_fields_sampling_and_schema_from_the_stage():
    t = _template()
    stage = t.stage("router")
    rendered = stage.render({"q": "hi", "other": 1})
    key = key_for(stage, t.fingerprint("router"), rendered, model="qwen3-32b",
                  revision="r1", tenant="acme")
    assert key == ReuseKey(t.fingerprint("router"), {"q": "hi"}, "qwen3-32b", "r1",
                           SAMPLING.canonical(), "3", "acme")
    scoped = key_for(stage, t.fingerprint("router"), rendered, model="qwen3-32b",
                     revision="r1", tenant="acme", extra={"state": "s1"})
    assert scoped.extra == {"state": "s1"} and scoped != key
    t2 = _template(sampling=SamplingParams(0.0, 0.9, 65, 7))
    s2 = t2.stage("router")
    key2 = key_for(s2, t2.fingerprint("router"), s2.render({"q": "hi"}), model="qwen3-32b",
                   revision="r1", tenant="acme")
    assert reuse_name(key2) != reuse_name(key)


def test_key_for_refuses_another_stages_rendered_input():
    stage = _template().stage("router")
    other = StageSpec("exec", "tool", ("q",), tool="bfcl").render({"q": "hi"})
    with pytest.raises(ValueError, match="rendered input of 'exec'"):
        key_for(stage, "fp", other, model="m", revision="r", tenant="t")


def _colliding_keys() -> tuple[ReuseKey, ReuseKey]:
    seen: dict[str, ReuseKey] = {}
    for i in itertools.count():
        key = _key(fields={"q": f"question {i}"})
        name = reuse_name(key, _bits16)
        if name in seen:
            return seen[name], key
        seen[name] = key
    raise AssertionError("unreachable")


def test_a_16_bit_name_collision_is_a_miss_not_a_wrong_value():
    first, second = _colliding_keys()
    assert first != second and reuse_name(first, _bits16) == reuse_name(second, _bits16)
    prov = Provenance("req-1", 0.0, "engine-0", "c1")
    stored = Record.create(first, "answer to first", read_set={}, provenance=prov,
                           hash_fn=_bits16)
    store = SubgraphStore(1 << 20)
    assert store.put(stored, 0.0).stored
    got = store.lookup(stored.name, second.key_bytes(), 1.0)
    assert got == Miss(MissReason.COLLISION)
    assert store.stats.collisions == 1 and store.stats.misses == 1 and store.stats.hits == 0
    hit = store.lookup(stored.name, first.key_bytes(), 2.0)
    assert isinstance(hit, Hit) and hit.record.value == "answer to first"


json_leaf = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                      st.floats(allow_nan=False), st.text(max_size=8))
json_tree = st.recursive(json_leaf, lambda c: st.lists(c, max_size=3)
                         | st.dictionaries(st.text(max_size=5), c, max_size=3), max_leaves=12)


def _shuffled(value, rnd):
    if isinstance(value, dict):
        items = [(k, _shuffled(v, rnd)) for k, v in value.items()]
        rnd.shuffle(items)
        return dict(items)
    if isinstance(value, list):
        return [_shuffled(v, rnd) for v in value]
    return value


@settings(max_examples=150, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=6), json_tree, max_size=5), r=st.randoms())
def test_property_key_order_never_matters(fields, r):
    assert reuse_name(_key(fields=fields)) == reuse_name(_key(fields=_shuffled(fields, r)))


@settings(max_examples=150, deadline=None)
@given(fields=st.dictionaries(st.text(max_size=6), json_tree, min_size=1, max_size=5),
       data=st.data())
def test_property_changing_any_input_value_changes_the_name(fields, data):
    name = data.draw(st.sampled_from(sorted(fields)))
    new = data.draw(json_tree.filter(lambda v: canonical_bytes(v)
                                     != canonical_bytes(fields[name])))
    assert reuse_name(_key(fields=fields)) != reuse_name(_key(fields={**fields, name: new}))
