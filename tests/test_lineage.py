"""Provenance for the write cascade: what a stage's output passes on to later inputs."""

from __future__ import annotations

from dynbranch.decode_lengths import THINK_CLOSE, THINK_OPEN
from dynbranch.runtime.execution import remember
from dynbranch.runtime.stage import upstream_of


def test_a_reasoned_output_is_linked_by_the_decision_it_passes_on():
    lineage: list[tuple[str, str]] = []
    handler = f"{THINK_OPEN}which directory holds the log?{THINK_CLOSE}cd(folder='logs')"
    remember(lineage, "name-handler", handler)
    remember(lineage, "name-router", "cd")
    remember(lineage, "", "no reuse name: no provenance")
    assert lineage == [("name-handler", "cd(folder='logs')"), ("name-router", "cd")]
    # the executor's input holds the decision alone, never the reasoning before it
    executor_input = '{"call": "cd(folder=\'logs\')", "scope": {"shared": "ws"}}'
    assert upstream_of(lineage, executor_input) == ("name-handler", "name-router")


def test_an_output_that_reasons_only_leaves_no_provenance():
    lineage: list[tuple[str, str]] = []
    remember(lineage, "name", f"{THINK_OPEN}nothing decided{THINK_CLOSE}")
    remember(lineage, "tool", {"result": [1, 2]})
    assert [name for name, _ in lineage] == ["tool"]
