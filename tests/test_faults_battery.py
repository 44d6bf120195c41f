"""The fault battery's bookkeeping (the scenarios themselves need Ray: `experiment faults`)."""

import json
from pathlib import Path

from experiments import faults


def test_each_scenario_starts_from_an_empty_directory(tmp_path, monkeypatch):
    """A scenario is read from what it leaves in its directory, so what an earlier run of the
    battery left there (final files, a killed run's shards) is gone before it starts."""
    names = ["engine-kill", "gate-kill", "store-kill", "sigint", "overload", "malformed"]
    for name in names:
        (tmp_path / name / "parts").mkdir(parents=True)
        (tmp_path / name / "parts" / "requests-00001.jsonl").write_text("{}\n")
        (tmp_path / name / "summary.json").write_text(json.dumps({"completed": 99}))
    seen: list[tuple[str, bool]] = []

    def look(out: Path) -> dict:
        seen.append((out.name, out.exists()))
        return {}

    monkeypatch.setattr(faults, "_ray", lambda spec: look(Path(spec.out)))
    monkeypatch.setattr(faults, "_sigint", lambda out, _replay, _after: look(out))
    monkeypatch.setattr(faults, "malformed_row", look)
    monkeypatch.setattr(faults, "_report", lambda rows, quick: f"{len(rows)} rows")
    experiment = faults.run(True, tmp_path)
    assert seen == [(name, False) for name in names]
    assert [r["fault"] for r in experiment.rows] == [*names[:5], "malformed-data"]
    # every row carries the experiment row fields (DESIGN §5), the fault as its variant
    contract = ("workload", "arm", "variant", "rate", "mean_latency_s", "p99_latency_s",
                "reduction_vs_floor", "accuracy", "unsafe_splices", "fills_issued",
                "fills_consumed", "fills_discarded", "oracle_reduction", "captured")
    for r in experiment.rows:
        assert set(contract) <= set(r) and r["variant"] == r["fault"] and r["oracle_why"]
    assert [(r["workload"], r["arm"]) for r in experiment.rows] == [
        *[("routing", "full")] * 4, ("routing", "floor"), (None, None)]
    assert experiment.rows[0]["rate"] == 2.0 and experiment.rows[4]["rate"] == 6.0


def test_a_scenarios_row_reads_its_summary(tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(
        {"mean_latency_s": 12.5, "p99_latency_s": 40.0, "accuracy": 0.9, "unsafe_splices": 0,
         "fills_issued": 7, "fills_consumed": 3, "fills_discarded": 4}))
    cell = faults._cell("engine-kill", {"workload": "routing", "arm": "full", "rate": 2.0},
                        tmp_path)
    assert cell == {"workload": "routing", "arm": "full", "variant": "engine-kill",
                    "rate": 2.0, "mean_latency_s": 12.5, "p99_latency_s": 40.0,
                    "reduction_vs_floor": None, "accuracy": 0.9, "unsafe_splices": 0,
                    "fills_issued": 7, "fills_consumed": 3, "fills_discarded": 4}
