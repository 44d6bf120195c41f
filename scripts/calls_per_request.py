"""How many Python function calls a replayed request makes, and what a request costs per call.

    python scripts/calls_per_request.py [--requests 300 600] [--arm full] [--rate 4] [--top 25]
                                        [--bfcl-root DIR]

Replays the same virtual-clock Routing stream twice, to two lengths, each in this process:
once with a profile hook counting every Python call (and every call into C) by function, and
once without, timing the CPU seconds of the replay alone (start-up and learning the train
split are in :func:`prepare`, outside both). The difference between the two lengths is what
the requests between them cost, without the start-up: calls per request, CPU milliseconds per
request, and so microseconds of CPU per Python call. Then the functions called most per
request, as a map of where a new request's calls go (a call count, not a time: the hook
slows every call alike, so its own timing is not reported).

The first requests of a Routing stream are new BFCL requests (a 10,000-request stream has
3,184 distinct ones), so the default span measures a new request.
"""

from __future__ import annotations

import argparse
import sys
import sysconfig
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dynbranch.driver import ReplayConfig, prepare, run_replay  # noqa: E402

_PREFIXES = (str(ROOT) + "/", "site-packages/", sysconfig.get_paths()["stdlib"] + "/")


def _where(code) -> str:
    path = code.co_filename
    for prefix in _PREFIXES:
        path = path.split(prefix)[-1]
    return f"{code.co_name} ({path}:{code.co_firstlineno})"


def _config(args: argparse.Namespace, requests: int, out: Path) -> ReplayConfig:
    options = {} if args.bfcl_root is None else {"root": str(args.bfcl_root)}
    return ReplayConfig(workload="routing", arm=args.arm, backend="local", clock="virtual",
                        requests=requests, rate=args.rate, out=out, progress=False,
                        workload_options=options)


def replay_counted(args: argparse.Namespace, requests: int, out: Path) -> tuple[Counter, int]:
    """Calls by function (C functions as ``C:name``) of one replay; and its stages."""
    prepared = prepare(_config(args, requests, out), progress=lambda _m: None)
    counts: Counter[str] = Counter()

    def hook(frame, event, arg) -> None:
        if event == "call":
            counts[_where(frame.f_code)] += 1
        elif event == "c_call":
            counts["C:" + getattr(arg, "__qualname__", type(arg).__name__)] += 1

    sys.setprofile(hook)
    try:
        summary = run_replay(prepared).summary
    finally:
        sys.setprofile(None)
    return counts, summary["stages"]


def replay_timed(args: argparse.Namespace, requests: int, out: Path) -> float:
    """CPU seconds of one replay, start-up left out."""
    prepared = prepare(_config(args, requests, out), progress=lambda _m: None)
    began = time.process_time()
    run_replay(prepared)
    return time.process_time() - began


def cpu_figures(lo_s: float, hi_s: float, span: int, python_calls: float) -> str:
    """CPU per request and per Python call from the two replays' CPU seconds.

    NOTE: a difference of two timings: when the longer replay took no more CPU than the
    shorter (another process slowed the shorter one, or the span is too short to outweigh
    the noise) there is no figure, and saying so beats printing a negative cost.
    """
    timings = f"{lo_s:.2f} and {hi_s:.2f} s for the two replays"
    if hi_s <= lo_s or python_calls <= 0:
        return (f"CPU per request not resolved ({timings}: the longer took no more; run "
                "nothing beside it, or widen --requests)")
    cpu_ms = 1000 * (hi_s - lo_s) / span
    return f"{cpu_ms:.1f} ms CPU ({timings}), {1000 * cpu_ms / python_calls:.2f} µs per Python call"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, nargs=2, default=[300, 600], metavar=("FROM", "TO"))
    ap.add_argument("--arm", default="full")
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--bfcl-root", type=Path, default=None,
                    help="BFCL data directory (default: the one a replay finds)")
    args = ap.parse_args()
    lo, hi = args.requests
    if not 0 < lo < hi:
        ap.error(f"--requests {lo} {hi}: need 0 < FROM < TO")
    with tempfile.TemporaryDirectory(prefix="calls-") as tmp:
        counted = {n: replay_counted(args, n, Path(tmp) / f"counted_{n}") for n in (lo, hi)}
        cpu = {n: replay_timed(args, n, Path(tmp) / f"timed_{n}") for n in (lo, hi)}
    span = hi - lo
    calls = counted[hi][0] - counted[lo][0]  # NOTE: Counter subtraction keeps positives only
    python_calls = sum(v for k, v in calls.items() if not k.startswith("C:")) / span
    c_calls = sum(v for k, v in calls.items() if k.startswith("C:")) / span
    stages = (counted[hi][1] - counted[lo][1]) / span
    print(f"requests {lo + 1}-{hi} of Routing `{args.arm}` at {args.rate:g} req/s, per request: "
          f"{stages:.1f} stages, {python_calls:,.0f} Python calls, {c_calls:,.0f} calls into C, "
          f"{cpu_figures(cpu[lo], cpu[hi], span, python_calls)}")
    print(f"called most per request (of {python_calls + c_calls:,.0f}):")
    for name, n in calls.most_common(args.top):
        print(f"{n / span:9.1f}  {name}")


if __name__ == "__main__":
    main()
