"""The conditional-logit predictor, and C3 keying its selection rates by the predictor's
own probabilities (``dynbranch.gate.gate.selection_arm``)."""

from __future__ import annotations

import math
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
from dynbranch.predictors.base import EVIDENCE_KEY, softmax
from dynbranch.predictors.frequency import FEATURES_KEY
from dynbranch.workflow import BranchCoordinate

END = "<end>"
COORD = BranchCoordinate("routing", "router", 0)
COORD_STAGE = ("routing", "router")


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
    before = predictor.learnt()
    first = predictor.rank(ctx, 9)
    assert predictor.rank(ctx, 9) == first and predictor.learnt() == before
    predictor.observe(ctx, ("not-offered",))
    assert predictor.learnt() == before


class _PerTokenLogit:
    """The conditional logit written as a loop over tokens, dicts of floats: the reference
    the array implementation must match to the bit."""

    def __init__(self, lr: float = 0.2, l2: float = 1e-2) -> None:
        self.lr, self.l2 = lr, l2
        self.weights: dict[str, float] = {}
        self.squares: dict[str, float] = {}

    def scores(self, tokens: list[tuple[str, ...]]) -> list[float]:
        return [sum(self.weights.get(t, 0.0) for t in toks) for toks in tokens]

    def observe(self, candidates: list[str], tokens: list[tuple[str, ...]],
                chosen: tuple[str, ...]) -> None:
        taken = [c for c in dict.fromkeys(chosen) if c in candidates]
        if not taken:
            return
        gradient: dict[str, float] = {}
        for c, toks, p in zip(candidates, tokens, softmax(self.scores(tokens)), strict=True):
            for t in toks:
                gradient[t] = gradient.get(t, 0.0) + ((1.0 / len(taken) if c in taken else 0.0) - p)
        for t, g in gradient.items():
            w = self.weights.get(t, 0.0)
            g -= self.l2 * w
            sq = self.squares[t] = self.squares.get(t, 1e-8) + g * g
            self.weights[t] = w + self.lr * g / math.sqrt(sq)


def _offer(rng: random.Random, words: list[str], functions: int, most: int, said: int
           ) -> tuple[tuple[str, ...], dict[str, list[str]]]:
    """Random candidates (up to ``most`` of ``functions``) with features: a token some
    share, and each of up to ``said`` words crossed with the candidate."""
    candidates = tuple(dict.fromkeys(f"c{rng.randrange(functions)}"
                                     for _ in range(rng.randint(1, most))))
    spoken = rng.sample(words, rng.randint(0, said))
    return candidates, {c: [f"shared={rng.randrange(3)}", *(f"{w}>{c}" for w in spoken)]
                        for c in candidates}


def test_the_array_steps_equal_a_per_token_loop_to_the_bit():
    # random branches whose candidates share some tokens and not others, ranked before
    # they are learnt and interleaved (other branches learnt between), multi-valued too
    rng, predictor, reference = random.Random(7), make_predictor("logit"), _PerTokenLogit()
    words = [f"w{i}" for i in range(40)]
    opened = []
    for i in range(600):
        candidates, features = _offer(rng, words, 30, 12, 8)
        ctx = BranchContext(f"r{i}", COORD, candidates, {FEATURES_KEY: features})
        chosen = tuple(rng.sample(candidates, min(len(candidates), rng.choice((1, 1, 1, 2)))))
        if rng.random() < 0.1:
            chosen = ("not-offered",)
        if rng.random() < 0.7:
            predictor.rank(ctx, 3)
        opened.append((ctx, chosen))
        if len(opened) > 5 or rng.random() < 0.3:
            ctx, chosen = opened.pop(rng.randrange(len(opened)))
            cands = list(dict.fromkeys(ctx.candidates))
            tokens = [predictor.tokens(ctx, c) for c in cands]
            assert predictor.probabilities(ctx) == dict(
                zip(cands, softmax(reference.scores(tokens)), strict=True))
            predictor.observe(ctx, chosen)
            reference.observe(cands, tokens, chosen)
    assert predictor.learnt() == {COORD_STAGE: reference.weights}


def test_named_evidence_is_learnt_as_if_read_afresh(monkeypatch):
    # branches whose evidence recurs under one name (a repeated request: new request id, new
    # evidence object, same content), learnt with or without being ranked first, others
    # learnt in between, one unhashable name, names whose evidence is offered with other
    # candidates, and a memory small enough to forget: the predictor that remembers named
    # branches scores and learns exactly as one that reads every branch afresh
    monkeypatch.setattr("dynbranch.predictors.logit.NAMED_BRANCHES", 25)
    rng = random.Random(11)
    named, plain = make_predictor("logit"), make_predictor("logit")
    words = [f"w{i}" for i in range(30)]
    contents = []
    for j in range(60):
        candidates, features = _offer(rng, words, 20, 9, 6)
        contents.append((("content", j) if j != 7 else ["unhashable"], candidates, features))
    # the same evidence offering other candidates: one name, several branches
    contents += [(n, c[::-1][:rng.randint(1, len(c))], f) for n, c, f in contents[:20]]
    opened = []
    for i in range(900):
        name, candidates, features = rng.choice(contents)
        copy = {c: list(f) for c, f in features.items()}  # fresh objects, equal content
        ctx = BranchContext(f"r{i}", COORD, candidates,
                            {FEATURES_KEY: copy, EVIDENCE_KEY: name})
        bare = BranchContext(f"r{i}", COORD, candidates, {FEATURES_KEY: copy})
        chosen = (rng.choice(candidates),)
        if rng.random() < 0.5:
            assert named.probabilities(ctx) == plain.probabilities(bare)
            assert named.rank(ctx, 3) == plain.rank(bare, 3)
        opened.append((ctx, bare, chosen))
        if len(opened) > 4 or rng.random() < 0.4:
            ctx, bare, chosen = opened.pop(rng.randrange(len(opened)))
            assert named.probabilities(ctx) == plain.probabilities(bare)
            named.observe(ctx, chosen)
            plain.observe(bare, chosen)
    assert named.learnt() == plain.learnt()
    assert 0 < len(named._named) <= 25 and not plain._named


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
