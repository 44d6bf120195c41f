"""The fault battery: one fault at a time, on the Ray backend, and what the run made of it.

Scenarios (Routing, arm ``full``, four simulated engines unless said otherwise):

* ``engine-kill`` — one of the four engine actors' processes is killed a third of the way
  through the arrivals (Ray restarts it; its calls are retried on the others);
* ``gate-kill`` — the central gate actor is killed (Ray restarts it from its journal);
* ``store-kill`` — one of the two store shards' processes is killed;
* ``sigint`` — the replay command itself gets SIGINT mid-run;
* ``overload`` — open loop at 3x the engines' capacity with ``--max-inflight`` and
  ``--deadline-s``;
* ``malformed-data`` — corrupted copies of data files, each given to a replay: every one
  must be refused with a typed error before anything starts.

Each Ray scenario runs in a process of its own (a fresh Ray instance, and a hard timeout:
requests still unfinished when it expires are *hung*). Columns: ``requests`` the replay was
asked for; ``completed`` / ``failed`` (typed failures) / ``rejected`` / ``deadline`` /
``interrupted`` / ``not_started`` their fates; ``lost`` requests with no record at all;
``hung`` requests that never ended; ``untyped`` failures whose error is not one of
DynBranch's; ``unsafe_splices`` from the independent checker. For ``malformed-data``,
``requests`` counts the corrupted files and ``failed`` those refused with a typed error.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict
from pathlib import Path
from typing import Any

import pandas as pd

from dynbranch.errors import typed_error_names
from dynbranch.resultlog import PARTS, read_partial
from experiments.common import Experiment, markdown_table
from experiments.fault_inject import FaultSpec
from experiments.malformed import malformed_row
from experiments.pairing import no_oracle

ROOT = Path(__file__).resolve().parents[1]
COLUMNS = (
    "fault",
    "requests",
    "completed",
    "failed",
    "lost",
    "hung",
    "untyped",
    "unsafe_splices",
    "rejected",
    "deadline",
    "interrupted",
    "not_started",
    "p99_latency_s",
    "failures_by_type",
    "notes",
)
CAPACITY_RPS = 2.0
"""The highest rate at which four simulated Qwen3-32B/H200 engines serve Routing (floor, modelled
decode lengths) stably: its median latency grows by at most 5 % from 300 to 1,000 requests at
2 req/s (12.31 -> 12.47 s) and by 8 % at 3 (``scripts/bench_overload.py``'s sweep, virtual
clock). Saturated, the four engines complete about 3.7 req/s."""
DEADLINE_S = 120.0
"""The overload scenario's deadline: above an unloaded Routing request's p99 (98 s at 1 req/s),
so that it cancels only what queueing made late."""


def run(quick: bool, out: Path) -> Experiment:
    """Every scenario, one after the other; the table of what each run made of its fault."""
    n, rate = (40, 2.0) if quick else (120, 3.0)
    base = {"workload": "routing", "arm": "full", "workers": 4, "requests": n, "rate": rate}
    kill_at = 0.3 * n / rate
    overload = _overload(quick)
    # NOTE: (fault, its directory, the replay it runs, the scenario run in it)
    scenarios: list[tuple[str, str, Mapping[str, Any] | None,
                          Callable[[Path], dict[str, Any]]]] = [
        ("engine-kill", "engine-kill", base,
         lambda d: _ray(FaultSpec(str(d), "engine", kill_at, None, base))),
        ("gate-kill", "gate-kill", base,
         lambda d: _ray(FaultSpec(str(d), "gate", kill_at, 0, base))),
        ("store-kill", "store-kill", base,
         lambda d: _ray(FaultSpec(str(d), "store", kill_at, 0, base))),
        ("sigint", "sigint", base, lambda d: _sigint(d, base, kill_at)),
        ("overload", "overload", overload,
         lambda d: _ray(FaultSpec(str(d), "none", 0.0, 0, overload))),
        ("malformed-data", "malformed", None, malformed_row),
    ]
    rows = []
    for name, sub, replay, scenario in scenarios:
        print(f"faults: {name} ...", file=sys.stderr, flush=True)
        # NOTE: each scenario is read from what it leaves in its directory (its final files,
        # or the shards of a run killed outright), so an earlier run's files there go first.
        shutil.rmtree(out / sub, ignore_errors=True)
        row = {"fault": name, **scenario(out / sub)}
        rows.append({**_cell(name, replay, out / sub), **row})
    no_oracle(rows, "a fault battery: each scenario is one run under its fault, paired with "
                    "no floor and no oracle")
    return Experiment("faults", rows, {}, _report(rows, quick))


def _cell(fault: str, replay: Mapping[str, Any] | None, out: Path) -> dict[str, Any]:
    """The experiment row fields every experiment's rows carry (DESIGN §5), from the
    scenario's replay and what its ``summary.json`` says (``None`` where it wrote none, and
    for ``malformed-data``, where no replay starts)."""
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    replay = replay or {}
    return {
        "workload": replay.get("workload"), "arm": replay.get("arm"), "variant": fault,
        "rate": replay.get("rate"), "mean_latency_s": summary.get("mean_latency_s"),
        "p99_latency_s": summary.get("p99_latency_s"),
        "reduction_vs_floor": None,  # NOTE: no floor runs beside a fault
        "accuracy": summary.get("accuracy"), "unsafe_splices": summary.get("unsafe_splices"),
        **{k: summary.get(k) for k in ("fills_issued", "fills_consumed", "fills_discarded")},
    }


def _overload(quick: bool) -> dict[str, Any]:
    n = 150 if quick else 600
    return {
        "workload": "routing",
        "arm": "floor",
        "workers": 4,
        "requests": n,
        "rate": round(3 * CAPACITY_RPS, 2),
        "max_inflight": 32,
        "deadline_s": DEADLINE_S,
    }


def _timeout(replay: Mapping[str, Any]) -> float:
    """Seconds a scenario may take before its unfinished requests count as hung."""
    return 120.0 + 4.0 * replay["requests"] / replay["rate"]


def _ray(spec: FaultSpec) -> dict[str, Any]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "experiments.fault_inject", json.dumps(asdict(spec))],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started = time.monotonic()
    timed_out = False
    try:
        stdout, stderr = proc.communicate(timeout=_timeout(spec.replay))
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        stdout, stderr = proc.communicate()
    injected = _last_json(stdout).get("injected", {})
    row = _row(Path(spec.out), spec.replay["requests"], timed_out)
    notes = _notes(Path(spec.out), injected)
    if proc.returncode not in (0, None) and not timed_out:
        notes["exit"] = f"{proc.returncode}: {stderr.strip().splitlines()[-1:]}"
    return {
        **row,
        "wall_s": round(time.monotonic() - started, 1),
        "notes": json.dumps(notes, sort_keys=True),
    }


def _sigint(out: Path, replay: Mapping[str, Any], after_s: float) -> dict[str, Any]:
    """The replay command gets SIGINT ``after_s`` seconds after its first streamed shard."""
    cmd = [
        sys.executable,
        "-m",
        "dynbranch",
        "replay",
        "--backend",
        "ray",
        "--quiet",
        "--out",
        str(out),
        *(f"--{k.replace('_', '-')}={v}" for k, v in replay.items()),
    ]
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    started, deadline = time.monotonic(), time.monotonic() + _timeout(replay)
    while time.monotonic() < deadline and proc.poll() is None:
        if list((out / PARTS).glob("requests-*.jsonl")):
            break
        time.sleep(0.2)
    time.sleep(min(after_s, 5.0))
    proc.send_signal(signal.SIGINT)
    timed_out = False
    try:
        _stdout, stderr = proc.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        _stdout, stderr = proc.communicate()
    row = _row(out, replay["requests"], timed_out)
    readable = (out / "summary.json").is_file() and _readable(out / "requests.parquet")
    notes = {
        "exit": proc.returncode,
        "partial_result_readable": readable,
        "message": stderr.strip().splitlines()[-1:] if stderr else [],
    }
    return {
        **row,
        "wall_s": round(time.monotonic() - started, 1),
        "notes": json.dumps(notes, sort_keys=True),
    }


def _readable(path: Path) -> bool:
    try:
        pd.read_parquet(path)
    except Exception:
        return False
    return True


def _row(out: Path, expected: int, timed_out: bool) -> dict[str, Any]:
    """A scenario's fates from what it left in ``out`` (its final files, or its shards)."""
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    if summary:
        requests = pd.read_parquet(out / "requests.parquet")
    else:
        requests, _stages = read_partial(out)
    status = requests["status"] if len(requests) else pd.Series([], dtype=str)
    ended = int(len(requests))
    not_started = int(summary.get("not_started", 0))
    bad = requests[status != "completed"] if ended else requests
    typed = typed_error_names()
    errors = bad["error_type"].value_counts().to_dict() if ended else {}
    return {
        "requests": expected,
        "completed": int((status == "completed").sum()),
        "failed": int((status == "failed").sum()),
        "rejected": int((status == "rejected").sum()),
        "deadline": int((status == "deadline").sum()),
        "interrupted": int((status == "interrupted").sum()),
        "not_started": not_started,
        "lost": 0 if timed_out else expected - ended - not_started,
        "hung": expected - ended - not_started if timed_out else 0,
        "untyped": int(sum(1 for e in bad["error_type"] if e not in typed)) if ended else 0,
        "unsafe_splices": summary.get("unsafe_splices"),
        "p99_latency_s": summary.get("p99_latency_s"),
        "failures_by_type": json.dumps({str(k): int(v) for k, v in errors.items()}, sort_keys=True),
    }


def _notes(out: Path, injected: Mapping[str, Any]) -> dict[str, Any]:
    summary_path = out / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    engines = summary.get("engines", {})
    notes: dict[str, Any] = {
        k: engines[k]
        for k in ("went_down", "retried", "recovered", "abandoned")
        if k in engines
    }
    shard_sets = injected.get("shard_sets") or []
    for key in ("resyncs", "degraded", "lost_shards"):
        total = sum(s.get(key, 0) for s in shard_sets)
        if total:
            notes[f"store_{key}"] = total
    gate = summary.get("speculation", {}).get("gate", {}).get("client", {})
    for key in ("retries", "degraded_generation", "degraded_admit"):
        if gate.get(key):
            notes[f"gate_{key}"] = gate[key]
    if summary.get("cleanup_errors"):
        notes["cleanup_errors"] = summary["cleanup_errors"]
    notes["killed"] = injected.get("target", "nothing")
    if "running_at_kill" in injected:
        notes["running_at_kill"] = injected["running_at_kill"]
    return notes


def _last_json(text: str) -> dict[str, Any]:
    for line in reversed(text.strip().splitlines()):
        try:
            return json.loads(line)
        except json.JSONDecodeError:
            continue
    return {}


def _report(rows: list[dict[str, Any]], quick: bool) -> str:
    table = markdown_table(rows, COLUMNS[:-1])
    notes = "\n".join(f"- **{r['fault']}**: {r['notes']}" for r in rows)
    size = "quick" if quick else "full"
    return (
        f"# Fault battery ({size})\n\nOne fault per run on the Ray backend (Routing; see "
        f"`experiments/faults.py` for each scenario). Every scenario must lose, hang and "
        f"leave untyped nothing.\n\n{table}\n\nWhat the stack did about it:\n\n{notes}\n"
    )
