"""The contention price's step stretch: measured by the engine, carried by the view, applied once."""

from __future__ import annotations

import dataclasses

import pytest

from dynbranch.clock import VirtualClock
from dynbranch.engines.client import DownSnapshot
from dynbranch.engines.profile import load_profile
from dynbranch.engines.protocol import GenerateRequest, LoadSnapshot
from dynbranch.engines.sim import SimEngine
from dynbranch.gate.load import LoadBudget, LoadEnvelope, LoadView
from dynbranch.gate.price import ContentionModel, FillShape
from tests.test_sim_engine import words

P32 = load_profile("qwen3-32b@h200")
FILL = FillShape(634, 149, 361)


def test_the_price_is_the_co_residency_price_times_the_stretch():
    model = ContentionModel.from_profile(P32, LoadBudget.from_profile(P32, engines=4))
    view = LoadView(o_fill=0.1, rho=0.05, busy=0.9)
    base = model.price_ms(FILL, view)
    assert base > 0
    assert model.price_ms(FILL, dataclasses.replace(view, stretch=2.5)) == pytest.approx(2.5 * base)
    off = dataclasses.replace(model, stretched=False)
    assert off.price_ms(FILL, dataclasses.replace(view, stretch=2.5)) == pytest.approx(base)


def test_a_view_refuses_a_stretch_below_one_and_keeps_it_through_its_operations():
    with pytest.raises(ValueError, match="stretch"):
        LoadView(stretch=0.5)
    view = LoadView(rho=0.2, stretch=1.7)
    assert view.with_fill(0.1, 0.1).stretch == 1.7
    assert view.max(LoadView(stretch=2.0)).stretch == 2.0
    assert LoadView(*view.as_tuple()) == view


def test_the_envelope_reads_an_idle_stretch_before_any_reading_and_keeps_the_max():
    env = LoadEnvelope(2.0)
    assert env.priced(0.0).stretch == 1.0
    env.observe(LoadView(stretch=3.0), 1.0)
    env.observe(LoadView(stretch=1.2), 1.5)
    assert env.priced(2.0).stretch == 3.0  # the higher reading is still within H
    assert env.priced(4.0).stretch == 1.2


def test_the_view_averages_the_engines_stretch_and_ignores_down_ones():
    budget = LoadBudget.from_profile(P32, engines=3)
    snaps = [LoadSnapshot("a", 0.0, 1, 0, 1, 10, stretch=3.0),
             LoadSnapshot("b", 0.0, 1, 0, 1, 10, stretch=1.0),
             DownSnapshot.of("c", 0.0, "gone")]
    assert LoadView.from_snapshots(snaps, budget).stretch == pytest.approx(2.0)


def test_the_sim_engine_reports_a_stretch_that_grows_with_its_batch():
    async def stretch_with(engine: SimEngine, n: int) -> float:
        await engine.start()
        try:
            streams = [engine.generate_stream(GenerateRequest(
                f"r{i}", words(2000, i), 4096, replay_text=words(400, 100 + i))) for i in range(n)]
            iters = [s.__aiter__() for s in streams]
            for _ in range(50):  # 50 tokens each, all decoding together
                for it in iters:
                    await it.__anext__()
            return engine.load().stretch
        finally:
            await engine.shutdown()

    def run(n: int) -> float:
        clock = VirtualClock()
        return clock.run(stretch_with(SimEngine(P32, clock), n))

    one, many = run(1), run(64)
    assert 1.0 <= one < many
