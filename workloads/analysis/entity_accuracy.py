"""How often the entity ranker's top k hold ReAct's next search, on held-out questions.

Every ``think`` branch of the split's replayed requests that resolves to a search (a
``finish`` has nothing to fill) is ranked from its evidence alone
(:func:`~dynbranch.predictors.entity.rank_entities`); a hit is an exact match of the
searched entity, what a fill must render to be promoted. Rows: ``hop 0`` (the evidence is
the question), ``hops 1+``, each hop, and ``all``, with top-1/3/5 and ``candidates`` (the
entity is among everything the ranker proposes: the ceiling of any ordering).

**The observation caveat.** A replayed ``read`` always states the recorded step's answer
(``observation="replayed"``), even where its passages do not hold it. Two more modes say how
much of the ranker's later-hop accuracy rests on that: ``reader`` keeps the observation only
where the answer it states occurs in the passages the read was given (what a reader that
never invents could write), ``none`` drops it.

**The fit.** :func:`fit_weights` sets the ranker's feature weights on the ``train`` split
(:mod:`~workloads.analysis.listwise`, L2 0.1, 3,000 steps): the question model on hop-0
branches, then the follow model on later hops with the fitted question model inside. The
shipped weights (:data:`~dynbranch.predictors.entity.FITTED_QUESTION`,
:data:`~dynbranch.predictors.entity.FITTED_FOLLOW`) are its output rounded to 0.01.

Measured on ``test`` (219 questions: 219 hop-0 and 308 later-hop search branches, 219
finishes; 3 passages per search), top-1 / top-3 / top-5 / candidates in %. The ranking
alone (``RankerWeights(finish_above=1, min_probability=0)``)::

                 hop 0                  hops 1+                all
    replayed     65 / 82 / 87 / 90      91 / 91 / 93 / 96      80 / 88 / 90 / 93
    reader       (as replayed)          72 / 72 / 75 / 79      69 / 77 / 80 / 84
    none         (as replayed)          22 / 40 / 52 / 73      40 / 58 / 66 / 80

as proposed (the shipped finish gate and probability cut, which drop 83 % of the finishes'
candidates and the unlikely tail: fewer losing fills): hop 0 65 / 77 / 77 / 77, hops 1+
85 / 85 / 85 / 85 replayed, 69 / 69 / 69 / 69 reader. The paper: 61 % top-3. Of the later
hops' +51 points of top-3 that the replayed observation adds over ``none``, 19 rest on
answers the read's passages do not hold. Hop 0's entity occurs in the question for 74 % of
questions (69 % verbatim), the ceiling of a ranker of the question's own words; the titles
its phrases name and the question search lift the candidates to 90 %. Without the question
search (``search_depth=0``) hop 0 is 54 / 68 / 72 / 73.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dynbranch.datasets import resolve_data_dir
from dynbranch.predictors.entity import (
    FOLLOW_FEATURES,
    QUESTION_FEATURES,
    RankerWeights,
    follow_features,
    question_features,
    rank_entities,
)
from dynbranch.predictors.hops import HOP_COUNTS, HOP_FEATURES, hop_features
from dynbranch.workload import DataConfig
from workloads.analysis.listwise import listwise_fit
from workloads.analysis.trace import trace_all
from workloads.react.template import FINISH, INVALID
from workloads.react.workload import ReActWorkload

PAPER_TOP3 = 0.61
KS = (1, 3, 5)
OBSERVATIONS = ("replayed", "reader", "none")


@dataclass(frozen=True)
class EntityBranch:
    """One ``think`` branch that resolved to a search: its evidence and what it searched.

    ``read_answer`` is the answer the previous hop's replayed read stated (``None`` at hop
    0); only :func:`with_observation` reads it, to drop an observation a reader could not
    have written. The ranker never sees it.
    """

    request_id: str
    hop: int
    evidence: Mapping[str, Any]
    entity: str
    read_answer: str | None
    finish: bool = False


def _data(data_dir: Path | None) -> DataConfig:
    found = data_dir if data_dir is not None else resolve_data_dir(None)
    return DataConfig(Path(found) if found is not None else None, Path("/nonexistent-cache"))


def entity_branches(
    data_dir: Path | None = None, split: str = "test", top_k: int = 3, finishes: bool = False
) -> list[EntityBranch]:
    """The search branches of every question of ``split``, replayed (file order), and with
    ``finishes`` the branches that finish too (``finish`` true; nothing to fill)."""
    data = _data(data_dir)
    workload = ReActWorkload(tool_time="modelled", top_k=top_k, decode_lengths="recorded")
    pool = workload.records(data, split)
    requests = workload.requests(data, len(pool), 0, split)
    out = []
    for request, trace in zip(requests, trace_all(requests), strict=True):
        steps = request.record.steps
        for point, (chosen,) in trace.branches:
            if chosen == INVALID or (chosen == FINISH and not finishes):
                continue
            hop = point.coordinate.step
            answer = steps[hop - 1].answer if 0 < hop <= len(steps) else None
            out.append(
                EntityBranch(
                    request.request_id, hop, point.evidence, chosen, answer, chosen == FINISH
                )
            )
    return out


def with_observation(branch: EntityBranch, mode: str) -> Mapping[str, Any]:
    """``branch``'s evidence under observation ``mode`` (the module docstring)."""
    if mode not in OBSERVATIONS:
        raise ValueError(f"observation {mode!r}: choose from {list(OBSERVATIONS)}")
    if mode == "replayed" or branch.hop == 0:
        return branch.evidence
    keep = mode == "reader" and _read_in_passages(branch)
    return {**branch.evidence, "observation": branch.evidence["observation"] if keep else ""}


def _read_in_passages(branch: EntityBranch) -> bool:
    answer = (branch.read_answer or "").lower()
    passages = branch.evidence.get("passages") or ()
    return bool(answer) and any(
        answer in f"{p.get('title', '')}\n{p.get('text', '')}".lower() for p in passages
    )


def entity_accuracy(
    data_dir: Path | None = None,
    split: str = "test",
    observation: str = "replayed",
    weights: RankerWeights | None = None,
    top_k: int = 3,
    branches: Sequence[EntityBranch] | None = None,
) -> dict[str, Any]:
    """Top-1/3/5 of the entity ranker per hop (the module docstring); ``finish``: of the
    branches that finish, the share where the ranker proposes nothing (``quiet``)."""
    if branches is None:
        branches = entity_branches(data_dir, split, top_k, finishes=True)
    groups: dict[str, list[list[int]]] = defaultdict(list)
    quiet: list[int] = []
    for b in branches:
        ranked = rank_entities(with_observation(b, observation), 1_000, weights)
        if b.finish:
            quiet.append(int(not ranked))
            continue
        hits = [int(b.entity in ranked[:k]) for k in KS] + [int(b.entity in ranked)]
        names = ("all", "hop 0") if b.hop == 0 else ("all", "hops 1+", f"hop {b.hop}")
        for name in names:
            groups[name].append(hits)
    rows = {name: _row(hits) for name, hits in groups.items()}
    return {
        "workload": "react",
        "split": split,
        "observation": observation,
        "top_k_passages": top_k,
        "rows": dict(sorted(rows.items(), key=lambda kv: _order(kv[0]))),
        "finish": {"branches": len(quiet), "quiet": sum(quiet) / len(quiet) if quiet else 0.0},
        "paper_top3": PAPER_TOP3,
    }


def _row(hits: list[list[int]]) -> dict[str, float | int]:
    n = len(hits)
    row: dict[str, float | int] = {"branches": n}
    for i, k in enumerate(KS):
        row[f"top{k}"] = sum(h[i] for h in hits) / n
    row["candidates"] = sum(h[-1] for h in hits) / n
    return row


def _order(name: str) -> tuple[int, str]:
    return ({"all": 0, "hop 0": 1, "hops 1+": 2}.get(name, 3), name)


def fit_weights(
    data_dir: Path | None = None,
    l2: float = 0.1,
    iterations: int = 3000,
    branches: Sequence[EntityBranch] | None = None,
) -> RankerWeights:
    """The ranker's weights fitted on the ``train`` split (the module docstring), rounded
    to 0.01 as shipped."""
    branches = entity_branches(data_dir, "train") if branches is None else branches
    base = RankerWeights()
    first = [(question_features(b.evidence, base), b.entity) for b in branches if b.hop == 0]
    question = _rounded(listwise_fit(first, QUESTION_FEATURES, l2, iterations))
    with_question = RankerWeights(question=question, follow=base.follow)
    later = [(follow_features(b.evidence, with_question), b.entity) for b in branches if b.hop > 0]
    follow = _rounded(listwise_fit(later, FOLLOW_FEATURES, l2, iterations))
    return RankerWeights(question=question, follow=follow)


def fit_hop_weights(
    data_dir: Path | None = None, l2: float = 0.01, iterations: int = 3000
) -> dict[int, dict[str, float]]:
    """The hop-count model (:mod:`dynbranch.predictors.hops`) fitted on the ``train``
    split's ReAct questions (a softmax over the hop counts, one weight per count and
    feature, by :func:`~workloads.analysis.listwise.listwise_fit`), rounded to 0.01."""
    records = ReActWorkload().records(_data(data_dir), "train")
    names = [f"{n}:{f}" for n in HOP_COUNTS for f in HOP_FEATURES]
    groups = []
    for r in records:
        features = hop_features(r.question)
        candidates = {str(n): {f"{n}:{f}": v for f, v in features.items()} for n in HOP_COUNTS}
        groups.append((candidates, str(min(len(r.steps), max(HOP_COUNTS)))))
    fitted = _rounded(listwise_fit(groups, names, l2, iterations))
    return {n: {f: fitted[f"{n}:{f}"] for f in HOP_FEATURES} for n in HOP_COUNTS}


def _rounded(weights: Mapping[str, float]) -> dict[str, float]:
    return {f: round(w, 2) + 0.0 for f, w in weights.items()}


def main() -> None:
    """Print the accuracy tables: as proposed and as ranked, each observation mode."""
    import argparse
    import json

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--split", default="test", choices=("train", "test"))
    args = ap.parse_args()
    branches = entity_branches(None, args.split, finishes=True)
    ranking = RankerWeights(finish_above=1.0, min_probability=0.0)
    for name, weights in (("proposed", None), ("ranking", ranking)):
        for mode in OBSERVATIONS:
            row = entity_accuracy(
                split=args.split, observation=mode, weights=weights, branches=branches
            )
            print(json.dumps({"weights": name, **row}))


if __name__ == "__main__":
    main()
