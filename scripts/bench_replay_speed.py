"""How fast the virtual clock replays, span by span, and what a new and a repeated request cost.

    python scripts/bench_replay_speed.py [--requests 10000] [--rate 4] [--arm full]
                                         [--every 1000] [--store-mb 1024] [--out DIR]

Runs one replay in this process as ``dynbranch replay --backend local --clock virtual`` runs
it (streamed rows leave memory: ``keep_log=False``), and reads it every ``--every`` finished
requests: wall and CPU seconds, the simulated seconds the finished requests reached, the
resident memory and the Python heap's live small objects (``sys.getallocatedblocks()``:
pymalloc's blocks, which a growing Python structure grows). Then the whole run's simulated
seconds per wall second, the figure issue 15 sets at 100 for 10,000 Routing ``full``
requests at 4 req/s.

A Routing stream draws its requests from a few thousand BFCL entries, so its first
requests are new and later ones mostly repeat one seen before, which C1 serves from its
store. A request is *new* when no request before it (in arrival order) had the same
:meth:`~dynbranch.workload.RequestInstance.request_input`. The CPU seconds of each span after
the first (the first carries the start-up: the engines, learning the train split) are
fitted as ``a × new + b × repeats`` over the requests that finished in it (least squares,
no intercept): ``a`` and ``b`` are the CPU milliseconds of a new and a repeated request,
and ``1000 / (rate × ms)`` the simulated seconds per CPU second a stream of only that kind
could reach (100 at 4 req/s needs 2.5 ms a request). A workload whose requests have no
input leaves the fit out.

With ``--out`` the spans and totals are also written to ``DIR/replay_speed.json``; the
replay's own result files go to ``DIR/replay`` (else to a temporary directory).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import resource
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # NOTE: measure this tree's code, not an installed copy
    sys.path.insert(0, str(ROOT))

from dynbranch.canonical import digest  # noqa: E402
from dynbranch.driver import ReplayConfig, prepare, run_replay  # noqa: E402
from dynbranch.runtime.runlog import RequestRecord  # noqa: E402


def rss_mb() -> float:
    """This process's resident memory now (Linux), else its peak so far."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def new_flags(instances: Sequence[Any]) -> dict[str, bool] | None:
    """Request id -> whether its input is the first of its kind in arrival order (``None``
    when the workload's requests have no input to compare).

    NOTE: give it a trace of its own (the workload's ``requests`` again): it lets each
    request go once read, so the replay's lazily made trace is not made ahead of the run
    (which would put every request in memory before the first arrives)."""
    seen: set[str] = set()
    flags = {}
    for i in range(len(instances)):
        instance = instances[i]
        request_input = instance.request_input()
        if request_input is None:
            return None
        key = digest(request_input)
        flags[instance.request_id] = key not in seen
        seen.add(key)
        with contextlib.suppress(TypeError):  # NOTE: a tuple keeps its requests
            instances[i] = None  # type: ignore[index]
    return flags


class Spans:
    """Reads the run every ``every`` finished requests (see the module doc)."""

    def __init__(self, every: int, new: dict[str, bool] | None) -> None:
        self.every, self.new = every, new
        self.rows: list[dict[str, Any]] = []
        self._done = self._new = 0
        self._sim = 0.0
        self._mark = (time.perf_counter(), time.process_time(), 0.0, 0, 0)

    def finished(self, record: RequestRecord) -> None:
        self._done += 1
        self._new += bool(self.new and self.new.get(record.request_id))
        self._sim = max(self._sim, record.end)
        if self._done % self.every == 0:
            self.close_span()

    def close_span(self) -> None:
        wall0, cpu0, sim0, done0, new0 = self._mark
        if self._done == done0:
            return
        wall, cpu = time.perf_counter(), time.process_time()
        requests, new = self._done - done0, self._new - new0
        self.rows.append({
            "requests": [done0 + 1, self._done], "new": new if self.new else None,
            "wall_s": wall - wall0, "cpu_s": cpu - cpu0, "simulated_s": self._sim - sim0,
            "rss_mb": rss_mb(), "python_blocks": sys.getallocatedblocks(),
            "sim_s_per_wall_s": (self._sim - sim0) / max(wall - wall0, 1e-9),
            "cpu_ms_per_request": 1e3 * (cpu - cpu0) / requests,
        })
        self._mark = (wall, cpu, self._sim, self._done, self._new)


def fit_costs(rows: Sequence[dict[str, Any]]) -> dict[str, float] | None:
    """CPU ms of a new and of a repeated request, fitted over the spans after the first
    (``None`` without request kinds, or when the spans cannot tell the two apart)."""
    used = [r for r in rows[1:] if r["new"] is not None]
    if len(used) < 2:
        return None
    x = np.array([[r["new"], r["requests"][1] - r["requests"][0] + 1 - r["new"]]
                  for r in used], dtype=float)
    y = np.array([r["cpu_s"] for r in used]) * 1e3
    if np.linalg.matrix_rank(x) < 2:
        return None
    (a, b), *_ = np.linalg.lstsq(x, y, rcond=None)
    residual = y - x @ np.array([a, b])
    return {"new_ms": float(a), "repeat_ms": float(b),
            "rms_residual_ms_per_request": float(np.sqrt(np.mean(
                (residual / x.sum(axis=1)) ** 2)))}


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--arm", default="full")
    ap.add_argument("--workload", default="routing")
    ap.add_argument("--every", type=int, default=1000, help="finished requests per span")
    ap.add_argument("--store-mb", type=int, default=ReplayConfig.store_mb)
    ap.add_argument("--profile", default=ReplayConfig.profile)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args(argv)
    if args.every < 1 or args.requests < 1:
        ap.error("--requests and --every must be at least 1")
    with tempfile.TemporaryDirectory() as tmp:
        out = (args.out / "replay") if args.out is not None else Path(tmp) / "replay"
        cfg = ReplayConfig(workload=args.workload, arm=args.arm, backend="local",
                           clock="virtual", requests=args.requests, rate=args.rate,
                           profile=args.profile, store_mb=args.store_mb, out=out,
                           progress=False)
        prepared = prepare(cfg, progress=lambda _m: None)
        cfg = prepared.config
        trace = prepared.workload.requests(prepared.data, cfg.requests, cfg.seed, cfg.split)
        spans = Spans(args.every, new_flags(trace))  # NOTE: the clock starts here
        summary = run_replay(prepared, keep_log=False, on_finished=spans.finished).summary
        spans.close_span()
    fit = fit_costs(spans.rows)
    result = {
        "config": {"workload": args.workload, "arm": args.arm, "requests": args.requests,
                   "rate": args.rate, "store_mb": args.store_mb, "profile": args.profile},
        "wall_s": summary["wall_s"], "simulated_s": summary["simulated_s"],
        "sim_s_per_wall_s": summary["sim_s_per_wall_s"],
        "completed": summary["completed"], "failed": summary["failed"],
        "new_requests": None if spans.new is None else sum(spans.new.values()),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "spans": spans.rows, "fit": fit,
    }
    print(report(result))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "replay_speed.json").write_text(json.dumps(result, indent=1) + "\n")
    return result


def report(result: dict[str, Any]) -> str:
    c = result["config"]
    lines = [f"{c['requests']} {c['workload']} requests of {c['arm']} at {c['rate']}/s "
             f"(virtual clock, {c['store_mb']} MB store): {result['completed']} completed, "
             f"{result['failed']} failed; {result['wall_s']:.1f} s wall, "
             f"{result['simulated_s']:.1f} s simulated, "
             f"{result['sim_s_per_wall_s']:.1f} simulated s per wall s",
             f"{'requests':>13} {'new':>5} {'wall s':>7} {'CPU s':>7} {'sim s':>7} "
             f"{'sim/wall':>8} {'CPU ms/req':>10} {'RSS MB':>7} {'py blocks':>10}"]
    for r in result["spans"]:
        first, last = r["requests"]
        new = "-" if r["new"] is None else str(r["new"])
        lines.append(f"{first:>6}-{last:<6} {new:>5} {r['wall_s']:7.1f} {r['cpu_s']:7.1f} "
                     f"{r['simulated_s']:7.1f} {r['sim_s_per_wall_s']:8.1f} "
                     f"{r['cpu_ms_per_request']:10.2f} {r['rss_mb']:7.0f} "
                     f"{r['python_blocks']:>10,}")
    fit = result["fit"]
    if fit is not None:
        rate = c["rate"]
        lines.append(
            f"CPU per request, fitted over the spans after the first: new {fit['new_ms']:.2f} "
            f"ms, repeated {fit['repeat_ms']:.2f} ms (rms residual "
            f"{fit['rms_residual_ms_per_request']:.2f} ms a request); at {rate} req/s a "
            f"stream of only new requests could reach {1e3 / (rate * fit['new_ms']):.0f} "
            f"simulated s per CPU s, of only repeats {1e3 / (rate * fit['repeat_ms']):.0f}")
    lines.append(f"peak RSS {result['peak_rss_mb']:.0f} MB")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
