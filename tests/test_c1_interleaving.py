"""Random interleavings of reads, writes, record stores and lookups, through the orchestrator,
C1's hook and the store on the virtual clock (Hypothesis).

Each example is a schedule of requests on one or two shared key-value stores: lookups (which
execute, store records, or are served them) and writes (charged up to a second after they
change the store, so they overlap; some raise after writing, some are cancelled while
charged), at arrivals on a coarse grid so that many land on one instant. The property, checked
against the stores' own history and not against anything C1 or the splice checker says:

* no lookup is ever served a record whose read version is older than the store's version
  when the lookup was issued — a write counts from the moment it changes the store, announced
  and not yet committed included — and the value served is what that version held;
* the splice checker agrees (no unsafe, no unverified splice), and nothing leaks (no open
  write, ticket or claim at the end).

The same property run against weaker protocols (writes reported only when their call ends;
overlapping writes' versions trusted in the order they commit) finds a counterexample, so the
property can fail.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from dynbranch.audit import unsafe_splices, unverified_splices
from dynbranch.reuse.writes import WriteMarks
from tests.shared_kv import LookupRequest, SharedKV, WriteRequest
from tests.test_c1_writes import LATE, run

EXAMPLES = 1000
KEYS = ("colour", "size")


@dataclass(frozen=True)
class Step:
    """One request of a schedule (a plain description; the test builds the objects)."""

    kind: str  # lookup | write | failing
    store: int
    key: str
    at: float
    charge_s: float


steps = st.builds(
    Step,
    kind=st.sampled_from(["lookup", "lookup", "lookup", "write", "write", "failing"]),
    store=st.sampled_from([0, 0, 0, 1]),  # NOTE: mostly one store, so writes overlap often
    key=st.sampled_from(KEYS),
    at=st.integers(0, 8).map(lambda i: i / 4),
    charge_s=st.sampled_from([0.01, 0.25, 0.5, 1.0]),
)
schedules = st.tuples(
    st.lists(steps, min_size=2, max_size=12),
    st.lists(st.tuples(st.integers(0, 11), st.integers(0, 14)), max_size=2),
)


def build(plan: list[Step]) -> tuple[list[SharedKV], list]:
    """The stores and the (arrival, request) schedule a plan describes."""
    # NOTE: a key names its store, so equal rendered inputs always read the same resource
    kvs = [SharedKV({f"{k}@{i}": "initial" for k in KEYS}, resource=f"kv:{i}") for i in (0, 1)]
    schedule = []
    for i, step in enumerate(plan):
        kv, rid, key = kvs[step.store], f"r{i:02d}", f"{step.key}@{step.store}"
        if step.kind == "lookup":
            request = LookupRequest(rid, kv, key, step.charge_s)
        else:
            fail = step.kind == "failing"
            request = WriteRequest(rid, kv, key, f"{rid}-value", write_s=step.charge_s, fail=fail)
        schedule.append((step.at, request))
    return kvs, schedule


def check_schedule(arm, drawn) -> None:
    """Run one drawn schedule through ``arm`` and assert the property (module docstring)."""
    plan, cancels = drawn
    kvs, schedule = build(plan)
    cancel = sorted((t / 4, f"r{i:02d}") for i, t in cancels if i < len(plan))
    orch = run(arm, schedule, cancel=cancel)
    rows = {s.request_id: s for s in orch.log.stages if s.stage == "lookup"}
    for _, request in schedule:
        if not isinstance(request, LookupRequest) or request.seen is None:
            continue
        issued, returned, value = request.seen
        served = rows[request.request_id]
        if served.served_from == "exec":
            continue
        read = int(served.read_set[request.kv.resource])
        assert issued <= read <= returned, (
            f"{request.request_id} issued at version {issued} was served a record of "
            f"version {read} ({served.served_from})"
        )
        assert value == request.kv.history[read][request.key]
    assert unsafe_splices(orch.log.stages) == []
    assert unverified_splices(orch.log.stages) == []
    reuse = orch.mechanism_stats["reuse"]
    store = reuse["store"]
    assert (reuse["open_tickets"], reuse["open_writes"]) == (0, 0)
    assert (store["writes_open"], store["in_flight"]) == (0, 0)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(schedules)
def test_no_lookup_is_served_a_version_older_than_the_current_one(drawn):
    check_schedule("c1", drawn)


@pytest.mark.parametrize("hole", ["writes reported late", "overlapping commits trusted"])
def test_the_property_finds_the_windows_a_weaker_protocol_leaves(hole, monkeypatch):
    """Writes reported only when their call ends (the old protocol), or two overlapping
    writes' reported versions trusted in commit order: the property finds a stale serve."""
    arm = LATE if hole == "writes reported late" else "c1"
    if hole == "overlapping commits trusted":
        monkeypatch.setattr(WriteMarks, "contended", lambda self, receipt, resource: False)

    @settings(
        max_examples=3 * EXAMPLES,
        deadline=None,
        database=None,
        derandomize=True,  # NOTE: the same examples every run, so the search cannot miss
        report_multiple_bugs=False,
        phases=[Phase.generate],  # a counterexample is enough; no need to shrink it
        suppress_health_check=[HealthCheck.too_slow],
    )
    @given(schedules)
    def weaker(drawn):
        check_schedule(arm, drawn)

    with pytest.raises(AssertionError):
        weaker()
