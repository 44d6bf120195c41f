"""Batch experiments that reproduce the paper's tables and figures.

``dynbranch experiment NAME [--quick] --out DIR`` runs one of them and writes
``results.parquet``, ``summary.json`` (``{"experiment", "rows", "paper"}``), PNG plots and a
``report.md`` that sets our numbers beside the paper's. Each experiment is a module here with
``run(quick: bool, out: Path) -> Experiment``; this registry maps names to modules so the CLI
can refuse unknown and not-yet-built names before anything runs. ``all`` runs every one of
them and writes an index page (:mod:`experiments.index`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path

from dynbranch.errors import NotBuiltError, UnknownNameError

ALL = ("table1", "table2", "fig5a", "fig5b", "fig8", "fig9a", "fig9b", "depth", "fig10",
       "fig11", "fig12", "fig13", "fig14", "faults")
"""Every experiment DESIGN.md §5 names, and the fault battery."""

BUILT: dict[str, str] = {name: name for name in ALL}
"""Experiment name → module (under ``experiments``) that implements it."""


def get_experiment(name: str) -> Callable[..., object]:
    """The ``run`` function of experiment ``name`` (``all``: every one, then an index page);
    a typed error naming what exists otherwise."""
    if name == "all":
        return importlib.import_module("experiments.index").run
    if name in BUILT:
        return importlib.import_module(f"experiments.{BUILT[name]}").run
    if name in ALL:
        raise NotBuiltError("experiment", name, list(BUILT))
    raise UnknownNameError("experiment", name, [*ALL, "all"])


def default_out(name: str) -> Path:
    return Path("runs") / "experiments" / name
