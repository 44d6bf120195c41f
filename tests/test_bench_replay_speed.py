"""scripts/bench_replay_speed.py: its spans add up to the run, a request is new only the first
time its input arrives, and the fit recovers what a new and a repeated request cost (no
timing is asserted)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import pytest

from tests.scripts import load

bench = load("bench_replay_speed")


@dataclass
class _Instance:
    request_id: str
    given: Any

    def request_input(self) -> Any:
        return self.given


def test_a_request_is_new_only_the_first_time_its_input_arrives():
    instances = [_Instance("r0", {"turns": ["a"]}), _Instance("r1", {"turns": ["b"]}),
                 _Instance("r2", {"turns": ["a"]}), _Instance("r3", {"turns": ["b"]}),
                 _Instance("r4", {"turns": ["c"]})]
    assert bench.new_flags(instances) == {"r0": True, "r1": True, "r2": False, "r3": False,
                                          "r4": True}
    assert bench.new_flags([_Instance("r0", None)]) is None  # nothing to compare


def _span(first: int, last: int, new: int | None, cpu_s: float) -> dict[str, Any]:
    return {"requests": [first, last], "new": new, "cpu_s": cpu_s}


def test_the_fit_recovers_the_cost_of_a_new_and_of_a_repeated_request():
    # 12 ms a new request, 3 ms a repeat; the first span (start-up) is left out
    rows = [_span(1, 100, 100, 99.0)]
    for i, new in enumerate((80, 40, 10, 0)):
        rows.append(_span(101 + 100 * i, 200 + 100 * i, new, (12 * new + 3 * (100 - new)) / 1e3))
    fit = bench.fit_costs(rows)
    assert fit["new_ms"] == pytest.approx(12.0)
    assert fit["repeat_ms"] == pytest.approx(3.0)
    assert fit["rms_residual_ms_per_request"] == pytest.approx(0.0, abs=1e-9)


def test_no_fit_where_the_spans_cannot_tell_the_kinds_apart():
    every_new = [_span(1, 10, 10, 1.0), _span(11, 20, 10, 0.5), _span(21, 30, 10, 0.5)]
    assert bench.fit_costs(every_new) is None
    no_kinds = [_span(1, 10, None, 1.0), _span(11, 20, None, 0.5), _span(21, 30, None, 0.5)]
    assert bench.fit_costs(no_kinds) is None


def test_a_short_replay_is_read_span_by_span(tmp_path, capsys):
    result = bench.main(["--requests", "12", "--every", "5", "--out", str(tmp_path)])
    assert result["completed"] == 12
    spans = result["spans"]
    assert [s["requests"] for s in spans] == [[1, 5], [6, 10], [11, 12]]
    assert sum(s["simulated_s"] for s in spans) == pytest.approx(result["simulated_s"])
    assert sum(s["new"] for s in spans) == result["new_requests"]
    assert all(s["rss_mb"] > 0 and s["python_blocks"] > 0 for s in spans)
    saved = json.loads((tmp_path / "replay_speed.json").read_text())
    assert saved["spans"] == spans
    assert (tmp_path / "replay" / "summary.json").exists()
    assert "simulated s per wall s" in capsys.readouterr().out
