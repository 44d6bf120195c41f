"""The orchestrator on the local backend with simulated engines and the virtual clock."""

import asyncio

import pytest

from dynbranch.arms.base import Arm
from dynbranch.arms.registry import get_arm
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.clock import VirtualClock
from dynbranch.fill.hook import NoSpeculation
from dynbranch.orchestrator import Orchestrator
from dynbranch.reuse.hook import NoReuse
from dynbranch.runtime.affinity import AffinityPlacement
from dynbranch.runtime.run import FillOptions, GateOptions, RunContext
from dynbranch.workflow import BranchCoordinate, BranchPoint
from tests.toy import KEYS, ToyRequest


def run_toy(requests, *, workers=2, arrivals=None, profile="qwen3-8b@rtx4090"):
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", profile, workers)})
    arrivals = arrivals or [0.0] * len(requests)

    async def main():
        await backend.start()
        try:
            orch = Orchestrator(clock, backend.clients(), get_arm("floor"))
            t0 = orch.start_run()

            async def one(req, at):
                await clock.sleep_until(t0 + at)
                return await orch.run_request(req, at)

            records = await asyncio.gather(*(one(r, a) for r, a in zip(requests, arrivals, strict=True)))
            loads = [await c.load() for c in backend.clients()["target"]]
            return records, orch, loads
        finally:
            await backend.shutdown()

    return clock.run(main())


def test_every_stage_is_logged_in_order_with_its_branch():
    records, orch, loads = run_toy([ToyRequest(0), ToyRequest(1)])
    assert [r.status for r in records] == ["completed", "completed"]
    assert [r.correct for r in records] == [1.0, 1.0]
    rows = [s for s in orch.log.stages if s.request_id == "toy-000"]
    assert [(s.stage, s.kind, s.seq) for s in rows] == [
        ("plan", "llm", 0), ("lookup", "tool", 1), ("answer", "llm", 2)]
    assert all(s.served_from == "exec" and not s.speculative for s in rows)
    assert [s.coordinate for s in rows] == ["toy/plan/0"] * 3
    assert rows[1].duration == pytest.approx(0.05)  # the tool's modelled cost, exactly
    assert rows[1].read_set == {"toy-000/kv": "0"}
    assert rows[0].engine.startswith("sim-target-") and rows[0].output_tokens > 0
    assert all(a.end <= b.start + 1e-12 for a, b in zip(rows, rows[1:], strict=False))
    branches = [b for b in orch.log.branches if b.request_id == "toy-000"]
    assert len(branches) == 1 and branches[0].chosen == ["alpha"]
    assert all(load.running == 0 and load.waiting == 0 for load in loads)


def test_a_failing_tool_fails_only_its_request():
    records, orch, _ = run_toy([ToyRequest(0), ToyRequest(1, fail=True), ToyRequest(2)])
    by_id = {r.request_id: r for r in records}
    assert by_id["toy-001"].status == "failed"
    assert by_id["toy-001"].error_type == "ToolCallError"
    assert "no such key 'beta'" in by_id["toy-001"].error
    assert by_id["toy-000"].status == by_id["toy-002"].status == "completed"
    failed_rows = [s for s in orch.log.stages if s.request_id == "toy-001"]
    assert [s.stage for s in failed_rows] == ["plan", "lookup"]
    assert failed_rows[-1].error.startswith("LookupError")


def test_latency_counts_from_the_scheduled_arrival():
    records, _, _ = run_toy([ToyRequest(0), ToyRequest(1)], arrivals=[0.0, 5.0])
    late = records[1]
    assert late.arrival == 5.0 and late.start == pytest.approx(5.0)
    assert late.latency == pytest.approx(late.end - 5.0)


def test_same_inputs_on_the_virtual_clock_give_identical_logs():
    def log():
        reqs = [ToyRequest(i, answer_words=10 + 7 * i) for i in range(12)]
        _, orch, _ = run_toy(reqs, arrivals=[0.1 * i for i in range(12)])
        return [s.row() for s in orch.log.stages]

    first, second = log(), log()
    assert first == second and len(first) == 36


def test_contention_makes_concurrent_requests_slower():
    # Long distinct contexts: prefill compute and KV reads grow with the crowd, so the same
    # request takes longer among 24 others than alone (from the step model, not a penalty).
    def req(i):
        return ToyRequest(i, answer_words=100, context_words=1500)

    alone, _, _ = run_toy([req(0)], workers=1)
    crowd, _, _ = run_toy([req(i) for i in range(24)], workers=1)
    assert crowd[0].latency > 1.5 * alone[0].latency
    assert max(r.latency for r in crowd) > 3 * alone[0].latency


class _UnresolvedRequest(ToyRequest):
    async def run(self, ctx):
        from dynbranch.workflow import BranchCoordinate, BranchPoint

        async with ctx.branch(BranchPoint(BranchCoordinate("toy", "plan", 0), ("a",))):
            await ctx.llm("plan", {"question": self.question})


class _MisrenderedRequest(ToyRequest):
    async def run(self, ctx):
        return await ctx.llm("answer", {"question": self.question})  # no "fact"


def test_workflow_mistakes_fail_the_request_with_a_typed_error():
    records, _, _ = run_toy([_UnresolvedRequest(0), _MisrenderedRequest(1), ToyRequest(2)])
    assert records[0].error_type == "StageError" and "without resolving" in records[0].error
    assert records[1].error_type == "RenderError" and "fact" in records[1].error
    assert records[2].status == "completed"


class _HumanRequest(ToyRequest):
    latency_origin = "last_human"

    async def run(self, ctx):
        await ctx.human("pick", {"question": self.question}, think_s=7.5)
        return await super().run(ctx)


def test_latency_after_a_human_wait_counts_from_the_click():
    records, orch, _ = run_toy([_HumanRequest(0), ToyRequest(1)])
    hci, plain = records
    pick = next(s for s in orch.log.stages if s.stage == "pick")
    assert pick.kind == "human" and pick.duration == pytest.approx(7.5)
    assert hci.measured_from == pytest.approx(pick.end)
    assert hci.latency == pytest.approx(hci.end - pick.end)
    assert plain.measured_from is None and plain.latency == pytest.approx(plain.end)


# -- placement ------------------------------------------------------------------------------


def _call(prompt, session, priority=0):
    from dynbranch.engines.protocol import GenerateRequest

    return GenerateRequest(f"{session}/x", prompt, 8, priority=priority, cache_salt="t",
                           session=session)


def test_affinity_placement_follows_the_prompt_and_keeps_fills_off_the_requests_engine():
    from dynbranch.runtime.affinity import AffinityPlacement

    policy = AffinityPlacement()
    head = "system prompt and function documents " * 40
    first = policy.choose([0, 0, 0, 0], _call(head + "user: a", "r1"))
    assert first == 0  # nothing cached yet: the least loaded, lowest index
    # the request's next prompt extends its first: it stays although engine 0 is busier
    assert policy.choose([2, 0, 0, 0], _call(head + "user: a\nassistant: b", "r1")) == 0
    # a new request sharing the head lands where the head is cached
    assert policy.choose([1, 0, 0, 0], _call(head + "user: c", "r2")) == 0
    # a fill of r1 goes to the least loaded engine other than r1's
    assert policy.choose([0, 3, 1, 2], _call(head + "fill", "r1", priority=1)) == 2
    # past the load guard affinity yields: of the idle engines, the one the fill warmed with
    # the head (engine 2) matches the prompt best
    assert policy.choose([9, 0, 0, 0], _call(head + "user: a\nassistant: b\nuser: d",
                                             "r1")) == 2


@pytest.mark.parametrize("kind", ["affinity", "prefix"])
def test_placing_then_noting_is_choosing_and_placing_alone_notes_nothing(kind):
    from dynbranch.runtime.affinity import PrefixAffinity

    make = AffinityPlacement if kind == "affinity" else PrefixAffinity
    chosen, placed = make(), make()
    prefix = (lambda p: p.prefix) if kind == "affinity" else (lambda p: p)
    head = "system prompt and function documents " * 40
    calls = [([0, 0, 0], _call(head + "user: a", "r1")),
             ([2, 0, 0], _call(head + "user: a\nassistant: b", "r1")),
             ([0, 0, 1], _call(head + "user: c", "r2")),
             ([0, 3, 1], _call(head + "fill", "r1", priority=1)),
             ([9, 0, 0], _call(head + "user: a\nassistant: b\nuser: d", "r1"))]
    for outstanding, call in calls:
        engine, note = placed.place(outstanding, call)
        held = [prefix(placed).held_blocks(i) for i in range(3)]
        recent = len(prefix(placed)._recent[call.cache_salt])
        assert engine == chosen.choose(outstanding, call)
        # NOTE: nothing of the call is noted until the pool has sent it
        assert [prefix(placed).held_blocks(i) for i in range(3)] == held
        assert len(prefix(placed)._recent[call.cache_salt]) == recent
        note(engine)
        assert [prefix(placed).held_blocks(i) for i in range(3)] == [
            prefix(chosen).held_blocks(i) for i in range(3)]
    assert placed.stats() == chosen.stats()


class _SlowDecision(NoSpeculation):
    """A branch hook whose decision takes a second of clock time (a gate across a network),
    or fails."""

    def __init__(self, run=None, reuse=None, fail=False):
        super().__init__(run, reuse)
        self.events: list[tuple[str, float]] = []
        self.fail = fail

    async def opened(self, session):
        clock = session._runner.executor.clock
        self.events.append(("opened", clock.now()))
        await clock.sleep(1.0)
        if self.fail:
            raise RuntimeError("the gate broke")
        self.events.append(("decided", clock.now()))

    async def resolved(self, session, chosen):
        self.events.append(("resolved", session.now()))


def _run_with(hook, requests):
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", "qwen3-8b@rtx4090", 2)})
    arm = Arm("slow-decision", "test", NoReuse, lambda run, reuse: hook, AffinityPlacement)

    async def main():
        await backend.start()
        try:
            orch = Orchestrator(clock, backend.clients(), arm)
            orch.start_run()
            records = [await orch.run_request(r, 0.0) for r in requests]
            return records, orch
        finally:
            await backend.shutdown()

    return clock.run(main())


def test_the_canonical_path_never_waits_on_c2_s_decision():
    hook = _SlowDecision()
    (record,), orch = _run_with(hook, [ToyRequest(0)])
    assert record.status == "completed"
    (branch,) = orch.log.branches
    plan = next(s for s in orch.log.stages if s.stage == "plan")
    # the branch's stage starts when the branch opens, not a second later
    assert plan.start == pytest.approx(branch.opened_at)
    assert [e for e, _ in hook.events] == ["opened", "decided", "resolved"]
    # the decision ends before the resolution reaches C2, however short the body
    assert hook.events[2][1] >= hook.events[1][1]


def test_a_failing_decision_fails_its_request_and_a_failing_body_cancels_the_decision():
    (record,), _ = _run_with(_SlowDecision(fail=True), [ToyRequest(0)])
    assert record.status == "failed" and "the gate broke" in record.error


    class Broken(ToyRequest):
        async def run(self, ctx):
            async with ctx.branch(BranchPoint(BranchCoordinate("toy", "plan", 0), KEYS)):
                await ctx.llm("plan", {"question": self.question})  # < 1 s: still deciding
                raise LookupError("the body broke")

    hook = _SlowDecision()
    (record,), _ = _run_with(hook, [Broken(1)])
    assert record.status == "failed" and "the body broke" in record.error
    assert [e for e, _ in hook.events] == ["opened"]  # cancelled, never decided


class _SeesDecided(NoSpeculation):
    """Records, at each entry's decision, whether the canonical path had already decided."""

    def __init__(self, run=None, reuse=None):
        super().__init__(run, reuse)
        self.seen: list[bool] = []

    async def opened(self, session):
        self.seen.append(session.decided)


def test_a_decision_that_begins_after_the_body_decided_sees_it_decided():
    class Instant(ToyRequest):
        async def run(self, ctx):
            async with ctx.branch(BranchPoint(BranchCoordinate("toy", "plan", 0), KEYS)) as br:
                br.resolve(self.key)  # decided without waiting on anything: no window
            return await ctx.llm("answer", {"question": self.question,
                                            "fact": f"{self.key} is 5 letters long"})

    hook = _SeesDecided()
    records, _ = _run_with(hook, [Instant(0), ToyRequest(1)])
    assert [r.status for r in records] == ["completed", "completed"]
    # the instant body decided before C2 began; the plan stage kept C2's window open
    assert hook.seen == [True, False]


def _run_full(clock, body):
    """``body(orch)`` on a ``full`` orchestrator over two sim engines (top-k gate, frequency
    predictor, a 64 MiB store), then the run finished: what ``body`` returned, and ``orch``."""
    backend = LocalBackend(clock, {"target": EngineSpec("sim", "qwen3-8b@rtx4090", 2)})

    async def main():
        await backend.start()
        try:
            run = RunContext(clock=clock, arm="full", models=backend.models(),
                             fill=FillOptions(fanout=2, predictor="frequency"),
                             gate=GateOptions(policy="topk", engines=2,
                                              profile="qwen3-8b@rtx4090"),
                             make_store=lambda: backend.make_store(1 << 26))
            orch = Orchestrator(clock, backend.clients(), get_arm("full"), run=run)
            orch.start_run()
            got = await body(orch)
            await orch.finish_run()
            return got, orch
        finally:
            await backend.shutdown()

    return clock.run(main())


def test_full_neither_prices_nor_fills_a_branch_whose_decision_c1_served():
    clock = VirtualClock()

    async def twice(orch):
        first = await orch.run_request(ToyRequest(0), 0.0)
        issued = orch.fills.counts["issued"]
        again = await orch.run_request(ToyRequest(0), clock.now())  # same input again
        return first, issued, again

    (first, issued, again), orch = _run_full(clock, twice)
    assert first.status == again.status == "completed"
    plans = [s for s in orch.log.stages if s.stage == "plan" and not s.speculative]
    assert [s.served_from for s in plans] == ["exec", "cache"]
    stats = orch.branch_hook.stats()
    assert issued > 0  # the first entry had a window and filled
    assert stats["branches"] == 2 and stats["decided_first"] == 1
    assert orch.fills.counts["issued"] == issued  # the C1-served entry filled nothing


def test_every_stage_row_begins_before_its_input_is_rendered(monkeypatch):
    # NOTE: rendering is a stage's own work, canonical or a fill's: on the real clock a row
    # that began after it would leave it out of the stage's time
    import time

    from dynbranch.clock import RealClock
    from dynbranch.runtime.execution import RequestState

    render, rendered = RequestState.render, []

    def slow_render(self, *args, **kwargs):
        began = time.monotonic()  # NOTE: the real clock's loop time
        time.sleep(RENDER_S)
        call = render(self, *args, **kwargs)
        rendered.append((call.rendered.input_digest, began))
        return call

    RENDER_S = 0.004
    monkeypatch.setattr(RequestState, "render", slow_render)
    _, orch = _run_full(RealClock(), lambda orch: orch.run_request(ToyRequest(0), 0.0))
    rows = [s for s in orch.log.stages if s.served_from == "exec"]
    assert {s.speculative for s in rows} == {False, True}  # canonical stages and a fill's
    assert {s.kind for s in rows} >= {"llm", "tool"}
    # each row holds a whole rendering of its stage: began before it, ended after it
    # (NOTE: an order, not a window, so a descheduled thread cannot fail it)
    late = [(s.stage, s.speculative) for s in rows
            if not any(digest == s.input_digest and s.start <= orch.rel(t) + 1e-6
                       and orch.rel(t) + RENDER_S <= s.end + 1e-6
                       for digest, t in rendered)]
    assert late == []


def test_a_request_ends_when_its_program_returns_not_after_scoring_it():
    # NOTE: the user has the answer when the program returns; scoring it against the data
    # set's ground truth (slow here) and ending its speculation are the harness's and the
    # system's own work after that, and on the real clock they were counted in its latency
    import time

    from dynbranch.clock import RealClock

    class SlowToScore(ToyRequest):
        def score(self, outcome):
            time.sleep(SCORE_S)
            return super().score(outcome)

    async def one(orch):
        record = await orch.run_request(SlowToScore(0), 0.0)
        return record, orch.rel()

    SCORE_S = 0.05
    (record, returned), orch = _run_full(RealClock(), one)
    assert record.status == "completed" and record.correct == 1.0
    last = max(s.end for s in orch.log.stages if not s.speculative)
    assert 0.0 <= record.end - last < SCORE_S / 2
    assert returned - record.end >= SCORE_S  # the scoring did run, after the end
