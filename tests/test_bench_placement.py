"""scripts/bench_placement.py on the shipped BFCL fixture: it records the calls the arm's
policy placed, drives every policy through them, and the arm's own policy, driven again,
picks what it picked in the run (no timing is asserted)."""

from __future__ import annotations

import json
from pathlib import Path

from tests import scripts

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
bench = scripts.load("bench_placement")


def test_every_policy_is_driven_through_the_recorded_calls(tmp_path, capsys) -> None:
    assert bench.main(["--requests", "4", "--repeat", "1", "--bfcl-root", str(FIXTURE),
                       "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "placement.json").read_text())
    assert result["calls"] >= 4 and set(result["policies"]) == set(bench.POLICIES)
    # NOTE: the recorded run's policy is `full`'s: driven alone through its own calls, it
    # picks the same engines, so the recording is faithful
    assert result["policies"]["affinity"]["same_engine_share"] == 1.0
    for figures in result["policies"].values():
        for part in ("place", "note", "place_and_note", "choose"):
            assert 0 <= figures[part]["p50"] <= figures[part]["p99"]
    out = capsys.readouterr().out
    assert out.startswith("recorded ") and all(name in out for name in bench.POLICIES)


def test_a_policy_is_driven_on_the_recorded_counts_and_noted_where_it_picked() -> None:
    from dynbranch.engines.protocol import GenerateRequest

    head = "system prompt and function documents " * 40
    counts = [(1, 0), (0, 0), (0, 1)]
    calls = [bench.Placed(c, GenerateRequest(f"r{i}", head + f"user {i}", 8, session=f"s{i}"),
                          1) for i, c in enumerate(counts)]
    # NOTE: the first prompt lands on engine 1, the least loaded; the next two share its
    # head, which engine 1 holds once the first is noted there, so affinity keeps them on it
    assert bench.drive(bench.POLICIES["affinity"], calls)["same_engine_share"] == 1.0
    # least outstanding goes by the counts alone: 1, then 0 (a tie), then 0
    assert bench.drive(bench.POLICIES["least-outstanding"], calls)["same_engine_share"] == (
        1 / 3)
