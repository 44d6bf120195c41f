"""Speed of the gate's decisions, and its contention price calibrated against the sim engine.

Prints, for the ``qwen3-32b@h200`` profile:

* decision latency (p50 / p99 / mean, microseconds) and decisions per second of
  ``Gate.admit`` with 4 candidates (greedy, priced, audits on, posteriors warmed up), of
  ``Gate.generation``, and of ``observe`` / ``release``;
* the calibration of the contention model against ``SimEngine`` on the virtual clock
  (Fig. 5b's co-resident fill counts), for the default small shapes and a larger one,
  beside the paper's Fig. 5b points.

Numbers go into notes, not tests:

    python scripts/bench_gate.py [--iterations N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dynbranch.calibrate import calibrate_price  # noqa: E402
from dynbranch.engines.profile import load_profile  # noqa: E402
from dynbranch.gate import (  # noqa: E402
    BranchReturn,
    Candidate,
    ContentionModel,
    FillShape,
    Gate,
    GateConfig,
    LoadView,
)

PROFILE = "qwen3-32b@h200"


def _timed(fn: Callable[[int], object], n: int) -> list[float]:
    """Per-call latencies in microseconds of ``fn(i)`` for i in range(n)."""
    out = []
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


def _summary(name: str, us: list[float]) -> str:
    us = sorted(us)
    p50, p99 = us[len(us) // 2], us[min(len(us) - 1, int(0.99 * len(us)))]
    mean = statistics.fmean(us)
    return (
        f"  {name:<28} p50 {p50:8.1f} us   p99 {p99:8.1f} us   mean {mean:8.1f} us"
        f"   {1e6 / mean:>9,.0f} decisions/s"
    )


def bench_decisions(iterations: int) -> list[str]:
    profile = load_profile(PROFILE)
    gate = Gate(ContentionModel.from_profile(profile), GateConfig(fanout=3, audit_rate=0.02))
    shape = FillShape(prompt_tokens=512, output_tokens=64, context_tokens=1024)
    blocks = shape.kv_blocks(profile.scheduler.block_size)
    cands = [Candidate(f"h{r}", r, f"stage{r}", 1500.0 - 300 * r, shape, blocks) for r in range(4)]
    # Warm the posteriors as a running system would have them.
    for i in range(2_000):
        for r in range(4):
            gate.observe(f"stage{r}", r, selected=(r == i % 3 == 0), usable=True)
        gate.settle(f"coord{i % 16}", BranchReturn(saved_ms=400.0, setup_ms=30.0))
    views = [
        LoadView(o_fill=0.01 * (i % 40), o_kv=0.01 * (i % 30), rho=0.005 * (i % 60))
        for i in range(97)
    ]

    def admit(i: int) -> None:
        out = gate.admit(f"coord{i % 16}", cands, views[i % len(views)], float(i))
        for a in out:
            if a.reservation is not None:
                gate.release(a.reservation)

    def admit_only(i: int) -> object:
        return gate.admit(f"coord{i % 16}", cands, views[i % len(views)], float(i))

    admit_us = []
    for i in range(iterations):
        t0 = time.perf_counter()
        out = admit_only(i)
        admit_us.append((time.perf_counter() - t0) * 1e6)
        for a in out:  # type: ignore[attr-defined]
            if a.reservation is not None:
                gate.release(a.reservation)
    admitted = gate.counters["admitted"] + gate.counters["audit"]
    lines = [
        f"decision latency ({PROFILE}, {iterations:,} calls each, one CPU thread):",
        _summary("admit (4 candidates)", admit_us),
        _summary(
            "generation", _timed(lambda i: gate.generation(f"coord{i % 16}", float(i)), iterations)
        ),
        _summary(
            "observe", _timed(lambda i: gate.observe("stage0", 0, i % 2 == 0, True), iterations)
        ),
        _summary("admit + release (4 cands)", _timed(admit, iterations // 4)),
        f"  (admitted {admitted:,} of {gate.counters['candidates']:,} candidates seen; "
        f"reserved now {gate.reserved_blocks} blocks)",
    ]
    return lines


def bench_calibration() -> list[str]:
    profile = load_profile(PROFILE)
    out = []
    for fill, canonical in (
        (FillShape(256, 32), None),
        (FillShape(1024, 128), FillShape(1024, 400)),
    ):
        t0 = time.perf_counter()
        fills = (0, 1, 2, 3, 6, 12, 24, 48) if canonical is None else (0, 1, 2, 3, 6, 12, 24)
        result = calibrate_price(profile, fill=fill, canonical=canonical, fills=fills)
        out += [result.table(), f"  ({time.perf_counter() - t0:.2f} s of wall time)", ""]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20_000)
    args = parser.parse_args()
    print("\n".join(bench_decisions(args.iterations)), end="\n\n")
    print("\n".join(bench_calibration()))


if __name__ == "__main__":
    main()
