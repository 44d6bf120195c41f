"""Measure how long BFCL's in-process API classes take per call, by class.

    python scripts/measure_bfcl_tool_times.py [--categories multi_turn_base] [--repeat 5]

Runs every ground-truth call of the chosen multi-turn records on fresh API instances (as the
executor does: parse, bind, execute, copy the value out) ``--repeat`` times and prints, per
class, the number of calls and the p50 / p90 seconds of one call. The file system and math
classes are the ones a deployment would run in process, so their modelled latency in
:mod:`workloads.routing.tools` is this measurement's p50.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import defaultdict

from dynbranch.datasets import cache_dir
from workloads.routing.apis import ApiState
from workloads.routing.bfcl_data import load_bfcl
from workloads.routing.bfcl_wheel import bfcl_dir
from workloads.routing.calls import parse_call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--categories", default="multi_turn_base")
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    data = load_bfcl(bfcl_dir(cache_dir()), tuple(args.categories.split(",")))
    times: dict[str, list[float]] = defaultdict(list)
    for _ in range(args.repeat):
        for record in data.all():
            state = ApiState(data.suite, record.classes, record.initial_config, record.long_context)
            for turn in record.recorded:
                for text in turn:
                    t0 = time.perf_counter()
                    try:
                        call = parse_call(text)
                        cls, bound = state.bind(call)
                        state.execute(cls, call, bound)
                    except Exception:  # NOTE: BFCL's own ground truth sometimes raises
                        cls = state.owner(parse_call(text).name) or "?"
                    times[cls].append(time.perf_counter() - t0)
    print(f"{'class':20} {'calls':>6} {'p50_s':>10} {'p90_s':>10}")
    for cls, ts in sorted(times.items()):
        q = statistics.quantiles(ts, n=10)
        print(f"{cls:20} {len(ts):6d} {statistics.median(ts):10.6f} {q[-1]:10.6f}")


if __name__ == "__main__":
    main()
