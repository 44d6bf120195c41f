"""C3, the load-priced gate: Beta quantiles, the load envelope, the contention price, greedy
admission with atomic KV reservations, Action 0, the fixed-threshold baseline, checkpoints
and seeded determinism. (The price's check against the sim engine is in test_calibrate.py:
it drives an engine, which the pure gate does not.)

Every test that admits goes through the ``gates`` fixture, whose teardown asserts that no
KV reservation leaked.
"""

from __future__ import annotations

import ast
import json
import math
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from dynbranch.engines.profile import SeqWork, load_profile
from dynbranch.engines.protocol import LoadSnapshot
from dynbranch.errors import UnknownNameError
from dynbranch.gate import (
    ADMITTED,
    AUDIT,
    BELOW_THRESHOLD,
    FANOUT,
    NEGATIVE_UTILITY,
    NO_KV,
    BetaPosterior,
    BranchReturn,
    Candidate,
    ContentionModel,
    FillShape,
    Gate,
    GateConfig,
    LoadBudget,
    LoadEnvelope,
    LoadView,
    ReservationError,
    bayes_ucb_level,
    beta_quantile,
    betainc,
    betaincc,
)
from dynbranch.gate.policy import make_policy

P32 = load_profile("qwen3-32b@h200")
MODEL = ContentionModel.from_profile(P32)
SHAPE = FillShape(prompt_tokens=256, output_tokens=32)
BLOCKS = SHAPE.kv_blocks(P32.scheduler.block_size)
COORD = "routing/router/2"
GateFactory = Callable[..., Gate]


@pytest.fixture
def gates() -> Iterator[GateFactory]:
    """Make gates; at teardown, every reservation they issued must have been released."""
    made: list[Gate] = []

    def make(model: ContentionModel = MODEL, **config: object) -> Gate:
        gate = Gate(model, GateConfig(**{"audit_rate": 0.0, **config}))  # type: ignore[arg-type]
        made.append(gate)
        return gate

    yield make
    for gate in made:
        assert gate.reserved_blocks == 0, f"leaked reservations: {gate.ledger.outstanding}"
        assert gate.ledger.outstanding == []


def cand(
    name: str, rank: int = 0, gain: float = 1000.0, shape: FillShape = SHAPE, **kw
) -> Candidate:
    blocks = kw.pop("kv_blocks", shape.kv_blocks(16))
    return Candidate(name, rank, kw.pop("stage", "handler"), gain, shape, blocks)


def release_all(gate: Gate, admissions) -> None:
    for a in admissions:
        if a.reservation is not None:
            assert gate.release(a.reservation)


# -- Beta posteriors ------------------------------------------------------------------------


@pytest.mark.parametrize("q", [0.0, 0.01, 0.25, 0.5, 0.9, 0.999, 1.0])
def test_uniform_quantile_is_the_level(q):
    assert beta_quantile(1.0, 1.0, q) == pytest.approx(q, abs=1e-13)


@pytest.mark.parametrize("a", [0.5, 2.0, 7.5])
def test_quantiles_with_closed_forms(a):
    for q in (0.05, 0.5, 0.95, 0.9999):
        # Beta(a, 1): F(x) = x^a; Beta(1, a): F(x) = 1 - (1 - x)^a.
        assert beta_quantile(a, 1.0, q) == pytest.approx(q ** (1 / a), rel=1e-11)
        assert beta_quantile(1.0, a, q) == pytest.approx(1 - (1 - q) ** (1 / a), rel=1e-10)
    # The arcsine law: I_x(1/2, 1/2) = (2 / pi) asin(sqrt x).
    for x in (0.01, 0.3, 0.8):
        assert betainc(0.5, 0.5, x) == pytest.approx(
            2 / math.pi * math.asin(math.sqrt(x)), abs=1e-13
        )


def test_beta_2_5_quantiles_match_numeric_integration():
    # Independent reference: integrate the density 30 x (1 - x)^4 on a fine grid.
    x = np.linspace(0.0, 1.0, 2_000_001)
    pdf = 30.0 * x * (1.0 - x) ** 4
    cdf = np.concatenate(([0.0], np.cumsum((pdf[1:] + pdf[:-1]) / 2 * np.diff(x))))
    assert cdf[-1] == pytest.approx(1.0, abs=1e-10)
    for q in (0.01, 0.1, 0.25, 0.5, 0.75, 0.9, 0.99, 0.999):
        expected = float(np.interp(q, cdf, x))
        assert beta_quantile(2.0, 5.0, q) == pytest.approx(expected, abs=2e-9)
    # Spot values: the median of Beta(2, 5) is 0.26445 (to 5 places).
    assert beta_quantile(2.0, 5.0, 0.5) == pytest.approx(0.264450, abs=1e-6)


@pytest.mark.parametrize(
    ("a", "b", "q", "expected"),
    [
        # Found by search; each broke an earlier solver. Expected values from closed forms
        # or the power-law tail I_x ~ x^a / (a B(a, b)) where it is exact to many digits.
        (
            3.0,
            40.0,
            1e-30,
            (1e-30 * 3 * math.exp(math.lgamma(3) + math.lgamma(40) - math.lgamma(43))) ** (1 / 3),
        ),
        (0.25, 1.0, 1e-6, 1e-24),
        (1.0, 0.25, 1 - 1e-6, 1.0),  # 1 - 1e-24 rounds to 1
        (1.0, 1000.0, 0.999, 1 - 0.001 ** (1 / 1000)),
    ],
)
def test_extreme_quantiles(a, b, q, expected):
    assert beta_quantile(a, b, q) == pytest.approx(expected, rel=1e-9)


def test_skewed_upper_quantile_keeps_relative_precision():
    # The median of this shape is ~1e-9: mirroring on q > 1/2 alone would solve for 1 - x
    # and keep only ~1e-8 of x's relative precision.
    a, b, q = 0.05655182827075348, 1321.3393178785866, 0.5249583902643392
    x = beta_quantile(a, b, q)
    assert x < 1e-8
    assert betainc(a, b, x) == pytest.approx(q, rel=1e-12)
    assert betaincc(a, b, x) == pytest.approx(1 - q, rel=1e-12)


def test_posterior_updates_and_mean():
    post = BetaPosterior()
    for outcome in (True, True, False):
        post.update(outcome)
    post.update(False, weight=0.5)
    assert (post.alpha, post.beta) == (3.0, 2.5)
    assert post.mean == pytest.approx(3 / 5.5)
    assert post.upper_quantile(0.99) > post.mean
    with pytest.raises(ValueError):
        post.update(True, weight=-1.0)
    with pytest.raises(ValueError):
        BetaPosterior(0.0, 1.0)


def test_bayes_ucb_level():
    assert bayes_ucb_level(1) == 0.0
    assert bayes_ucb_level(10) == pytest.approx(0.9)
    assert bayes_ucb_level(10, c=1.0, horizon=1000) == pytest.approx(1 - 1 / (10 * math.log(1000)))
    assert bayes_ucb_level(2, c=5.0) == pytest.approx(0.5)  # log T floored at 1
    with pytest.raises(ValueError):
        bayes_ucb_level(0)


# -- the load view and its envelope ---------------------------------------------------------


def test_view_from_snapshots_aggregates_and_normalises():
    budget = LoadBudget(fill_slots=10, spec_kv_blocks=100, max_num_seqs=20, engines=2)
    snaps = [
        LoadSnapshot("e0", 0.0, running=8, waiting=2, kv_blocks_used=300, kv_blocks_total=1000,
                     spec_running=3, spec_waiting=1, spec_kv_blocks=40),
        LoadSnapshot("e1", 0.0, running=4, waiting=0, kv_blocks_used=90, kv_blocks_total=1000,
                     spec_running=1, spec_waiting=0, spec_kv_blocks=10),
    ]  # fmt: skip
    view = LoadView.from_snapshots(snaps, budget)
    assert view == LoadView(o_fill=5 / 20, o_kv=50 / 200, rho=(6 + 3) / 40)
    crowded = [replace(s, waiting=500) for s in snaps]
    assert LoadView.from_snapshots(crowded, budget).rho == 1.0  # capped
    with pytest.raises(ValueError, match="one snapshot per engine"):
        LoadView.from_snapshots(snaps[:1], budget)
    with pytest.raises(ValueError):
        LoadView(o_fill=1.5)


def test_envelope_rises_at_once_and_falls_after_the_window():
    env = LoadEnvelope(window_s=5.0)
    assert env.priced(0.0) == LoadView()  # idle before any observation
    env.observe(LoadView(0.1, 0.1, 0.2), 0.0)
    env.observe(LoadView(0.6, 0.1, 0.9), 1.0)
    assert env.priced(1.0) == LoadView(0.6, 0.1, 0.9)  # a rise counts at once
    env.observe(LoadView(0.2, 0.3, 0.1), 2.0)
    # The high view was in effect until t = 2: it prices until t = 2 + H.
    assert env.priced(2.0) == LoadView(0.6, 0.3, 0.9)
    assert env.priced(6.999) == LoadView(0.6, 0.3, 0.9)
    assert env.priced(7.0) == LoadView(0.2, 0.3, 0.1)
    # A value holds until superseded: with no new observation it keeps pricing.
    assert env.priced(100.0) == LoadView(0.2, 0.3, 0.1)
    with pytest.raises(ValueError, match="backwards"):
        env.observe(LoadView(), 50.0)


def test_envelope_memory_is_bounded_by_one_window():
    env = LoadEnvelope(window_s=1.0)
    for i in range(20_000):  # falling load: the worst case for a max-deque
        env.observe(LoadView(rho=1.0 - i / 20_000), i * 0.01)
    assert env.retained <= 3 * 101


# -- the contention price -------------------------------------------------------------------


def test_decode_marginal_is_exactly_the_step_models():
    # SHAPE decodes 31 steps over contexts 256..286: their mean, 271, is a whole token.
    assert SHAPE.prompt_tokens + (SHAPE.decode_steps - 1) / 2 == 271
    for n in (1, 10, 100):
        batch = [SeqWork(1024, 1)] * n
        exact = P32.step_cost([*batch, SeqWork(271, 1)]).total_s - P32.step_cost(batch).total_s
        model = MODEL.decode_step_s(SHAPE, LoadView(rho=n / 256))
        assert model == pytest.approx(exact, rel=1e-9)


def test_prefill_marginal_bounds_the_step_model_from_above_by_the_kv_read_time():
    for n in (1, 10, 100):
        batch = [SeqWork(1024, 1)] * n
        exact = P32.step_cost([*batch, SeqWork(0, 256)]).total_s - P32.step_cost(batch).total_s
        model = MODEL.prefill_s(SHAPE, LoadView(rho=n / 256))
        kv_read = n * 1025 * MODEL.kv_token_s
        assert exact <= model <= exact + kv_read + 1e-12


def test_price_is_zero_without_canonical_load_and_grows_with_it():
    assert MODEL.price_ms(SHAPE, LoadView(0.5, 0.5, 0.0)) == 0.0
    prices = [MODEL.price_ms(SHAPE, LoadView(rho=r)) for r in (0.01, 0.1, 0.3, 0.6, 1.0)]
    assert prices == sorted(prices) and len(set(prices)) == len(prices)
    fills = [MODEL.price_ms(SHAPE, LoadView(o_fill=f, rho=0.3)) for f in (0.0, 0.25, 0.5, 1.0)]
    assert fills == sorted(fills) and fills[-1] > fills[0]
    kv = [MODEL.price_ms(SHAPE, LoadView(o_kv=k, rho=0.3)) for k in (0.0, 0.5, 1.0)]
    assert kv == sorted(kv) and kv[-1] > kv[0]


def test_the_queueing_switch_multiplies_the_price_of_a_busy_engine():
    idle = MODEL.price_ms(SHAPE, LoadView(rho=0.1))
    assert MODEL.price_ms(SHAPE, LoadView(rho=0.1, busy=0.9)) == pytest.approx(idle)  # design
    queued = replace(MODEL, queueing=True)
    assert queued.price_ms(SHAPE, LoadView(rho=0.1)) == pytest.approx(idle)
    assert queued.price_ms(SHAPE, LoadView(rho=0.1, busy=0.5)) == pytest.approx(2 * idle)
    assert queued.price_ms(SHAPE, LoadView(rho=0.1, busy=0.9)) == pytest.approx(10 * idle)
    assert queued.price_ms(SHAPE, LoadView(rho=0.1, busy=1.0)) == pytest.approx(20 * idle)
    snaps = [LoadSnapshot("a", 0.0, 2, 0, 10, 100, busy=0.2),
             LoadSnapshot("b", 0.0, 2, 0, 10, 100, busy=0.6)]
    budget = LoadBudget(fill_slots=4, spec_kv_blocks=40, max_num_seqs=8, engines=2)
    assert LoadView.from_snapshots(snaps, budget).busy == pytest.approx(0.4)


def test_price_grows_with_fill_size_and_context():
    view = LoadView(0.2, 0.2, 0.2)
    by_prompt = [MODEL.price_ms(FillShape(p, 32), view) for p in (16, 256, 4096, 20_000)]
    by_output = [MODEL.price_ms(FillShape(256, o), view) for o in (1, 8, 64, 512)]
    by_context = [MODEL.price_ms(FillShape(256, 32, c), view) for c in (0, 1024, 8192)]
    for series in (by_prompt, by_output, by_context):
        assert series == sorted(series) and len(set(series)) == len(series)


# -- Action 1: greedy admission -------------------------------------------------------------


def test_admits_best_first_and_stops_at_non_positive_utility(gates):
    gate = gates(fanout=8)
    view = LoadView(rho=0.1)
    cands = [cand("low", 0, gain=10.0), cand("high", 1, gain=5000.0), cand("mid", 2, gain=2500.0)]
    out = {a.candidate: a for a in gate.admit(COORD, cands, view, now=0.0)}
    assert out["high"].reason == out["mid"].reason == ADMITTED
    assert out["low"].reason == NEGATIVE_UTILITY and out["low"].utility_ms <= 0
    assert out["low"].reservation is None
    # Best first: the higher utility got the earlier receipt.
    assert out["high"].reservation.reservation_id < out["mid"].reservation.reservation_id
    for a in out.values():
        assert a.p_tilde == pytest.approx(a.p_sel * a.p_use)
        expected = a.p_tilde * a.gain_ms - (1 - a.p_tilde) * a.price_ms
        assert a.utility_ms == pytest.approx(expected)
    assert gate.reserved_blocks == 2 * BLOCKS
    release_all(gate, out.values())


def test_projection_reprices_the_rest(gates):
    """A candidate that pays alone is refused once a better one's pressure is projected."""
    view = LoadView(rho=0.1)
    budget = MODEL.budget
    after = view.with_fill(1 / budget.total_fill_slots, BLOCKS / budget.total_spec_kv_blocks)
    c0, c1 = MODEL.price_ms(SHAPE, view), MODEL.price_ms(SHAPE, after)
    assert c1 > c0
    # p~ of a fresh gate's first decision at rank 1 (the same in every fresh gate).
    probe = gates(fanout=8)
    [p] = probe.admit(COORD, [cand("x", 1)], view, 0.0)
    release_all(probe, [p])
    gain = (1 - p.p_tilde) * (c0 + c1) / 2 / p.p_tilde  # positive at c0, negative at c1
    alone_gate = gates(fanout=8)
    alone = alone_gate.admit(COORD, [cand("marginal", 1, gain=gain)], view, 0.0)
    assert alone[0].reason == ADMITTED and alone[0].price_ms == pytest.approx(c0)
    release_all(alone_gate, alone)
    gate = gates(fanout=8)
    out = gate.admit(COORD, [cand("best", 0, gain=1e5), cand("marginal", 1, gain=gain)], view, 0.0)
    assert [a.reason for a in out] == [ADMITTED, NEGATIVE_UTILITY]
    assert out[1].price_ms == pytest.approx(c1) and out[1].utility_ms < 0
    release_all(gate, out)


def test_fanout_caps_a_branch(gates):
    gate = gates(fanout=2)
    out = gate.admit(COORD, [cand(f"c{i}", i) for i in range(4)], LoadView(), 0.0)
    assert [a.reason for a in out] == [ADMITTED, ADMITTED, FANOUT, FANOUT]
    assert all(a.utility_ms > 0 for a in out)
    release_all(gate, out)
    none = gates(fanout=0).admit(COORD, [cand("c")], LoadView(), 0.0)
    assert none[0].reason == FANOUT and not none[0].admitted


def test_kv_budget_global_and_per_branch(gates):
    gate = gates(fanout=8, kv_budget_blocks=3 * BLOCKS)
    first = gate.admit(COORD, [cand(f"a{i}", i) for i in range(2)], LoadView(), 0.0)
    assert all(a.admitted for a in first)
    second = gate.admit(COORD, [cand(f"b{i}", i) for i in range(2)], LoadView(), 1.0)
    assert [a.reason for a in second] == [ADMITTED, NO_KV]  # one block-set left, atomically
    assert gate.reserved_blocks == gate.ledger.capacity
    # Released capacity comes back.
    release_all(gate, first)
    third = gate.admit(COORD, [cand("c0", 0)], LoadView(), 2.0)
    assert third[0].admitted
    release_all(gate, second + third)
    # A per-branch cap holds below the global budget; a smaller candidate still fits.
    capped = gates(fanout=8, branch_kv_blocks=BLOCKS + 1)
    small = FillShape(8, 4)
    out = capped.admit(
        COORD, [cand("big0", 0, gain=9e4), cand("big1", 1, gain=8e4), cand("tiny", 2, shape=small)],
        LoadView(), 0.0,
    )  # fmt: skip
    assert [a.reason for a in out] == [ADMITTED, NO_KV, ADMITTED]
    release_all(capped, out)


def test_same_candidate_passes_under_headroom_and_fails_under_contention(gates):
    c = cand("handler_a", 0, gain=1500.0)
    calm, busy = gates(), gates()
    headroom = calm.admit(COORD, [c], LoadView(o_fill=0.05, o_kv=0.05, rho=0.02), 0.0)[0]
    contention = busy.admit(COORD, [c], LoadView(o_fill=0.5, o_kv=0.5, rho=0.5), 0.0)[0]
    # Same belief; only the load differs. The refusal needed no quantile: its record holds
    # an upper bound of it (never below the solved one).
    assert contention.bounded and not headroom.bounded
    assert contention.p_tilde >= headroom.p_tilde
    assert headroom.reason == ADMITTED and headroom.utility_ms > 0
    assert contention.reason == NEGATIVE_UTILITY and contention.utility_ms < 0
    # The threshold form of eq. 5: p~ > C / (G + C) exactly when admitted.
    for a in (headroom, contention):
        assert (a.p_tilde > a.price_ms / (a.gain_ms + a.price_ms)) == a.admitted
    release_all(calm, [headroom])


def test_release_is_receipt_consuming_and_idempotent_safe(gates):
    gate = gates()
    [a] = gate.admit(COORD, [cand("c")], LoadView(), 0.0)
    receipt = a.reservation
    assert gate.release(receipt) is True
    assert gate.release(receipt) is False  # a fill ending twice frees nothing twice
    assert gate.reserved_blocks == 0
    with pytest.raises(ReservationError):
        gate.release(replace(receipt, blocks=receipt.blocks + 1))  # a different receipt
    with pytest.raises(ReservationError):
        gate.release(replace(receipt, reservation_id=99))  # never issued
    other = gates(name="other-gate")
    [b] = other.admit(COORD, [cand("c")], LoadView(), 0.0)
    with pytest.raises(ReservationError):
        gate.release(b.reservation)  # another gate's receipt
    [c] = gate.admit(COORD, [cand("d")], LoadView(), 1.0)
    with pytest.raises(ReservationError):
        gate.release(replace(c.reservation, candidate="e"))  # an edited outstanding receipt
    release_all(other, [b])
    release_all(gate, [c])


def test_encoded_released_rows_follow_the_rows_the_ledger_remembers(monkeypatch):
    from dynbranch.gate import reservations

    monkeypatch.setattr(reservations, "RECENTLY_RELEASED", 5)
    ledger = reservations.KvLedger("gate", 100)
    receipts = [ledger.try_reserve(COORD, f"c{i}", 2, float(i)) for i in range(9)]
    for r in receipts[:3]:
        ledger.release(r)
    with pytest.raises(RuntimeError, match="encode_rows_with"):
        ledger.encoded_released()
    ledger.encode_rows_with(json.dumps)  # NOTE: encodes the three remembered already
    for r in receipts[3:]:
        ledger.release(r)
    rows = ledger.to_state()["released"]
    assert [row[0] for row in rows] == [4, 5, 6, 7, 8]  # the newest five, in release order
    assert ledger.encoded_released() == [json.dumps(row) for row in rows]
    restored = reservations.KvLedger.from_state(json.loads(json.dumps(ledger.to_state())))
    assert restored.to_state() == ledger.to_state()
    with pytest.raises(ReservationError):  # a remembered receipt in another form, restored
        restored.release(replace(receipts[8], blocks=3))
    assert restored.release(receipts[8]) is False


def test_observations_move_the_posteriors(gates):
    gate = gates(fanout=1)
    for _ in range(40):
        gate.observe("handler", 0, selected=True, usable=True)
        gate.observe("handler", 3, selected=False)
    gate.observe("handler", 0, selected=True, usable=False)
    out = gate.admit(COORD, [cand("top", 0), cand("tail", 3)], LoadView(rho=0.05), 0.0)
    top, tail = out
    assert top.p_sel > 0.9 and tail.p_sel < 0.2
    assert top.p_use == pytest.approx(41 / 43)  # Beta(1, 1) prior + 40 usable, 1 not
    assert top.reason == ADMITTED and tail.reason in (FANOUT, NEGATIVE_UTILITY)
    release_all(gate, out)


def test_audits_admit_refused_candidates_with_the_seed(gates):
    def run(seed: int) -> list[str]:
        gate = gates(audit_rate=0.25, seed=seed, fanout=8)
        reasons = []
        for t in range(40):
            out = gate.admit(COORD, [cand("hopeless", 0, gain=1.0)], LoadView(rho=0.5), float(t))
            reasons.append(out[0].reason)
            for a in out:
                if a.audit:
                    assert a.reason == AUDIT and a.admitted and a.utility_ms < 0
            release_all(gate, out)
        return reasons

    first = run(seed=1)
    assert set(first) == {AUDIT, NEGATIVE_UTILITY}
    assert 3 <= first.count(AUDIT) <= 20
    assert run(seed=1) == first  # seeded: replays exactly
    assert run(seed=2) != first


# -- Action 0 -------------------------------------------------------------------------------


def test_generation_starts_open_and_closes_on_negative_returns(gates):
    gate = gates(generation_audit_rate=0.0)
    first = gate.generation("bad", 0.0)
    assert first.open and first.estimate == math.inf and not first.audit
    for t in range(20):
        gate.settle("bad", BranchReturn(saved_ms=0.0, setup_ms=40.0, fill_cost_ms=20.0))
        gate.generation("bad", float(t))
    assert gate.return_estimate("bad") < 0
    assert not gate.generation("bad", 30.0).open
    for t in range(20):
        gate.generation("good", float(t))
        gate.settle("good", BranchReturn(saved_ms=900.0, setup_ms=40.0, fill_cost_ms=300.0))
    decision = gate.generation("good", 30.0)
    assert decision.open and decision.estimate > 500.0


def test_generation_audits_reopen_a_closed_coordinate(gates):
    def openings(seed: int) -> list[bool]:
        gate = gates(generation_audit_rate=0.1, seed=seed)
        for _ in range(10):
            gate.generation("bad", 0.0)
            gate.settle("bad", BranchReturn(saved_ms=0.0, setup_ms=500.0))
        decisions = [gate.generation("bad", float(t)) for t in range(300)]
        assert all(d.audit == d.open for d in decisions)  # only audits open it now
        return [d.open for d in decisions]

    opens = openings(seed=7)
    assert 10 <= sum(opens) <= 55  # ~ Binomial(300, 0.1)
    assert openings(seed=7) == opens
    assert openings(seed=8) != opens


def test_action0_learns_one_aggregate_return_per_entry(gates):
    """The estimate depends on the entries' returns, not on how many candidates they had."""
    narrow, wide = gates(fanout=1), gates(fanout=4)
    for t in range(12):
        for gate, k in ((narrow, 1), (wide, 4)):
            assert gate.generation(COORD, float(t)).open
            out = gate.admit(COORD, [cand(f"c{i}", i) for i in range(k)], LoadView(), float(t))
            release_all(gate, out)
            # One return for the whole entry: the consumed fill's saving less every cost.
            gate.settle(COORD, BranchReturn(saved_ms=300.0, setup_ms=50.0, fill_cost_ms=100.0))
    assert narrow.return_estimate(COORD) == wide.return_estimate(COORD)
    assert narrow.counters["settled"] == wide.counters["settled"] == 12
    assert wide.counters["admitted"] == 4 * narrow.counters["admitted"]
    # Its bonus shrinks with returns: no per-candidate optimism accumulates.
    stats = wide._returns[COORD]
    assert stats.n == 12 and stats.mean == pytest.approx(150.0)
    assert 150.0 < wide.return_estimate(COORD) < 150.0 + 100.0


def test_branch_return_value():
    r = BranchReturn(saved_ms=1000.0, setup_ms=30.0, fill_cost_ms=200.0, wait_ms=70.0)
    assert r.value_ms == 700.0
    with pytest.raises(ValueError):
        BranchReturn(saved_ms=math.nan)


# -- the fixed-threshold baseline -----------------------------------------------------------


def test_fixed_threshold_mode(gates):
    gate = gates(policy="fixed_threshold", p_star=0.3, audit_rate=1.0, generation_audit_rate=1.0)
    assert gate.policy == "fixed_threshold(p*=0.3)"
    for _ in range(10):
        gate.settle(COORD, BranchReturn(saved_ms=0.0, setup_ms=1000.0))
    decision = gate.generation(COORD, 0.0)
    assert decision.open and not decision.audit  # Action 0 disabled: always open
    for _ in range(30):
        gate.observe("handler", 0, selected=True, usable=True)
        gate.observe("handler", 1, selected=False)
    out = gate.admit(
        COORD, [cand("a", 0, gain=1.0), cand("b", 1, gain=1e6)], LoadView(rho=1.0), 0.0
    )
    a, b = out
    assert a.p_tilde > 0.3 and a.reason == ADMITTED and a.price_ms == 0.0  # no pricing
    assert b.p_tilde <= 0.3 and b.reason == BELOW_THRESHOLD and not b.audit  # no audits
    release_all(gate, out)
    assert gates().policy == "priced"
    with pytest.raises(UnknownNameError):
        make_policy("greedy")
    with pytest.raises(ValueError):
        GateConfig(policy="nope")


# -- checkpoint and determinism -------------------------------------------------------------


def _workload(gate: Gate, steps: int, offset: int = 0) -> list:
    """A deterministic mix of every gate call; returns what the gate answered."""
    trace: list = []
    held = []
    for i in range(offset, offset + steps):
        coord = f"coord{i % 3}"
        trace.append(gate.generation(coord, float(i)))
        cands = [cand(f"c{j}", j, gain=200.0 * (j + 1), stage=f"s{i % 2}") for j in range(4)]
        out = gate.admit(coord, cands, LoadView(rho=0.02 * (i % 7)), float(i))
        trace.append(out)
        held += [a.reservation for a in out if a.admitted]
        for j in range(4):
            gate.observe(f"s{i % 2}", j, selected=(j == i % 3), usable=(j == i % 3) and i % 5 != 0)
        gate.settle(coord, BranchReturn(saved_ms=100.0 * (i % 4), setup_ms=30.0))
        while len(held) > 5:  # some fills still running at checkpoint time
            gate.release(held.pop(0))
    return trace


def test_state_round_trip_is_exact_and_decides_identically(gates):
    gate = gates(audit_rate=0.3, generation_audit_rate=0.3, seed=11)
    _workload(gate, 25)
    state = gate.state()
    assert json.loads(json.dumps(state)) == state  # plain JSON-able data
    restored = Gate.from_state(json.loads(json.dumps(state)))
    assert restored.state() == state
    assert restored.reserved_blocks == gate.reserved_blocks > 0
    assert _workload(restored, 15, offset=25) == _workload(gate, 15, offset=25)
    assert restored.state() == gate.state()
    for g in (gate, restored):
        for r in g.ledger.outstanding:
            g.release(r)


def test_seeded_determinism(gates):
    a, b = gates(audit_rate=0.2, seed=5), gates(audit_rate=0.2, seed=5)
    assert _workload(a, 30) == _workload(b, 30)
    assert a.state() == b.state()
    for g in (a, b):
        for r in g.ledger.outstanding:
            g.release(r)


def test_gate_sources_import_no_event_loop_ray_or_vllm():
    # NOTE: priced.py is the async adapter that drives the pure gate from C2 (its load probe
    # is an asyncio task), as reuse/store_hook.py drives the pure store; the rest is pure.
    for path in Path(__file__).parents[1].joinpath("dynbranch", "gate").glob("*.py"):
        if path.name == "priced.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                roots = {n.name.split(".")[0] for n in node.names}
            elif isinstance(node, ast.ImportFrom):
                roots = {(node.module or "").split(".")[0]}
            else:
                continue
            assert not roots & {"asyncio", "ray", "vllm", "time"}, f"{path.name}: {roots}"


def test_the_gates_default_fanout_is_the_runs():
    from dynbranch.runtime.run import DEFAULT_FANOUT, FillOptions

    assert GateConfig().fanout == DEFAULT_FANOUT == FillOptions().fanout


def test_a_step_with_two_unlucky_returns_inherits_its_stages_payoff():
    # returns are bimodal: most entries save nothing, a consumed fill saves seconds. A step
    # whose first two entries saved nothing stays open while its stage pays on average.
    gate = Gate(MODEL, GateConfig(generation_audit_rate=0.0))
    for i in range(20):
        gate.settle(f"w/router/{i % 4}", BranchReturn(saved_ms=3000.0 if i % 2 else 0.0,
                                                       fill_cost_ms=200.0))
    for _ in range(2):
        gate.settle("w/router/9", BranchReturn(saved_ms=0.0, fill_cost_ms=200.0))
    assert gate.generation("w/router/9", 0.0).open
    alone = Gate(MODEL, GateConfig(generation_audit_rate=0.0))  # no stage to learn from
    for _ in range(2):
        alone.settle("w/router/9", BranchReturn(saved_ms=0.0, fill_cost_ms=200.0))
    assert not alone.generation("w/router/9", 0.0).open
