"""The replay driver end to end: results files, bad input refused before a run, determinism."""

import gc
import json
import weakref
from pathlib import Path

import pandas as pd
import pytest

from dynbranch.cli import main
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.errors import (
    ConfigError,
    DataMissingError,
    MalformedRecordError,
    UnknownNameError,
)
from dynbranch.results import SUMMARY_FIELDS
from dynbranch.workload import LazyTrace

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"


def _cfg(tmp_path, **kw) -> ReplayConfig:
    base = dict(workload="routing", arm="floor", backend="local", clock="virtual",
                requests=12, rate=2.0, seed=3, workers=2, out=tmp_path / "run",
                progress=False, workload_options={"root": str(FIXTURE)})
    base.update(kw)
    return ReplayConfig(**base)


def test_replay_writes_every_result_file_with_every_summary_field(tmp_path):
    result = run_replay(prepare(_cfg(tmp_path), progress=lambda _m: None))
    out = tmp_path / "run"
    summary = json.loads((out / "summary.json").read_text())
    assert set(SUMMARY_FIELDS) <= set(summary)
    assert summary["completed"] == 12 and summary["failed"] == 0
    assert summary["accuracy"] == 1.0  # replayed ground truth: a check of the replay
    assert summary["reuse_hits"] == summary["fills_issued"] == summary["unsafe_splices"] == 0
    requests = pd.read_parquet(out / "requests.parquet")
    stages = pd.read_parquet(out / "stages.parquet")
    assert len(requests) == 12 and set(requests.status) == {"completed"}
    assert (requests.latency > 0).all() and (requests.send_lag.abs() < 1e-9).all()
    assert set(stages.kind) == {"llm", "tool"} and set(stages.served_from) == {"exec"}
    assert set(stages.stage) == {"router", "handler", "executor"}
    assert stages.request_id.nunique() == 12
    assert summary["mean_latency_s"] == pytest.approx(requests.latency.mean(), abs=1e-6)
    assert (out / "latency_cdf.png").stat().st_size > 10_000
    assert (out / "branches.parquet").exists()
    assert len(result.requests) == 12


def test_same_seed_on_the_virtual_clock_gives_an_identical_stage_log(tmp_path):
    a = run_replay(prepare(_cfg(tmp_path, out=tmp_path / "a"), progress=lambda _m: None))
    b = run_replay(prepare(_cfg(tmp_path, out=tmp_path / "b"), progress=lambda _m: None))
    rows_a = [s.row() for s in a.orchestrator.log.stages]
    rows_b = [s.row() for s in b.orchestrator.log.stages]
    assert rows_a == rows_b and len(rows_a) > 12
    c = run_replay(prepare(_cfg(tmp_path, out=tmp_path / "c", seed=4), progress=lambda _m: None))
    assert [s.row() for s in c.orchestrator.log.stages] != rows_a


def test_a_run_that_forgets_streamed_rows_writes_the_same_results(tmp_path):
    """keep_log=False (the CLI's replay) drops stage and branch records once streamed; the
    summary (its tallies, tenant check included) and every table are those of a run that kept
    them, row for row and in the same order."""
    cfg = dict(arm="full", requests=16, rate=4.0)
    kept = run_replay(prepare(_cfg(tmp_path, out=tmp_path / "kept", **cfg), lambda _m: None))
    lean = run_replay(prepare(_cfg(tmp_path, out=tmp_path / "lean", **cfg), lambda _m: None),
                      keep_log=False)
    assert lean.orchestrator.log.stages == [] and lean.orchestrator.log.branches == []
    assert len(kept.orchestrator.log.stages) == kept.summary["stages"] > 16
    a, b = dict(kept.summary), dict(lean.summary)
    for s in (a, b):
        s.pop("wall_s"), s.pop("sim_s_per_wall_s"), s.pop("out")
    assert a == b and a["promotions"] + a["reuse_hits"] > 0
    assert sum(a["tenant_reuse"].values()) == a["promotions"] + a["reuse_hits"]
    for name in ("stages", "branches", "requests"):
        x = pd.read_parquet(tmp_path / "kept" / f"{name}.parquet")
        y = pd.read_parquet(tmp_path / "lean" / f"{name}.parquet")
        pd.testing.assert_frame_equal(x, y)
    rows = pd.read_parquet(tmp_path / "kept" / "stages.parquet")
    assert list(rows.reuse_name) == [s.reuse_name for s in kept.orchestrator.log.stages]
    branches = pd.read_parquet(tmp_path / "kept" / "branches.parquet")
    assert list(branches.opened_at) == [br.opened_at for br in kept.orchestrator.log.branches]


def test_a_lean_run_lets_each_finished_request_instance_go(tmp_path):
    """keep_log=False hands the instances to the launcher, which drops each when its request
    ends: none outlives the run (a long run keeps no finished request's state); a run that
    keeps its log keeps them too, in ``prepared.instances``."""
    lean = prepare(_cfg(tmp_path, out=tmp_path / "lean", arm="full"), lambda _m: None)
    refs = [weakref.ref(i) for i in lean.instances]
    result = run_replay(lean, keep_log=False)
    gc.collect()
    assert result.summary["completed"] == 12 and lean.instances == ()
    assert [r for r in refs if r() is not None] == []
    kept = prepare(_cfg(tmp_path, out=tmp_path / "kept", arm="full"), lambda _m: None)
    refs = [weakref.ref(i) for i in kept.instances]
    run_replay(kept)
    gc.collect()
    assert all(r() is not None for r in refs) and len(kept.instances) == 12


def test_a_lean_run_makes_each_request_when_it_arrives(tmp_path):
    """A Routing trace is made lazily: preparing a run makes no request; a lean run makes
    each as it arrives and lets it go as it ends, so the trace never holds more requests
    than are in flight (a long trace's waiting requests take no memory); and the rows are
    those of a run whose trace was made in full before it started."""
    lean = prepare(_cfg(tmp_path, out=tmp_path / "lean", arm="full"), lambda _m: None)
    trace = lean.instances
    assert isinstance(trace, LazyTrace) and len(trace) == 12 and trace.made() == 0
    held: list[int] = []
    result = run_replay(lean, keep_log=False, on_finished=lambda _r: held.append(trace.made()))
    assert result.summary["completed"] == 12 and trace.made() == 0
    assert len(held) == 12 and max(held) < 12
    full = prepare(_cfg(tmp_path, out=tmp_path / "full", arm="full"), lambda _m: None)
    made = list(full.instances)  # NOTE: every request made before the run starts
    assert full.instances.made() == 12 and len({id(r) for r in made}) == 12
    run_replay(full, keep_log=False)
    for name in ("requests", "stages", "branches"):
        x = pd.read_parquet(tmp_path / "lean" / f"{name}.parquet")
        y = pd.read_parquet(tmp_path / "full" / f"{name}.parquet")
        pd.testing.assert_frame_equal(x, y)


@pytest.mark.parametrize("kw,error,match", [
    ({"workload": "chess"}, UnknownNameError, "known workloads: .*routing"),
    ({"arm": "magic"}, UnknownNameError, "known arms: c1, c2, dsp, floor, full, helium, instcache, oracle, parrot, spagent"),
    ({"arm": "magic"}, UnknownNameError, "unknown arm 'magic'"),
    ({"engine": "tpu"}, UnknownNameError, "unknown engine 'tpu'"),
    ({"backend": "ray", "clock": "virtual"}, ConfigError, "virtual clock runs in one process"),
    ({"requests": 0}, ConfigError, "--requests must be >= 1"),
])
def test_bad_settings_are_refused_before_anything_starts(tmp_path, kw, error, match):
    with pytest.raises(error, match=match):
        prepare(_cfg(tmp_path, **kw), progress=lambda _m: None)
    assert not (tmp_path / "run").exists()


def test_missing_data_names_where_it_looked(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNBRANCH_CACHE", str(tmp_path / "empty-cache"))
    cfg = _cfg(tmp_path, workload_options={"fetch": False})
    with pytest.raises(DataMissingError, match="dynbranch data bfcl"):
        prepare(cfg, progress=lambda _m: None)


def test_a_malformed_record_is_named_before_the_run(tmp_path):
    import shutil

    root = tmp_path / "bfcl"
    shutil.copytree(FIXTURE, root)
    path = root / "bfcl_eval" / "data" / "BFCL_v4_multiple.json"
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"question"', '"questions"')
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(MalformedRecordError, match=r"BFCL_v4_multiple\.json: record multiple_0"):
        prepare(_cfg(tmp_path, workload_options={"root": str(root)}), progress=lambda _m: None)
    assert not (tmp_path / "run").exists()


def test_cli_prints_one_line_and_exits_2_on_bad_input(capsys):
    assert main(["replay", "--workload", "chess", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("dynbranch: error: unknown workload 'chess'") and err.count("\n") == 1
    assert main(["experiment", "fig99"]) == 2
    assert "unknown experiment 'fig99'" in capsys.readouterr().err


def test_the_fanout_defaults_to_one_fill_per_other_engine(tmp_path):
    from dynbranch.runtime.run import default_fanout

    assert [default_fanout(w) for w in (1, 2, 4, 8)] == [1, 1, 3, 7]
    prepared = prepare(_cfg(tmp_path, workers=4), progress=lambda _m: None)
    assert prepared.config.fanout == 3
    prepared = prepare(_cfg(tmp_path, workers=4, fanout=1), progress=lambda _m: None)
    assert prepared.config.fanout == 1


def test_the_workload_key_is_known_only_for_the_workload_prepare_built(tmp_path):
    """Runs share what they learnt from the train split by this key; an experiment that
    swaps in a shaped workload after prepare() draws another train split, so its key is None."""
    import dataclasses

    from dynbranch.driver import workload_key

    a = prepare(_cfg(tmp_path, out=tmp_path / "a", arm="full"), lambda _m: None)
    b = prepare(_cfg(tmp_path, out=tmp_path / "b", arm="c2", rate=9.0), lambda _m: None)
    assert workload_key(a) is not None and workload_key(a) == workload_key(b)
    assert workload_key(dataclasses.replace(a, workload=_Wrapped(a.workload))) is None


class _Wrapped:
    def __init__(self, inner) -> None:
        self._inner = inner

    def __getattr__(self, name):
        return getattr(self._inner, name)


def test_the_collector_stays_tuned_while_results_are_written_and_is_restored(
        tmp_path, monkeypatch):
    from dynbranch import driver, resultlog

    seen = []
    close = resultlog.ResultStream.close

    def watched(self, *a, **kw):
        seen.append((gc.get_threshold(), gc.get_freeze_count() > 0))
        return close(self, *a, **kw)

    monkeypatch.setattr(resultlog.ResultStream, "close", watched)
    before = gc.get_threshold()
    run_replay(prepare(_cfg(tmp_path), progress=lambda _m: None))
    assert seen == [(driver.GC_THRESHOLD, True)]
    assert gc.get_threshold() == before and gc.get_freeze_count() == 0
