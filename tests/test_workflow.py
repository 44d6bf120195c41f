"""The workflow model: stage validation, rendering, fingerprints, canonical encoding."""

import math

import pytest

from dynbranch.canonical import canonical_bytes, digest
from dynbranch.workflow import (
    BranchCoordinate,
    SamplingParams,
    StageSpec,
    SubgraphSpec,
    Template,
)


def _router(**kw):
    args = dict(name="router", kind="llm", inputs=("q", "docs"), prompt="Q: {q}\n{docs}",
                model="target", speculable=True)
    args.update(kw)
    return StageSpec(**args)


def test_render_uses_exactly_declared_inputs():
    r = _router().render({"q": "hi", "docs": [{"b": 1, "a": 2}], "unrelated": "x"})
    assert dict(r.fields) == {"q": "hi", "docs": [{"b": 1, "a": 2}]}
    assert r.text == 'Q: hi\n[{"a": 2, "b": 1}]'
    assert r.input_digest == digest({"docs": [{"a": 2, "b": 1}], "q": "hi"})


def test_render_missing_input_names_it():
    with pytest.raises(KeyError, match="docs"):
        _router().render({"q": "hi"})


def test_prompt_must_use_declared_inputs_and_speculable_must_be_greedy():
    with pytest.raises(ValueError, match="prompt uses"):
        _router(prompt="{q}")
    with pytest.raises(ValueError, match="sampling stage cannot be speculable"):
        _router(sampling=SamplingParams(temperature=0.7))
    with pytest.raises(ValueError, match="needs a tool name"):
        StageSpec("exec", "tool", ("call",))
    with pytest.raises(ValueError, match="cannot be speculable"):
        StageSpec("pick", "human", (), speculable=True)


def test_fingerprints_cover_definition_and_nesting():
    exec_ = StageSpec("exec", "tool", ("call",), tool="bfcl", tool_schema_version="1")
    t = Template("routing", "1", [_router(), exec_], [SubgraphSpec("g", "router", ("exec",))])
    same = Template("routing", "1", [_router(), exec_],
                    [SubgraphSpec("g", "router", ("exec",))])
    assert t.fingerprint("router") == same.fingerprint("router")
    assert t.fingerprint("g") == same.fingerprint("g")
    changed = [
        Template("routing", "2", [_router(), exec_]).fingerprint("router"),
        Template("routing", "1", [_router(prompt="Q:{q} {docs}"), exec_]).fingerprint("router"),
        Template("routing", "1", [_router(sampling=SamplingParams(max_tokens=9)), exec_]
                 ).fingerprint("router"),
        Template("routing", "1", [_router(model="drafter"), exec_]).fingerprint("router"),
    ]
    assert t.fingerprint("router") not in changed
    exec2 = StageSpec("exec", "tool", ("call",), tool="bfcl", tool_schema_version="2")
    t2 = Template("routing", "1", [_router(), exec2], [SubgraphSpec("g", "router", ("exec",))])
    assert t2.fingerprint("g") != t.fingerprint("g")  # a nested change reaches the subgraph


def test_template_rejects_unknown_subgraph_members():
    with pytest.raises(ValueError, match="unknown stages"):
        Template("t", "1", [_router()], [SubgraphSpec("g", "router", ("nope",))])


def test_canonical_bytes_are_order_independent_and_refuse_ambiguous_values():
    assert canonical_bytes({"a": 1, "b": [1, 2]}) == canonical_bytes({"b": (1, 2), "a": 1})
    assert canonical_bytes({"a": 1}) != canonical_bytes({"a": 1.0})
    assert canonical_bytes("1") != canonical_bytes(1)
    with pytest.raises(TypeError):
        canonical_bytes({1, 2})
    with pytest.raises(TypeError):
        canonical_bytes(math.nan)


def test_branch_coordinate_is_stable_text():
    assert str(BranchCoordinate("routing", "router", 2)) == "routing/router/2"
