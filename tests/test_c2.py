"""C2 through the orchestrator: fills, promotion on resolution, non-interference."""

import asyncio
import dataclasses

from dynbranch.arms.registry import get_arm
from dynbranch.audit import unsafe_splices
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.clock import VirtualClock
from dynbranch.orchestrator import Orchestrator
from dynbranch.runtime.run import FillOptions, GateOptions, RunContext
from tests.shared_kv import KVTool as SharedKVTool
from tests.shared_kv import SharedKV
from tests.toy import KEYS, ToyRequest


def run(arm, requests, *, fanout=3, workers=2, spacing=0.0, gate="topk"):
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", "qwen3-8b@rtx4090", workers)})

    async def main():
        await backend.start()
        try:
            ctx = RunContext(clock=clock, arm=arm, models=backend.models(),
                             fill=FillOptions(fanout=fanout),
                             gate=GateOptions(policy=gate, engines=workers,
                                              profile="qwen3-8b@rtx4090"),
                             make_store=lambda: backend.make_store(1 << 26))
            orch = Orchestrator(clock, backend.clients(), get_arm(arm), run=ctx)
            t0 = orch.start_run()

            async def one(i, req):
                await clock.sleep_until(t0 + i * spacing)
                return await orch.run_request(req, i * spacing)

            records = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
            await orch.finish_run()
            loads = [await c.load() for c in backend.clients()["target"]]
            return records, orch, loads
        finally:
            await backend.shutdown()

    return clock.run(main())


def test_fills_run_every_candidate_and_the_winner_is_promoted():
    # a long question makes the plan's prefill slow, so fills finish while it decides
    records, orch, loads = run("c2", [ToyRequest(1, context_words=2500)])
    assert records[0].status == "completed" and records[0].correct == 1.0
    spec = [s for s in orch.log.stages if s.speculative]
    assert {s.fill for s in spec} == set(KEYS)  # all three candidates were filled
    canon = {s.stage: s.served_from for s in orch.log.stages if not s.speculative}
    assert canon["plan"] == "exec" and canon["lookup"] in ("shadow", "join")
    assert canon["answer"] in ("shadow", "join")
    fills = orch.mechanism_stats["speculation"]["fills"]
    assert fills["issued"] == 3 and fills["consumed"] == 1 and fills["discarded"] == 2
    assert fills["running"] == 0
    # non-interference: nothing of the losers is left running or readable
    assert all(load.running == 0 and load.waiting == 0 for load in loads)
    store = orch.mechanism_stats["reuse"]["store"]
    assert store["in_flight"] == 0 and store["drops"] >= 1
    assert unsafe_splices(orch.log.stages) == []


def test_a_fill_a_canonical_stage_joins_runs_at_canonical_priority_from_then_on():
    # the answer decodes long, so the canonical answer joins the fill's still running
    records, orch, _ = run("c2", [ToyRequest(1, answer_words=400)], workers=1)
    assert records[0].status == "completed" and records[0].correct == 1.0
    canon = {s.stage: s.served_from for s in orch.log.stages if not s.speculative}
    assert canon["answer"] == "join"
    reuse = orch.mechanism_stats["reuse"]
    assert reuse["fills_joined"] >= 1 and reuse["served_join"] >= 1
    # the joined engine call was promoted on its engine (the tool stage has no engine call)
    assert orch.pool.counts["promoted"] == 1


class _MovedOnToy(ToyRequest):
    """Its lookups answer another input than the one they were named by (see ToolResult):
    ``ahead`` the tool says so before a call runs (:meth:`Tool.answers`), else only in the
    result. ``calls`` counts the calls that ran."""

    def __init__(self, *args, ahead: bool = False, **kwargs):
        super().__init__(*args, **kwargs)
        inner, calls = self._tool, []
        self.calls = calls

        class Moved(type(inner)):
            def answers(self, fields):
                return not ahead

            def call(self, fields):
                calls.append(fields)
                return dataclasses.replace(inner.call(fields), recordable=False)

        self._tool = Moved(self.request_id, False)


def _moved_on_run(ahead):
    request = _MovedOnToy(1, context_words=2500, ahead=ahead)
    records, orch, loads = run("c2", [request])
    assert records[0].status == "completed" and records[0].correct == 1.0
    canon = {s.stage: s.served_from for s in orch.log.stages if not s.speculative}
    assert canon == {"plan": "exec", "lookup": "exec", "answer": "exec"}
    fills = orch.mechanism_stats["speculation"]["fills"]
    assert fills["issued"] == 3 and fills["consumed"] == 0 and fills["running"] == 0
    assert fills["stopped"] == 3
    store = orch.mechanism_stats["reuse"]["store"]
    assert store["in_flight"] == 0 and store["puts"] == 0  # no shadow was left
    assert all(load.running == 0 and load.waiting == 0 for load in loads)
    return request, [s for s in orch.log.stages if s.speculative]


def test_a_fill_stops_before_a_tool_call_that_would_answer_another_input():
    request, spec = _moved_on_run(ahead=True)
    assert spec == []  # every fill stopped at its lookup before the call ran
    assert len(request.calls) == 1  # the canonical lookup's call only


def test_a_fill_whose_tool_answers_another_input_is_charged_logged_and_stops():
    # a tool that only tells in its result: the call ran, so it is charged and logged
    request, spec = _moved_on_run(ahead=False)
    assert len(request.calls) == 4  # three fills' lookups and the canonical one
    assert sorted(s.stage for s in spec) == ["lookup"] * 3
    assert all(s.error and not s.output_digest and s.end > s.start for s in spec)


def test_promoted_values_equal_what_the_floor_computes():
    reqs = lambda: [ToyRequest(i, context_words=800) for i in range(6)]  # noqa: E731
    floor, floor_orch, _ = run("floor", reqs(), spacing=1.0)
    c2, orch, _ = run("c2", reqs(), spacing=1.0)
    assert [r.correct for r in c2] == [r.correct for r in floor] == [1.0] * 6
    assert sum(s.served_from != "exec" for s in orch.log.stages) >= 6

    # NOTE: the score only reads the answer's letter count, which two keys share; the
    # canonical stages' outputs tell a promoted fill of the wrong key apart.
    def outputs(o):
        return sorted((s.request_id, s.stage, s.output_digest)
                      for s in o.log.stages if not s.speculative)

    assert all(digest for _, _, digest in outputs(orch))
    assert outputs(orch) == outputs(floor_orch)


def test_c2_does_not_reuse_across_requests_and_full_does():
    reqs = lambda: [ToyRequest(0), ToyRequest(3)]  # noqa: E731 - same key and question shape
    _, c2, _ = run("c2", reqs(), fanout=0, spacing=5.0)
    _, full, _ = run("full", reqs(), fanout=0, spacing=5.0)
    assert {s.served_from for s in c2.log.stages} == {"exec"}
    later = [s for s in full.log.stages if s.request_id == "toy-003"]
    assert any(s.served_from == "cache" for s in later)


class _MutatingLookup(ToyRequest):
    """A workflow whose downstream tool call writes: it must never run in a fill."""

    def __init__(self, n, kv):
        super().__init__(n, context_words=2500)
        self._tool = _WritingTool(kv)


class _WritingTool(SharedKVTool):
    def is_read_only(self, fields):
        return False

    def call(self, fields):
        written = super().call({"key": fields["key"], "value": "written"})
        key = fields["key"]
        return type(written)(f"{key} is {len(key)} letters long", written.reads, written.writes)


def test_a_mutating_stage_never_runs_speculatively():
    kv = SharedKV({})
    records, orch, _ = run("c2", [_MutatingLookup(1, kv)])
    assert records[0].status == "completed"
    assert not any(s.speculative and s.kind == "tool" for s in orch.log.stages)
    assert kv.version == 1  # only the canonical call wrote
    assert orch.mechanism_stats["speculation"]["fills"]["stopped"] == 3


def test_the_priced_gate_admits_less_under_load_and_leaks_no_reservation():
    light, orch_light, _ = run("c2", [ToyRequest(i, context_words=600) for i in range(4)],
                               gate="priced", spacing=3.0)
    heavy, orch_heavy, _ = run("c2", [ToyRequest(i, context_words=600) for i in range(48)],
                               gate="priced", workers=1, spacing=0.01)
    assert all(r.status == "completed" and r.correct == 1.0 for r in light + heavy)
    per_request = []
    for orch, n in ((orch_light, 4), (orch_heavy, 48)):
        spec = orch.mechanism_stats["speculation"]
        assert spec["reserved_blocks"] == 0 and spec["fills"]["running"] == 0
        assert spec["gate"]["released"] == spec["gate"]["admitted"] + spec["gate"]["audit"]
        per_request.append(spec["fills"]["issued"] / n)
    assert per_request[1] < per_request[0]
    assert unsafe_splices(orch_heavy.log.stages) == []
