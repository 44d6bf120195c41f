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
