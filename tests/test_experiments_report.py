"""Pairing with the floor and the oracle, and the ours | paper | difference-and-why report."""

from __future__ import annotations

import pytest

from experiments.common import Cell
from experiments.index import central_table, index_page
from experiments.pairing import MIN_BOUND, add_relative, no_oracle, pair_rows, with_oracle
from experiments.report import (
    Line,
    as_change,
    comparison,
    facts_why,
    gap_pct,
    gap_ratio,
    mean_rows,
    over_seeds,
    page,
    rows_table,
    spread_of,
)
from experiments.stats import Spread


def _row(arm, mean, seed=0, variant="v", **extra):
    return {
        "workload": "w",
        "arm": arm,
        "variant": variant,
        "rate": 1.0,
        "seed": seed,
        "requests": 10,
        "mean_latency_s": mean,
        **extra,
    }


def test_with_oracle_adds_one_oracle_per_pair_with_the_pairs_deployment():
    cells = [
        Cell("w", "floor", "a", 1.0, 10, 0, {"workers": 2, "tool_time": "modelled"}),
        Cell("w", "c2", "a", 1.0, 10, 0, {"workers": 2, "fanout": 3, "gate": "topk"}),
        Cell("w", "floor", "b", 1.0, 10, 0, {"workers": 4}),
    ]
    out = with_oracle(cells)
    oracles = [c for c in out if c.arm == "oracle"]
    assert [c.variant for c in oracles] == ["a", "b"]
    assert out[1].arm == "oracle" and out[1].variant == "a"  # right after its floor
    assert dict(oracles[0].replay) == {"workers": 2, "tool_time": "modelled", "fanout": 3}
    assert with_oracle(out) == out  # an existing oracle is not doubled


def test_pair_rows_sets_reduction_oracle_and_captured_exactly():
    rows = pair_rows(
        [
            _row("floor", 10.0),
            _row("oracle", 8.0),
            _row("c2", 9.0),
            _row("c2", 5.0, seed=1),
            _row("floor", 10.0, seed=1),
        ]
    )
    by = {(r["arm"], r["seed"]): r for r in rows}
    assert by[("c2", 0)]["reduction_vs_floor"] == pytest.approx(0.1)
    assert by[("c2", 0)]["oracle_reduction"] == pytest.approx(0.2)
    assert by[("c2", 0)]["captured"] == pytest.approx(0.5)
    assert by[("c2", 1)]["reduction_vs_floor"] == pytest.approx(0.5)
    assert by[("c2", 1)]["oracle_reduction"] is None and by[("c2", 1)]["captured"] is None


def test_captured_is_none_when_the_oracle_gains_too_little():
    tiny = 10.0 * (1 - MIN_BOUND / 2)
    rows = pair_rows([_row("floor", 10.0), _row("oracle", tiny), _row("c2", 9.99)])
    assert rows[2]["oracle_reduction"] == pytest.approx(MIN_BOUND / 2)
    assert rows[2]["captured"] is None
    slower = pair_rows([_row("floor", 10.0), _row("oracle", 11.0), _row("c2", 9.0)])
    assert slower[2]["oracle_reduction"] == pytest.approx(-0.1) and slower[2]["captured"] is None


def test_pair_rows_with_other_keys_pairs_across_variants():
    rows = pair_rows(
        [
            _row("floor", 10.0, variant="floor"),
            _row("full", 6.0, variant="K=3"),
            _row("oracle", 5.0, variant="oracle"),
        ],
        ("workload", "rate", "seed", "requests"),
    )
    assert rows[1]["reduction_vs_floor"] == pytest.approx(0.4)
    assert rows[1]["captured"] == pytest.approx(0.8)


def test_add_relative_and_no_oracle():
    rows = add_relative([_row("floor", 1, p99=4.0), _row("c2", 1, p99=3.0)], "p99", "p99_red")
    assert rows[1]["p99_red"] == pytest.approx(0.25) and rows[0]["p99_red"] == 0.0
    offline = no_oracle([{"arm": "floor"}], "no replay")
    assert offline[0]["oracle_reduction"] is None and offline[0]["oracle_why"] == "no replay"


def test_comparison_has_the_three_columns_and_the_cell():
    text = comparison([Line("Routing p99", "−12.0 %", "−11 … −33 %", "within range")])
    assert text.splitlines()[0] == "| cell | ours | paper | difference and why |"
    assert "| Routing p99 | −12.0 % | −11 … −33 % | within range |" in text


def test_page_for_one_seed_says_so_and_prints_no_spread():
    text = page("Fig. X", True, "setup", [Line("c", "1.00 s", "2 s", "why")], seeds=1)
    assert text.startswith("# Fig. X (quick)\n")
    assert "One seed per cell, so no ± s.d. is printed" in text
    assert "± 0.000" not in text and "## Ours | paper | difference and why" in text


def test_gaps_against_values_and_ranges():
    assert gap_pct(Spread(-0.2, None, 1), (-0.33, -0.11)) == "within the paper's range"
    assert gap_pct(-0.05, (-0.33, -0.11)) == "+6.0 pts outside the paper's range"
    assert gap_pct(-0.35, -0.31) == "−4.0 pts"
    assert gap_pct(None, 0.1) == "not measured" and gap_pct(0.1, None) == "no paper number"
    assert gap_ratio(0.9, 1.8) == "0.50× the paper's"
    assert gap_ratio(1.2, (1.55, 1.99)) == "0.77× the paper's lower end"


def test_mean_rows_spreads_over_seeds():
    rows = [
        _row("c2", 2.0, seed=0, reduction_vs_floor=0.1, fills_issued=4),
        _row("c2", 4.0, seed=1, reduction_vs_floor=0.3, fills_issued=6),
    ]
    (t,) = mean_rows(rows, ("arm",), ("reduction_vs_floor",))
    assert (t["seeds"], t["mean_latency_s"], t["fills_issued"]) == (2, 3.0, 5.0)
    s = spread_of(t, "reduction_vs_floor")
    assert s.mean == pytest.approx(0.2) and s.sd == pytest.approx(0.1414213, abs=1e-6)
    assert as_change(s).mean == pytest.approx(-0.2)


def test_over_seeds_quotes_the_mean_of_every_seed_not_the_first():
    rows = [
        _row("floor", 2.0, seed=0, f_llm_output_tokens=100.0, f_llm_stage_s=1.0),
        _row("c2", 1.0, seed=0),
        _row("floor", 4.0, seed=1, f_llm_output_tokens=300.0, f_llm_stage_s=3.0),
    ]
    floor = over_seeds(rows, arm="floor")
    assert (floor["arm"], floor["seeds"], floor["mean_latency_s"]) == ("floor", 2, 3.0)
    assert "decode 200 tokens (2.00 s)" in facts_why(floor)
    assert over_seeds(rows, arm="oracle") is None


def test_rows_table_prints_whole_numbers_without_decimals():
    text = rows_table(
        [{"arm": "c2", "fills_issued": 47.0, "captured": 0.5, "x": None, "zero": 0.0}],
        ("arm", "fills_issued", "captured", "x", "zero"),
    )
    assert text.splitlines()[2] == "| c2 | 47 | 0.500 |  | 0 |"


def test_facts_why_quotes_the_measured_facts():
    floor = {
        "f_llm_output_tokens": 23.4,
        "f_llm_stage_s": 0.31,
        "f_eq2_share": 0.042,
        "f_eq2_bound_s": 0.1,
    }
    arm = {
        "arm": "c2",
        "fills_issued": 952,
        "fills_consumed": 145,
        "oracle_reduction": 0.146,
        "captured": 0.39,
    }
    text = facts_why(floor, arm)
    assert "decode 23 tokens (0.31 s)" in text and "Eq. 2 bound 4.2 %" in text
    assert "c2 consumed 145 of 952 fills" in text and "oracle bound −14.6 %" in text
    assert "captured 0.39" in text
    assert facts_why(None, None) == "no stage facts (no replay)"


def test_index_quotes_each_central_table():
    report = page("Fig. Y", True, "s", [Line("c", "1", "2", "w")], [("More", "| a |\n|---|")])
    assert central_table(report).splitlines()[0] == "| cell | ours | paper | difference and why |"
    assert "More" not in central_table(report)
    rows = [
        {
            "experiment": "figY",
            "report": "figY/report.md",
            "status": "ok",
            "wall_s": 61.0,
            "plots": "figY.png",
        },
        {
            "experiment": "figZ",
            "report": "figZ/report.md",
            "status": "failed",
            "wall_s": 1.0,
            "error": "boom",
        },
    ]
    text = index_page(rows, {"figY": report, "figZ": "failed: ValueError: boom"}, True)
    assert "1 of 2 ran, 62 s wall in all" in text and "[figY](figY/report.md)" in text
    assert "| c | 1 | 2 | w |" in text and "failed: ValueError: boom" in text


def test_facts_why_says_when_unused_fills_made_an_arm_slower():
    arm = {
        "arm": "full",
        "fills_issued": 199,
        "fills_consumed": 20,
        "reduction_vs_floor": -0.05,
        "f_discarded_gpu_s_per_request": 1.234,
    }
    assert "slower than the floor: its unused fills ran 1.23 GPU-s/request" in facts_why(None, arm)
    arm["reduction_vs_floor"] = 0.05
    assert "slower" not in facts_why(None, arm)


def test_facts_why_says_why_an_arm_issued_no_fills():
    arm = {
        "arm": "c2",
        "fills_issued": 0,
        "f_openings_per_request": 1.0,
        "f_ranked_per_opening": 0.0,
    }
    assert facts_why(None, arm) == (
        "c2 issued no fills: its gate opened 1.00 times per "
        "request and its predictor ranked 0.00 fillable candidates "
        "per opening"
    )
