"""Arrival rates set by measured load, not written in: "low load" and "at load".

The paper reports Fig. 8 at a low-load and an at-load rate without saying what they are,
and our stage durations are the sim engine's, not the paper's, so a rate copied from a
figure would mean a different load here. Instead each (workload, deployment) gets a
**pilot**: the floor on a handful of requests at a rate so low they rarely overlap, whose
stage log gives ``T_llm``, the canonical LLM seconds one request carries
(:func:`~experiments.facts.run_facts`). A rate is then an offered *canonical concurrency*
ρ — the mean number of canonical LLM calls in flight per engine, ``λ = ρ · W / T_llm`` —
so the same ρ is the same load on every workload and deployment:

* ``low`` (ρ = 0.1): engines mostly idle, one call at a time; fills run on idle engines;
* ``at load`` (ρ = 1.5): every engine batches more than one canonical call most of the
  time, so fills share decode steps and KV with canonical work and C3's price rises.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from experiments.common import Cell, run_cells
from experiments.facts import with_facts

LOADS: dict[str, float] = {"low": 0.1, "at-load": 1.5}
"""Load name → ρ, canonical LLM calls in flight per engine (see the module docstring)."""
PILOT_RATE = 0.02
PILOT_REQUESTS = 12


def canonical_llm_s(
    workload: str,
    replay: Mapping[str, Any],
    out: Path,
    seed: int = 0,
    workload_options: Mapping[str, Any] | None = None,
    requests: int = PILOT_REQUESTS,
) -> float:
    """The floor's mean canonical LLM seconds per request, measured alone (the pilot)."""
    cell = Cell(
        workload,
        "floor",
        "pilot",
        rate=PILOT_RATE,
        requests=requests,
        seed=seed,
        replay=dict(replay),
        workload_options=dict(workload_options or {}),
    )
    row = run_cells([cell], out, extra=with_facts())[0]
    llm_s = row["f_llm_s_per_request"]
    if not llm_s or llm_s <= 0:
        raise ValueError(f"pilot of {workload}: no canonical LLM time measured")
    return float(llm_s)


def rate_for(rho: float, workers: int, llm_s: float) -> float:
    """λ = ρ · W / T_llm, rounded to three significant digits (so reports read cleanly)."""
    rate = rho * workers / llm_s
    return float(f"{rate:.3g}")
