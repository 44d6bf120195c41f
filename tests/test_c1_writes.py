"""C1 under writes, through the real orchestrator on the virtual clock: the write windows that
used to serve stale values, failed and cancelled writes, and the independent splice checker.

A mutating tool changes the store the moment it runs and is then charged its time; C1 must
serve nothing that read the old value from that moment on, although the write's new version
is known only when the call ends.
"""

import asyncio

import pytest

from dynbranch.arms.base import Arm
from dynbranch.arms.registry import get_arm
from dynbranch.audit import UNSAFE, UNVERIFIED, unsafe_splices, unverified_splices
from dynbranch.backend import EngineSpec, LocalBackend
from dynbranch.clock import VirtualClock
from dynbranch.fill import NoSpeculation
from dynbranch.orchestrator import Orchestrator
from dynbranch.reuse.hook import WriteAnnouncement
from dynbranch.reuse.store_hook import StoreReuseHook
from dynbranch.runtime.placement import SessionAffinity
from dynbranch.runtime.run import RunContext
from dynbranch.workload import Tool
from tests.shared_kv import RESOURCE, KVTool, LookupRequest, ReadRequest, SharedKV, WriteRequest


def run(arm, schedule, *, cancel=()):
    """Run ``schedule`` = [(arrival, request)] through ``arm`` (a name or an :class:`Arm`);
    ``cancel`` = [(time, request id)] cancels those requests then. Returns the orchestrator."""
    clock = VirtualClock()
    backend = LocalBackend(clock, {"target": EngineSpec("sim", "qwen3-8b@rtx4090", 2)})
    arm = get_arm(arm) if isinstance(arm, str) else arm

    async def main():
        await backend.start()
        try:
            ctx = RunContext(
                clock=clock,
                arm=arm.name,
                models=backend.models(),
                make_store=lambda: backend.make_store(1 << 24),
            )
            orch = Orchestrator(clock, backend.clients(), arm, run=ctx)
            t0 = orch.start_run()

            async def one(at, req):
                await clock.sleep_until(t0 + at)
                return await orch.run_request(req, at)

            tasks = {r.request_id: asyncio.ensure_future(one(at, r)) for at, r in schedule}
            for at, rid in cancel:
                await clock.sleep_until(t0 + at)
                tasks[rid].cancel()
            await asyncio.gather(*tasks.values(), return_exceptions=True)
            await orch.finish_run()
            return orch
        finally:
            await backend.shutdown()

    return clock.run(main())


def row(orch, request_id, stage):
    (found,) = [s for s in orch.log.stages if (s.request_id, s.stage) == (request_id, stage)]
    return found


class LateReport(StoreReuseHook):
    """The protocol before announcements: a write reaches C1 only when its call ends."""

    async def announce(self, request_id, write_set):
        return WriteAnnouncement(request_id, write_set)


LATE = Arm(
    "late",
    "C1 told of writes only after their charged time",
    lambda run: LateReport(run.make_store(), run),
    NoSpeculation,
    SessionAffinity,
)


# -- the two write windows -----------------------------------------------------------------------


def writer_at_1_reporting_at_1_5(kv):
    return WriteRequest("w", kv, "colour", "red", write_s=0.5)


def test_a_lookup_while_a_write_is_charged_misses_and_reads_the_new_value():
    """Writer mutates at 1.0 and reports at 1.5; a reader at 1.2 must not hit 0.0's record."""
    kv = SharedKV({"colour": "blue"})
    b, c, d = (LookupRequest(r, kv, "colour") for r in "bcd")
    orch = run(
        "c1",
        [
            (0.0, LookupRequest("a", kv, "colour")),
            (1.0, writer_at_1_reporting_at_1_5(kv)),
            (1.2, b),
            (2.0, c),
            (3.0, d),
        ],
    )
    w = row(orch, "w", "store")
    assert (w.start, w.end) == pytest.approx((1.0, 1.5))
    assert row(orch, "b", "lookup").start == pytest.approx(1.2)
    assert [row(orch, r, "lookup").served_from for r in "abcd"] == ["exec", "exec", "exec", "cache"]
    assert b.seen == (1, 1, "red") and c.seen == (1, 1, "red") and d.seen == (1, 1, "red")
    store = orch.mechanism_stats["reuse"]["store"]
    # b's lookup found a's record withheld; b's own record overlapped the write: refused
    assert (store["writing"], store["writes_open"], store["in_flight"]) == (1, 0, 0)
    assert orch.mechanism_stats["reuse"]["announced"] == 1
    assert unsafe_splices(orch.log.stages) == [] and unverified_splices(orch.log.stages) == []
    assert row(orch, "d", "lookup").audit_verdict == "safe"


def test_a_record_read_before_the_write_and_stored_during_it_is_refused():
    """A reader reads at 0.9 and stores at 1.1; the writer mutates at 1.0; a lookup at 1.3."""
    kv = SharedKV({"colour": "blue"})
    a = LookupRequest("a", kv, "colour", lookup_s=0.2)
    b = LookupRequest("b", kv, "colour")
    orch = run("c1", [(0.9, a), (1.0, writer_at_1_reporting_at_1_5(kv)), (1.3, b)])
    assert (row(orch, "a", "lookup").start, row(orch, "a", "lookup").end) == pytest.approx(
        (0.9, 1.1)
    )
    assert a.seen == (0, 1, "blue")  # it read before the write: its value was current then
    assert row(orch, "b", "lookup").served_from == "exec" and b.seen == (1, 1, "red")
    assert orch.mechanism_stats["reuse"]["recorded"] == 0  # a's and b's overlapped the write
    assert unsafe_splices(orch.log.stages) == []


@pytest.mark.parametrize("scenario", ["during", "stored-during"])
def test_without_announcements_both_windows_serve_the_old_value_and_the_checker_sees_it(scenario):
    """The same schedules with writes reported only when they end (the old protocol): the
    stale value reaches the reader, and the checker, reading only what it witnessed, flags it."""
    kv = SharedKV({"colour": "blue"})
    b = LookupRequest("b", kv, "colour")
    first = (
        (0.0, LookupRequest("a", kv, "colour"))
        if scenario == "during"
        else (0.9, LookupRequest("a", kv, "colour", lookup_s=0.2))
    )
    at = 1.2 if scenario == "during" else 1.3
    orch = run(LATE, [first, (1.0, writer_at_1_reporting_at_1_5(kv)), (at, b)])
    assert row(orch, "b", "lookup").served_from == "cache" and b.seen == (1, 1, "blue")
    (bad,) = unsafe_splices(orch.log.stages)
    assert (bad.request_id, bad.audit_verdict) == ("b", UNSAFE)
    assert "read at version '0' by a" in bad.audit_note and "by w at t=1.000000" in bad.audit_note


def test_overlapping_writes_committed_out_of_order_leave_no_stale_record():
    """w1 changes the store at 0.0 and commits at 0.5; w2 changes it again at 0.2 and commits
    at 0.3; a reader of w1's version stores at 0.7, a lookup follows at 1.0."""
    kv = SharedKV({"colour": "blue"})
    r = LookupRequest("r", kv, "colour", lookup_s=0.6)
    last = LookupRequest("l", kv, "colour")
    orch = run(
        "c1",
        [
            (0.0, WriteRequest("w1", kv, "colour", "red", write_s=0.5)),
            (0.1, r),
            (0.2, WriteRequest("w2", kv, "colour", "green", write_s=0.1)),
            (1.0, last),
        ],
    )
    assert r.seen == (1, 2, "red")
    assert row(orch, "l", "lookup").served_from == "exec" and last.seen == (2, 2, "green")
    assert orch.mechanism_stats["reuse"]["recorded"] == 0  # the resource's version is unknown
    assert unsafe_splices(orch.log.stages) == []


def test_helium_keeps_ignoring_writes_and_its_stale_hits_are_counted():
    kv = SharedKV({"colour": "blue"})
    b, c = LookupRequest("b", kv, "colour"), LookupRequest("c", kv, "colour")
    orch = run(
        "helium",
        [
            (0.0, LookupRequest("a", kv, "colour")),
            (1.0, writer_at_1_reporting_at_1_5(kv)),
            (1.2, b),
            (2.0, c),
        ],
    )
    assert b.seen[2] == c.seen[2] == "blue"  # served the pre-write value, during and after
    assert [s.request_id for s in unsafe_splices(orch.log.stages)] == ["b", "c"]
    reuse = orch.mechanism_stats["reuse"]
    assert reuse["announced"] == 0 and reuse["writes_ignored"] == 1


# -- writes that fail or are cancelled ----------------------------------------------------------


def test_a_write_that_raises_after_changing_the_store_still_invalidates():
    kv = SharedKV({"colour": "blue"})
    b, c = LookupRequest("b", kv, "colour"), LookupRequest("c", kv, "colour")
    w = WriteRequest("w", kv, "colour", "red", write_s=0.5, fail=True)
    orch = run("c1", [(0.0, LookupRequest("a", kv, "colour")), (1.0, w), (1.2, b), (2.0, c)])
    assert kv.contents["colour"] == "red"
    assert [row(orch, r, "lookup").served_from for r in "abc"] == ["exec", "exec", "exec"]
    assert b.seen[2] == c.seen[2] == "red"
    reuse = orch.mechanism_stats["reuse"]
    # the unreported version stales every later read until a write reports one again
    assert reuse["invalidated"] == 1 and reuse["store"]["writes_open"] == 0
    assert unsafe_splices(orch.log.stages) == []


class _Undeclared(KVTool):
    """Declares no write set (the contract's safe default); ``fail``: raises after writing."""

    def __init__(self, kv, cost_s, fail):
        super().__init__(kv, cost_s)
        self.fail = fail

    def write_set(self, fields):
        return Tool.write_set(self, fields)

    def call(self, fields):
        result = super().call(fields)
        if self.fail:
            raise ConnectionError("gone after writing")
        return result


class UndeclaredWrite(WriteRequest):
    def __init__(self, request_id, kv, key, value, *, fail):
        super().__init__(request_id, kv, key, value, write_s=0.5)
        self._tool = _Undeclared(kv, 0.5, fail)


@pytest.mark.parametrize("fail", [False, True])
def test_a_tool_that_declares_nothing_is_taken_to_write_anything(fail):
    kv, other = SharedKV({"colour": "blue"}), SharedKV({"size": "small"}, resource="kv:other")
    b, c = LookupRequest("b", kv, "colour"), LookupRequest("c", other, "size")
    d = LookupRequest("d", other, "size")
    orch = run(
        "c1",
        [
            (0.0, LookupRequest("a", kv, "colour")),
            (0.0, LookupRequest("a2", other, "size")),
            (1.0, UndeclaredWrite("w", kv, "colour", "red", fail=fail)),
            (1.2, b),
            (1.3, c),
            (2.0, d),
        ],
    )
    # while it runs, no record serves; a failed one may have changed anything
    assert [row(orch, r, "lookup").served_from for r in "bcd"] == [
        "exec",
        "exec",
        "exec" if fail else "cache",
    ]
    assert b.seen[2] == "red" and c.seen[2] == d.seen[2] == "small"
    reuse = orch.mechanism_stats["reuse"]
    assert reuse["invalidated"] == (2 if fail else 1)
    assert reuse["store"]["writing"] == (0 if fail else 2)
    assert unsafe_splices(orch.log.stages) == []


def test_a_write_cancelled_while_charged_commits_what_it_wrote():
    kv = SharedKV({"colour": "blue"})
    b, c = LookupRequest("b", kv, "colour"), LookupRequest("c", kv, "colour")
    orch = run(
        "c1",
        [
            (0.0, LookupRequest("a", kv, "colour")),
            (1.0, writer_at_1_reporting_at_1_5(kv)),
            (1.3, b),
            (2.0, c),
        ],
        cancel=[(1.2, "w")],
    )
    assert kv.version == 1
    assert [row(orch, r, "lookup").served_from for r in "abc"] == ["exec", "exec", "cache"]
    assert b.seen[2] == c.seen[2] == "red"
    store = orch.mechanism_stats["reuse"]["store"]
    assert (store["writes_open"], store["writes_committed"], store["invalidated_direct"]) == (
        0,
        1,
        1,
    )
    assert unsafe_splices(orch.log.stages) == []


def test_reads_and_cascade_survive_the_protocol():
    """The full read request: plan and answer (LLM) around the lookup, with a write between."""
    kv = SharedKV({"colour": "blue"})
    orch = run(
        "c1",
        [
            (0.0, ReadRequest("a", kv, "colour")),
            (5.0, ReadRequest("b", kv, "colour")),
            (10.0, writer_at_1_reporting_at_1_5(kv)),
            (20.0, ReadRequest("c", kv, "colour")),
        ],
    )
    assert [row(orch, "b", s).served_from for s in ("plan", "lookup", "answer")] == ["cache"] * 3
    assert [row(orch, "c", s).served_from for s in ("plan", "lookup", "answer")] == [
        "cache",
        "exec",
        "exec",
    ]
    assert orch.mechanism_stats["reuse"]["invalidated"] == 2
    assert unsafe_splices(orch.log.stages) == []


# -- the checker's other halves ---------------------------------------------------------------


class _Unreachable(KVTool):
    def call(self, fields):
        raise ConnectionError("the store cannot be reached")


class UnreachableLookup(LookupRequest):
    """Served from another's record; its own tool raises (only the audit ever calls it)."""

    def __init__(self, request_id, kv, key):
        super().__init__(request_id, kv, key)
        self._tool = _Unreachable(kv)


def test_a_served_stage_the_audit_cannot_re_execute_is_unverified_not_unsafe():
    kv = SharedKV({"colour": "blue"})
    orch = run(
        "c1", [(0.0, LookupRequest("a", kv, "colour")), (1.0, UnreachableLookup("b", kv, "colour"))]
    )
    (unverified,) = unverified_splices(orch.log.stages)
    assert (unverified.request_id, unverified.served_from) == ("b", "cache")
    assert unverified.audit_verdict == UNVERIFIED
    assert "could not re-execute: ConnectionError" in unverified.audit_note
    assert unsafe_splices(orch.log.stages) == []


class BehindTheBack(LookupRequest):
    """Before its lookup, changes the store without any tool call: nobody can know."""

    def __init__(self, request_id, kv, key, *, value=None, version=False):
        super().__init__(request_id, kv, key)
        self._value, self._version = value, version

    async def run(self, ctx):
        if self._value is not None:
            self.kv.contents[self.key] = self._value
        if self._version:
            self.kv.version += 1
        return await super().run(ctx)


@pytest.mark.parametrize(
    ("change", "note"),
    [
        ({"value": "red"}, "value differs"),
        ({"version": True}, "re-execution now reads {'kv:shared': '1'}"),
    ],
)
def test_changes_no_write_reported_are_caught_by_the_re_execution(change, note):
    kv = SharedKV({"colour": "blue"})
    orch = run(
        "c1",
        [
            (0.0, LookupRequest("a", kv, "colour")),
            (1.0, BehindTheBack("b", kv, "colour", **change)),
        ],
    )
    (bad,) = unsafe_splices(orch.log.stages)
    assert bad.request_id == "b" and note in bad.audit_note
    assert RESOURCE in bad.read_set  # the store served its record, none the wiser
