"""The conditional-logit predictor, and C3 keying its selection rates by the predictor's
own probabilities (``dynbranch.gate.gate.selection_arm``)."""

from __future__ import annotations

import random

import pytest

from dynbranch.cluster.gate.codec import (
    decode_candidate,
    decode_observation,
    encode_candidate,
    encode_observation,
)
from dynbranch.engines.profile import load_profile
from dynbranch.gate import Candidate, ContentionModel, FillShape, Gate, GateConfig, LoadView
from dynbranch.gate.gate import selection_arm
from dynbranch.gate.returns import Observation
from dynbranch.predictors import BranchContext, make_predictor
from dynbranch.predictors.frequency import FEATURES_KEY
from dynbranch.workflow import BranchCoordinate

END = "<end>"
COORD = BranchCoordinate("routing", "router", 0)


def _branch(rng: random.Random, i: int) -> tuple[BranchContext, tuple[str, ...]]:
    """A router-like branch: the end marker is offered always and chosen half the time,
    mostly after a call was made ("after=1": 80 %, "after=0": 20 %); otherwise one of
    eight functions never seen before is, and the turn's words hint at it ("hint", also on
    5 % of the others)."""
    functions = [f"f{i}_{j}" for j in range(8)]
    after = rng.random() < 0.5
    ends = rng.random() < (0.8 if after else 0.2)
    chosen = END if ends else rng.choice(functions)
    features = {END: [f"after={int(after)}"]}
    for f in functions:
        features[f] = ["hint"] if f == chosen or rng.random() < 0.05 else []
    ctx = BranchContext(f"r{i}", COORD, (END, *functions), {FEATURES_KEY: features})
    return ctx, (chosen,)


def _top1(name: str, seed: int = 0) -> float:
    rng, predictor = random.Random(seed), make_predictor(name)
    for i in range(400):
        predictor.observe(*_branch(rng, i))
    hits = 0
    for i in range(400, 700):
        ctx, chosen = _branch(rng, i)
        hits += predictor.rank(ctx, 1) == list(chosen)
    return hits / 300


def test_it_weighs_tokens_where_summed_pick_rates_cannot():
    # summed pick rates: the end marker's own (0.5) plus "after=0"'s (0.2) beat "hint"'s
    # (about 0.57), so the end ranks first even before any call; the logit model weighs them
    logit, frequency = _top1("logit"), _top1("frequency")
    assert logit > 0.7 and frequency < 0.55  # the best possible here is about 0.74


def test_its_probabilities_are_calibrated_on_what_it_learnt():
    rng, predictor = random.Random(1), make_predictor("logit")
    ctxs = []
    for i in range(3000):
        marked = rng.random() < 0.5
        features = {"a": ["mark"] if marked else [], "b": []}
        ctx = BranchContext(f"r{i}", COORD, ("a", "b"), {FEATURES_KEY: features})
        # when "a" is marked it is chosen 80 % of the time, else 50 %
        chosen = "a" if rng.random() < (0.8 if marked else 0.5) else "b"
        predictor.observe(ctx, (chosen,))
        ctxs.append((ctx, marked))
    marked_ctx = next(c for c, m in ctxs if m)
    plain_ctx = next(c for c, m in ctxs if not m)
    probs = predictor.confidences(marked_ctx)
    assert sum(probs.values()) == pytest.approx(1.0)
    assert probs["a"] == pytest.approx(0.8, abs=0.06)
    assert predictor.confidences(plain_ctx)["a"] == pytest.approx(0.5, abs=0.06)


def test_ranking_learns_nothing_and_an_unoffered_choice_teaches_nothing():
    rng, predictor = random.Random(2), make_predictor("logit")
    for i in range(50):
        predictor.observe(*_branch(rng, i))
    ctx, _ = _branch(rng, 99)
    before = dict(predictor._weights)
    first = predictor.rank(ctx, 9)
    assert predictor.rank(ctx, 9) == first and predictor._weights == before
    predictor.observe(ctx, ("not-offered",))
    assert predictor._weights == before


def test_predictors_without_probabilities_report_none():
    ctx = BranchContext("r", COORD, ("a",), {})
    assert make_predictor("frequency").confidences(ctx) is None
    with pytest.raises(ValueError):
        make_predictor("logit", learning_rate=0.0)


# -- C3 keyed by the predictor's own probability ------------------------------------------

P32 = load_profile("qwen3-32b@h200")
SHAPE = FillShape(prompt_tokens=256, output_tokens=32)


def _cand(name: str, rank: int, confidence: float | None) -> Candidate:
    return Candidate(name, rank, "handler", 1000.0, SHAPE, SHAPE.kv_blocks(16), confidence)


def test_the_selection_arm_is_the_rank_or_the_probability_decile():
    assert selection_arm(3, None) == 3
    assert [selection_arm(0, p) for p in (0.0, 0.099, 0.1, 0.55, 0.999, 1.0)] == [
        "p0", "p0", "p1", "p5", "p9", "p9"]
    with pytest.raises(ValueError):
        _cand("x", 0, 1.5)


def test_the_gate_learns_and_reads_rates_per_decile_not_per_rank():
    gate = Gate(ContentionModel.from_profile(P32), GateConfig(audit_rate=0.0, fanout=4))
    for _ in range(60):
        # at rank 1, candidates the predictor is sure of are chosen; unsure ones are not
        gate.observe("handler", 1, selected=True, usable=True, confidence=0.93)
        gate.observe("handler", 1, selected=False, confidence=0.04)
    out = gate.admit("routing/router/0", [_cand("sure", 1, 0.95), _cand("unsure", 1, 0.02),
                                          _cand("ranked", 1, None)], LoadView(rho=0.05), 0.0)
    sure, unsure, ranked = out
    assert sure.p_sel > 0.9 and unsure.p_sel < 0.1
    assert 0.3 < ranked.p_sel < 0.7  # the rank-1 arm learnt nothing: its prior's quantile
    for a in out:
        if a.reservation is not None:
            gate.release(a.reservation)


def test_the_wire_rows_carry_the_confidence_and_read_older_rows():
    c = _cand("x", 2, 0.25)
    assert decode_candidate(encode_candidate(c)) == c
    assert decode_candidate(encode_candidate(c)[:-1]) == _cand("x", 2, None)
    o = Observation("handler", 2, True, False, 0.25)
    assert decode_observation(encode_observation(o)) == o
    assert decode_observation(["handler", 2, True, None]) == Observation("handler", 2, True)
