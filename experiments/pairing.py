"""Pairing: every arm against the floor and the oracle of its own arrival schedule.

Cells that differ only in arm are *paired*: the same requests, arrival schedule and seed
(:data:`PAIR_KEYS`). Within a pair,

* ``reduction_vs_floor`` = 1 − mean latency / the floor's mean latency;
* ``oracle_reduction`` = the ``oracle`` arm's reduction in the same pair — a **bound**, not
  a system (c2 whose predictor is handed each branch's resolved candidates; gate, engines
  and contention real), so it is what early fill could reach with perfect prediction;
* ``captured`` = ``reduction_vs_floor / oracle_reduction``: the share of that reachable
  saving the arm gets. For arms with C1 (``c1``, ``full``, the reuse baselines) it can pass
  1, since the oracle bounds early fill only; ``None`` where the oracle gains nothing.

:func:`with_oracle` adds the oracle cell to every pair of a cell list (with the settings of
the pair's own C2 cell, so it runs on the same engines, rates and fill width), and
:func:`pair_rows` fills the three columns. Experiments whose pairs are not
:data:`PAIR_KEYS` (e.g. Fig. 13, where the variant is the gate) pass their own keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from experiments.stats import ratio

if TYPE_CHECKING:
    from experiments.common import Cell

PAIR_KEYS = ("workload", "variant", "rate", "seed", "requests")
"""What makes cells a pair: everything but the arm (the same requests and arrival schedule)."""
ORACLE = "oracle"
FLOOR = "floor"
MIN_BOUND = 0.01
"""The least oracle reduction (1 % of the floor's mean latency) that ``captured`` divides by."""
ORACLE_REPLAY_KEYS = (
    "workers",
    "tool_time",
    "fanout",
    "depth",
    "profile",
    "network",
    "decode_lengths",
    "store_mb",
)
"""Replay settings an oracle cell takes from its pair (the deployment and the fill width);
gate variants and predictors are the arm's own, not the bound's."""


def pair_key(row: dict[str, Any] | Cell, keys: Sequence[str] = PAIR_KEYS) -> tuple:
    """The pair a row (or cell) belongs to."""
    get = row.get if isinstance(row, dict) else lambda k: getattr(row, k)
    return tuple(get(k) for k in keys)


def with_oracle(cells: Iterable[Cell], keys: Sequence[str] = PAIR_KEYS) -> list[Cell]:
    """``cells`` plus one ``oracle`` cell per pair that has a floor and none yet.

    The oracle copies the floor cell of its pair (workload, variant, rate, requests, seed,
    workload options) and the deployment settings of the pair's cells
    (:data:`ORACLE_REPLAY_KEYS`), placed right after the pair's floor so the batch order
    stays as the experiment wrote it.
    """
    cells = list(cells)
    have = {pair_key(c, keys) for c in cells if c.arm == ORACLE}
    replay: dict[tuple, dict[str, Any]] = {}
    for c in cells:
        found = replay.setdefault(pair_key(c, keys), {})
        for k in ORACLE_REPLAY_KEYS:
            if k in c.replay:
                found.setdefault(k, c.replay[k])
    out: list[Cell] = []
    for c in cells:
        out.append(c)
        key = pair_key(c, keys)
        if c.arm == FLOOR and key not in have:
            have.add(key)
            out.append(dataclasses.replace(c, arm=ORACLE, replay=replay[key]))
    return out


def pair_rows(rows: list[dict[str, Any]], keys: Sequence[str] = PAIR_KEYS) -> list[dict[str, Any]]:
    """Set ``reduction_vs_floor``, ``oracle_reduction`` and ``captured`` on every row from
    the floor and oracle rows of its pair (``None`` where the pair lacks one)."""
    floors = {pair_key(r, keys): r.get("mean_latency_s") for r in rows if r["arm"] == FLOOR}
    for r in rows:
        floor = floors.get(pair_key(r, keys))
        mean = r.get("mean_latency_s")
        r["reduction_vs_floor"] = (1.0 - mean / floor) if floor and mean is not None else None
    oracles = {pair_key(r, keys): r["reduction_vs_floor"] for r in rows if r["arm"] == ORACLE}
    for r in rows:
        bound = oracles.get(pair_key(r, keys))
        r["oracle_reduction"] = bound
        # NOTE: a bound under MIN_BOUND (the oracle gains next to nothing in this pair)
        # leaves nothing to capture: a ratio over it would be noise or flip signs.
        r["captured"] = (
            ratio(r["reduction_vs_floor"], bound)
            if bound is not None and bound >= MIN_BOUND
            else None
        )
    return rows


def no_oracle(rows: list[dict[str, Any]], why: str) -> list[dict[str, Any]]:
    """Rows of an experiment with no replay (offline analyses, the engine driven directly):
    ``oracle_reduction`` and ``captured`` do not apply, and ``oracle_why`` says why."""
    for r in rows:
        r.setdefault("oracle_reduction", None)
        r.setdefault("captured", None)
        r["oracle_why"] = why
    return rows


def add_relative(
    rows: list[dict[str, Any]], metric: str, name: str, keys: Sequence[str] = PAIR_KEYS
) -> list[dict[str, Any]]:
    """Set ``name`` = 1 − ``metric`` / the pair's floor ``metric`` on every row (a reduction
    of, e.g., p99 latency; ``None`` without a floor)."""
    floors = {pair_key(r, keys): r.get(metric) for r in rows if r["arm"] == FLOOR}
    for r in rows:
        floor, value = floors.get(pair_key(r, keys)), r.get(metric)
        r[name] = (1.0 - value / floor) if floor and value is not None else None
    return rows
