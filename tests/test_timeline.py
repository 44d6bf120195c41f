"""One request drawn as a per-stage timeline: reading a run, comparing two, the command."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dynbranch.cli import main
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.errors import ConfigError
from dynbranch.timeline import SERVED_LANE, _layout, compare, draw, lanes, load_request

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
STAGE = dict(
    kind="llm", coordinate="routing/router/0", fill="", error="", prompt_tokens=1, output_tokens=1
)


def _run_dir(path: Path, arm: str, stages: list[dict], latency: float) -> Path:
    """A run directory with one request arriving at t = 10."""
    path.mkdir(parents=True)
    rows = [{"request_id": "r1", **STAGE, **s} for s in stages]
    for r in rows:
        r["start"] += 10.0
        r["end"] += 10.0
    pd.DataFrame(rows).to_parquet(path / "stages.parquet")
    pd.DataFrame(
        [
            {
                "request_id": "r1",
                "arrival": 10.0,
                "start": 10.0,
                "end": 10.0 + latency,
                "latency": latency,
                "status": "completed",
            }
        ]
    ).to_parquet(path / "requests.parquet")
    pd.DataFrame(
        [
            {
                "request_id": "r1",
                "coordinate": "routing/router/0",
                "candidates": ["a"],
                "chosen": ["a"],
                "opened_at": 10.0,
                "resolved_at": 11.0,
            }
        ]
    ).to_parquet(path / "branches.parquet")
    (path / "summary.json").write_text(json.dumps({"arm": arm}))
    return path


def _exec(seq, start, end, engine="sim-target-0", stage="handler", speculative=False):
    return dict(
        seq=seq,
        stage=stage,
        start=start,
        end=end,
        engine=engine,
        served_from="exec",
        speculative=speculative,
    )


@pytest.fixture
def pair(tmp_path):
    floor = _run_dir(
        tmp_path / "floor",
        "floor",
        [
            _exec(0, 0.0, 1.0, stage="router"),
            _exec(1, 1.0, 3.0),
            _exec(2, 3.0, 3.5, "bfcl"),
            _exec(3, 3.5, 4.0, stage="router"),
        ],
        latency=4.0,
    )
    full = _run_dir(
        tmp_path / "full",
        "full",
        [
            _exec(0, 0.0, 1.0, stage="router"),
            _exec(-1, 0.0, 1.2, "sim-target-1", speculative=True),
            dict(
                seq=1,
                stage="handler",
                start=1.0,
                end=1.2,
                engine="",
                served_from="join",
                speculative=False,
            ),
            _exec(-1, 1.2, 1.7, "bfcl", speculative=True),
            dict(
                seq=2,
                stage="executor",
                start=1.2,
                end=1.7,
                engine="",
                served_from="join",
                speculative=False,
            ),
            _exec(3, 1.7, 2.2, stage="router"),
        ],
        latency=2.2,
    )
    return load_request(floor, "r1"), load_request(full, "r1")


def test_times_are_read_from_the_requests_arrival(pair):
    floor, full = pair
    assert floor.arm == "floor" and floor.latency == 4.0
    assert floor.stages["start"].min() == 0.0 and floor.branches.iloc[0]["resolved_at"] == 1.0


def test_compare_counts_what_full_served_from_fills_and_what_the_floor_ran_for_it(pair):
    c = compare(*pair)
    assert c.saving_s == pytest.approx(1.8)
    assert c.served_from_fills == 2 and c.fills == 2
    assert c.downstream_s == pytest.approx(2.5)  # the floor's handler (2 s) and executor (0.5 s)
    assert c.base_seqs == frozenset({1, 2})


def test_lanes_put_engines_first_and_concurrent_stages_on_sub_rows(pair):
    names = lanes(list(pair))
    assert names == ["sim-target-0", "sim-target-1", "bfcl", SERVED_LANE]
    full = pair[1]
    layout = _layout(full, names)
    got = {
        (s.stage, s.served_from, round(s.start, 6)): layout[s.Index]
        for s in full.stages.itertuples()
    }
    assert got == {
        ("router", "exec", 0.0): (0, "sim-target-0"),
        ("router", "exec", 1.7): (0, "sim-target-0"),  # after the first: same row
        ("handler", "exec", 0.0): (1, "sim-target-1"),
        ("handler", "exec", 1.2): (2, "bfcl"),
        ("handler", "join", 1.0): (3, SERVED_LANE),
        ("executor", "join", 1.2): (3, SERVED_LANE),
    }  # back to back: one row
    floor = _layout(pair[0], names)
    assert sorted(y for y, _ in floor.values()) == [0, 0, 0, 2]  # idle lane 1 keeps its row


def test_draw_writes_a_png(pair, tmp_path):
    draw(list(pair), tmp_path / "t.png", "case")
    assert (tmp_path / "t.png").stat().st_size > 20_000


def test_a_missing_request_or_run_is_a_typed_error(pair, tmp_path):
    with pytest.raises(ConfigError, match="no request 'nope'"):
        load_request(pair[0].run_dir, "nope")
    with pytest.raises(ConfigError, match="no stages.parquet"):
        load_request(tmp_path / "empty", "r1")


def test_the_timeline_command_draws_a_real_pair(tmp_path, capsys):
    dirs = {}
    for arm in ("floor", "full"):
        cfg = ReplayConfig(
            workload="routing",
            arm=arm,
            backend="local",
            clock="virtual",
            requests=6,
            rate=1.0,
            seed=2,
            workers=2,
            out=tmp_path / arm,
            progress=False,
            workload_options={"root": str(FIXTURE)},
        )
        run_replay(prepare(cfg, progress=lambda _m: None))
        dirs[arm] = tmp_path / arm
    request = pd.read_parquet(dirs["floor"] / "requests.parquet")["request_id"].iloc[0]
    out = tmp_path / "case.png"
    assert (
        main(
            [
                "timeline",
                str(dirs["floor"]),
                "--request",
                request,
                "--vs",
                str(dirs["full"]),
                "--out",
                str(out),
            ]
        )
        == 0
    )
    text = capsys.readouterr().out
    assert f"floor ({dirs['floor'].name})" in text and "saving" in text
    assert out.stat().st_size > 20_000
    assert main(["timeline", str(dirs["floor"]), "--request", "missing"]) == 2
    assert "no request 'missing'" in capsys.readouterr().err
