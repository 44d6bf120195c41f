"""Corrupted data, handed to a replay on the Ray backend: each must stop with one typed error
before anything starts (the fault battery's ``malformed-data`` row).

Each variant copies one data set (the BFCL test fixture for Routing, the shared data
directory's MuSiQue/HotpotQA for ReAct and Sub-Agent, SGD for HCI), corrupts one file the
way a bad download or a hand edit would, and runs ``dynbranch replay`` on it in a process of
its own. A variant passes when the command exits 2 with one line naming the problem; a
traceback, another status or a run that starts is counted ``untyped``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dynbranch.datasets import resolve_data_dir

ROOT = Path(__file__).resolve().parents[1]
FIXTURE = ROOT / "tests" / "fixtures" / "bfcl"
BFCL_DATA = Path("bfcl_eval") / "data"


def _rename_field(path: Path) -> None:
    lines = path.read_text().splitlines()
    lines[0] = lines[0].replace('"question"', '"questions"', 1)
    path.write_text("\n".join(lines) + "\n")


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _bad_line(path: Path) -> None:
    lines = path.read_text().splitlines()
    lines[1] = "{not json"
    path.write_text("\n".join(lines) + "\n")


def _empty(path: Path) -> None:
    path.write_text("")


VARIANTS: dict[str, tuple[str, str, str, Callable[[Path], None]]] = {
    # name: (workload, data set copied, file corrupted, corruption)
    "routing/renamed-field": ("routing", "bfcl", "BFCL_v4_multiple.json", _rename_field),
    "routing/truncated-file": ("routing", "bfcl", "BFCL_v4_multi_turn_base.json", _truncate),
    "routing/empty-answers": ("routing", "bfcl", "possible_answer/BFCL_v4_multiple.json", _empty),
    "react/bad-json-line": ("react", "musique", "dev_200_full.jsonl", _bad_line),
    "react/truncated-corpus": ("react", "musique", "dev_200_paragraph_corpus.jsonl", _truncate),
    "subagent/truncated": ("subagent", "musique", "dev_2417_decompositions.json", _truncate),
    "hci/bad-json": ("hci", "sgd", "", _truncate),
}


def _prepare_copy(out: Path, dataset: str, target: str) -> tuple[list[str], Path]:
    """Copy the data set and return the replay flags that point at the copy and the file."""
    if dataset == "bfcl":
        root = out / "bfcl"
        shutil.copytree(FIXTURE, root)
        return ["--workload-root", str(root)], root / BFCL_DATA / target
    source = resolve_data_dir(None)
    if source is None:
        raise FileNotFoundError("no data directory (../shared/data) to copy")
    data = out / "data"
    for name in ("musique", "hotpotqa", "sgd"):
        if (source / name).is_dir():
            shutil.copytree(source / name, data / name)
    if not target:  # the data set's largest JSON file
        files = sorted((data / dataset).rglob("*.json"), key=lambda p: p.stat().st_size)
        return ["--data-dir", str(data)], files[-1]
    return ["--data-dir", str(data)], data / dataset / target


def run_variant(name: str, out: Path) -> dict[str, Any]:
    """Corrupt one copy as ``name`` says and replay it; what the command answered."""
    workload, dataset, target, corrupt = VARIANTS[name]
    out.mkdir(parents=True, exist_ok=True)
    flags, path = _prepare_copy(out, dataset, target)
    corrupt(path)
    cmd = [sys.executable, "-c", _RUNNER, workload, *flags, str(out / "run")]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    lines = proc.stderr.strip().splitlines()
    typed = proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("dynbranch: error:")
    return {
        "variant": name,
        "exit": proc.returncode,
        "typed": typed,
        "error_type": proc.stdout.strip().splitlines()[-1] if proc.stdout.strip() else "",
        "started": (out / "run").exists(),
        "message": lines[-1][:240] if lines else "",
    }


# NOTE: the replay command with one addition the CLI does not have: the BFCL root of the
# routing workload (its data normally comes from the cache), passed as a workload option.
_RUNNER = """
import sys
from dynbranch import cli
from dynbranch.errors import DynBranchError
workload, *rest = sys.argv[1:]
out = rest.pop()
options = {}
if rest[0] == "--workload-root":
    options, rest = {"root": rest[1]}, rest[2:]
import dynbranch.driver as driver
real = driver.ReplayConfig
driver.ReplayConfig = lambda **kw: real(**{**kw, "workload_options": options})
args = cli.build_parser().parse_args(["replay", "--backend", "ray", "--quiet", "--workload",
                                      workload, "--out", out, *rest])
try:
    sys.exit(cli.cmd_replay(args))
except DynBranchError as e:  # as cli.main answers, plus the error's type on stdout
    print(type(e).__name__)
    print(f"dynbranch: error: {e}", file=sys.stderr)
    sys.exit(2)
"""


def malformed_row(out: Path) -> dict[str, Any]:
    """The battery's row: every variant, refused typed before anything started."""
    results = [run_variant(name, out / name.replace("/", "-")) for name in VARIANTS]
    typed = [r for r in results if r["typed"] and not r["started"]]
    errors: dict[str, int] = {}
    for r in typed:
        errors[r["error_type"]] = errors.get(r["error_type"], 0) + 1
    return {
        "requests": len(results),
        "completed": 0,
        "failed": len(typed),
        "rejected": 0,
        "deadline": 0,
        "interrupted": 0,
        "not_started": 0,
        "lost": 0,
        "hung": 0,
        "untyped": len(results) - len(typed),
        "unsafe_splices": 0,
        "p99_latency_s": None,
        "failures_by_type": json.dumps(errors, sort_keys=True),
        "notes": json.dumps({r["variant"]: r["message"] for r in results}),
    }
