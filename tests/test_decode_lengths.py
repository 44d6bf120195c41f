"""The decode-length model: deterministic per rendered input, the decision always last."""

import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dynbranch.decode_lengths import (
    RECORDED,
    THINK_CLOSE,
    DecodeModel,
    LengthModel,
    decision_of,
    filler,
)
from dynbranch.engines.tokenizer import count_tokens
from dynbranch.workflow import RenderedInput

MODEL = DecodeModel({"router": LengthModel(200, 0.6, 10, 2000, source="test")})


def rendered(stage="router", question="q"):
    return RenderedInput(stage, {"question": question}, f"Q: {question}")


@given(st.integers(0, 4000), st.integers(0, 2**63))
def test_a_filler_of_n_tokens_is_n_tokens_long(n, seed):
    assert count_tokens(filler(n, seed)) == n


def test_one_rendered_input_always_decodes_the_same_text():
    a = MODEL.wrap(rendered(question="x"), "handler_a")
    b = MODEL.wrap(rendered(question="x"), "handler_a")
    assert a == b and decision_of(a) == "handler_a" and THINK_CLOSE in a
    assert MODEL.wrap(rendered(question="x"), "handler_a", theta="t=0.7") != a


def test_another_input_or_salt_draws_another_length():
    lengths = {MODEL.reasoning_tokens(rendered(question=str(i))) for i in range(50)}
    assert len(lengths) > 30
    salted = DecodeModel(MODEL.stages, salt="other")
    assert salted.wrap(rendered(), "d") != MODEL.wrap(rendered(), "d")


def test_lengths_follow_the_stage_model_median_and_clip():
    draws = [MODEL.reasoning_tokens(rendered(question=str(i))) for i in range(2000)]
    assert statistics.median(draws) == pytest.approx(200, rel=0.06)
    assert min(draws) >= 10 and max(draws) <= 2000
    wide = DecodeModel({"router": LengthModel(200, 3.0, 10, 2000)})
    wide_draws = [wide.reasoning_tokens(rendered(question=str(i))) for i in range(500)]
    assert min(wide_draws) == 10 and max(wide_draws) == 2000


def test_scale_multiplies_the_median():
    doubled = DecodeModel(MODEL.stages, scale=2.0)
    assert doubled.reasoning_tokens(rendered()) == pytest.approx(
        2 * MODEL.reasoning_tokens(rendered()), abs=1)


def test_a_stage_without_a_model_and_the_recorded_mode_emit_the_decision_alone():
    assert MODEL.wrap(rendered(stage="handler"), "call()") == "call()"
    assert RECORDED.wrap(rendered(), "handler_a") == "handler_a"
    assert decision_of("plain text") == "plain text"


@pytest.mark.parametrize("kwargs,field", [
    ({"median_tokens": -1}, "median_tokens"), ({"median_tokens": 10, "sigma": -0.1}, "sigma"),
    ({"median_tokens": 10, "min_tokens": 5, "max_tokens": 4}, "min_tokens")])
def test_a_bad_length_model_is_refused_by_name(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LengthModel(**kwargs)
