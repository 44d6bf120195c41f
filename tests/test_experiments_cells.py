"""The experiments' cell builders, their pairing, and tiny real runs on the BFCL fixture.

The quick variants themselves take minutes; these tests run the builders, the summaries and
the reports on small inputs (a few requests of the routing fixture, or synthetic rows).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from pathlib import Path

import pandas as pd
import pytest

from dynbranch.errors import UnknownNameError
from experiments import ALL, get_experiment
from experiments.common import Cell, run_cells
from experiments.facts import with_facts
from experiments.pairing import pair_key

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
ROOT = Path(__file__).resolve().parents[1]


def test_every_design_experiment_is_built_and_all_runs_them():
    from experiments import index

    for name in ALL:
        assert callable(get_experiment(name))
    assert get_experiment("all") is index.run
    with pytest.raises(UnknownNameError, match="all"):
        get_experiment("fig99")


def test_no_experiment_module_is_over_500_lines():
    long = {
        p.name: n
        for p in (ROOT / "experiments").glob("*.py")
        if (n := len(p.read_text().splitlines())) > 500
    }
    assert not long


def _one_floor_one_oracle(cells, keys=None):
    pairs = Counter()
    for c in cells:
        if c.arm in ("floor", "oracle"):
            pairs[(pair_key(c) if keys is None else pair_key(c, keys), c.arm)] += 1
    assert pairs and set(pairs.values()) == {1}
    assert {k for k, _ in pairs} == {k for k, a in pairs if a == "oracle"}


def test_fig8_cells_pair_every_arm_with_a_floor_and_an_oracle():
    from experiments import fig8

    rates = {
        (d, w, load): 1.0 for d in fig8.DEPLOYMENTS for w in fig8.WORKLOADS for load in fig8.LOADS
    }
    cells = fig8.cells(True, rates)
    assert len(cells) == len(rates) * (len(fig8.ARMS) + 1)
    _one_floor_one_oracle(cells)
    commodity = [c for c in cells if c.variant.startswith("8b-4090")]
    assert {c.replay["network"] for c in commodity} == {"vastai-wan"}
    assert {c.replay["profile"] for c in commodity} == {"qwen3-8b@rtx4090"}


def test_fig8_pair_columns_are_exact():
    from experiments import fig8
    from experiments.fig8_report import lines, summarize

    def row(arm, mean, p99, acc=1.0):
        return {
            "workload": "routing",
            "arm": arm,
            "variant": "32b-h200/at-load",
            "rate": 1.0,
            "seed": 0,
            "requests": 10,
            "deployment": "32b-h200",
            "load": "at-load",
            "mean_latency_s": mean,
            "p99_latency_s": p99,
            "accuracy": acc,
            "reduction_vs_floor": 1 - mean / 10.0,
            "failed": 0,
        }

    rows = [
        row("floor", 10.0, 20.0),
        row("c1", 8.0, 18.0),
        row("full", 6.0, 15.0, 0.9),
        row("helium", 7.5, 16.0),
        row("dsp", 9.0, 19.0),
    ]
    fig8.add_pair_columns(rows)
    full = next(r for r in rows if r["arm"] == "full")
    assert full["p99_reduction_vs_floor"] == pytest.approx(0.25)
    assert full["c2_over_c1"] == pytest.approx(-0.25)
    assert full["best_baseline"] == "helium" and full["vs_best_baseline"] == pytest.approx(-0.2)
    assert full["accuracy_vs_floor"] == pytest.approx(0.9)
    text = {x.cell: x for x in lines(summarize(rows), fig8.PAPER)}
    p99 = text["32B/H200 at-load, Routing: p99, full vs floor"]
    assert (p99.ours, p99.paper) == ("−25.0 %", "−33.0 % … −11.0 %")
    assert text["32B/H200 at-load, Routing: C2 over C1-only (full vs c1)"].ours == "−25.0 %"


def test_fig9_cells_sweep_fanout_and_replicas_at_fixed_per_gpu_load():
    from experiments import fig9a, fig9b

    a = fig9a.cells(True, 2.0)
    assert [c.replay["fanout"] for c in a if c.arm == "full"] == list(fig9a.FANOUTS)
    assert {c.workload for c in a} == {"subagent"}
    b = fig9b.cells(True, llm_s=2.0)
    full = [c for c in b if c.arm == "full"]
    assert [(c.replay["workers"], c.replay["fanout"]) for c in full] == [
        (1, 0),
        (2, 1),
        (3, 2),
        (4, 3),
    ]
    assert [c.rate for c in full] == [0.5, 1.0, 1.5, 2.0]  # ρ · W / T_llm
    _one_floor_one_oracle(b)


def test_depth_cells_give_each_cycle_its_fill_depth():
    from experiments import depth

    cells = depth.cells(True, 0.2)
    assert [(c.variant, c.replay["depth"]) for c in cells if c.arm == "c2"] == [
        ("cycles=1", 3),
        ("cycles=2", 6),
        ("cycles=3", 9),
    ]
    _one_floor_one_oracle(cells, depth.PAIR)


def _fixture(cells):
    return [
        dataclasses.replace(c, requests=6, workload_options={"root": str(FIXTURE)}) for c in cells
    ]


def test_a_repetition_cell_runs_at_its_share_and_pairs_with_its_oracle(tmp_path):
    from experiments import scaling

    cells = _fixture(
        scaling.trio(scaling.variant(0.5, panel="a"), 1.0, 6, 0, scaling.replay("qwen3-32b@h200"))
    )
    rows = run_cells(
        cells, tmp_path, extra=with_facts(scaling.replay_share), customize=scaling.customize
    )
    scaling.add_speedup(rows)
    assert [r["exact_replay_share"] for r in rows] == [0.5, 0.5, 0.5]
    floor, full, oracle = rows
    assert floor["speedup"] == 1.0 and full["speedup"] == pytest.approx(
        floor["mean_latency_s"] / full["mean_latency_s"]
    )
    for r in rows:
        assert {
            "reduction_vs_floor",
            "oracle_reduction",
            "captured",
            "f_llm_output_tokens",
            "f_eq2_share" if r["arm"] == "floor" else "arm",
        } <= set(r)
    assert full["oracle_reduction"] == pytest.approx(oracle["reduction_vs_floor"])


def test_fig8_routing_cells_replay_fig14s_mix_and_the_others_their_own_streams(tmp_path):
    # NOTE: a plain Routing stream shorter than the test split repeats no record, so its c1
    # would be the floor and "C2 over C1-only" C2 over the floor
    from experiments import fig8, fig14

    assert fig8.ROUTING_SHARE == fig14.SHARE
    cells = _fixture(
        [
            Cell("routing", arm, "32b-h200/low", 1.0, 6, 0, fig8.replay("32b-h200"))
            for arm in ("floor", "c1")
        ]
    )
    rows = run_cells(cells, tmp_path, extra=with_facts(fig8._cell_info),
                     customize=fig8.customize)
    repeats = round(fig8.ROUTING_SHARE * 6)
    assert repeats >= 1
    assert [r["exact_replay_share"] for r in rows] == [repeats / 6] * 2
    assert [(r["deployment"], r["load"]) for r in rows] == [("32b-h200", "low")] * 2
    prepared = object()
    assert fig8.customize(dataclasses.replace(cells[0], workload="react"), prepared) is prepared


def test_a_drafter_cell_drafts_with_the_swept_accuracy(tmp_path):
    from experiments import fig11

    cells = [c for c in fig11.cells(True, 1.0) if "drafter=8b" in c.variant]
    rows = run_cells(
        _fixture(cells), tmp_path, extra=with_facts(fig11._drafter_stats), customize=fig11.customize
    )
    assert {r["arm"] for r in rows} == {"floor", "full-sweep", "oracle"}  # never "full"
    full = next(r for r in rows if r["arm"] == "full-sweep")
    assert full["vote_accuracy"] == fig11.VOTE_ACCURACY["8b"]
    assert full["scored_branches"] > 0 and 0.0 <= full["top1_accuracy"] <= 1.0
    assert "vote_accuracy" not in next(r for r in rows if r["arm"] == "floor")


def test_the_case_study_rule_picks_the_request_with_most_stages_from_fills(tmp_path):
    from experiments import fig12

    cells = _fixture(fig12.cells(6, 0.5))
    run_cells(cells, tmp_path)
    dirs = {c.arm: tmp_path / "replays" / c.slug() for c in cells}
    request, table = fig12.choose(dirs["floor"], dirs["full"])
    assert request == table.index[0]
    ordered = list(zip(table["served_from_fills"], table["saving_s"], strict=True))
    assert ordered == sorted(ordered, reverse=True)
    served = pd.read_parquet(dirs["full"] / "stages.parquet")
    mine = served[
        (served["request_id"] == request)
        & served["served_from"].isin(["shadow", "join"])
        & ~served["speculative"]
    ]
    assert len(mine) == table.iloc[0]["served_from_fills"]


def test_table1_and_table2_cells_add_the_oracle_to_every_pair():
    from experiments import fig13, fig14, table1, table2

    for module in (table1, table2, fig14):
        _one_floor_one_oracle(module.cells(True))
    _one_floor_one_oracle(fig13.cells(True, "entity"), fig13.PAIR)
    assert all(isinstance(c, Cell) for c in table1.cells(True))


def test_fig8_refuses_an_unknown_or_empty_workload_list_before_running(tmp_path):
    from experiments import fig8

    for bad in (("nope",), ()):
        with pytest.raises(UnknownNameError):
            fig8.run(True, tmp_path, bad)
    with pytest.raises(SystemExit):
        fig8.main(["--workload", "nope", "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_table2_measures_c2_over_c1_only_where_c1_has_repeats_to_serve(tmp_path):
    # NOTE: on a plain Routing stream c1 served 9 stages of 300, so "C2 over C1-only" was C2
    # over the floor; the pair now runs with a floor and an oracle of its own at the share
    from experiments import table2
    from experiments.scaling import tag

    for quick in (True, False):
        cells = table2.cells(quick)
        c1 = [c for c in cells if c.arm in ("c1", "full")]
        assert c1 and all(tag(c, "share") == f"{table2.C1_SHARE:g}" for c in c1)
        assert all(tag(c, "share") is None for c in cells if c.arm in table2.ARMS[1:])
        for c in c1:
            assert {x.arm for x in cells if x.variant == c.variant and x.seed == c.seed} == {
                *table2.C1_ARMS, "oracle"}
    mix = [c for c in table2.cells(True) if tag(c, "share") is not None and c.arm != "oracle"]
    plain = next(c for c in table2.cells(True) if c.workload == "routing" and c.arm == "floor"
                 and tag(c, "share") is None)
    rows = run_cells(_fixture([*mix, plain]), tmp_path, extra=with_facts(table2._cell_info),
                     customize=table2.shaped_stream)
    shares = {(r["arm"], r["variant"]): r["exact_replay_share"] for r in rows}
    assert shares[("floor", plain.variant)] == 0.0
    assert {shares[(c.arm, c.variant)] for c in mix} == {round(table2.C1_SHARE * 6) / 6}
    assert {r["deployment"] for r in rows} == {"4gpu"}
    (full,) = [t for t in table2.summarize(rows) if t["arm"] == "full"]
    assert full["c2_over_c1"] is not None and full["c1_reuse_hits"] is not None


def test_fig14_replays_one_repeating_mix_at_every_rate():
    # NOTE: a plain stream shorter than the test split repeats no record, so C1's share of
    # the decomposition would measure nothing; every cell is drawn at the set share
    from experiments import fig14
    from experiments.scaling import tag

    for quick in (True, False):
        cells = fig14.cells(quick)
        assert {tag(c, "share") for c in cells} == {f"{fig14.SHARE:g}"}
        assert {c.arm for c in cells} == {*fig14.ARMS, "oracle"}


def test_an_interrupted_cell_stops_the_experiment_and_keeps_its_partial_results(tmp_path):
    import signal
    import threading

    from dynbranch.clock import make_clock

    cells = _fixture([Cell("routing", "floor", rate=0.5), Cell("routing", "c2", rate=0.5)])
    started: list[str] = []

    def real_clock(cell, prepared):
        # NOTE: on the real clock six arrivals at 0.5/s take ~10 s: a SIGINT 1 s in lands
        # inside the first cell's replay, as a Ctrl-C at the terminal would.
        started.append(cell.arm)
        if len(started) == 1:
            threading.Timer(1.0, signal.raise_signal, (signal.SIGINT,)).start()
        return dataclasses.replace(prepared, clock=make_clock("real"))

    with pytest.raises(KeyboardInterrupt, match="interrupted by SIGINT"):
        run_cells(cells, tmp_path, customize=real_clock)
    assert started == ["floor"]  # the second cell never started
    (replay,) = (tmp_path / "replays").iterdir()
    summary = pd.read_json(replay / "summary.json", typ="series")
    assert summary["interrupted"] and summary["interrupted_by"] == "SIGINT"


def test_cells_run_in_forked_processes_give_the_rows_of_one_process(tmp_path):
    from experiments import scaling
    from experiments.common import cell_jobs

    cells = _fixture(
        scaling.trio(scaling.variant(0.5, panel="a"), 1.0, 6, 0, scaling.replay("qwen3-32b@h200"))
    ) + _fixture(
        scaling.trio(scaling.variant(0.0, panel="a"), 1.0, 6, 1, scaling.replay("qwen3-32b@h200"))
    )
    extra = with_facts(scaling.replay_share)  # a closure: forked processes inherit it

    def run(jobs, out):
        rows = run_cells(cells, out, extra=extra, customize=scaling.customize, jobs=jobs)
        for r in rows:
            assert r.pop("wall_s") > 0
        return rows

    one = run(1, tmp_path / "one")
    with cell_jobs(2):
        two = run(None, tmp_path / "two")
    assert two == one and len(one) == 6
    assert [(r["arm"], r["seed"]) for r in two] == [(c.arm, c.seed) for c in cells]
    assert all((tmp_path / "two" / "replays" / c.slug() / "summary.json").exists() for c in cells)


def test_cell_jobs_must_be_positive():
    from experiments.common import cell_jobs

    with pytest.raises(ValueError, match="jobs=0"), cell_jobs(0):
        pass


def test_cells_run_one_after_another_where_forking_is_unsafe(tmp_path, monkeypatch, capsys):
    import sys
    import types

    from experiments import common

    connected = types.SimpleNamespace(is_initialized=lambda: True)
    monkeypatch.setitem(sys.modules, "ray", connected)
    monkeypatch.setattr(common, "_run_forked", lambda *a: pytest.fail("forked"))
    cells = _fixture([Cell("routing", "floor", seed=0), Cell("routing", "floor", seed=1)])
    rows = run_cells(cells, tmp_path, jobs=2)
    assert len(rows) == 2 and "connected to Ray" in capsys.readouterr().err
