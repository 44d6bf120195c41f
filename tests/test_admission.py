"""Admission control and tenants, as the serving side applies them: ``--max-inflight``
rejects at arrival, ``--deadline-s`` cancels late requests (both typed, counted in the
summary and the report), ``--tenants`` spreads requests over tenants and reuse never
crosses them."""

from pathlib import Path

import pandas as pd
import pytest

from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.results import report
from dynbranch.reuse.names import reuse_name
from dynbranch.reuse.store_hook import StoreReuseHook
from dynbranch.runtime.execution import RequestState
from dynbranch.runtime.run import AdmissionOptions, RunContext
from tests.toy import ToyRequest

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
MUSIQUE = Path(__file__).parent / "fixtures" / "musique"  # the shipped MuSiQue/HotpotQA fixture


def _run(tmp_path, **kw):
    base = dict(
        workload="routing",
        arm="floor",
        backend="local",
        clock="virtual",
        requests=40,
        rate=20.0,
        seed=1,
        workers=1,
        out=tmp_path / "run",
        progress=False,
        workload_options={"root": str(FIXTURE)},
    )
    base.update(kw)
    return run_replay(prepare(ReplayConfig(**base), progress=lambda _m: None))


def test_max_inflight_rejects_at_arrival_and_bounds_what_runs(tmp_path):
    free = _run(tmp_path, out=tmp_path / "free")
    capped = _run(tmp_path, max_inflight=3)
    s = capped.summary
    statuses = [r.status for r in capped.requests]
    assert len(statuses) == 40 and set(statuses) == {"completed", "rejected"}
    assert s["rejected"] == statuses.count("rejected") > 0
    assert s["completed"] + s["rejected"] == 40 and s["failed"] == 0
    assert s["launch"]["peak_inflight"] == 3 and free.summary["launch"]["peak_inflight"] > 3
    assert s["errors"] == {"AdmissionRejected": s["rejected"]}
    rejected = [r for r in capped.requests if r.status == "rejected"]
    assert all(r.end == r.start and "--max-inflight 3" in r.error for r in rejected)
    # completed latency is from the scheduled arrival, and bounded by the cap
    assert s["p99_latency_s"] < free.summary["p99_latency_s"]
    assert "Rejected at admission / past deadline:" in report(s)
    frame = pd.read_parquet(tmp_path / "run" / "requests.parquet")
    assert (frame.status == "rejected").sum() == s["rejected"]


def test_a_deadline_cancels_late_requests_typed_and_leaks_nothing(tmp_path):
    result = _run(tmp_path, arm="full", deadline_s=0.5)
    s, orch = result.summary, result.orchestrator
    late = [r for r in result.requests if r.status == "deadline"]
    assert s["deadline"] == len(late) > 0 and s["completed"] + len(late) == 40
    assert all(r.error_type == "DeadlineExceeded" for r in late)
    assert all(r.latency == pytest.approx(0.5) for r in late)  # cancelled at the deadline
    assert all(r.latency <= 0.5 + 1e-9 for r in result.requests if r.status == "completed")
    assert orch.fills.running == 0 and s["reuse"]["open_tickets"] == 0
    assert s["cleanup_errors"] == 0


def test_tenants_are_assigned_by_arrival_and_reuse_stays_within_a_tenant(tmp_path):
    one = _run(
        tmp_path,
        workload="subagent",
        arm="c1",
        requests=60,
        rate=2.0,
        workers=4,
        workload_options={},
        data_dir=str(MUSIQUE),
        out=tmp_path / "one",
    )
    two = _run(
        tmp_path,
        workload="subagent",
        arm="c1",
        requests=60,
        rate=2.0,
        workers=4,
        workload_options={},
        data_dir=str(MUSIQUE),
        tenants=2,
        out=tmp_path / "two",
    )
    tenants = [r.tenant for r in two.requests]
    assert tenants == [f"tenant-{i % 2}" for i in range(60)]
    assert {r.tenant for r in one.requests} == {"default"}
    reuse = two.summary["tenant_reuse"]
    assert reuse["cross_tenant"] == 0 and reuse["same_tenant"] > 0
    assert one.summary["tenant_reuse"]["same_tenant"] > reuse["same_tenant"]
    frame = pd.read_parquet(tmp_path / "two" / "requests.parquet")
    assert sorted(frame.tenant.unique()) == ["tenant-0", "tenant-1"]


def test_request_scoped_names_frame_the_tenant_unambiguously():
    from dynbranch.clock import VirtualClock

    def name(tenant: str, request: str, cross_request: bool) -> str:
        instance = ToyRequest(0)
        instance.request_id = request
        call = RequestState(instance, tenant).render("lookup", "tool", {"key": "alpha"})
        hook = StoreReuseHook(
            None, RunContext(clock=VirtualClock(), arm="c2"), cross_request=cross_request
        )
        return reuse_name(hook.key(call))

    # a tenant "a/b" serving request "c" and a tenant "a" serving request "b/c"
    assert name("a/b", "c", False) != name("a", "b/c", False)
    assert name("a/b", "r", True) != name("a", "r", True)
    assert name("a", "r1", True) == name("a", "r2", True)  # cross-request within a tenant
    assert name("a", "r1", False) != name("a", "r2", False)


def test_admission_options_check_their_ranges():
    with pytest.raises(ValueError, match="max_inflight=0 must be >= 1"):
        AdmissionOptions(max_inflight=0)
    with pytest.raises(ValueError, match="deadline_s=inf must be finite"):
        AdmissionOptions(deadline_s=float("inf"))
    with pytest.raises(ValueError, match="tenants=0 must be >= 1"):
        AdmissionOptions(tenants=0)
    assert AdmissionOptions(tenants=3).tenant(4) == "tenant-1"
    assert AdmissionOptions().tenant(4, "acme") == "acme"
