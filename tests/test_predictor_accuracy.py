"""scripts/predictor_accuracy.py's held-out quarter of the train split (``--validation``)."""

from __future__ import annotations

from collections import Counter

from tests import scripts
from workloads.routing import split_of

bench = scripts.load("predictor_accuracy")


def test_a_routing_requests_scenario_is_its_base_records():
    assert bench.scenario("routing", "routing-00007-multi_turn_long_context_12") == (
        "multi_turn_base_12")
    assert bench.scenario("routing", "routing-00008-live_multiple_3-1-0") == "live_multiple_3-1-0"
    assert bench.scenario("react", "react-00001-2hop__1001_1002") == "2hop__1001_1002"


def test_the_held_out_quarter_keeps_a_scenario_together_and_is_not_the_split():
    ids = [f"routing-{i:05d}-multi_turn_{v}_{i}" for i in range(400)
           for v in ("base", "miss_func", "miss_param", "long_context")]
    by_scenario: dict[str, set[bool]] = {}
    for rid in ids:
        by_scenario.setdefault(bench.scenario("routing", rid), set()).add(
            bench.held_out("routing", rid))
    assert all(len(sides) == 1 for sides in by_scenario.values())
    share = Counter(next(iter(s)) for s in by_scenario.values())[True] / len(by_scenario)
    assert 0.18 < share < 0.32
    # NOTE: salted: among the train side's scenarios some are held out and some learnt
    train = [s for s in by_scenario if split_of(s) == "train"]
    assert {next(iter(by_scenario[s])) for s in train} == {True, False}


def test_with_the_step_split_the_held_out_quarter_keeps_a_step_group_together():
    groups = {f"2hop__{i}": f"2hop__{i - i % 5}" for i in range(400)}  # groups of five
    sides: dict[str, set[bool]] = {}
    for question, group in groups.items():
        sides.setdefault(group, set()).add(
            bench.held_out("subagent", f"subagent-00001-{question}", groups))
    assert all(len(s) == 1 for s in sides.values())
    assert {next(iter(s)) for s in sides.values()} == {True, False}
