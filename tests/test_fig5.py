"""Fig. 5a (recurrence and predictor coverage) and Fig. 5b (contention from co-resident fills).

Fig. 5a reads the shared data directory and is skipped, saying so, without it. Fig. 5b runs
the sim engine on the virtual clock with a short request, so it is exact and quick.
"""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest

from dynbranch.calibrate import ContentionShape, sim_contention
from dynbranch.engines.profile import load_profile
from dynbranch.errors import DataMissingError
from experiments import fig5a, fig5b
from experiments.common import write_experiment

REQUIRED = (
    "workload",
    "arm",
    "variant",
    "rate",
    "mean_latency_s",
    "p99_latency_s",
    "reduction_vs_floor",
    "accuracy",
    "unsafe_splices",
    "fills_issued",
    "fills_consumed",
    "fills_discarded",
)
"""The columns DESIGN.md §5 requires of every experiment row."""
SMALL = ContentionShape(
    canonical_prompt=256,
    canonical_output=64,
    fill_instruction=32,
    fill_max_tokens=512,
    repetitions=2,
)


@pytest.fixture(scope="module")
def data_dir() -> Path:
    try:
        return fig5a.check_data(None)
    except DataMissingError as e:
        pytest.skip(f"fig5a needs the shared data directory: {e}")


# -- Fig. 5a -----------------------------------------------------------------------------------


def test_fig5a_refuses_to_run_without_data(tmp_path):
    with pytest.raises(DataMissingError, match="musique"):
        fig5a.run(quick=True, out=tmp_path, data_dir=tmp_path / "nowhere")


@pytest.mark.data
def test_fig5a_recurrence_on_the_real_data(data_dir):
    rows = {
        (r["workload"], r["variant"], r["metric"]): r
        for r in fig5a.recurrence_rows(data_dir, seeds=(0, 1))
    }
    react = rows[("react", "retrieval_within_run", "repeat_share")]
    assert (react["value"], react["n"], react["paper"]) == (103 / 527, 527, 0.12)
    cross = rows[("subagent", "subtask_cross_run", "cross_run_share")]
    assert cross["seeds"] == 2 and 0.1 < cross["value"] < 0.5 and cross["spread"] is not None
    swe = rows[("swe-agent", "mini_swe_agent", "recurring_share")]
    assert round(swe["value"], 3) == 0.316 and swe["paper"] == pytest.approx(0.435)


@pytest.mark.data
def test_fig5a_curve_and_predictors_on_the_real_data(data_dir):
    curve = [
        r for r in fig5a.curve_rows(data_dir, seeds=(0,)) if r["metric"] == "repeat_share@entity"
    ]
    measured = [r for r in curve if r["value"] is not None]
    assert [r["questions"] for r in measured] == [100, 200, 500, 1000, 2417]
    assert measured[0]["value"] == pytest.approx(51 / 270) and measured[0]["paper"] == 0.19
    shares = [r["value"] for r in measured]
    assert shares == sorted(shares)
    beyond = curve[-1]  # the paper's 5,000: no measurement, a labelled extrapolation
    assert (beyond["questions"], beyond["value"], beyond["paper"]) == (5000, None, 0.61)
    assert beyond["extrapolated"] > shares[-1]
    rows = {r["metric"]: r for r in fig5a.predictor_rows(data_dir)}
    assert rows["top1_match"]["value"] == pytest.approx(1288 / 1463)
    assert rows["top3_coverage"]["n"] == 308
    assert rows["top3_coverage"]["value"] <= rows["candidates_ceiling"]["value"]


def test_fig5a_writes_its_files(data_dir, tmp_path):
    exp = fig5a.run(quick=True, out=tmp_path)
    write_experiment(exp, tmp_path)
    _check_files(tmp_path, "fig5a", ["fig5a.png"], ("metric", "value", "paper", "n"))
    assert "| cell | ours | paper | difference and why |" in (tmp_path / "report.md").read_text()


# -- Fig. 5b -----------------------------------------------------------------------------------


def test_fig5b_contention_grows_with_fill_count_and_context():
    profile = load_profile("qwen3-32b@h200")
    counts, contexts = [(n, 300) for n in (1, 4, 16)], [(8, w) for w in (0, 500, 1500)]
    curve = sim_contention(profile, counts + contexts, SMALL)
    increases = [curve.increase(s) for s in curve.samples]
    shares = [s.kv_share for s in curve.samples]
    assert 0 < increases[0] < increases[1] < increases[2]
    assert 0 < increases[3] < increases[4] < increases[5]
    assert shares[:3] == sorted(shares[:3]) and shares[3:] == sorted(shares[3:])
    assert all(s.fills_ended_early == 0 and len(s.latencies_s) == 2 for s in curve.samples)
    assert curve.samples[4].context_tokens == SMALL.context_tokens(500) == 665
    again = sim_contention(profile, counts[:1], SMALL)  # the virtual clock: exact repeats
    assert again.samples[0].latencies_s == curve.samples[0].latencies_s


def test_fig5b_rows_summary_and_files(tmp_path):
    exp = fig5b.run(quick=True, out=tmp_path, hf=False, shape=SMALL)
    write_experiment(exp, tmp_path)
    _check_files(
        tmp_path,
        "fig5b",
        ["fig5b.png", "qwen3-32b@h200-fig5b.toml"],
        ("increase", "paper_increase", "fitted", "kv_share", "engine", "fills"),
    )
    frame = pd.read_parquet(tmp_path / "results.parquet")
    assert set(frame.variant) == {"prior", "calibrated"}
    fitted = frame[frame.fitted]
    assert sorted(zip(fitted.fills, fitted.context_words, strict=True)) == [(24, 4500), (48, 1000)]
    assert set(fitted.variant) == {"calibrated"}
    assert frame.paper_increase.notna().sum() == 2 * 5  # the five paper points, per profile
    alone = frame[frame.fills == 0]
    assert (alone.increase == 0).all() and len(alone) == 2
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert set(summary["paper"]["fit"]["knobs"]) == {"seq_overhead_us", "mfu"}
    assert "## The paper's five points" in (tmp_path / "report.md").read_text()


def _check_files(out: Path, name: str, plots: list[str], own: tuple[str, ...]) -> None:
    summary = json.loads((out / "summary.json").read_text())
    assert summary["experiment"] == name and set(summary) == {"experiment", "rows", "paper"}
    assert summary["rows"] and summary["paper"]
    for row in summary["rows"]:
        missing = [c for c in (*REQUIRED, *own) if c not in row]
        assert not missing, (row.get("variant"), missing)
        assert row["unsafe_splices"] == 0
    assert len(pd.read_parquet(out / "results.parquet")) == len(summary["rows"])
    for plot in plots:
        assert (out / plot).stat().st_size > 10_000 or plot.endswith(".toml")
    assert (out / "report.md").read_text().startswith("# Fig. 5")
