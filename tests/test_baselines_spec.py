"""The speculation and scheduling baselines: DSP (run-ahead depth learned online), SPAgent (top-1
next action into an in-request buffer, throttled by load) and Parrot (prefix-context
placement, no reuse, no fills)."""

import asyncio
from pathlib import Path

import pytest

import dynbranch.arms.registry
from dynbranch.audit import unsafe_splices
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.baselines import (
    DepthLearner,
    DepthOutcome,
    DSPConfig,
    LoadThrottle,
    ParrotConfig,
    ParrotPlacement,
    SPAgentConfig,
    dsp_arm,
    parrot_arm,
    spagent_arm,
)
from dynbranch.baselines.parrot import PrefixMatcher
from dynbranch.clock import VirtualClock
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.engines.protocol import CANONICAL, GenerateRequest, LoadSnapshot
from dynbranch.fill import NoSpeculation
from dynbranch.orchestrator import Orchestrator
from dynbranch.reuse.hook import NoReuse
from dynbranch.reuse.store_hook import StoreReuseHook
from dynbranch.runtime.placement import SessionAffinity
from dynbranch.runtime.run import FillOptions, RunContext
from tests.shared_kv import ReadRequest, SharedKV
from tests.toy import ToyRequest

FLOOR = dynbranch.arms.registry.BUILT["floor"]
ARMS = {"dsp": dsp_arm, "spagent": spagent_arm, "parrot": parrot_arm}


def run(arm, requests, *, workers=2, spacing=0.0, depth=2, config=None, background=0):
    """Run ``requests`` through the arm object ``arm`` on ``workers`` sim engines, with fill
    depth ``depth`` and the arm's own typed ``config``.

    ``background`` long canonical calls are started on every engine first and cancelled at
    the end: a loaded engine. Returns (records, orchestrator, engine loads at the end).
    """
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", "qwen3-8b@rtx4090", workers)})

    async def main():
        await backend.start()
        try:
            ctx = RunContext(clock=clock, arm=arm.name, models=backend.models(),
                             fill=FillOptions(depth=depth), arm_config=config,
                             make_store=lambda: backend.make_store(1 << 26))
            orch = Orchestrator(clock, backend.clients(), arm, run=ctx)
            hold = [asyncio.create_task(c.generate(GenerateRequest(
                f"bg-{c.engine_id}-{i}", "x " * 64, 4000, replay_text="y " * 4000)))
                for c in backend.clients()["target"] for i in range(background)]
            await asyncio.sleep(0)  # let the background calls reach their engines
            t0 = orch.start_run()

            async def one(i, req):
                await clock.sleep_until(t0 + i * spacing)
                return await orch.run_request(req, i * spacing)

            records = [await one(i, r) for i, r in enumerate(requests)] if spacing else \
                await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
            for task in hold:
                task.cancel()
            await asyncio.gather(*hold, return_exceptions=True)
            await orch.finish_run()
            loads = [await c.load() for c in backend.clients()["target"]]
            return list(records), orch, loads
        finally:
            await backend.shutdown()

    return clock.run(main())


def speculative(orch, request_id=None):
    return [s.stage for s in orch.log.stages
            if s.speculative and (request_id is None or s.request_id == request_id)]


def canonical_values(orch):
    return {(s.request_id, s.stage, s.output_digest)
            for s in orch.log.stages if not s.speculative}


def served_only_from_own_fills(orch):
    """Every stage served without executing was served a name a fill of its own request
    claimed (the in-request buffer), never another request's record."""
    own = {(s.request_id, s.reuse_name) for s in orch.log.stages if s.speculative}
    served = [s for s in orch.log.stages if not s.speculative and s.served_from != "exec"]
    return all((s.request_id, s.reuse_name) in own for s in served)


class _Mispredicted(ToyRequest):
    """A toy request whose fills render inputs the canonical path never renders: no fill of
    it can ever be consumed."""

    async def speculate(self, ctx, point, candidate):
        await super().speculate(ctx, point, candidate + "-x")


# -- every arm: completes, exact, safe --------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ARMS))
def test_each_arm_completes_the_toy_requests_exactly_and_safely(name):
    reqs = lambda: [ToyRequest(i, context_words=800) for i in range(6)]  # noqa: E731
    floor, floor_orch, _ = run(FLOOR, reqs(), spacing=2.0)
    records, orch, loads = run(ARMS[name](), reqs(), spacing=2.0)
    assert [r.status for r in records] == ["completed"] * 6
    assert [r.correct for r in records] == [r.correct for r in floor] == [1.0] * 6
    assert canonical_values(orch) == canonical_values(floor_orch)  # lossless
    assert unsafe_splices(orch.log.stages) == []
    assert orch.fills.running == 0
    assert all(load.running == 0 and load.waiting == 0 for load in loads)


# -- DSP --------------------------------------------------------------------------------------


def test_the_dsp_learner_switches_a_depth_off_when_it_never_pays_and_back_on_when_it_does():
    learner = DepthLearner(DSPConfig(trade_off=0.5, alpha=0.5, probe_every=3, max_depth=2))
    key = ("toy", "plan")
    assert learner.best_k(key) == 1  # untried depths are worth trying, one at a time
    learner.observe(key, [DepthOutcome(gain_s=0.0, cost_s=1.0)])  # not consumed
    assert learner.best_k(key) == 2  # depth 1 lost 0.5 s; depth 2 is still untried
    learner.observe(key, [DepthOutcome(0.0, 1.0), DepthOutcome(0.0, 1.0)])
    assert learner.best_k(key) == 0
    assert [learner.plan(key) for _ in range(6)] == [0, 0, 1, 0, 0, 1]  # probes, every 3rd
    for _ in range(3):  # consumed: each saved its whole duration
        learner.observe(key, [DepthOutcome(1.0, 1.0)])
    assert learner.best_k(key) == 1  # depth 1 now nets > 0; depth 2 still nets -0.5 s
    for _ in range(4):
        learner.observe(key, [DepthOutcome(1.0, 1.0), DepthOutcome(2.0, 1.0)])
    assert learner.best_k(key) == 2
    # a depth whose stage never runs (the downstream is one stage long) adds nothing: ties
    # go to the smaller k
    other = ("toy", "other")
    for _ in range(2):
        learner.observe(other, [DepthOutcome(1.0, 1.0), DepthOutcome(0.0, 0.0)])
    assert learner.best_k(other) == 1


@pytest.mark.parametrize("field,value", [
    ("trade_off", -1.0), ("alpha", 0.0), ("alpha", 1.5), ("probe_every", 0), ("max_depth", -1)])
def test_a_bad_dsp_setting_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        DSPConfig(**{field: value})


def test_dsp_fills_the_top_candidate_only_and_stops_it_at_its_depth_budget():
    # a fresh learner speculates one stage (k = 1) at the first entry: lookup, not answer
    records, orch, _ = run(dsp_arm(), [ToyRequest(1, context_words=2500)])
    assert records[0].correct == 1.0
    assert speculative(orch) == ["lookup"]
    fills = orch.mechanism_stats["speculation"]["fills"]
    assert fills["issued"] == 1 and fills["stopped"] == 1 and fills["running"] == 0
    assert orch.fills.running == 0  # no fill outlived its request


def test_dsp_k_falls_when_fills_are_never_consumed_and_rises_when_they_are():
    config = DSPConfig(alpha=0.5, probe_every=2)
    missed = [_Mispredicted(3 * i, context_words=2500) for i in range(6)]
    hit = [ToyRequest(3 * i, context_words=2500) for i in range(6, 18)]  # key "alpha" each
    records, orch, _ = run(dsp_arm(), missed + hit, spacing=10.0, config=config)
    assert all(r.correct == 1.0 for r in records)
    rows = [s for s in orch.log.stages if s.speculative]
    per_request = {r.request_id: [s.stage for s in rows if s.request_id == r.request_id]
                   for r in records}
    # missed: after the first two entries (k = 1, then depth 2 tried once) only probes fill
    assert [len(per_request[r.request_id]) for r in missed[2:]] == [0, 1, 0, 1]
    # hit: probes get consumed, k comes back and every later entry is filled
    assert all(per_request[r.request_id] for r in hit[-4:])
    assert orch.branch_hook.policy.learner.best_k(("toy", "plan")) >= 1
    assert orch.mechanism_stats["speculation"]["fills"]["consumed"] >= 4


def test_dsp_never_reuses_across_requests():
    reqs = lambda: [ToyRequest(0), ToyRequest(3), ToyRequest(6)]  # noqa: E731 - equal lookups
    _, off, _ = run(dsp_arm(), reqs(), spacing=5.0, depth=0)  # K = 0: no fills
    assert isinstance(off.reuse, StoreReuseHook) and not off.reuse.cross_request
    assert {s.served_from for s in off.log.stages} == {"exec"}
    assert speculative(off) == []
    _, on, _ = run(dsp_arm(), reqs(), spacing=5.0)
    assert served_only_from_own_fills(on)


# -- SPAgent ----------------------------------------------------------------------------------


def snapshot(engine, running, waiting=0, kv_used=0, kv_total=100):
    return LoadSnapshot(engine, 0.0, running, waiting, kv_used, kv_total)


def test_the_load_throttle_reads_the_least_loaded_engine_against_its_thresholds():
    throttle = LoadThrottle(SPAgentConfig(max_sequences=8, max_kv_usage=0.8))
    room = throttle.headroom([snapshot("a", 9), snapshot("b", 5, 2)])
    assert (room.engine_id, room.sequences, room.admit) == ("b", 7, True)
    assert not throttle.headroom([snapshot("a", 8), snapshot("b", 6, 2)]).admit  # 8: at the bar
    assert not throttle.headroom([snapshot("a", 0, 0, kv_used=80)]).admit  # KV at 0.8
    assert throttle.headroom([snapshot("a", 0, 0, kv_used=79)]).admit
    assert not throttle.headroom([]).admit


@pytest.mark.parametrize("field,value", [("max_sequences", 0), ("max_kv_usage", 0.0),
                                         ("max_kv_usage", 1.5)])
def test_a_bad_spagent_setting_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        SPAgentConfig(**{field: value})


def test_spagent_fills_only_while_engine_load_is_under_the_threshold():
    request = lambda: [ToyRequest(3, context_words=2500)]  # noqa: E731 - key: the top-1
    idle, idle_orch, _ = run(spagent_arm(), request(), workers=1)
    loaded, loaded_orch, loads = run(spagent_arm(), request(), workers=1, background=8)
    assert idle[0].correct == loaded[0].correct == 1.0
    idle_stats = idle_orch.mechanism_stats["speculation"]
    loaded_stats = loaded_orch.mechanism_stats["speculation"]
    assert (idle_stats["admitted"], idle_stats["throttled"]) == (1, 0)
    assert idle_stats["fills"]["issued"] == 1 and idle_stats["fills"]["consumed"] == 1
    assert speculative(idle_orch) == ["lookup", "answer"]  # the top-1 candidate's downstream
    assert (loaded_stats["admitted"], loaded_stats["throttled"]) == (0, 1)
    assert loaded_stats["fills"]["issued"] == 0 and speculative(loaded_orch) == []
    assert all(load.running == 0 and load.waiting == 0 for load in loads)
    # the same load with a higher bar is headroom again. NOTE: the decision runs beside the
    # branch's own canonical call, which the engine already holds: 8 + 1 sequences
    _, held, _ = run(spagent_arm(), request(), workers=1, background=8,
                     config=SPAgentConfig(max_sequences=9))
    assert held.mechanism_stats["speculation"]["fills"]["issued"] == 0
    _, raised, _ = run(spagent_arm(), request(), workers=1, background=8,
                       config=SPAgentConfig(max_sequences=10))
    assert raised.mechanism_stats["speculation"]["fills"]["issued"] == 1


def test_spagent_stops_a_search_fill_after_the_search():
    records, orch, _ = run(spagent_arm(), [ToyRequest(3, context_words=2500)],
                           config=SPAgentConfig(search_tools=("kv",)))
    assert records[0].correct == 1.0
    assert speculative(orch) == ["lookup"]  # the action's result, not the reasoning after it
    assert orch.mechanism_stats["speculation"]["after_search_stops"] == 1
    canon = {s.stage: s.served_from for s in orch.log.stages if not s.speculative}
    assert canon["lookup"] in ("shadow", "join") and canon["answer"] == "exec"


def test_spagent_never_reuses_across_requests():
    kv = SharedKV({"colour": "blue"})
    _, orch, _ = run(spagent_arm(), [ReadRequest(r, kv, "colour") for r in "abc"], spacing=5.0)
    assert {s.served_from for s in orch.log.stages} == {"exec"}  # no branch: nothing to fill
    _, toy, _ = run(spagent_arm(), [ToyRequest(0), ToyRequest(3), ToyRequest(6)], spacing=5.0)
    assert not toy.reuse.cross_request and served_only_from_own_fills(toy)


# -- Parrot -----------------------------------------------------------------------------------


def test_parrot_never_serves_from_cache_and_never_fills():
    kv = SharedKV({"colour": "blue"})
    reqs = [ReadRequest("a", kv, "colour"), ReadRequest("b", kv, "colour"),
            ReadRequest("c", kv, "colour")]
    records, orch, _ = run(parrot_arm(), reqs)  # concurrent equal operators: helium joins them
    assert [r.status for r in records] == ["completed"] * 3
    assert type(orch.reuse) is NoReuse and type(orch.branch_hook) is NoSpeculation
    assert {s.served_from for s in orch.log.stages} == {"exec"}
    _, toy, _ = run(parrot_arm(), [ToyRequest(i, context_words=2500) for i in range(3)])
    assert speculative(toy) == [] and toy.mechanism_stats["speculation"]["fills"]["issued"] == 0
    assert {s.served_from for s in toy.log.stages} == {"exec"}


def call(prompt, session, priority=CANONICAL):
    return GenerateRequest("r", prompt, 8, session=session, priority=priority)


SHARED = "You are a careful assistant. Documents follow. " + "d" * 400


def test_parrot_colocates_calls_sharing_a_global_prefix():
    parrot, floor = ParrotPlacement(), SessionAffinity()
    for s in ("s1", "s2", "s3", "s4"):  # four sessions share SHARED; all land on engine 1
        assert parrot.choose([1, 0, 1], call(SHARED + f" question {s}", s)) == 1
    # a fifth session with that prefix goes to the engine holding it, not the idlest one
    assert parrot.choose([0, 2, 0], call(SHARED + " question s5", "s5")) == 1
    assert floor.choose([0, 2, 0], call(SHARED + " question s5", "s5")) == 0
    # a prompt without a global prefix goes by load alone
    assert parrot.choose([1, 2, 0], call("Another template entirely. " + "e" * 200, "s6")) == 2
    assert parrot.stats()["global_prefix"] == 1 and parrot.stats()["no_context"] == 5


def test_parrot_keeps_a_chain_on_its_context_up_to_the_latency_cap():
    parrot, floor = ParrotPlacement(ParrotConfig(latency_task_cap=4)), SessionAffinity(slack=2)
    assert parrot.choose([0, 0], call("p1", "a")) == floor.choose([0, 0], call("p1", "a")) == 0
    # three open calls at home: the floor re-homes (slack 2), Parrot keeps its context
    assert floor.choose([3, 0], call("p2", "a")) == 1
    assert parrot.choose([3, 0], call("p2", "a")) == 0
    assert parrot.choose([4, 0], call("p3", "a")) == 1  # at the cap: another engine
    # every engine at the cap: the call stays with its context (engine 1 since p3)
    assert parrot.choose([5, 4], call("p4", "a")) == 1
    assert parrot.stats()["session_context"] == 2 and parrot.stats()["over_cap"] == 1


@pytest.mark.parametrize("make", [ParrotPlacement, SessionAffinity])
def test_a_session_is_homed_where_its_call_was_sent_not_where_it_was_placed(make):
    policy, other = make(), make()
    engine, note = policy.place([0, 0], call(SHARED + " question a", "a"))
    assert engine == other.choose([0, 0], call(SHARED + " question a", "a")) == 0
    # NOTE: placing alone remembers nothing: the next call of the session is placed afresh
    assert policy.place([1, 0], call(SHARED + " question a2", "a"))[0] == 1
    assert other.choose([1, 0], call(SHARED + " question a2", "a")) == 0
    note(1)  # the pool sent the first call to engine 1 (it overrode the pick)
    assert policy.choose([0, 0], call(SHARED + " question a3", "a")) == 1
    # a fill is not remembered; the floor's keeps off the session's home (engine 1 now),
    # Parrot places fills by load alone
    fill = call(SHARED + " fill", "a", priority=CANONICAL + 1)
    assert policy.place([1, 0], fill) == ((0 if make is SessionAffinity else 1), None)


def test_parrot_notes_a_prompt_prefix_on_the_engine_it_was_sent_to():
    parrot = ParrotPlacement()
    for s in ("s1", "s2", "s3", "s4"):
        engine, note = parrot.place([0, 0, 0], call(SHARED + f" question {s}", s))
        assert engine == 0
        note(2)  # each sent to engine 2
    # the shared prefix is global now, held by engine 2 alone: a new session goes there
    assert parrot.choose([0, 0, 1], call(SHARED + " question s5", "s5")) == 2
    assert parrot.stats()["global_prefix"] == 1


def test_the_prefix_matcher_shrinks_to_the_shared_part_and_counts_it():
    matcher = PrefixMatcher(ParrotConfig(min_prefix_chars=10, global_prefix_count=3))
    head = "0123456789ABCDEF"
    assert matcher.add("short") is None  # not beyond min_prefix_chars
    matcher.add(head + "one")
    matcher.add(head + "two")
    assert matcher.query(head + "three") is None  # shared twice: not global yet
    entry = matcher.add(head + "three")
    assert entry.count == 3 and matcher.query(head + "four") == (head, entry)
    matcher.add("0123456789Zzz")  # same bucket, another continuation: its own entry
    assert len(matcher) == 2 and matcher.query("0123456789Zzzz") is None


@pytest.mark.parametrize("field,value", [("latency_task_cap", 0), ("min_prefix_chars", 0),
                                         ("global_prefix_count", 1), ("max_sessions", 0)])
def test_a_bad_parrot_setting_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        ParrotConfig(**{field: value})


# -- through the CLI path ---------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(ARMS))
def test_each_arm_replays_routing_through_the_driver(name, tmp_path, monkeypatch):
    monkeypatch.setitem(dynbranch.arms.registry.BUILT, name, ARMS[name]())
    cfg = ReplayConfig(workload="routing", arm=name, backend="local", clock="virtual",
                       requests=12, out=Path(tmp_path), progress=False,
                       workload_options={"root": "tests/fixtures/bfcl"})
    summary = run_replay(prepare(cfg, progress=lambda _: None)).summary
    assert summary["arm"] == name and summary["completed"] == 12 and summary["failed"] == 0
    assert summary["unsafe_splices"] == 0 and summary["accuracy"] == 1.0
    assert (tmp_path / "summary.json").exists()
    if name == "parrot":
        assert summary["fills_issued"] == 0 and summary["reuse_hits"] == 0
    else:
        assert summary["fills_issued"] > 0
        assert summary["fills_issued"] == summary["fills_consumed"] + summary["fills_discarded"]
