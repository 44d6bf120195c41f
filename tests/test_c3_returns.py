"""C3 as DESIGN §3 specifies it, through the orchestrator: one aggregate return per branch
entry made of every measured term, every candidate priced, reservations that end with their
fills, and consumption credited whichever request consumes."""

import asyncio

import pytest

from dynbranch.arms.registry import get_arm
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.clock import VirtualClock
from dynbranch.gate import Gate
from dynbranch.gate.client import LocalGateClient
from dynbranch.orchestrator import Orchestrator
from dynbranch.runtime.run import FillOptions, GateOptions, RunContext
from tests.toy import KEYS, ToyRequest

PROFILE = "qwen3-8b@rtx4090"


class RecordingGate(LocalGateClient):
    """The in-process gate, keeping every learning call and the held blocks over time."""

    def __init__(self, gate: Gate, clock) -> None:
        super().__init__(gate)
        self.clock = clock
        self.learned: list = []
        self.released_at: list[float] = []

    async def learn(self, observations, settlements):
        self.learned.append((list(observations), list(settlements)))
        await super().learn(observations, settlements)

    async def release(self, reservations):
        self.released_at.extend(self.clock.now() for _ in reservations)
        return await super().release(reservations)


def run(requests, *, arm="c2", fanout=3, workers=2, spacing=0.0):
    """Run ``requests``; returns the records, the orchestrator, the recording gate, the
    run's origin on the clock and every fill that ended (captured before teardown)."""
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", PROFILE, workers)})
    gates: list[RecordingGate] = []

    def make_gate(model, config):
        gates.append(RecordingGate(Gate(model, config), clock))
        return gates[-1]

    async def main():
        await backend.start()
        try:
            ctx = RunContext(clock=clock, arm=arm, models=backend.models(),
                             fill=FillOptions(fanout=fanout),
                             gate=GateOptions(policy="priced", engines=workers, profile=PROFILE),
                             make_store=lambda: backend.make_store(1 << 26), make_gate=make_gate)
            orch = Orchestrator(clock, backend.clients(), get_arm(arm), run=ctx)
            done = orch.fills.request_done

            async def keep(request_id):
                fills = await done(request_id)
                ended.extend(fills)
                return fills

            orch.fills.request_done = keep
            t0 = orch.start_run()

            async def one(i, req):
                await clock.sleep_until(t0 + i * spacing)
                return await orch.run_request(req, i * spacing)

            records = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
            await orch.finish_run()
            return records, orch, t0
        finally:
            await backend.shutdown()

    ended: list = []
    records, orch, t0 = clock.run(main())
    return records, orch, gates[0], t0, ended


def _settlements(gate):
    return [s for _obs, settled in gate.learned for s in settled]


def test_one_aggregate_return_per_entry_made_of_every_measured_term():
    records, orch, gate, *_ = run([ToyRequest(1, context_words=2500)])
    assert records[0].correct == 1.0
    (settlement,) = _settlements(gate)  # one entry, three candidates: ONE return
    fills = orch.mechanism_stats["speculation"]["fills"]
    assert fills["issued"] == 3 and fills["consumed"] == 1
    spec = [s for s in orch.log.stages if s.speculative and s.fill == "beta"]
    executed = sum(s.duration for s in spec)
    ret = settlement.ret
    # the winner's saved execution, not the three candidates' predicted gains summed
    assert ret.saved_ms == pytest.approx(1e3 * executed, rel=1e-6)
    assert ret.value_ms == pytest.approx(ret.saved_ms - ret.setup_ms - ret.fill_cost_ms
                                         - ret.wait_ms)
    (observations, _), = gate.learned
    assert [(o.rank, o.selected) for o in observations][:3] == [(0, False), (1, True),
                                                                (2, False)]


def test_every_candidate_is_priced_not_a_head_of_the_ranking():
    records, orch, gate, *_ = run([ToyRequest(1, context_words=2500)], fanout=1)
    (observations, _), = gate.learned
    assert len(observations) == len(KEYS)  # all three priced although only one may fill
    assert orch.mechanism_stats["speculation"]["gate"]["candidates"] == len(KEYS)


def test_a_wait_on_a_fill_still_running_is_charged_to_its_entry():
    # a short question: the plan decodes fast, so the winner's fill is still running when
    # the canonical lookup arrives and the request joins it (and waits)
    records, orch, gate, *_ = run([ToyRequest(1, context_words=0, answer_words=400)])
    assert records[0].correct == 1.0
    joins = [s for s in orch.log.stages if s.served_from == "join" and not s.speculative]
    assert joins, "the scenario needs a join"
    (settlement,) = _settlements(gate)
    assert settlement.ret.wait_ms > 0.0
    waited = sum(s.duration for s in joins)  # a joined stage's row spans its wait
    assert settlement.ret.wait_ms == pytest.approx(1e3 * waited, rel=1e-6)


def test_a_cancelled_losers_reservation_is_released_when_it_is_cancelled():
    records, orch, gate, t0, fills = run([ToyRequest(1, context_words=2500, answer_words=600)])
    assert records[0].correct == 1.0
    losers = [f for f in fills if f.candidate != "beta"]
    assert len(losers) == 2 and all(f.state in ("cancelled", "done") for f in losers)
    assert len(gate.released_at) == 3 and gate.gate.ledger.held == 0
    resolved = t0 + next(s.end for s in orch.log.stages if s.stage == "plan")
    request_end = t0 + records[0].end
    # the losers gave their blocks back when the branch resolved, not when the request ended
    assert sorted(gate.released_at)[:2] == pytest.approx([resolved, resolved], abs=0.05)
    assert sorted(gate.released_at)[1] < request_end - 0.5


def test_a_shadow_promoted_by_another_request_credits_its_fill():
    # the second request asks the first's question a little later, under the full arm: its
    # answer is served the first request's fill, which is credited to that fill
    first, second = ToyRequest(3, context_words=2500), ToyRequest(6, context_words=2500)
    second.question = first.question
    records, orch, gate, t0, fills = run([first, second], arm="full", spacing=0.3)
    assert [r.correct for r in records] == [1.0, 1.0]
    credited = [(f.request_id, c.request_id) for f in fills for c in f.consumptions
                if c.served]
    assert any(owner != consumer for owner, consumer in credited), credited


def test_a_stage_whose_fills_are_lookups_is_priced_as_no_engine_work():
    from dynbranch.fill.model import Fill, FillStage
    from dynbranch.gate.priced import PRIOR_SHAPE, PricedPolicy

    run_ctx = RunContext(clock=VirtualClock(), arm="c2",
                         gate=GateOptions(policy="priced", profile=PROFILE))
    policy = PricedPolicy.for_run(run_ctx)
    assert policy._shape("w/pick") == PRIOR_SHAPE  # nothing measured yet
    lookup = Fill("f1", "r", "w/pick/0", "a", 0, 0.0, state="done", ended_at=0.03)
    lookup.trace.append(FillStage("lookup", "tool", "db", claimed="n", duration_s=0.03,
                                  done=True))
    policy._learn_from("w/pick", lookup)
    shape = policy._shape("w/pick")
    assert (shape.prompt_tokens, shape.output_tokens) == (1, 1)


def test_only_fill_work_no_canonical_stage_was_served_is_charged_to_the_return():
    from types import SimpleNamespace

    from dynbranch.fill.model import Consumption, Fill, FillStage
    from dynbranch.gate.load import LoadView
    from dynbranch.gate.price import FillShape
    from dynbranch.gate.priced import PricedPolicy

    run_ctx = RunContext(clock=VirtualClock(), arm="c2",
                         gate=GateOptions(policy="priced", profile=PROFILE))
    policy = PricedPolicy.for_run(run_ctx)
    entry = SimpleNamespace(stage_key="w/pick", admitted={})
    loaded = LoadView(rho=0.5, busy=0.5, stretch=1.5)

    def fill(fill_id, served=()):
        f = Fill(fill_id, "r", "w/pick/0", fill_id, 0, 0.0, state="done", ended_at=2.0)
        f.trace += [
            FillStage("handler", "llm", claimed=f"{fill_id}-a", duration_s=1.0,
                      prompt_tokens=800, output_tokens=150, done=True),
            FillStage("answer", "llm", claimed=f"{fill_id}-b", duration_s=1.0,
                      prompt_tokens=300, output_tokens=60, done=True),
        ]
        f.consumptions += [Consumption(name, "r", "shadow", 2.0, 0.0) for name in served]
        policy._ran_under[fill_id] = loaded
        return f

    price = policy.model.price_ms
    # a loser: all of its work went unused
    assert policy._cost_ms(entry, fill("lost")) == pytest.approx(
        price(FillShape(1100, 210), loaded))
    # a winner served in full did work its request would have done itself
    assert policy._cost_ms(entry, fill("won", ("won-a", "won-b"))) == 0.0
    # served up to its first stage: only the second stage's work is charged
    assert policy._cost_ms(entry, fill("half", ("half-a",))) == pytest.approx(
        price(FillShape(300, 60), loaded))
    assert price(FillShape(300, 60), loaded) > 0.0
