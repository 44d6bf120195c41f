"""Recurrence analyses for the paper's §2 "Recurrence concentrates in content sub-tasks".

Plain numbers and rows, no plotting (``experiments/fig5a`` draws them). Two shares are
reported for a sequence of units (retrieval inputs, sub-tasks, commands):

* ``repeat_share`` — the units that repeat an *earlier* unit: ``1 − distinct / total``. This
  is what an ideal exact cache would serve (the first occurrence must execute);
* ``recurring_share`` — the units whose key occurs at least twice, first occurrences
  included (the data README's SWE-agent sanity check uses this one).

Where the paper gives a number, a result carries it under ``paper``. Every function reads
the data directory (``data_dir``, else :func:`~dynbranch.datasets.resolve_data_dir`) and
raises :class:`~dynbranch.errors.DataMissingError` when a set is absent.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from dynbranch.datasets import read_jsonl, require_dataset, resolve_data_dir
from dynbranch.errors import MalformedRecordError
from dynbranch.predictors.entity import RankerWeights, rank_entities
from dynbranch.workload import DataConfig
from workloads.analysis.entity_accuracy import entity_branches
from workloads.analysis.trace import trace_all
from workloads.musique import draw, in_split
from workloads.react.workload import ReActWorkload
from workloads.subagent.workload import SubAgentWorkload

PAPER = {
    "react_retrieval_within_run": 0.12,
    "subagent_cross_run": 0.26,
    "subtopic_mentions": {100: 0.19, 5000: 0.61},
    "swe_commands_within_repo": (0.42, 0.45),
    "entity_ranker_top3": 0.61,
}
SUBTOPIC_NS = (100, 200, 500, 1000, 2417)
SWE_COMMANDS = "mini_swe_agent_gemini3pro_verified_commands.jsonl"


@dataclass(frozen=True)
class Recurrence:
    """How often the units of one sequence recur (see the module docstring)."""

    total: int
    distinct: int
    repeats: int
    repeat_share: float
    recurring: int
    recurring_share: float


def recurrence(keys: Iterable[Hashable]) -> Recurrence:
    """The recurrence of a sequence of unit keys (byte strings, digests, texts)."""
    counts = Counter(keys)
    total, distinct = sum(counts.values()), len(counts)
    recurring = sum(c for c in counts.values() if c > 1)
    return Recurrence(
        total,
        distinct,
        total - distinct,
        (total - distinct) / total if total else 0.0,
        recurring,
        recurring / total if total else 0.0,
    )


def _data(data_dir: Path | None) -> DataConfig:
    found = data_dir if data_dir is not None else resolve_data_dir(None)
    return DataConfig(Path(found) if found is not None else None, Path("/nonexistent-cache"))


# -- ReAct ------------------------------------------------------------------------------------


def react_retrieval_recurrence(
    data_dir: Path | None = None,
    n: int | None = None,
    seed: int = 0,
    split: str = "test",
    top_k: int = 3,
) -> dict[str, Any]:
    """Within one run: the share of ReAct retrievals whose rendered inputs are identical.

    The run is ``n`` requests of ``split`` drawn as a replay draws them (default: the whole
    split once, so no question repeats); its retrieval inputs are those the request programs
    render when replayed (``{"query", "k"}``), compared by their canonical digest.
    """
    data = _data(data_dir)
    workload = ReActWorkload(tool_time="modelled", top_k=top_k)
    n = len(workload.records(data, split)) if n is None else n
    traces = trace_all(workload.requests(data, n, seed, split))
    keys = [r.input_digest for t in traces for r in t.inputs("retrieve")]
    return {
        "workload": "react",
        "split": split,
        "requests": n,
        "seed": seed,
        **asdict(recurrence(keys)),
        "paper": PAPER["react_retrieval_within_run"],
    }


def entity_ranker_top3(
    data_dir: Path | None = None,
    split: str = "test",
    k: int = 3,
    top_k: int = 3,
    weights: RankerWeights | None = None,
    from_hop: int = 1,
) -> dict[str, Any]:
    """Coverage of the entity ranker: how often ReAct's next search is in its top ``k``.

    Over every ``think`` branch of the split's replayed requests from hop ``from_hop`` on
    (by default hop ≥ 1, where the evidence is a previous hop's passages and observation;
    ``from_hop=0`` adds hop 0, whose evidence is the question) that resolves to a search,
    the ranker ranks from the branch's evidence alone; ``covered`` counts exact matches of
    the searched entity (what a fill must render to be promoted). ``candidates`` is the
    ceiling of any ordering: the entity is among everything the ranker proposes.
    ``in_passages``: the entity occurs in the passages read (NOTE: no ceiling for a ranker
    that also reads the observation, which states the replayed answer; see
    :mod:`workloads.analysis.entity_accuracy` for the accuracy without it).
    """
    branches = [b for b in entity_branches(data_dir, split, top_k) if b.hop >= from_hop]
    covered = top1 = in_passages = candidates = 0
    by_hop: dict[int, list[int]] = defaultdict(lambda: [0, 0])
    for b in branches:
        ranked = rank_entities(b.evidence, 1_000, weights)
        hit = b.entity in ranked[:k]
        covered += hit
        top1 += bool(ranked) and ranked[0] == b.entity
        candidates += b.entity in ranked
        passages = b.evidence.get("passages") or []
        in_passages += any(b.entity in p["text"] or b.entity == p["title"] for p in passages)
        by_hop[b.hop][0] += 1
        by_hop[b.hop][1] += hit
    n = len(branches)
    return {
        "workload": "react",
        "split": split,
        "k": k,
        "top_k_passages": top_k,
        "branches": n,
        "covered": covered,
        "coverage": covered / n if n else 0.0,
        "top1": top1 / n if n else 0.0,
        "candidates": candidates / n if n else 0.0,
        "in_passages": in_passages / n if n else 0.0,
        "by_hop": {h: {"branches": b, "coverage": c / b} for h, (b, c) in sorted(by_hop.items())},
        "paper": PAPER["entity_ranker_top3"],
    }


# -- Sub-Agent --------------------------------------------------------------------------------


def subagent_cross_run_recurrence(
    data_dir: Path | None = None,
    n: int = 200,
    seed: int = 0,
    split: str = "test",
    top_k: int = 3,
) -> dict[str, Any]:
    """Across runs: the share of run B's sub-tasks whose input run A already rendered.

    The two runs are disjoint draws of ``n`` questions each: one seeded permutation of the
    split, run A its first ``n``, run B the next ``n`` (so no question is in both). A sub-task
    is one sub-agent's ``research`` input (sub-topic + retrieved passages), compared by its
    canonical digest; ``cross_run_share`` = B's sub-tasks found in A / B's sub-tasks.
    ``within_run`` gives each run's own recurrence.
    """
    data = _data(data_dir)
    workload = SubAgentWorkload(tool_time="modelled", top_k=top_k)
    pool = workload.records(data, split)
    if not 0 < 2 * n <= len(pool):
        raise ValueError(f"two disjoint runs of n={n} need 2n <= {len(pool)} ({split} split)")
    order = workload.requests(data, len(pool), seed, split)
    runs = [trace_all(order[:n]), trace_all(order[n : 2 * n])]
    keys = [[r.input_digest for t in run for r in t.inputs("research")] for run in runs]
    seen = set(keys[0])
    found = sum(k in seen for k in keys[1])
    return {
        "workload": "subagent",
        "split": split,
        "requests_per_run": n,
        "seed": seed,
        "subtasks_a": len(keys[0]),
        "subtasks_b": len(keys[1]),
        "found_in_a": found,
        "cross_run_share": found / len(keys[1]) if keys[1] else 0.0,
        "within_run": [asdict(recurrence(k)) for k in keys],
        "paper": PAPER["subagent_cross_run"],
    }


def subtopic_mention_curve(
    data_dir: Path | None = None,
    ns: Sequence[int] = SUBTOPIC_NS,
    seed: int = 0,
    unit: str = "entity",
    split: str = "all",
) -> list[dict[str, Any]]:
    """Repeated MuSiQue sub-topic mentions as questions accumulate.

    The 2,417 dev decompositions (of ``split``) in one seeded order; for each ``n`` the
    mentions are every decomposition step of the first ``n`` questions, keyed by ``unit``:
    ``entity`` (the default: the entity a step names — the paper's Sub-Agent sub-topics are
    entities, "the same entity distribution") or ``subtopic`` (``"<entity> >> <ask>"``, the
    exact sub-task a sub-agent researches, a stricter unit). One row per ``n`` with the share
    of mentions that repeat an earlier one.
    """
    if unit not in ("subtopic", "entity"):
        raise ValueError(f"unit {unit!r}: choose subtopic or entity")
    records = in_split(SubAgentWorkload().load(_data(data_dir)).records, split)
    order = draw(records, len(records), seed)
    rows = []
    for n in ns:
        if not 0 < n <= len(order):
            raise ValueError(f"n={n} outside 1..{len(order)}")
        keys = [getattr(s, unit) for r in order[:n] for s in r.steps]
        rows.append(
            {
                "n": n,
                "unit": unit,
                "seed": seed,
                **asdict(recurrence(keys)),
                "paper": PAPER["subtopic_mentions"].get(n),
            }
        )
    return rows


# -- SWE-agent --------------------------------------------------------------------------------


def swe_command_recurrence(data_dir: Path | None = None) -> dict[str, Any]:
    """Commands recurring verbatim within a repository, in two sets of SWE-agent trajectories.

    ``mini_swe_agent``: the 19,479 commands of 500 mini-swe-agent runs on SWE-bench Verified
    (the ``command`` of each step that has one), grouped by repository in file order. The
    data README's check (31.6 %) is ``recurring_share``: commands whose exact text occurs
    more than once in their repository. ``repeat_share`` counts only later occurrences.
    ``normalised`` repeats both with whitespace runs collapsed. ``sweagent_demos``: the
    ``action`` of every trajectory step of the 13 SWE-agent demo files (one, with no
    ``trajectory``, contributes nothing), trailing whitespace dropped (the older format ends
    every action with a newline, the newer does not), repository read from the file name.
    """
    where = require_dataset(
        Path(data_dir) if data_dir is not None else resolve_data_dir(None), "swe_agent"
    )
    commands = _mini_swe_commands(where / SWE_COMMANDS)
    demos = _demo_actions(sorted((where / "sweagent_demos").glob("*.traj")))
    return {
        "mini_swe_agent": _by_repo(commands),
        "mini_swe_agent_normalised": _by_repo([(r, " ".join(c.split())) for r, c in commands]),
        "sweagent_demos": _by_repo(demos),
        "paper": PAPER["swe_commands_within_repo"],
    }


def _by_repo(pairs: Sequence[tuple[str, str]]) -> dict[str, Any]:
    """Recurrence within each repository, pooled: keys are (repository, command)."""
    pooled = recurrence(pairs)
    repos = sorted({r for r, _ in pairs})
    return {
        "repositories": len(repos),
        **asdict(pooled),
        "per_repository": {r: asdict(recurrence(c for q, c in pairs if q == r)) for r in repos},
    }


def _mini_swe_commands(path: Path) -> list[tuple[str, str]]:
    out = []
    for n, raw in read_jsonl(path, "swe_agent"):
        if not isinstance(raw.get("repo"), str):
            raise MalformedRecordError(str(path), f"line {n}", "needs a string 'repo'")
        command = raw.get("command")
        if command is not None and not isinstance(command, str):
            raise MalformedRecordError(str(path), f"line {n}", "'command' is not text")
        if command is not None:
            out.append((raw["repo"], command))
    return out


_DEMO_REPOS = (
    ("marshmallow", "marshmallow-code/marshmallow"),
    ("pydicom", "pydicom/pydicom"),
    ("test-repo", "SWE-agent/test-repo"),
    ("testrepo", "SWE-agent/test-repo"),
    ("humanevalfix", "HumanEvalFix"),
)


def _demo_actions(paths: Sequence[Path]) -> list[tuple[str, str]]:
    out = []
    for path in paths:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except ValueError as e:
            raise MalformedRecordError(str(path), "file", f"not JSON: {e}") from None
        steps = raw.get("trajectory", []) if isinstance(raw, dict) else None
        if not isinstance(steps, list):
            raise MalformedRecordError(str(path), "file", "'trajectory' is not a list")
        repo = next((r for key, r in _DEMO_REPOS if key in path.name.lower()), path.stem)
        for i, step in enumerate(steps):
            action = step.get("action") if isinstance(step, dict) else None
            if not isinstance(action, str):
                raise MalformedRecordError(str(path), f"step {i}", "no 'action' text")
            out.append((repo, re.sub(r"\s+$", "", action)))
    return out
