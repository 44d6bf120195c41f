"""The running stage tally gives the summary fields the whole stage log gives."""

from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.audit import UNSAFE, UNVERIFIED, unsafe_splices, unverified_splices
from dynbranch.results import StageTally
from dynbranch.runtime.runlog import RequestRecord, StageRecord

REQUESTS = [
    RequestRecord(f"r{i}", 0.0, 0.0, 1.0, "completed", tenant=f"t{i % 2}") for i in range(4)
]


def _whole_log_tenant_reuse(requests, stages):
    """The check as a sort over the whole log (what the tally must reproduce)."""
    tenant = {r.request_id: r.tenant for r in requests}
    producer: dict[str, str] = {}
    counts = {"same_tenant": 0, "cross_tenant": 0, "unattributed": 0}
    for s in sorted(stages, key=lambda s: (s.end, s.start)):
        if s.served_from == "exec" and s.reuse_name and not s.error:
            producer.setdefault(s.reuse_name, s.request_id)
        elif s.served_from != "exec":
            source = producer.get(s.reuse_name)
            if source is None or source not in tenant or s.request_id not in tenant:
                counts["unattributed"] += 1
            else:
                same = tenant[source] == tenant[s.request_id]
                counts["same_tenant" if same else "cross_tenant"] += 1
    return counts


@st.composite
def _stage(draw):
    # NOTE: few names, few instants and few requests, so ties in (end, start) and names
    # shared across requests (the order-sensitive cases) are common.
    start = draw(st.integers(0, 3)) / 2
    return StageRecord(
        request_id=draw(st.sampled_from(["r0", "r1", "r2", "r3", "gone"])),
        stage="s",
        kind="llm",
        seq=0,
        coordinate=None,
        start=start,
        end=start + draw(st.integers(0, 2)) / 2,
        served_from=draw(st.sampled_from(["exec", "exec", "cache", "shadow", "join"])),
        speculative=draw(st.booleans()),
        reuse_name=draw(st.sampled_from(["", "a", "b", "c"])),
        engine_s=draw(st.floats(0, 10, allow_nan=False)),
        error=draw(st.sampled_from(["", "x"])),
        audit_verdict=draw(st.sampled_from(["", UNSAFE, UNVERIFIED, "safe"])),
        audit_digest=draw(st.sampled_from(["", "d1"])),
        output_digest=draw(st.sampled_from(["d1", "d2"])),
    )


@settings(max_examples=300, deadline=None)
@given(st.lists(_stage(), max_size=40))
def test_the_tally_equals_the_whole_log(stages):
    tally = StageTally()
    for s in stages:
        tally.add(s)
    assert tally.tenant_reuse(REQUESTS) == _whole_log_tenant_reuse(REQUESTS, stages)
    assert tally.stages == len(stages)
    assert tally.reuse_hits == sum(s.served_from == "cache" for s in stages)
    assert tally.promotions == sum(s.served_from in ("shadow", "join") for s in stages)
    assert tally.unsafe == len(unsafe_splices(stages))
    assert tally.unverified == len(unverified_splices(stages))
    assert sum(tally.spec_engine_s) == sum(s.engine_s for s in stages if s.speculative)
