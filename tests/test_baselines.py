"""The baseline arms: Helium⁺ (prefix-affinity placement, an exact operator cache without
freshness) and InstCache (a whole-request cache pre-populated from the train split)."""

import asyncio
import copy
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from dynbranch.audit import unsafe_splices
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.baselines import (
    AffinityConfig,
    HeliumReuseHook,
    InstCacheHook,
    PrefixAffinity,
    RequestCache,
    helium_arm,
    instcache_arm,
)
from dynbranch.baselines.instcache import request_input, request_key
from dynbranch.canonical import value_digest
from dynbranch.clock import VirtualClock
from dynbranch.engines.protocol import GenerateRequest
from dynbranch.errors import ConfigError
from dynbranch.fill import NoSpeculation
from dynbranch.orchestrator import Orchestrator
from dynbranch.runtime.offline import precompute
from dynbranch.runtime.placement import LeastOutstanding
from dynbranch.runtime.run import RunContext
from dynbranch.workflow import StageSpec, Template
from dynbranch.workload import DataConfig, Workload
from tests.shared_kv import TEMPLATE as KV_TEMPLATE
from tests.shared_kv import ReadRequest, SharedKV, WriteRequest
from workloads.react import ReActWorkload
from workloads.routing import RoutingRequest, RoutingWorkload, split_of
from workloads.subagent import SubAgentWorkload

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
MUSIQUE = Path(__file__).parent / "fixtures" / "musique"
DATA = DataConfig(None, Path("/nonexistent-cache"))


def run(arm, schedule, *, before=None, capacity=1 << 24):
    """Run ``schedule`` = [(arrival, request)] through the arm object ``arm``.

    ``before(orch)``, if given, is awaited after the orchestrator is built and before the
    run's clock starts (where the driver pre-populates InstCache).
    """
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", "qwen3-8b@rtx4090", 2)})

    async def main():
        await backend.start()
        try:
            ctx = RunContext(clock=clock, arm=arm.name, models=backend.models(),
                             make_store=lambda: backend.make_store(capacity))
            orch = Orchestrator(clock, backend.clients(), arm, run=ctx)
            if before is not None:
                await before(orch)
            t0 = orch.start_run()

            async def one(at, req):
                await clock.sleep_until(t0 + at)
                return await orch.run_request(req, at)

            records = await asyncio.gather(*(one(at, r) for at, r in schedule))
            await orch.finish_run()
            return records, orch
        finally:
            await backend.shutdown()

    return clock.run(main())


def served(orch, request_id):
    return [(s.stage, s.served_from) for s in orch.log.stages if s.request_id == request_id]


# -- PrefixAffinity -----------------------------------------------------------------------------


def call(prompt, salt="tenant"):
    return GenerateRequest(request_id="r", prompt=prompt, max_tokens=8, cache_salt=salt)


A, B = "a" * 1000, "b" * 1000  # 7 full blocks of 128 characters each, then the tail


def test_a_shared_prefix_goes_back_to_the_engine_that_served_it():
    policy = PrefixAffinity()
    assert policy.choose([0, 0, 0], call(A + "first tail " * 20)) == 0  # new: least loaded
    assert policy.choose([1, 0, 0], call(B + "first tail " * 20)) == 1
    # least-outstanding would pick engine 0 for both; affinity keeps each prefix at home
    assert policy.choose([0, 0, 0], call(B + "another tail " * 20)) == 1
    assert policy.choose([0, 1, 0], call(A + "another tail " * 20)) == 0
    assert policy.stats() == {"affinity": 2, "no_affinity": 2, "load_guard": 0}


def test_a_short_shared_head_alone_is_no_reason_to_stack_calls():
    policy = PrefixAffinity()
    head = "You route requests. " * 13  # 260 characters: two blocks every prompt shares
    assert policy.choose([0, 0], call(head + "x" * 1000)) == 0
    # 2 of 9 blocks match engine 0: below min_match_fraction, so the least loaded engine
    assert policy.choose([1, 0], call(head + "y" * 1000)) == 1
    assert policy.stats()["no_affinity"] == 2


def test_the_load_guard_moves_a_call_off_an_engine_too_far_ahead():
    policy = PrefixAffinity(AffinityConfig(max_imbalance=4))
    assert policy.choose([0, 0], call(A)) == 0
    assert policy.choose([4, 0], call(A + "tail")) == 0  # exactly at the threshold: stays
    assert policy.choose([5, 0], call(A + "tail")) == 1  # beyond it: least loaded
    assert policy.stats() == {"affinity": 1, "no_affinity": 1, "load_guard": 1}
    # the call that moved taught engine 1 the prefix too; equal matches go to the less loaded
    assert policy.choose([3, 1], call(A + "again")) == 1


def test_prefixes_of_different_cache_salts_never_attract_each_other():
    policy = PrefixAffinity()
    assert policy.choose([0, 0], call(A, salt="t1")) == 0
    assert policy.choose([1, 0], call(A, salt="t2")) == 1
    assert policy.choose([0, 0], call(A, salt="t2")) == 1


def test_memory_is_bounded_per_engine_and_eviction_cuts_chains_from_the_tail():
    config = AffinityConfig(block_chars=4, max_blocks=4, blocks_per_engine=8)
    policy = PrefixAffinity(config)
    for i in range(200):
        policy.choose([i % 2, (i + 1) % 2], call(f"{i:04d}" * 5))
        assert max(policy.held_blocks(0), policy.held_blocks(1)) <= 8
    assert policy.held_blocks(0) == policy.held_blocks(1) == 8

    small = PrefixAffinity(AffinityConfig(block_chars=4, max_blocks=4, blocks_per_engine=4))
    x = small.block_keys("xxxxXXXXxxxxXXXX", "s")
    small.choose([0], call("xxxxXXXXxxxxXXXX", salt="s"))
    small.choose([0], call("yyyyYYYY", salt="s"))  # evicts two of x's four blocks
    assert small.held_blocks(0) == 4
    assert small.match(0, x).blocks == 2  # its head survives: still a usable prefix


def test_choices_are_deterministic_across_processes_and_hash_seeds():
    script = (
        "import json\n"
        "from dynbranch.runtime.affinity import PrefixAffinity\n"
        "from dynbranch.engines.protocol import GenerateRequest\n"
        "p = PrefixAffinity()\n"
        "out = []\n"
        "for i in range(60):\n"
        "    prompt = ('abcdefgh'[i % 5] * 700) + str(i) * 40\n"
        "    load = [(i * 7 + k) % 6 for k in range(4)]\n"
        "    out.append(p.choose(load, GenerateRequest('r', prompt, 8, cache_salt='t')))\n"
        "print(json.dumps(out))\n"
    )
    outs = set()
    for seed in ("0", "1", "12345"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env=env, check=True, cwd=Path(__file__).resolve().parent.parent)
        outs.add(done.stdout.strip())
    assert len(outs) == 1
    assert len(set(json.loads(outs.pop()))) > 1  # it does spread calls, not pin everything on one


@pytest.mark.parametrize("field,value", [
    ("block_chars", 0), ("max_blocks", 0), ("blocks_per_engine", 0),
    ("min_match_fraction", 1.5), ("max_imbalance", -1)])
def test_a_bad_affinity_setting_is_refused_by_name(field, value):
    with pytest.raises(ValueError, match=field):
        AffinityConfig(**{field: value})
    with pytest.raises(ValueError, match="evict its own head"):
        AffinityConfig(max_blocks=64, blocks_per_engine=32)


# -- Helium⁺ ------------------------------------------------------------------------------------


def test_the_helium_arm_is_prefix_affinity_plus_the_freshless_operator_cache():
    arm = helium_arm()
    assert arm.name == "helium"
    assert isinstance(arm.make_placement(), PrefixAffinity)
    kv = SharedKV({"colour": "blue"})
    _, orch = run(arm, [(0.0, ReadRequest("a", kv, "colour"))])
    assert isinstance(orch.reuse, HeliumReuseHook) and not orch.reuse.track_reads
    assert type(orch.branch_hook) is NoSpeculation  # no speculation
    assert not any(s.speculative for s in orch.log.stages)


def test_helium_serves_repeats_and_joins_equal_operators_in_flight():
    kv = SharedKV({"colour": "blue"})
    records, orch = run(helium_arm(), [(0.0, ReadRequest("a", kv, "colour")),
                                       (0.0, ReadRequest("b", kv, "colour")),
                                       (10.0, ReadRequest("c", kv, "colour"))])
    assert served(orch, "a") == [("plan", "exec"), ("lookup", "exec"), ("answer", "exec")]
    assert served(orch, "b") == [("plan", "join"), ("lookup", "join"), ("answer", "join")]
    assert served(orch, "c") == [("plan", "cache"), ("lookup", "cache"), ("answer", "cache")]
    assert records[2].latency < 0.01 < records[0].latency
    assert unsafe_splices(orch.log.stages) == []
    stats = orch.mechanism_stats["reuse"]
    assert stats["executed"] == 3 and stats["served_cache"] == 3 and stats["open_tickets"] == 0


def test_after_a_write_helium_serves_the_stale_record_and_the_checker_counts_it():
    kv = SharedKV({"colour": "blue"})
    schedule = [(0.0, ReadRequest("a", kv, "colour")),
                (10.0, WriteRequest("w", kv, "colour", "red")),
                (20.0, ReadRequest("b", kv, "colour"))]
    records, orch = run(helium_arm(), schedule)
    assert [r.status for r in records] == ["completed"] * 3 and kv.contents["colour"] == "red"
    assert served(orch, "b") == [("plan", "cache"), ("lookup", "cache"), ("answer", "cache")]
    lookup_b = next(s for s in orch.log.stages if s.request_id == "b" and s.stage == "lookup")
    assert lookup_b.output_digest == value_digest("blue")  # the pre-write value
    assert lookup_b.read_set == {}  # no read-set is tracked, so none is logged
    # the answer was rendered from the stale fact, so it replays equal: only the lookup is unsafe
    assert [(s.request_id, s.stage) for s in unsafe_splices(orch.log.stages)] == [("b", "lookup")]
    stats = orch.mechanism_stats["reuse"]
    assert stats["writes_ignored"] == 1 and stats["invalidated"] == stats["writes"] == 0

    kv = SharedKV({"colour": "blue"})  # the same schedule on C1: fresh, so nothing unsafe
    from dynbranch.arms.registry import get_arm

    _, c1 = run(get_arm("c1"), [(0.0, ReadRequest("a", kv, "colour")),
                                (10.0, WriteRequest("w", kv, "colour", "red")),
                                (20.0, ReadRequest("b", kv, "colour"))])
    assert unsafe_splices(c1.log.stages) == []


# -- InstCache ----------------------------------------------------------------------------------


class AskRequest(ReadRequest):
    """A read request that says what its entire input is (the proposed method)."""

    def request_input(self):
        return {"question": self.question}


class AskWorkload(Workload):
    """Read requests over one shared store, with keys per split; records what it was asked."""

    name, template = "kv", KV_TEMPLATE

    def __init__(self, kv, keys):
        self.kv, self.keys, self.asked = kv, keys, []

    def check_data(self, data):
        pass

    def requests(self, data, n, seed, split="test"):
        self.asked.append((n, seed, split))
        keys = self.keys[split]
        return [AskRequest(f"{split}-{i}", self.kv, keys[i % len(keys)]) for i in range(n)]


def instcache_hook(train_requests):
    return InstCacheHook(RunContext(clock=VirtualClock(), arm="instcache"),
                         train_requests=train_requests)


def test_prepopulation_draws_only_from_the_train_split():
    kv = SharedKV({"colour": "blue", "size": "big", "shape": "round"})
    workload = AskWorkload(kv, {"train": ["colour", "size"], "test": ["colour", "shape"]})
    hook = instcache_hook(3)
    asyncio.run(hook.prepopulate(workload, DATA, seed=5))
    assert workload.asked == [(3, 5, "train")]
    stats = hook.stats()
    assert stats["entries"] == stats["prepopulated"] == 2 and stats["duplicates"] == 1
    assert {e.run.request_id for e in hook.cache.entries()} == {"train-0", "train-1"}
    with pytest.raises(ConfigError, match="train split"):
        asyncio.run(hook.prepopulate(workload, DATA, seed=5, measured_split="train"))
    assert workload.asked == [(3, 5, "train")]


def test_routing_prepopulates_from_train_records_only():
    workload = RoutingWorkload(root=FIXTURE)
    hook = instcache_hook(4)
    asyncio.run(hook.prepopulate(workload, DATA, seed=0))
    sources = [e.run.request_id for e in hook.cache.entries()]
    assert sources and all(split_of(s.split("-", 2)[2]) == "train" for s in sources)
    assert hook.stats()["duplicates"] == 4 - len(sources)


def test_a_request_identical_in_input_is_served_whole_and_a_different_one_is_not():
    kv = SharedKV({"colour": "blue", "shape": "round"})
    cache = RequestCache()
    asyncio.run(cache.prepopulate([AskRequest("train-0", kv, "colour")]))
    twin, other = AskRequest("test-0", kv, "colour"), AskRequest("test-1", kv, "shape")
    entry = cache.lookup(twin)
    assert entry is not None and entry.run.request_id == "train-0"
    assert entry.outcome() == "The colour is blue."
    rows = entry.stage_records(twin, 3.0)
    assert [(r.stage, r.served_from, r.start, r.end) for r in rows] == [
        ("plan", "cache", 3.0, 3.0), ("lookup", "cache", 3.0, 3.0), ("answer", "cache", 3.0, 3.0)]
    assert all(r.request_id == "test-0" and r.reuse_name == entry.key.name for r in rows)
    assert all(r.audit_digest == r.output_digest for r in rows)
    assert unsafe_splices(rows) == []
    assert cache.lookup(other) is None
    assert cache.stats()["hits"] == 1 and cache.stats()["misses"] == 1


class ShortAnswer(AskRequest):
    """Its answer stage may emit 3 tokens, fewer than its replayed text has."""

    template = Template("kv-short", "1", [
        dataclasses.replace(spec, sampling=dataclasses.replace(spec.sampling, max_tokens=3))
        if spec.name == "answer" else spec
        for spec in KV_TEMPLATE.stages.values()
    ])


def test_the_audit_reference_of_a_cached_llm_stage_is_cut_as_the_engine_cuts_it():
    kv = SharedKV({"colour": "blue"})
    cache = RequestCache()
    asyncio.run(cache.prepopulate([ShortAnswer("train-0", kv, "colour")]))
    twin = ShortAnswer("test-0", kv, "colour")
    rows = cache.lookup(twin).stage_records(twin, 0.0)
    answer = next(r for r in rows if r.stage == "answer")
    assert answer.output_digest != value_digest("The colour is blue.")  # it was cut
    assert answer.audit_digest == answer.output_digest  # against the cut text, not the whole
    assert unsafe_splices(rows) == []


def test_instcache_prepopulates_what_the_replaying_engine_returns_within_its_context():
    from dynbranch.engines.tokenizer import encode

    kv = SharedKV({"colour": "blue", "size": "big"})
    workload = AskWorkload(kv, {"train": ["colour"], "test": ["colour"]})
    probe = AskRequest("probe", kv, "colour")
    prompt = KV_TEMPLATE.stage("answer").render({"question": probe.question,
                                                   "fact": "blue"}).text
    context = len(encode(prompt)) + 2  # room for two tokens of the answer
    hook = InstCacheHook(RunContext(clock=VirtualClock(), arm="instcache",
                                    replay_context=context), train_requests=1)
    asyncio.run(hook.prepopulate(workload, DATA, seed=0))
    whole = hook.serve_request(AskRequest("test-0", kv, "colour"), 0.0, audit=True)
    answer = next(r for r in whole.rows if r.stage == "answer")
    assert answer.output_digest != value_digest("The colour is blue.")
    assert answer.audit_digest == answer.output_digest
    assert unsafe_splices(whole.rows) == []


def test_a_whole_request_served_after_a_write_is_counted_unsafe():
    kv = SharedKV({"colour": "blue"})
    cache = RequestCache()
    asyncio.run(cache.prepopulate([AskRequest("train-0", kv, "colour")]))
    kv.contents["colour"], kv.version = "red", 1  # another request wrote the store
    late = AskRequest("test-0", kv, "colour")
    rows = cache.lookup(late).stage_records(late, 0.0)
    assert [r.stage for r in unsafe_splices(rows)] == ["lookup"]


def test_requests_without_a_stated_input_are_never_cached():
    kv = SharedKV({"colour": "blue"})
    plain = ReadRequest("train-0", kv, "colour")  # the kv template has no adapter
    assert request_input(plain) is None and request_key(plain) is None
    cache = RequestCache()
    asyncio.run(cache.prepopulate([plain]))
    assert len(cache) == 0 and cache.lookup(ReadRequest("t", kv, "colour")) is None
    assert cache.stats()["uncacheable"] == cache.stats()["uncacheable_lookups"] == 1


class ClickRequest(AskRequest):
    """A request that waits on a person before it answers (as HCI's do)."""

    template = Template("click", "1", [
        *KV_TEMPLATE.stages.values(),
        StageSpec("pick", "human", ("question",))])

    async def run(self, ctx):
        await ctx.human("pick", {"question": self.question}, think_s=2.0)
        return await super().run(ctx)


def test_a_request_that_waits_on_a_person_is_not_prepopulated():
    kv = SharedKV({"colour": "blue"})
    cache = RequestCache()
    asyncio.run(cache.prepopulate([ClickRequest("train-0", kv, "colour")]))
    assert len(cache) == 0 and cache.stats()["interactive"] == 1
    assert cache.lookup(ClickRequest("test-0", kv, "colour")) is None


@pytest.mark.parametrize("make", [ReActWorkload, SubAgentWorkload])
def test_musique_workloads_are_keyed_on_their_question(make):
    workload, data = make(), DataConfig(MUSIQUE, Path("/nonexistent-cache"))
    cache = RequestCache()
    train = workload.requests(data, 1, 0, "train")[0]
    asyncio.run(cache.prepopulate([train]))
    twin = copy.copy(train)
    twin.request_id = "twin"
    entry = cache.lookup(twin)
    assert entry is not None and twin.score(entry.outcome()) == 1.0
    assert request_input(twin) == {"question": train.record.question}
    others = workload.requests(data, 5, 0, "test")
    assert all(t.record.question != train.record.question for t in others)
    assert all(cache.lookup(t) is None for t in others)


def routing_fixture():
    # NOTE: the fixture's original three categories (its train split then holds one record)
    workload = RoutingWorkload(root=FIXTURE,
                               categories=("multi_turn_base", "multiple", "parallel_multiple"))
    suite = workload.load(DATA).suite
    train = workload.requests(DATA, 1, 0, "train")[0]
    return workload, suite, train


def test_a_routing_request_with_the_same_turns_docs_and_config_is_a_hit():
    workload, suite, train = routing_fixture()
    cache = RequestCache()
    asyncio.run(cache.prepopulate([train]))
    record = train.record
    twin = RoutingRequest("routing-twin", dataclasses.replace(record, id="twin"), suite)
    entry = cache.lookup(twin)
    assert entry is not None and entry.run.effectful  # multi-turn calls write the request's APIs
    outcome = entry.outcome()
    assert twin.score(outcome) == 1.0
    assert outcome is not entry.outcome()  # a private copy per hit
    for test in workload.requests(DATA, 3, 0, "test"):
        assert cache.lookup(test) is None
    config = copy.deepcopy(dict(record.initial_config))
    notes = config["GorillaFileSystem"]["root"]["home"]["contents"]["notes"]["contents"]
    notes["ideas.txt"]["content"] = "paint the fence"  # one file differs: another input
    other_config = dataclasses.replace(record, id="cfg", initial_config=config)
    assert cache.lookup(RoutingRequest("routing-cfg", other_config, suite)) is None


def test_sub_request_overlap_is_never_served():
    workload, suite, train = routing_fixture()
    record = train.record
    partial = dataclasses.replace(record, id="partial",
                                  turns=(*record.turns[:-1], "Now, what is 2 plus 2?"))
    request = RoutingRequest("routing-partial", partial, suite)
    cache_run = asyncio.run(precompute(train))
    own_run = asyncio.run(precompute(RoutingRequest("probe", partial, suite)))
    shared = [a.rendered.input_digest for a, b in zip(cache_run.stages, own_run.stages,
                                                      strict=False)
              if a.rendered.input_digest == b.rendered.input_digest]
    assert len(shared) >= 3  # the first turns render identical stage inputs

    arm = instcache_arm(LeastOutstanding)

    async def before(orch):
        await orch.reuse.prepopulate(workload, DATA, seed=0)

    records, orch = run(arm, [(0.0, request)], before=before)
    assert records[0].status == "completed"
    assert {f for _, f in served(orch, "routing-partial")} == {"exec"}
    assert orch.mechanism_stats["reuse"]["entries"] == 1
    assert orch.reuse.serve_request(request, 0.0, audit=False) is None


def test_instcache_through_the_orchestrator_serves_a_hit_whole_in_no_time():
    kv = SharedKV({"colour": "blue", "shape": "round"})
    workload = AskWorkload(kv, {"train": ["colour"], "test": ["colour", "shape"]})

    async def before(orch):
        await orch.reuse.prepopulate(workload, DATA, seed=0)

    records, orch = run(instcache_arm(LeastOutstanding),
                        [(1.0, AskRequest("hit", kv, "colour")),
                         (1.0, AskRequest("miss", kv, "shape"))], before=before)
    hit, miss = records
    assert hit.status == "completed" and hit.correct == 1.0 and hit.stages == 3
    assert hit.latency == 0.0 and miss.latency > 0.0
    assert served(orch, "hit") == [("plan", "cache"), ("lookup", "cache"), ("answer", "cache")]
    assert {f for _, f in served(orch, "miss")} == {"exec"}
    assert unsafe_splices(orch.log.stages) == []
    stats = orch.mechanism_stats["reuse"]
    assert stats["hits"] == 1 and stats["misses"] == 1 and stats["entries"] == 1
