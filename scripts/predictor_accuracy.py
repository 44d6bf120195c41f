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
"""

from __future__ import annotations

import argparse
import asyncio
import sys
from collections import defaultdict
from pathlib import Path

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


async def measure(name: str, train: int, test: int, predictor: str | None) -> dict:
    workload = get_workload(name)
    data = DataConfig(resolve_data_dir(None), cache_dir())
    workload.fetch_data(data, lambda _m: None)
    model = make_predictor(predictor or workload.predictor)
    for instance, branches in await _branches(workload, data, train, "train", "train"):
        for point, chosen in branches:
            model.observe(BranchContext.of(instance.request_id, point), chosen)
    stats: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    for instance, branches in await _branches(workload, data, test, "test", "test"):
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
    return {"workload": name, "predictor": model.name, "stages": stats}


def report(result: dict) -> list[str]:
    lines = []
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
    args = ap.parse_args()
    for name in args.workloads:
        for line in report(asyncio.run(measure(name, args.train, args.test, args.predictor))):
            print(line, flush=True)


if __name__ == "__main__":
    main()
