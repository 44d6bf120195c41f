"""Recurrence analyses (``workloads/analysis/recurrence.py``) and the entity ranker.

Fixture tests use ``tests/fixtures/musique`` and SWE-agent files written into a temporary
data directory; tests marked ``data`` read the shared data directory and skip, saying so,
when it is absent.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dynbranch.datasets import DATASETS
from dynbranch.errors import DataMissingError, MalformedRecordError
from dynbranch.predictors.entity import RankerWeights
from tests.data_sets import shared_data
from workloads.analysis.recurrence import (
    Recurrence,
    entity_ranker_top3,
    react_retrieval_recurrence,
    recurrence,
    subagent_cross_run_recurrence,
    subtopic_mention_curve,
    swe_command_recurrence,
)

FIXTURE = Path(__file__).parent / "fixtures" / "musique"


@pytest.fixture(scope="module")
def real_dir() -> Path:
    return shared_data("musique", "hotpotqa", "swe_agent")


def test_recurrence_counts_repeats_and_recurring_units():
    assert recurrence(["a", "b", "a", "c", "a", "b"]) == Recurrence(6, 3, 3, 0.5, 5, 5 / 6)
    assert recurrence([]) == Recurrence(0, 0, 0, 0.0, 0, 0.0)
    assert recurrence(["x"]) == Recurrence(1, 1, 0, 0.0, 0, 0.0)


# -- on the fixture ---------------------------------------------------------------------------


def test_react_retrieval_recurrence_on_the_fixture():
    # 6 questions, 13 searches: "Mira Calloway" ×2, "Quillfeather Press" ×2, "Port Verity" ×3
    row = react_retrieval_recurrence(FIXTURE, split="all")
    assert (row["total"], row["distinct"], row["repeats"], row["recurring"]) == (13, 9, 4, 7)
    assert row["repeat_share"] == pytest.approx(4 / 13) and row["paper"] == 0.12
    test = react_retrieval_recurrence(FIXTURE)
    assert (test["split"], test["requests"], test["total"], test["repeats"]) == ("test", 4, 9, 2)


def test_subagent_cross_run_recurrence_on_the_fixture():
    row = subagent_cross_run_recurrence(FIXTURE, n=4, split="all")
    assert (row["subtasks_a"], row["subtasks_b"], row["found_in_a"]) == (10, 8, 4)
    assert row["cross_run_share"] == 0.5 and row["paper"] == 0.26
    assert [w["repeats"] for w in row["within_run"]] == [1, 0]
    with pytest.raises(ValueError, match="2n <= 8"):
        subagent_cross_run_recurrence(FIXTURE, n=5, split="all")


def test_subtopic_mention_curve_on_the_fixture():
    entity = subtopic_mention_curve(FIXTURE, ns=(2, 4, 8))
    assert [(r["n"], r["total"], r["distinct"]) for r in entity] == [
        (2, 4, 3),
        (4, 10, 7),
        (8, 18, 9),
    ]
    assert entity[-1]["repeat_share"] == 0.5 and entity[0]["unit"] == "entity"
    subtopic = subtopic_mention_curve(FIXTURE, ns=(8,), unit="subtopic")
    assert (subtopic[0]["distinct"], subtopic[0]["repeats"]) == (13, 5)
    with pytest.raises(ValueError, match="outside 1..8"):
        subtopic_mention_curve(FIXTURE, ns=(9,))
    with pytest.raises(ValueError, match="unit"):
        subtopic_mention_curve(FIXTURE, unit="word")


def test_entity_ranker_coverage_on_the_fixture():
    ranking = RankerWeights(finish_above=1.0, min_probability=0.0)  # the ranking alone
    row = entity_ranker_top3(FIXTURE, split="all", weights=ranking)
    assert (row["branches"], row["covered"], row["coverage"], row["top1"]) == (7, 7, 1.0, 1.0)
    assert row["by_hop"][2] == {"branches": 1, "coverage": 1.0} and row["candidates"] == 1.0
    # hop 0 too: the question's names and the titles they name; one of 6 is missed
    every = entity_ranker_top3(FIXTURE, split="all", k=1, from_hop=0, weights=ranking)
    assert (every["branches"], every["covered"]) == (13, 12)
    assert every["by_hop"][0] == {"branches": 6, "coverage": pytest.approx(5 / 6)}
    # as shipped, the hop-count model takes the one 3-hop question's last search for a finish
    shipped = entity_ranker_top3(FIXTURE, split="all")
    assert (shipped["covered"], shipped["by_hop"][2]) == (6, {"branches": 1, "coverage": 0.0})


def _swe_dir(tmp_path: Path, commands: list[dict], demos: dict[str, dict]) -> Path:
    where = tmp_path / "swe_agent"
    for rel in DATASETS["swe_agent"].files:
        path = where / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"trajectory": []}) if rel.endswith(".traj") else "")
    (where / "mini_swe_agent_gemini3pro_verified_commands.jsonl").write_text(
        "".join(json.dumps(c) + "\n" for c in commands)
    )
    for name, raw in demos.items():
        path = next((where / "sweagent_demos").glob(f"{name}*.traj"))
        path.write_text(json.dumps(raw))
    return tmp_path


def test_swe_command_recurrence_within_repository(tmp_path):
    commands = [{"repo": "a/x", "command": c} for c in ("ls", "ls", "cat f", "ls", "cat  f\n")]
    commands += [{"repo": "b/y", "command": c} for c in ("ls", None, "pytest")]
    demos = {
        "replay__marshmallow-code__marshmallow-1867__default__": {
            "trajectory": [{"action": "ls -F\n"}, {"action": "open setup.py\n"}]
        },
        "replay__marshmallow-code__marshmallow-1867__function_calling__": {
            "trajectory": [{"action": "ls -F"}, {"action": "python reproduce.py"}]
        },
        "gpt4__swe-bench-dev-easy": {"trajectory": [{"action": "ls"}]},
        "function_calling_simple": {"history": []},
    }
    row = swe_command_recurrence(_swe_dir(tmp_path, commands, demos))
    mini = row["mini_swe_agent"]
    assert (mini["repositories"], mini["total"], mini["distinct"]) == (2, 7, 5)
    assert (mini["repeats"], mini["recurring"]) == (2, 3)  # "ls" in b/y is another repository
    assert mini["per_repository"]["a/x"]["recurring"] == 3
    normalised = row["mini_swe_agent_normalised"]
    assert (normalised["distinct"], normalised["recurring"]) == (4, 5)
    demo = row["sweagent_demos"]
    assert (demo["repositories"], demo["total"], demo["distinct"], demo["recurring"]) == (
        2,
        5,
        4,
        2,
    )
    assert set(demo["per_repository"]) == {"marshmallow-code/marshmallow", "pydicom/pydicom"}
    assert row["paper"] == (0.42, 0.45)


def test_swe_command_recurrence_rejects_bad_input(tmp_path):
    root = _swe_dir(tmp_path, [{"repo": "a/x", "command": "ls"}], {})
    path = root / "swe_agent" / "mini_swe_agent_gemini3pro_verified_commands.jsonl"
    path.write_text('{"repo": "a/x", "command": "ls"}\n{oops\n')
    with pytest.raises(MalformedRecordError, match="record line 2: not JSON"):
        swe_command_recurrence(root)
    path.write_text('{"repo": "a/x", "command": 3}\n')
    with pytest.raises(MalformedRecordError, match="'command' is not text"):
        swe_command_recurrence(root)
    path.write_text('{"command": "ls"}\n')
    with pytest.raises(MalformedRecordError, match="needs a string 'repo'"):
        swe_command_recurrence(root)
    path.write_text("")
    demo = next((root / "swe_agent" / "sweagent_demos").glob("gpt4__swe-bench*.traj"))
    demo.write_text(json.dumps({"trajectory": [{"thought": "no action"}]}))
    with pytest.raises(MalformedRecordError, match="record step 0: no 'action' text"):
        swe_command_recurrence(root)
    with pytest.raises(DataMissingError, match="swe_agent"):
        swe_command_recurrence(tmp_path / "nowhere")


# -- the real data ----------------------------------------------------------------------------


@pytest.mark.data
def test_real_swe_commands_match_the_data_readme(real_dir):
    row = swe_command_recurrence(real_dir)
    mini = row["mini_swe_agent"]
    assert (mini["repositories"], mini["total"]) == (12, 19479)
    assert round(mini["recurring_share"], 3) == 0.316  # data/README.md's sanity check
    assert row["sweagent_demos"]["total"] == 122


@pytest.mark.data
def test_real_recurrence_numbers(real_dir):
    react = react_retrieval_recurrence(real_dir)
    assert react["requests"] == 219 and 0.05 < react["repeat_share"] < 0.4
    curve = subtopic_mention_curve(real_dir)
    assert [r["n"] for r in curve] == [100, 200, 500, 1000, 2417] and curve[-1]["total"] == 6404
    shares = [r["repeat_share"] for r in curve]
    assert shares == sorted(shares) and 0.5 < shares[-1] < 0.75
    cross = subagent_cross_run_recurrence(real_dir, n=200)
    assert 0.1 < cross["cross_run_share"] < 0.5
    ranker = entity_ranker_top3(real_dir)
    assert ranker["branches"] == 308 and ranker["covered"] == 262  # the observation is read
    assert ranker["coverage"] <= ranker["candidates"] and ranker["in_passages"] < 0.75
