"""scripts/bench_scale.py keeps what it measured when a point fails: the failed point is
recorded with the replay's own error, the sweep goes on, the fits and the plot use the
points that finished, and the script exits with status 1 (no timing is asserted)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.scripts import load

bench_scale = load("bench_scale")


def test_a_replay_that_fails_raises_with_its_own_error():
    with pytest.raises(bench_scale.PointFailed) as failed:
        bench_scale.run_point("no-such-arm", 5, 1, 1.0)
    message = str(failed.value)
    assert "local replay of 5 requests on 1 engines exited with status 1" in message
    assert "no-such-arm" in message  # NOTE: the child's stderr, not only its status


def _fake_point(arm, requests, engines, rate, **_kw):
    if engines == 16:
        raise bench_scale.PointFailed("local replay of 100 requests on 16 engines exited "
                                      "with status 1:\nMemoryError")
    wall = 2.0 * engines ** 0.5
    return {"wall_s": wall, "cpu_s": wall, "simulated_s": 10.0, "completed": requests,
            "failed": 0, "mean_latency_s": 1.0, "stages": 3, "maxrss_mb": 100.0 + engines,
            "arm": arm, "requests": requests, "engines": engines, "rate": rate,
            "backend": "local", "clock": "virtual", "address": None, "store_mb": 64,
            "process_s": wall, "sim_s_per_wall_s": 10.0 / wall, "sim_s_per_cpu_s": 10.0 / wall}


def test_a_failed_point_is_kept_and_left_out_of_the_fits_and_the_plot(tmp_path, monkeypatch,
                                                                      capsys):
    monkeypatch.setattr(bench_scale, "run_point", _fake_point)
    written = []
    monkeypatch.setattr(bench_scale, "plot", lambda points, path: written.extend(points))
    monkeypatch.setattr(sys, "argv", ["bench_scale.py", "--only", "engines", "--engines", "4",
                                      "16", "64", "--sweep-requests", "100",
                                      "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        bench_scale.main()
    assert stopped.value.code == 1
    saved = json.loads((tmp_path / "points.json").read_text())
    points = saved["points"]
    assert [p["engines"] for p in points] == [4, 16, 64]  # NOTE: the sweep went on
    assert "MemoryError" in points[1]["error"] and "wall_s" not in points[1]
    assert [p["engines"] for p in written] == [4, 64]
    # wall ∝ engines^0.5 over the two points that finished
    assert saved["fits"]["engines"]["wall_exponent"] == pytest.approx(0.5)
    out = capsys.readouterr()
    assert "engines=16: failed: local replay of 100 requests on 16 engines" in out.out
    assert "1 of 3 points failed" in out.err and "engines 16" in out.err


def test_points_are_written_as_they_come(tmp_path):
    points = bench_scale.Points(tmp_path / "points.json")
    points.add(_fake_point("full", 10, 4, 4.0) | {"sweep": "engines"})
    first = json.loads((tmp_path / "points.json").read_text())
    assert len(first["points"]) == 1 and first["fits"] == {}
    points.add({"sweep": "engines", "engines": 16, "error": "stopped"})
    points.add(_fake_point("full", 10, 64, 4.0) | {"sweep": "engines"})
    saved = json.loads((tmp_path / "points.json").read_text())
    assert len(saved["points"]) == 3 and "engines" in saved["fits"]
    assert [p["engines"] for p in points.failed()] == [16]


def test_a_run_whose_every_point_fails_still_writes_its_points(tmp_path, monkeypatch, capsys):
    def failing(*_a, **_kw):
        raise bench_scale.PointFailed("ray replay of 300 requests on 64 engines exited with "
                                      "status 1:\nConfigError: the Ray cluster cannot hold")

    monkeypatch.setattr(bench_scale, "run_point", failing)
    monkeypatch.setattr(sys, "argv", ["bench_scale.py", "--only", "rate", "--rates", "1", "4",
                                      "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as stopped:
        bench_scale.main()
    assert stopped.value.code == 1
    saved = json.loads((tmp_path / "points.json").read_text())
    assert [p["rate"] for p in saved["points"]] == [1.0, 4.0] and saved["fits"] == {}
    assert not (tmp_path / "scale.png").exists()
    assert "2 of 2 points failed" in capsys.readouterr().err


def test_tick_values_that_would_overlap_on_a_log_axis_are_thinned():
    assert bench_scale.spaced([169.8, 162.9, 111.8, 25.1, 25.1, 37.0]) == [25.1, 37.0, 111.8,
                                                                           162.9]
    assert bench_scale.spaced([]) == []
