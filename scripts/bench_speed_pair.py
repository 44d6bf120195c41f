"""Replay speed of two trees side by side, their results compared row for row.

    python scripts/bench_speed_pair.py --base REV [--head REV] [--requests 10000] [--pairs 2]
                                       [--rate 4] [--arm full] [--out DIR]

``--base`` (and ``--head``, default: this working tree, uncommitted changes included) are
checked out into temporary git worktrees. The same virtual-clock Routing replay then runs in
each, alternating base, head, base, head, ... (``--pairs`` times), each as its own process
running its own tree's code (``python -m dynbranch replay`` from the tree's root). This
machine's speed drifts by a fifth within an hour, so a speed change is only read against the
other tree's run next to it, never against a figure from another time.

``--together`` runs each pair's two replays at the same time instead, one per core: both then
see the same spell of the machine, which alternating runs minutes apart do not (on this 2-core
machine one tree ran the same replay in 100 s and in 155 s within the hour). Run nothing else
beside them.

``--mypyc`` compiles the head tree's leaf modules of the simulator (:data:`COMPILED_CORE`,
or the modules named) with mypyc before the runs, to measure what compiling the core as it
is written buys (``pip install mypy`` first; a build takes about 4 minutes here). The head is
then always a worktree (``--head``, default ``HEAD``), so no built file lands in this tree.

Prints per run the wall seconds, simulated seconds per wall second, the process's CPU seconds
(start-up and writing the results included: steadier than wall time on a shared machine) and
peak RSS, and whether the first pair's request, stage and branch rows are identical (every
column but wall-clock ones); writes the same to ``DIR/pairs.json``. A speed change that is
meant to change nothing else must print ``identical``.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # NOTE: the data directory as this tree resolves it
    sys.path.insert(0, str(ROOT))

from dynbranch.datasets import resolve_data_dir  # noqa: E402

TABLES = ("requests", "stages", "branches")
COMPILED_CORE = (
    "dynbranch/prefix_memo.py", "dynbranch/engines/blocks.py", "dynbranch/engines/scheduler.py",
    "dynbranch/engines/skip_ahead.py", "dynbranch/engines/lazy_decodes.py",
    "dynbranch/engines/tokenizer.py", "dynbranch/gate/beta.py", "dynbranch/reuse/names.py",
)
"""The hot modules mypyc compiles as written: the sim engine's step loop, KV blocks and
tokenizer, the prefix memory, the Beta posteriors and reuse naming. (The sim engine's own
module holds an async generator and ``canonical``'s frozen containers subclass ``dict`` and
``list``, which mypyc does not compile; the predictors are subclassed by interpreted code.)"""


def worktree(rev: str, where: Path) -> Path:
    """A detached worktree of ``rev`` at ``where``."""
    subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(where), rev],
                   check=True, capture_output=True)
    return where


def compile_tree(tree: Path, modules: list[str]) -> float:
    """Compile ``modules`` (paths from ``tree``'s root) in place with mypyc; the seconds taken.

    The extension modules land beside their sources, so a replay run from ``tree`` imports
    them instead.
    """
    if not _has_mypyc():
        raise SystemExit("--mypyc needs mypyc: pip install mypy")
    began = time.perf_counter()
    # NOTE: silent imports: what the modules import from outside is typed as far as mypy sees
    done = subprocess.run([sys.executable, "-m", "mypyc", "--follow-imports=silent",
                           "--ignore-missing-imports", *modules],
                          cwd=tree, capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"mypyc failed in {tree} ({done.returncode}):\n"
                         f"{(done.stdout + done.stderr)[-3000:]}")
    return time.perf_counter() - began


def _has_mypyc() -> bool:
    return importlib.util.find_spec("mypyc") is not None


def replay(tree: Path, out: Path, args: argparse.Namespace, data_dir: Path | None) -> dict:
    """One replay in ``tree``'s code; its summary's speed figures and the process's peak RSS."""
    return finish(start(tree, out, args, data_dir), tree, out)


def start(tree: Path, out: Path, args: argparse.Namespace,
          data_dir: Path | None) -> subprocess.Popen:
    """Start one replay in ``tree``'s code, writing to ``out`` (see :func:`finish`)."""
    cmd = [sys.executable, "-m", "dynbranch", "replay", "--workload", "routing",
           "--arm", args.arm, "--backend", "local", "--clock", "virtual",
           "--rate", str(args.rate), "--requests", str(args.requests), "--out", str(out),
           "--quiet"]
    if data_dir is not None:
        cmd += ["--data-dir", str(data_dir)]
    env = {**os.environ, "PYTHONPATH": str(tree)}  # NOTE: this tree's code, not an install
    # NOTE: stderr to a file, not a pipe: two replays at once must not block on full pipes
    with _stderr_of(out).open("w") as log:
        return subprocess.Popen(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=log)


def _stderr_of(out: Path) -> Path:
    """Where the replay writing to ``out`` writes its stderr (beside ``out``, removed after)."""
    return out.parent / f".{out.name}.stderr"


def finish(proc: subprocess.Popen, tree: Path, out: Path) -> dict:
    """Wait for a replay :func:`start` began; its speed figures and the process's peak RSS."""
    _pid, status, usage = os.wait4(proc.pid, 0)
    log = _stderr_of(out)
    stderr = log.read_text() if log.exists() else ""
    log.unlink(missing_ok=True)
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode != 0:
        raise SystemExit(f"replay in {tree} failed ({proc.returncode}):\n{stderr[-2000:]}")
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": summary["wall_s"], "sim_s_per_wall_s": summary["sim_s_per_wall_s"],
            "mean_latency_s": summary["mean_latency_s"], "completed": summary["completed"],
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 2)}


def run_pair(trees: dict[str, Path], out: Path, pair: int, args: argparse.Namespace,
             data_dir: Path | None) -> Iterator[tuple[str, dict]]:
    """One pair's replays, base then head, or both at once (``--together``); each side's
    figures as soon as they are in."""
    where = {side: out / f"{side}_{pair}" for side in ("base", "head")}
    if not args.together:
        for side in where:
            yield side, replay(trees[side], where[side], args, data_dir)
        return
    procs = {side: start(trees[side], where[side], args, data_dir) for side in where}
    try:
        for side in where:
            yield side, finish(procs[side], trees[side], where[side])
    finally:
        for proc in procs.values():  # NOTE: one side failed or we were stopped: no orphan
            if proc.returncode is None:
                proc.kill()
                proc.wait()


def compare(a: Path, b: Path) -> dict[str, str]:
    """Per result table: ``identical``, or what differs (wall-clock columns left out)."""
    import pandas as pd

    verdict = {}
    for table in TABLES:
        x, y = pd.read_parquet(a / f"{table}.parquet"), pd.read_parquet(b / f"{table}.parquet")
        if len(x) != len(y) or list(x.columns) != list(y.columns):
            verdict[table] = f"differ: {len(x)} rows / {len(y)} rows, or other columns"
            continue
        bad = [c for c in x.columns if "wall" not in c and not x[c].equals(y[c])]
        verdict[table] = (f"identical ({len(x)} rows)" if not bad
                          else f"differ in {', '.join(bad)}")
    return verdict


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", required=True, help="the commit to compare against")
    ap.add_argument("--head", default=None, help="a commit (default: this working tree)")
    ap.add_argument("--requests", type=int, default=10_000)
    ap.add_argument("--rate", type=float, default=4.0)
    ap.add_argument("--arm", default="full")
    ap.add_argument("--pairs", type=int, default=2)
    ap.add_argument("--together", action="store_true",
                    help="run each pair's two replays at the same time, one per core")
    ap.add_argument("--out", type=Path, default=None, help="where runs and pairs.json go")
    ap.add_argument("--mypyc", nargs="*", default=None, metavar="MODULE",
                    help="compile these modules of the head tree with mypyc first "
                         "(none named: COMPILED_CORE); the head is then a worktree of --head "
                         "(default: HEAD)")
    args = ap.parse_args()
    if args.mypyc is not None:
        args.mypyc = args.mypyc or list(COMPILED_CORE)
        args.head = args.head or "HEAD"
    data_dir = resolve_data_dir(None)
    with tempfile.TemporaryDirectory(prefix="speed-pair-") as tmp:
        # NOTE: absolute: each replay runs from its own tree's root
        out = (args.out or Path(tmp) / "runs").resolve()
        out.mkdir(parents=True, exist_ok=True)
        trees = {"base": worktree(args.base, Path(tmp) / "base")}
        trees["head"] = worktree(args.head, Path(tmp) / "head") if args.head else ROOT
        try:
            if args.mypyc:
                took = compile_tree(trees["head"], args.mypyc)
                print(f"head: {len(args.mypyc)} modules compiled with mypyc in {took:.0f} s",
                      flush=True)
            runs: list[dict] = []
            for i in range(args.pairs):
                for side, got in run_pair(trees, out, i + 1, args, data_dir):
                    runs.append({"pair": i + 1, "side": side, **got})
                    print(f"pair {i + 1} {side}: {got['wall_s']:.1f} s wall, "
                          f"{got['sim_s_per_wall_s']:.1f} simulated s per wall s, "
                          f"{got['cpu_s']:.1f} CPU s (the whole process), "
                          f"peak RSS {got['peak_rss_mb']:.0f} MB, "
                          f"mean latency {got['mean_latency_s']:.6f} s", flush=True)
                base_s, head_s = (r["cpu_s"] for r in runs[-2:])
                print(f"pair {i + 1}: head / base CPU seconds {head_s / base_s:.3f}", flush=True)
            verdict = compare(out / "base_1", out / "head_1")
        finally:
            for tree in trees.values():
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force",
                                    str(tree)], capture_output=True)
        for table, said in verdict.items():
            print(f"{table}: {said}")
        report = {"base": args.base, "head": args.head or "working tree",
                  "requests": args.requests, "rate": args.rate, "arm": args.arm,
                  "together": args.together, "mypyc": args.mypyc,
                  "runs": runs, "rows": verdict}
        (out / "pairs.json").write_text(json.dumps(report, indent=1) + "\n")
        if args.out is not None:
            print(f"runs and pairs.json in {out}")


if __name__ == "__main__":
    main()
