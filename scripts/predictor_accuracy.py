"""Top-1/3/5 of each workload's predictor on the test split, after learning the train split.

    python scripts/predictor_accuracy.py [--workloads routing react subagent hci]
                                         [--train 1024] [--test 300] [--predictor NAME]

As a replay's C2 arm sees it: the predictor first observes the branches of up to ``--train``
train-split requests run offline (what :meth:`~dynbranch.fill.speculator.Speculator.prepopulate`
teaches it), then ranks every branch of ``--test`` test-split requests with only what is
known at branch time, and learns each one after ranking it (as it learns resolved branches
online). A branch counts as a hit at k when one of its chosen candidates is among the top k.

Per branch stage it prints branches, top-1/3/5, and, where the branch can end without
work to fill (Routing's end of turn), the same over the branches that chose something
fillable ("fillable top-k": what a fill can cover), and the mean number of candidates.

``--validation`` keeps the test split out of it, for choosing a predictor's settings
(DESIGN §4: a held-out part of every data set stays out of any tuning): the train split's
requests are divided by scenario (a Routing multi-turn record's is its base record's,
:func:`~workloads.routing.scenario_of`; any other record is its own) into a quarter held
out, which is ranked, and the rest, which is learnt first (up to ``--train``).
``--option KEY=VALUE`` sets the predictor's options, e.g. ``--option learning_rate=0.3
--option l2=1e-4`` for the logit model. ``--split-by step`` splits MuSiQue (ReAct, Sub-Agent)
so that no test question shares a single-hop step with a train one (:mod:`workloads.musique`).

    python scripts/predictor_accuracy.py --workloads routing --validation --test 1000 \
        [--option learning_rate=0.2] [--option l2=0.01]
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import sys
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # NOTE: measure this tree's code, not an installed copy
    sys.path.insert(0, str(ROOT))

from dynbranch.datasets import cache_dir, resolve_data_dir  # noqa: E402
from dynbranch.fill.speculator import TRAIN_REQUESTS  # noqa: E402
from dynbranch.predictors import BranchContext, make_predictor  # noqa: E402
from dynbranch.runtime.offline import precompute  # noqa: E402
from dynbranch.workload import DataConfig  # noqa: E402
from workloads import get_workload  # noqa: E402

KS = (1, 3, 5)


async def _branches(workload, data, n: int, split: str, label: str):
    from tqdm import tqdm

    out = []
    for instance in tqdm(workload.requests(data, n, 0, split), desc=f"{workload.name} {label}",
                         unit="req", leave=False):
        try:
            run = await precompute(instance)
        except Exception:  # NOTE: as prepopulate does: a request that cannot run teaches nothing
            continue
        out.append((instance, run.branches))
    return out


def scenario(workload: str, request_id: str) -> str:
    """The scenario a request's record belongs to (its id past ``NAME-NNNNN-``)."""
    record = request_id.split("-", 2)[2]
    if workload == "routing":
        from workloads.routing import scenario_of

        return scenario_of(record)
    return record


def held_out(workload: str, request_id: str, groups: Mapping[str, str] | None = None) -> bool:
    """Whether a train request is in the quarter ``--validation`` ranks (a hash of its
    scenario, or of its step group with ``--split-by step``, salted so it is not the one
    that chose the train split)."""
    unit = scenario(workload, request_id)
    if groups is not None:
        unit = groups.get(unit, unit)
    key = f"validation:{unit}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 4 == 0


async def measure(name: str, train: int, test: int, predictor: str | None,
                  validation: bool = False, options: dict[str, Any] | None = None,
                  split_by: str | None = None) -> dict:
    workload = get_workload(name) if split_by is None else get_workload(name, split_by=split_by)
    data = DataConfig(resolve_data_dir(None), cache_dir())
    workload.fetch_data(data, lambda _m: None)
    model = make_predictor(predictor or workload.predictor, **(options or {}))
    if validation:
        every = await _branches(workload, data, workload.split_size(data, "train") or train,
                                "train", "train")
        groups = workload.groups(data) if split_by == "step" else None
        learnt = [b for b in every if not held_out(name, b[0].request_id, groups)][:train]
        scored = [b for b in every if held_out(name, b[0].request_id, groups)][:test]
    else:
        learnt = await _branches(workload, data, train, "train", "train")
        scored = await _branches(workload, data, test, "test", "test")
    for instance, branches in learnt:
        for point, chosen in branches:
            model.observe(BranchContext.of(instance.request_id, point), chosen)
    stats: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    stats_requests = {"learnt": len(learnt), "ranked": len(scored)}
    for instance, branches in scored:
        for point, chosen in branches:
            ctx = BranchContext.of(instance.request_id, point)
            ranked = model.rank(ctx, max(KS))
            fillable = [c for c in chosen if instance.fillable(point, c)]
            s = stats[point.coordinate.stage]
            s["branches"] += 1
            s["candidates"] += len(point.candidates)
            for k in KS:
                s[f"top{k}"] += bool(set(chosen) & set(ranked[:k]))
            if fillable:
                ranked_fillable = [c for c in ranked if instance.fillable(point, c)]
                s["fillable"] += 1
                for k in KS:
                    s[f"fillable_top{k}"] += bool(set(fillable) & set(ranked_fillable[:k]))
            if len(set(chosen)) > 1:
                s["multi"] += 1
                for k in KS:
                    s[f"all_top{k}"] += set(chosen) <= set(ranked[:k])
            model.observe(ctx, chosen)
    return {"workload": name, "predictor": model.name, "stages": stats,
            "requests": stats_requests, "on": "validation" if validation else "test"}


def report(result: dict) -> list[str]:
    r = result["requests"]
    lines = [f"{result['workload']}: learnt {r['learnt']} train requests, ranked {r['ranked']} "
             f"{'held-out train' if result['on'] == 'validation' else 'test'} requests"]
    for stage, s in sorted(result["stages"].items()):
        n = s["branches"]
        head = (f"{result['workload']:>9} {stage:<11} {result['predictor']:<9} {int(n):5d} branches"
                f" ({s['candidates'] / n:.1f} candidates): "
                + " ".join(f"top-{k} {s[f'top{k}'] / n:.3f}" for k in KS))
        if s["fillable"] and s["fillable"] < n:
            f = s["fillable"]
            head += (f"; {int(f)} chose fillable work: "
                     + " ".join(f"top-{k} {s[f'fillable_top{k}'] / f:.3f}" for k in KS))
        if s["multi"]:
            head += (f"; {int(s['multi'])} chose several, all of them in the top k: "
                     + " ".join(f"top-{k} {s[f'all_top{k}'] / s['multi']:.3f}" for k in KS))
        lines.append(head)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workloads", nargs="+", default=["routing", "react", "subagent", "hci"])
    ap.add_argument("--train", type=int, default=TRAIN_REQUESTS,
                    help="train requests learnt first (default: as many as a replay learns)")
    ap.add_argument("--test", type=int, default=300)
    ap.add_argument("--predictor", default=None, help="default: each workload's own")
    ap.add_argument("--validation", action="store_true",
                    help="rank a held-out quarter of the train split's scenarios, not the test "
                         "split (for choosing settings)")
    ap.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                    help="a predictor option (a number where it reads as one)")
    ap.add_argument("--split-by", default=None, choices=["question", "step"],
                    help="react, subagent: MuSiQue's split (default: the workload's, question)")
    args = ap.parse_args()
    options = {}
    for item in args.option:
        key, sep, value = item.partition("=")
        if not sep or not key:
            ap.error(f"--option {item!r}: write KEY=VALUE")
        try:
            options[key] = float(value) if any(c in value for c in ".eE") else int(value)
        except ValueError:
            options[key] = value
    for name in args.workloads:
        split_by = args.split_by if name in ("react", "subagent") else None
        result = asyncio.run(measure(name, args.train, args.test, args.predictor,
                                     args.validation, options, split_by))
        for line in report(result):
            print(line, flush=True)


if __name__ == "__main__":
    main()
