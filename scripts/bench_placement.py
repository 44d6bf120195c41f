"""What each placement policy costs per call, on the calls of a real replay.

A replay (Routing ``full`` by default, local backend, virtual clock) is run once with its
arm's placement wrapped so that every call the pool places is recorded as the pool gave it:
the engines' open-call counts and the request (its prompt, session, priority, salt). Then
each policy is driven through that same sequence of calls, in order, on a fresh instance,
and timed per call:

* ``place``: deciding the engine (for the noting policies, the prompt's block keys or its
  prefix, and the match against what each engine holds);
* ``note``: what the policy remembers once the pool has sent the call there (nothing for a
  policy that remembers nothing), which the pool runs after the send;
* ``choose``: the two at once, as a direct caller gets them (a second fresh instance).

The policy sees each call's recorded counts, not counts its own choices would have led to,
so all policies are timed on the same inputs; the engine each picks is noted as sent there.
Also given: how often each picks the engine the recorded run's policy did, which is 100 %
for the arm's own policy (a check that the replay through the recording is faithful).

    python scripts/bench_placement.py [--workload routing] [--arm full] [--requests 300]
        [--rate 4] [--repeat 3] [--bfcl-root DIR] [--out runs/bench_placement]

Numbers go into notes (``scripts/BENCHMARKS.md``), not tests.
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import json
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # NOTE: measure this tree's code, not an installed copy
    sys.path.insert(0, str(ROOT))

from dynbranch.baselines.parrot import ParrotPlacement  # noqa: E402
from dynbranch.driver import ReplayConfig, prepare, run_replay  # noqa: E402
from dynbranch.engines.protocol import GenerateRequest  # noqa: E402
from dynbranch.runtime.affinity import AffinityPlacement, PrefixAffinity  # noqa: E402
from dynbranch.runtime.placement import (  # noqa: E402
    LeastOutstanding,
    Noting,
    PlacementPolicy,
    SessionAffinity,
)

POLICIES: dict[str, Callable[[], PlacementPolicy]] = {
    "affinity": AffinityPlacement,
    "prefix-affinity": PrefixAffinity,
    "session-affinity": SessionAffinity,
    "parrot": ParrotPlacement,
    "least-outstanding": LeastOutstanding,
}


@dataclasses.dataclass(frozen=True)
class Placed:
    """One call as the pool placed it in the recorded run."""

    outstanding: tuple[int, ...]
    request: GenerateRequest
    engine: int  # what the run's policy picked


class Recording(PlacementPolicy):
    """The arm's own policy, unchanged, with every call it is asked to place recorded."""

    def __init__(self, inner: PlacementPolicy, calls: list[Placed]) -> None:
        self.inner, self.calls, self.name = inner, calls, inner.name

    def choose(self, outstanding: Sequence[int], request: GenerateRequest) -> int:
        engine = self.inner.choose(outstanding, request)
        self.calls.append(Placed(tuple(outstanding), request, engine))
        return engine

    def place(self, outstanding: Sequence[int],
              request: GenerateRequest) -> tuple[int, Noting | None]:
        engine, note = self.inner.place(outstanding, request)
        self.calls.append(Placed(tuple(outstanding), request, engine))
        return engine, note

    def stats(self) -> dict[str, int]:
        stats = getattr(self.inner, "stats", None)
        return stats() if stats is not None else {}


def record(workload: str, arm: str, requests: int, rate: float, out: Path,
           bfcl_root: str | None = None) -> list[Placed]:
    """The target engines' placements of one local virtual-clock replay, in order."""
    options = {"root": bfcl_root} if bfcl_root else {}
    cfg = ReplayConfig(workload=workload, arm=arm, backend="local", clock="virtual",
                       requests=requests, rate=rate, seed=0, out=out, progress=False,
                       workload_options=options)
    prepared = prepare(cfg, progress=lambda _m: None)
    make = prepared.arm.make_placement
    # NOTE: each role (target engines, drafters) gets a policy of its own; all are recorded,
    # and the calls of the role with most of them (the engines serving stages) are kept
    by_role: list[list[Placed]] = []

    def recording() -> PlacementPolicy:
        mine: list[Placed] = []
        by_role.append(mine)
        return Recording(make(), mine)

    prepared = dataclasses.replace(
        prepared, arm=dataclasses.replace(prepared.arm, make_placement=recording))
    summary = run_replay(prepared).summary
    if summary.get("failed"):
        raise SystemExit(f"the recorded replay had {summary['failed']} failed requests")
    calls = max(by_role, key=len, default=[])
    if not calls:
        raise SystemExit("the recorded replay placed no engine calls")
    return calls


def _pct(values: list[float]) -> dict[str, float]:
    a = np.asarray(values) * 1e6
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean())}


def drive(make: Callable[[], PlacementPolicy], calls: Sequence[Placed]) -> dict[str, Any]:
    """``place``, ``note`` and ``choose`` over ``calls`` in order: per call, microseconds at
    p50 and p99 and their mean; and the share of calls placed where the recorded run did."""
    placing, choosing = make(), make()
    place_s, note_s, choose_s, same = [], [], [], 0
    picked: list[int] = []
    clock = time.perf_counter
    gc_was = gc.isenabled()
    gc.disable()  # NOTE: a collection pass would land on whichever call allocated last
    try:
        # NOTE: two passes, not the two instances call by call: the second to see a prompt
        # would find it in the CPU's caches
        for c in calls:
            t0 = clock()
            engine, note = placing.place(c.outstanding, c.request)
            t1 = clock()
            if note is not None:
                note(engine)
            t2 = clock()
            place_s.append(t1 - t0)
            note_s.append(t2 - t1)
            picked.append(engine)
            same += engine == c.engine
        for c, engine in zip(calls, picked, strict=True):
            t0 = clock()
            chosen = choosing.choose(c.outstanding, c.request)
            choose_s.append(clock() - t0)
            assert chosen == engine, "placing then noting picks what choosing picks"
    finally:
        if gc_was:
            gc.enable()
    return {"place": _pct(place_s), "note": _pct(note_s), "choose": _pct(choose_s),
            "place_and_note": _pct([a + b for a, b in zip(place_s, note_s, strict=True)]),
            "same_engine_share": same / len(calls)}


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Of repeated runs, each figure's least (the run least disturbed by the machine)."""
    out: dict[str, Any] = {"same_engine_share": runs[0]["same_engine_share"]}
    for part in ("place", "note", "choose", "place_and_note"):
        out[part] = {q: min(r[part][q] for r in runs) for q in ("p50", "p99", "mean")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workload", default="routing")
    ap.add_argument("--arm", default="full")
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--repeat", type=int, default=3,
                    help="times each policy is driven through the calls (each figure's least)")
    ap.add_argument("--policies", nargs="*", default=list(POLICIES), choices=list(POLICIES))
    ap.add_argument("--bfcl-root", default=None,
                    help="BFCL's data folder (default: the installed bfcl-eval package's)")
    ap.add_argument("--out", type=Path, default=None,
                    help="folder for placement.json (default: print only)")
    args = ap.parse_args(argv)
    if args.requests < 1 or args.repeat < 1:
        ap.error("--requests and --repeat must be at least 1")

    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        calls = record(args.workload, args.arm, args.requests, args.rate, Path(tmp),
                       args.bfcl_root)
    prompt_chars = np.array([len(c.request.prompt) for c in calls])
    fills = sum(c.request.priority > 0 for c in calls)
    print(f"recorded {len(calls)} placements ({fills} of them fills) of {args.requests} "
          f"{args.workload} requests, arm {args.arm}, in {time.perf_counter() - t0:.1f} s; "
          f"prompt chars p50 {np.percentile(prompt_chars, 50):.0f}, "
          f"max {prompt_chars.max()}")
    result: dict[str, Any] = {
        "workload": args.workload, "arm": args.arm, "requests": args.requests,
        "rate": args.rate, "calls": len(calls), "fills": fills, "policies": {}}
    print(f"{'policy':<18} {'part':<15} {'p50 us':>8} {'p99 us':>8} {'mean us':>8}  same pick")
    for name in args.policies:
        best = _best([drive(POLICIES[name], calls) for _ in range(args.repeat)])
        result["policies"][name] = best
        for part in ("place", "note", "place_and_note", "choose"):
            f = best[part]
            same = f"{100 * best['same_engine_share']:.1f} %" if part == "place" else ""
            print(f"{name:<18} {part:<15} {f['p50']:8.1f} {f['p99']:8.1f} {f['mean']:8.1f}  "
                  f"{same}")
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "placement.json").write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {args.out / 'placement.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
