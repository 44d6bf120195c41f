"""What every experiment shares: cells of replays, pairing with the floor, result files.

An experiment writes into a directory or a filesystem URI (:func:`staged`: a remote
destination gets the files once the experiment has finished). An experiment is a list of
:class:`Cell` s — one replay each, on the local backend and the
virtual clock unless the cell says otherwise — whose summaries become rows. Rows that differ
only in arm are *paired*: the same requests, arrival schedule and seed, so each arm's
``reduction_vs_floor`` is ``1 - mean_latency / floor's mean_latency`` within its pair.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import json
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.fill.speculator import keeping_train_splits
from dynbranch.outdir import OutDir
from experiments.pairing import PAIR_KEYS, pair_rows

ROW_FIELDS = ("workload", "arm", "variant", "rate", "requests", "seed", "mean_latency_s",
              "p50_latency_s", "p99_latency_s", "reduction_vs_floor", "accuracy",
              "unsafe_splices", "fills_issued", "fills_consumed", "fills_discarded",
              "reuse_hits", "promotions", "spec_engine_s", "completed", "failed", "wall_s")


WORKLOADS = ("routing", "react", "subagent", "hci")
"""The four workloads, in the paper's order."""
WORKLOAD_NAMES = {"routing": "Routing", "react": "ReAct", "subagent": "Sub-Agent", "hci": "HCI"}
"""How the reports name them."""


def sweep_settings(quick: bool) -> tuple[tuple[int, ...], int]:
    """(seeds, requests per cell) of the sweeps (width, replicas, scaling, backbones): one
    seed of 40 requests quick, else three seeds of 200."""
    return ((0,), 40) if quick else ((0, 1, 2), 200)

@dataclass(frozen=True)
class Cell:
    """One replay of an experiment: a workload × arm × variant × rate × seed."""

    workload: str
    arm: str
    variant: str = "default"
    rate: float = 1.0
    requests: int = 100
    seed: int = 0
    replay: Mapping[str, Any] = field(default_factory=dict)  # other ReplayConfig fields
    workload_options: Mapping[str, Any] = field(default_factory=dict)

    def config(self, out: Path) -> ReplayConfig:
        settings = {"backend": "local", "clock": "virtual", **self.replay}
        return ReplayConfig(
            workload=self.workload, arm=self.arm, rate=self.rate, requests=self.requests,
            seed=self.seed, out=out / self.slug(), progress=False,
            workload_options=dict(self.workload_options), **settings)

    def slug(self) -> str:
        return (f"{self.workload}-{self.variant}-{self.arm}-r{self.rate:g}"
                f"-n{self.requests}-s{self.seed}")


_JOBS = 1
"""Processes :func:`run_cells` runs cells in, unless told otherwise (see :func:`cell_jobs`)."""


@contextlib.contextmanager
def cell_jobs(jobs: int) -> Iterator[None]:
    """Within the block, :func:`run_cells` runs up to ``jobs`` cells at once, each in a
    process of its own (``dynbranch experiment --jobs``)."""
    global _JOBS
    if jobs < 1:
        raise ValueError(f"jobs={jobs} must be >= 1")
    before, _JOBS = _JOBS, jobs
    try:
        yield
    finally:
        _JOBS = before


def run_cells(cells: Sequence[Cell], out: Path,
              extra: Callable[[Cell, Any], Mapping[str, Any]] | None = None,
              customize: Callable[[Cell, Any], Any] | None = None,
              jobs: int | None = None) -> list[dict[str, Any]]:
    """Run every cell (a progress bar over cells) and return one row per cell, paired with
    its floor and oracle (:func:`experiments.pairing.pair_rows`). ``customize`` may replace
    parts of a prepared replay (its arm, its request stream) before it runs.

    With ``jobs`` > 1 (default: :func:`cell_jobs`'s) the cells run in that many forked
    processes at once. A cell is one seeded replay on the virtual clock whatever else the
    process ran, so the rows are the same as one after another (a test compares them), in
    cell order; only ``wall_s`` differs.
    """
    from tqdm import tqdm

    jobs = min(_JOBS if jobs is None else jobs, len(cells))
    with keeping_train_splits():  # NOTE: cells of one workload learn its train split once
        if jobs > 1 and _can_fork():
            rows = _run_forked(cells, out, extra, customize, jobs)
        else:
            rows = [_run_cell(cell, out, extra, customize)
                    for cell in tqdm(cells, desc="cells", unit="replay")]
    return pair_rows(rows)


def _can_fork() -> bool:
    """Whether cells may run in forked processes (else they run one after another)."""
    import multiprocessing
    import sys

    ray = sys.modules.get("ray")
    if "fork" not in multiprocessing.get_all_start_methods():
        why = "this platform cannot fork"
    elif ray is not None and ray.is_initialized():
        why = "this process is connected to Ray, which a forked copy must not share"
    else:
        return True
    print(f"experiments: {why}; the cells run one after another", file=sys.stderr)
    return False


_FORKED: tuple[Any, ...] | None = None
"""What forked cell processes run: (cells, out, extra, customize), set before they fork.
NOTE: inherited through fork, not pickled: ``extra`` and ``customize`` are often closures."""


def _run_forked(cells: Sequence[Cell], out: Path,
                extra: Callable[[Cell, Any], Mapping[str, Any]] | None,
                customize: Callable[[Cell, Any], Any] | None, jobs: int
                ) -> list[dict[str, Any]]:
    import multiprocessing

    from tqdm import tqdm

    global _FORKED
    _FORKED = (cells, out, extra, customize)
    rows: list[dict[str, Any] | None] = [None] * len(cells)
    try:
        with multiprocessing.get_context("fork").Pool(jobs) as pool:
            done = pool.imap_unordered(_forked_cell, range(len(cells)))
            for i, row, stopped in tqdm(done, total=len(cells), desc=f"cells ({jobs} at once)",
                                        unit="replay"):
                if stopped is not None:
                    raise KeyboardInterrupt(stopped)
                rows[i] = row
    finally:
        _FORKED = None
    return rows  # type: ignore[return-value]


def _forked_cell(i: int) -> tuple[int, dict[str, Any] | None, str | None]:
    """One cell in a forked process: its row, or why it stopped (an interrupt cannot cross
    the pool: a worker that raised one would die and leave the pool waiting on it)."""
    assert _FORKED is not None, "set before the pool forked"
    cells, out, extra, customize = _FORKED
    try:
        return i, _run_cell(cells[i], out, extra, customize), None
    except KeyboardInterrupt as e:
        return i, None, str(e) or f"{cells[i].slug()}: interrupted"


def _run_cell(cell: Cell, out: Path, extra: Callable[[Cell, Any], Mapping[str, Any]] | None,
              customize: Callable[[Cell, Any], Any] | None) -> dict[str, Any]:
    prepared = prepare(cell.config(out / "replays"), progress=lambda _m: None)
    if customize is not None:
        prepared = customize(cell, prepared)
    result = run_replay(prepared)
    if result.summary.get("interrupted"):
        # NOTE: the replay caught the SIGINT/SIGTERM to write its partial results; the
        # experiment stops with it rather than going on to the next cell.
        raise KeyboardInterrupt(f"{cell.slug()}: interrupted by "
                                f"{result.summary.get('interrupted_by')}")
    row = {k: result.summary.get(k) for k in ROW_FIELDS if k in result.summary}
    row.update({"workload": cell.workload, "arm": cell.arm, "variant": cell.variant,
                "rate": cell.rate, "requests": cell.requests, "seed": cell.seed})
    if extra is not None:
        row.update(extra(cell, result))
    return row


def add_reduction_vs_floor(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Set ``reduction_vs_floor`` on every row from the floor row of its pair."""
    floors = {tuple(r[k] for k in PAIR_KEYS): r["mean_latency_s"]
              for r in rows if r["arm"] == "floor"}
    for r in rows:
        floor = floors.get(tuple(r[k] for k in PAIR_KEYS))
        r["reduction_vs_floor"] = (1.0 - r["mean_latency_s"] / floor
                                   if floor and r.get("mean_latency_s") is not None else None)
    return rows


@dataclass
class Experiment:
    """An experiment's outcome, ready to be written."""

    name: str
    rows: list[dict[str, Any]]
    paper: dict[str, Any]
    report: str
    plots: dict[str, Callable[[Path], None]] = field(default_factory=dict)


def write_experiment(exp: Experiment, out: Path) -> None:
    """``results.parquet``, ``summary.json``, every plot and ``report.md`` into ``out``
    (each file written atomically; ``summary.json`` last)."""
    dest = OutDir.parse(out)
    dest.make()
    buf = io.BytesIO()
    pd.DataFrame(exp.rows).to_parquet(buf, index=False)
    dest.write_bytes("results.parquet", buf.getvalue())
    for filename, plot in exp.plots.items():
        # NOTE: drawn beside the target under a hidden name with the same suffix (the
        # plotting code picks the format from it), then moved on in one step.
        tmp = Path(out) / f".{filename}.part{Path(filename).suffix}"
        plot(tmp)
        dest.write_bytes(filename, tmp.read_bytes())
        tmp.unlink()
    dest.write_text("report.md", exp.report.rstrip() + "\n")
    summary = {"experiment": exp.name, "rows": exp.rows, "paper": exp.paper}
    dest.write_text("summary.json", json.dumps(summary, indent=2, default=_json) + "\n")


@contextlib.contextmanager
def staged(dest: OutDir) -> Iterator[Path]:
    """A local directory to run an experiment into: ``dest`` itself when it is on this
    machine's filesystem, else a temporary one whose files are uploaded to ``dest`` (each
    atomically) when the block ends without an error."""
    if dest.local is not None:
        yield dest.local
        return
    with tempfile.TemporaryDirectory(prefix="dynbranch-experiment-") as tmp:
        yield Path(tmp)
        upload_tree(Path(tmp), dest)


def upload_tree(local: Path, dest: OutDir) -> list[str]:
    """Copy every file under ``local`` to the same relative path under ``dest`` (each
    atomically, ``summary.json`` files last); returns the relative paths copied."""
    files = sorted((p for p in local.rglob("*") if p.is_file()),
                   key=lambda p: (p.name == "summary.json", str(p)))
    names = [str(p.relative_to(local)) for p in files]
    dest.make()
    for path, name in zip(files, names, strict=True):
        dest.write_bytes(name, path.read_bytes())
    return names


def markdown_table(rows: Iterable[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of ``columns`` (floats to 3 decimals, fractions as given)."""
    def cell(v: Any) -> str:
        if isinstance(v, float):
            return f"{v:.3f}"
        return "" if v is None else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c)) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def _json(value: Any) -> Any:
    if dataclasses.is_dataclass(value):
        return dataclasses.asdict(value)
    if hasattr(value, "item"):
        return value.item()
    return str(value)
