"""Property tests of the gate: quantiles invert the CDF, the envelope is the windowed max
of the piecewise-constant load, the price is monotone, and reservations stay atomic and
leak-free over random candidate sets and interleaved releases."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from dynbranch.engines.profile import load_profile
from dynbranch.gate import (
    ADMITTED,
    AUDIT,
    FANOUT,
    NEGATIVE_UTILITY,
    NO_KV,
    BranchReturn,
    Candidate,
    ContentionModel,
    FillShape,
    Gate,
    GateConfig,
    LoadEnvelope,
    LoadView,
    beta_quantile,
    betainc,
    betaincc,
)
from dynbranch.gate.beta import quantile_upper_bound

P32 = load_profile("qwen3-32b@h200")
MODEL = ContentionModel.from_profile(P32)

shapes_ = st.floats(0.2, 200.0)
unit = st.floats(0.0, 1.0)
views = st.builds(LoadView, unit, unit, unit)
fills = st.builds(FillShape, st.integers(1, 20_000), st.integers(1, 2_000), st.integers(0, 20_000))


# -- Beta quantiles -------------------------------------------------------------------------


levels = st.one_of(
    st.floats(1e-300, 0.5),  # lower tails, down to the tiny
    st.floats(-15.0, -0.3011).map(lambda e: 1.0 - 10.0**e),  # upper tails, up to 1 - 1e-15
)


@settings(max_examples=300, deadline=None)
@given(shapes_, shapes_, levels)
@example(0.203125, 44.0, 0.999999999999999)  # q and I_{1/2} round to neighbours near 1
def test_quantile_inverts_the_cdf_to_relative_precision(a, b, q):
    x = beta_quantile(a, b, q)
    assert 0.0 <= x <= 1.0
    # The small tail at x's float neighbours brackets the target to 1e-9 relative
    # (x itself may not be representable: Beta(1, 0.25) at q = 1 - 1e-6 is 1 - 1e-24).
    below, above = math.nextafter(x, 0.0), math.nextafter(x, 1.0)
    if q < 0.5:
        assert betainc(a, b, below) * (1 - 1e-9) <= q <= betainc(a, b, above) * (1 + 1e-9)
    else:
        tail = 1.0 - q
        assert betaincc(a, b, above) * (1 - 1e-9) <= tail <= betaincc(a, b, below) * (1 + 1e-9)


@settings(max_examples=100, deadline=None)
@given(shapes_, shapes_, st.floats(0.0, 1.0), st.floats(0.0, 1.0))
def test_quantile_is_monotone_in_the_level(a, b, q1, q2):
    lo, hi = sorted((q1, q2))
    assert beta_quantile(a, b, lo) <= beta_quantile(a, b, hi) + 1e-12


# -- the envelope ---------------------------------------------------------------------------

steps = st.lists(
    st.tuples(st.floats(0.0, 3.0), views, st.booleans()), min_size=1, max_size=40
)  # (time increment, view, also query after observing)


@settings(max_examples=150, deadline=None)
@given(st.floats(0.0, 5.0), steps, st.floats(0.0, 10.0))
def test_envelope_is_the_windowed_max_of_the_held_load(window, script, tail):
    env = LoadEnvelope(window)
    history: list[tuple[float, LoadView]] = []
    now = 0.0

    def brute(t: float) -> LoadView:
        # The load is piecewise constant: each observation holds until the next one.
        held = [v for i, (s, v) in enumerate(history)
                if (history[i + 1][0] if i + 1 < len(history) else float("inf")) > t - window
                and s <= t]  # fmt: skip
        return LoadView(*(max(v.as_tuple()[k] for v in held) for k in range(3)))

    for dt, view, query in script:
        now += dt
        env.observe(view, now)
        history.append((now, view))
        if query:
            assert env.priced(now) == brute(now)
    assert env.priced(now + tail) == brute(now + tail)


# -- the price ------------------------------------------------------------------------------


@settings(max_examples=200, deadline=None)
@given(fills, views, views)
def test_price_is_monotone_in_load(fill, v1, v2):
    lo = LoadView(*(min(a, b) for a, b in zip(v1.as_tuple(), v2.as_tuple(), strict=True)))
    hi = lo.max(v1).max(v2)
    assert MODEL.price_ms(fill, lo) <= MODEL.price_ms(fill, hi) * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(fills, views, st.integers(0, 5_000), st.integers(0, 500), st.integers(0, 5_000))
def test_price_is_monotone_in_fill_size_and_context(fill, view, dp, do, dc):
    bigger = FillShape(fill.prompt_tokens + dp, fill.output_tokens + do, fill.context_tokens + dc)
    assert MODEL.price_ms(fill, view) <= MODEL.price_ms(bigger, view) * (1 + 1e-12)


# -- greedy admission and reservations ------------------------------------------------------

candidate_sets = st.lists(
    st.tuples(
        st.floats(0.0, 5_000.0),  # gain
        st.integers(1, 4_096),  # prompt
        st.integers(1, 256),  # output
        st.integers(0, 400),  # kv blocks
    ),
    min_size=0,
    max_size=6,
)


def _candidates(raw, tag: str) -> list[Candidate]:
    return [
        Candidate(f"{tag}{i}", i, f"stage{i % 2}", gain, FillShape(p, o), blocks)
        for i, (gain, p, o, blocks) in enumerate(raw)
    ]


@settings(max_examples=120, deadline=None)
@given(
    st.lists(st.tuples(candidate_sets, views, st.lists(st.booleans(), max_size=6)), max_size=8),
    st.integers(0, 4),  # fanout
    st.integers(0, 1_200),  # global KV capacity
    st.one_of(st.none(), st.integers(0, 600)),  # per-branch cap
    st.floats(0.0, 0.5),  # audit rate
    st.integers(0, 3),  # seed
)
def test_reservations_are_atomic_and_leak_free(branches, fanout, capacity, cap, audit, seed):
    gate = Gate(
        MODEL,
        GateConfig(
            fanout=fanout,
            kv_budget_blocks=capacity,
            branch_kv_blocks=cap,
            audit_rate=audit,
            seed=seed,
        ),
    )
    held = []
    for b, (raw, view, releases) in enumerate(branches):
        cands = _candidates(raw, f"b{b}c")
        free_before = gate.ledger.free
        out = gate.admit(f"coord{b}", cands, view, float(b))
        assert [a.candidate for a in out] == [c.name for c in cands]
        admitted = [a for a in out if a.admitted]
        blocks = {c.name: c.kv_blocks for c in cands}
        # Never over budget, and each admission is exactly its candidate's blocks.
        assert gate.reserved_blocks <= gate.ledger.capacity
        assert sum(blocks[a.candidate] for a in admitted) == free_before - gate.ledger.free
        assert all(a.reservation.blocks == blocks[a.candidate] for a in admitted)
        assert len(admitted) <= fanout
        if cap is not None:
            assert sum(blocks[a.candidate] for a in admitted) <= cap
        for a in out:
            assert a.admitted == (a.reason in (ADMITTED, AUDIT))
            assert a.audit == (a.reason == AUDIT)
            if a.reason == ADMITTED:
                assert a.utility_ms > 0
            if a.reason == NEGATIVE_UTILITY:
                assert a.utility_ms <= 0
            if a.reason == FANOUT:
                assert a.utility_ms > 0 and len(admitted) == fanout
            if a.reason == NO_KV:
                assert a.utility_ms > 0
        held += [a.reservation for a in admitted]
        # Release some fills (as if they ended), some twice.
        for i, again in enumerate(releases):
            if i < len(held):
                receipt = held[i]
                gate.release(receipt)
                if again:
                    assert gate.release(receipt) is False
        held = [r for r in held if r in gate.ledger.outstanding]
        assert gate.reserved_blocks == sum(r.blocks for r in gate.ledger.outstanding)
    for receipt in list(gate.ledger.outstanding):
        assert gate.release(receipt)
    assert gate.reserved_blocks == 0 and gate.ledger.free == gate.ledger.capacity


@settings(max_examples=40, deadline=None)
@given(
    st.lists(st.tuples(candidate_sets, views, st.booleans(), st.floats(-500.0, 500.0)), max_size=6),
    st.integers(0, 3),
)
def test_checkpoint_round_trip_over_random_histories(branches, seed):
    gate = Gate(MODEL, GateConfig(seed=seed, audit_rate=0.2, generation_audit_rate=0.2))
    for b, (raw, view, selected, ret) in enumerate(branches):
        gate.generation(f"coord{b % 2}", float(b))
        cands = _candidates(raw, f"b{b}c")
        gate.admit(f"coord{b % 2}", cands, view, float(b))
        for c in cands:
            gate.observe(c.stage_key, c.rank, selected and c.rank == 0, usable=selected or None)
        gate.settle(f"coord{b % 2}", BranchReturn(saved_ms=ret))
    state = gate.state()
    assert json.loads(json.dumps(state)) == state
    restored = Gate.from_state(json.loads(json.dumps(state)))
    assert restored.state() == state
    probe = _candidates([(1000.0, 64, 8, 2), (10.0, 64, 8, 2)], "probe")
    assert restored.admit("coord0", probe, LoadView(rho=0.1), 99.0) == gate.admit(
        "coord0", probe, LoadView(rho=0.1), 99.0
    )
    assert restored.generation("coord1", 99.0) == gate.generation("coord1", 99.0)


# -- refusing on a bound of the quantile ------------------------------------------------------

wide_shapes = st.floats(-0.7, 5.0).map(lambda e: 10.0**e)  # 0.2 … 100,000


@settings(max_examples=400, deadline=None)
@given(wide_shapes, wide_shapes, levels)
@example(290.0, 30_000.0, 1.0 - 1e-5)  # a low decile of Routing's router, late in a run
def test_the_quantile_bound_is_never_below_the_quantile(a, b, q):
    assert quantile_upper_bound(a, b, q) >= beta_quantile(a, b, q)


def _history(branches, seed: int, policy: str) -> tuple[list[list], dict]:
    """Admissions and final state of one gate over a random history, learning as it goes."""
    gate = Gate(MODEL, GateConfig(policy=policy, p_star=0.3, seed=seed, audit_rate=0.3))
    out = []
    for b, (raw, view, chosen, confidences) in enumerate(branches):
        cands = [replace(c, confidence=confidences[c.rank % len(confidences)])
                 for c in _candidates(raw, f"b{b}c")]
        admissions = gate.admit(f"coord{b % 3}", cands, view, float(b))
        out.append(admissions)
        for a in admissions:
            if a.reservation is not None:
                gate.release(a.reservation)
        for c in cands:
            picked = c.rank == chosen
            gate.observe(c.stage_key, c.rank, picked, usable=picked or None,
                         confidence=c.confidence)
    return out, gate.state()


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.tuples(candidate_sets, views, st.integers(-1, 5),
                       st.lists(st.floats(0.0, 1.0), min_size=1, max_size=6)),
             min_size=1, max_size=40),
    st.integers(0, 3),
    st.sampled_from(["priced", "fixed_threshold"]),
)
def test_refusing_on_the_bound_decides_exactly_as_solving_every_quantile(branches, seed, policy):
    """The gate skips the quantile of a candidate its upper bound already refuses; every
    decision, reservation, audit and the learnt state are those of a gate that solves each
    one, and a record marked ``bounded`` only overstates a refused candidate's p and
    utility."""
    import dynbranch.gate.gate as gate_module

    lazy, lazy_state = _history(branches, seed, policy)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(gate_module._Optimism, "solved", property(lambda self: True))
        eager, eager_state = _history(branches, seed, policy)
    assert lazy_state == eager_state
    for mine, theirs in zip(lazy, eager, strict=True):
        for a, e in zip(mine, theirs, strict=True):
            assert not e.bounded
            if a.bounded:
                assert (a.reason, a.audit, a.reservation) == (e.reason, False, None)
                assert a.p_sel >= e.p_sel and a.utility_ms >= e.utility_ms
                assert replace(a, p_tilde=e.p_tilde, p_sel=e.p_sel, utility_ms=e.utility_ms,
                               bounded=False) == e
            else:
                assert a == e
