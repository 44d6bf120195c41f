"""C1 through the orchestrator: serve, join, invalidate on write, release on failure."""

import asyncio
import dataclasses

import pytest

from dynbranch.arms.registry import get_arm
from dynbranch.audit import unsafe_splices
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.clock import VirtualClock
from dynbranch.orchestrator import Orchestrator
from dynbranch.runtime.run import RunContext
from tests.shared_kv import RESOURCE, ReadRequest, SharedKV, WriteRequest


def run(arm, schedule, *, capacity=1 << 24):
    """Run ``schedule`` = [(arrival, request)] through ``arm``; returns records and the log."""
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", "qwen3-8b@rtx4090", 2)})

    async def main():
        await backend.start()
        try:
            ctx = RunContext(clock=clock, arm=arm, models=backend.models(),
                             make_store=lambda: backend.make_store(capacity))
            orch = Orchestrator(clock, backend.clients(), get_arm(arm), run=ctx)
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


def test_a_repeat_is_served_from_records_with_identical_values():
    kv = SharedKV({"colour": "blue"})
    records, orch = run("c1", [(0.0, ReadRequest("a", kv, "colour")),
                               (10.0, ReadRequest("b", kv, "colour"))])
    assert served(orch, "a") == [("plan", "exec"), ("lookup", "exec"), ("answer", "exec")]
    assert served(orch, "b") == [("plan", "cache"), ("lookup", "cache"), ("answer", "cache")]
    a, b = records
    assert b.latency < 0.01 < a.latency
    outs = {s.request_id: s.output_digest for s in orch.log.stages if s.stage == "answer"}
    assert outs["a"] == outs["b"]
    assert unsafe_splices(orch.log.stages) == []
    stats = orch.mechanism_stats["reuse"]
    assert stats["served_cache"] == 3 and stats["open_tickets"] == 0
    assert stats["store"]["in_flight"] == 0 and stats["store"]["records_held"] == 3


def test_the_floor_never_serves():
    kv = SharedKV({"colour": "blue"})
    _, orch = run("floor", [(0.0, ReadRequest("a", kv, "colour")),
                            (10.0, ReadRequest("b", kv, "colour"))])
    assert {s.served_from for s in orch.log.stages} == {"exec"}
    assert {s.reuse_name for s in orch.log.stages} == {""}


def test_concurrent_equal_stages_join_instead_of_executing_twice():
    kv = SharedKV({"colour": "blue"})
    _, orch = run("c1", [(0.0, ReadRequest("a", kv, "colour")),
                         (0.0, ReadRequest("b", kv, "colour"))])
    assert served(orch, "b") == [("plan", "join"), ("lookup", "join"), ("answer", "join")]
    assert orch.mechanism_stats["reuse"]["executed"] == 3


def test_a_write_invalidates_what_read_the_old_version_and_what_was_rendered_from_it():
    kv = SharedKV({"colour": "blue"})
    records, orch = run("c1", [(0.0, ReadRequest("a", kv, "colour")),
                               (10.0, WriteRequest("w", kv, "colour", "red")),
                               (20.0, ReadRequest("b", kv, "colour"))])
    # plan reads nothing and survives; lookup read the old version; answer was rendered from it
    assert served(orch, "b") == [("plan", "cache"), ("lookup", "exec"), ("answer", "exec")]
    write = next(s for s in orch.log.stages if s.stage == "store")
    assert write.served_from == "exec" and write.writes == {RESOURCE: "1"}
    # the lookup read the old version (direct); the answer was rendered from it (cascade)
    assert orch.mechanism_stats["reuse"]["invalidated"] == 2
    assert orch.mechanism_stats["reuse"]["store"]["invalidated_direct"] == 1
    assert orch.mechanism_stats["reuse"]["store"]["invalidated_cascade"] == 1
    answer_a = next(s for s in orch.log.stages if s.request_id == "a" and s.stage == "answer")
    lookup_a = next(s for s in orch.log.stages if s.request_id == "a" and s.stage == "lookup")
    assert lookup_a.read_set == {RESOURCE: "0"} and answer_a.reuse_name
    b_lookup = next(s for s in orch.log.stages if s.request_id == "b" and s.stage == "lookup")
    assert b_lookup.read_set == {RESOURCE: "1"}
    assert unsafe_splices(orch.log.stages) == []


def test_a_mutating_tool_call_is_never_served_from_a_record():
    kv = SharedKV({"colour": "blue"})
    _, orch = run("c1", [(0.0, WriteRequest("w1", kv, "colour", "red")),
                         (5.0, WriteRequest("w2", kv, "colour", "red"))])
    assert [s.served_from for s in orch.log.stages] == ["exec", "exec"]
    assert kv.version == 2


class _Failing(ReadRequest):
    def tool(self, name):
        tool = super().tool(name)

        class Broken(type(tool)):
            def call(self, fields):
                raise ConnectionError("store unreachable")

        broken = Broken(tool.kv)
        return broken


def test_a_failed_execution_releases_its_claim_and_joiners_execute_themselves():
    kv = SharedKV({"colour": "blue"})
    records, orch = run("c1", [(0.0, _Failing("a", kv, "colour")),
                               (0.0, ReadRequest("b", kv, "colour"))])
    assert records[0].status == "failed" and records[0].error_type == "ToolCallError"
    assert records[1].status == "completed"
    assert served(orch, "b")[1] == ("lookup", "exec")
    stats = orch.mechanism_stats["reuse"]
    assert stats["open_tickets"] == 0 and stats["store"]["in_flight"] == 0


class _MovedOn(ReadRequest):
    """Its lookup's value answers another input than the one it was named by."""

    def tool(self, name):
        tool = super().tool(name)

        class Moved(type(tool)):
            def call(self, fields):
                return dataclasses.replace(super().call(fields), recordable=False)

        return Moved(tool.kv)


def test_a_value_that_answers_another_input_is_returned_but_never_recorded():
    kv = SharedKV({"colour": "blue"})
    records, orch = run("c1", [(0.0, _MovedOn("a", kv, "colour")),
                               (10.0, ReadRequest("b", kv, "colour"))])
    assert [r.status for r in records] == ["completed", "completed"]
    # a's lookup left no record; a's answer names no lookup upstream, b executes its own
    assert served(orch, "b") == [("plan", "cache"), ("lookup", "exec"), ("answer", "cache")]
    stats = orch.mechanism_stats["reuse"]
    assert stats["not_its_input"] == 1 and stats["unrecordable"] == 0
    assert stats["open_tickets"] == 0
    assert stats["store"]["in_flight"] == 0
    assert unsafe_splices(orch.log.stages) == []


@pytest.mark.parametrize("capacity", [1])
def test_a_store_too_small_to_hold_anything_still_serves_every_request(capacity):
    kv = SharedKV({"colour": "blue"})
    records, orch = run("c1", [(0.0, ReadRequest("a", kv, "colour")),
                               (10.0, ReadRequest("b", kv, "colour"))], capacity=capacity)
    assert [r.status for r in records] == ["completed", "completed"]
    assert {s.served_from for s in orch.log.stages} == {"exec"}


def test_the_splice_checker_judges_served_stages_by_its_own_timeline():
    from dynbranch.audit import SAFE, UNSAFE, UNVERIFIED, Rerun, SpliceAudit
    from dynbranch.canonical import value_digest
    from dynbranch.runtime.execution import RequestState
    from dynbranch.workload import ToolResult, WriteSet

    kv = SharedKV({"colour": "blue"})
    lookup = RequestState(ReadRequest("r", kv, "colour")).render("lookup", "tool",
                                                                  {"key": "colour"})
    store = RequestState(WriteRequest("w", kv, "colour", "red")).render(
        "store", "tool", {"key": "colour", "value": "red"})
    blue, red = value_digest("blue"), value_digest("red")
    audit = SpliceAudit()

    def verdict(digest, issued, rerun):
        return audit.check(lookup, digest, issued, rerun).verdict

    audit.called(lookup, ToolResult("blue", reads={RESOURCE: "0"}), 0.1)
    before_write = audit.mark()
    now_blue = Rerun(blue, {RESOURCE: "0"})
    assert verdict(blue, before_write, now_blue) == SAFE
    assert verdict(red, before_write, Rerun(red, {RESOURCE: "0"})) == UNSAFE  # nobody made it
    assert verdict(blue, before_write, Rerun(red, {RESOURCE: "0"})) == UNSAFE  # value moved
    assert verdict(blue, before_write, Rerun(error="boom")) == UNVERIFIED
    audit.called(store, ToolResult("ok", reads={RESOURCE: "0"}, writes={RESOURCE: "1"}), 0.2)
    after_write = audit.mark()
    # served by a lookup issued after the write took effect: stale, whatever the re-run says
    assert verdict(blue, after_write, now_blue) == UNSAFE
    assert verdict(blue, after_write, Rerun(error="boom")) == UNSAFE
    # the value half compares with what canonical execution returns now, whenever served
    assert verdict(blue, before_write, Rerun(red, {RESOURCE: "1"})) == UNSAFE
    # an execution after the write (a join the lookup waited for) justifies its own value
    audit.called(lookup, ToolResult("red", reads={RESOURCE: "1"}), 0.3)
    assert verdict(red, after_write, Rerun(red, {RESOURCE: "1"})) == SAFE
    assert verdict(red, audit.mark(), Rerun(red, {RESOURCE: "2"})) == UNSAFE  # moved unseen
    audit.raised(store, WriteSet(unbounded=True), 0.4)
    assert verdict(red, audit.mark(), Rerun(red, {RESOURCE: "1"})) == UNSAFE  # may be changed


def test_the_splice_checker_keeps_a_repeated_value_and_read_set_once():
    from dynbranch.audit import SAFE, Rerun, SpliceAudit
    from dynbranch.canonical import value_digest
    from dynbranch.runtime.execution import RequestState
    from dynbranch.workload import ToolResult

    kv = SharedKV({"colour": "blue"})
    audit = SpliceAudit()
    calls = [RequestState(ReadRequest(f"r{i}", kv, "colour")).render("lookup", "tool",
                                                                     {"key": "colour"})
             for i in range(3)]
    reads = {RESOURCE: "0"}
    for i, call in enumerate(calls):
        audit.called(call, ToolResult("blue", reads=reads), 0.1 * (i + 1))
    reads[RESOURCE] = "9"  # NOTE: the tool's mapping changing later changes nothing kept
    (seen,) = audit._productions.values()
    assert [p.request_id for p in seen] == ["r0", "r1", "r2"]
    assert seen[0].digest is seen[1].digest is seen[2].digest
    assert seen[0].reads is seen[2].reads and dict(seen[0].reads) == {RESOURCE: "0"}
    verdict = audit.check(calls[0], value_digest("blue"), audit.mark(),
                          Rerun(value_digest("blue"), {RESOURCE: "0"}))
    assert verdict.verdict == SAFE and "r2" in verdict.note  # the latest producer
