"""ReAct fills that run more than one cycle ahead (the paper's depth experiment).

A ReAct fill runs one *run-ahead cycle*: the retrieve of the predicted entity and what the
workload's hop reads after it (the next ``think`` in the original template, a ``read`` of
the passages where the template has one). Deeper cycles keep going along the fill's own
decisions: the fill decodes the next ``think`` on the trajectory it has built, and when that
think searches an entity, it retrieves (and reads) that too — exactly the stages the
canonical path will render if every decision so far was the predicted one, so a canonical
stage can promote any of them by reuse name.

:class:`RunAheadRequest` wraps a ReAct request and replaces only its ``speculate``;
:func:`run_ahead` is the :data:`~experiments.streams.Shape` that wraps every request of a
stream. :func:`consumed_by_cycle` reads a run's stage log and counts, per cycle, the
speculative results canonical stages consumed (cycle ``k`` holds the ``k``-th retrieve
ahead, its read, and the think that follows it).
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import Any

import pandas as pd

from dynbranch.workload import DataConfig, RequestInstance
from experiments.streams import Shape

STAGES_PER_CYCLE = 3
"""At most retrieve, read and think per cycle: the fill depth a run of ``c`` cycles needs is
``3 c`` (the run-ahead loop itself stops at ``c`` cycles)."""


class RunAheadRequest:
    """A ReAct request whose fills run ``cycles`` hops ahead (see the module docstring)."""

    def __init__(self, inner: RequestInstance, cycles: int) -> None:
        if cycles < 1:
            raise ValueError(f"run-ahead cycles must be >= 1, got {cycles}")
        self._inner, self.cycles = inner, cycles
        module = importlib.import_module(type(inner).__module__)
        self._parse_action = module.parse_action
        self._parse_observation = getattr(module, "parse_observation", None)
        self._passages = importlib.import_module("workloads.react.retrieval").passage_values

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    @property
    def request_id(self) -> str:
        return self._inner.request_id

    async def speculate(self, ctx: Any, point: Any, candidate: str) -> None:
        """Retrieve (and read) ``candidate``, then follow the fill's own thinks for the
        remaining cycles (see the module docstring)."""
        inner = self._inner
        # NOTE: the trajectory at the open branch is the request's own state; the ReAct
        # request keeps it (``_open``) for exactly this: rendering a fill's inputs.
        opened = inner._open.get(point.coordinate)
        if opened is None or inner.fill_values(point.coordinate, candidate) is None:
            return
        trajectory, entity = list(opened), candidate
        reads = hasattr(inner, "read_values")
        for cycle in range(self.cycles):
            found = await ctx.tool("retrieve", inner.retrieve_values(entity))
            passages = self._passages(found)
            if reads:
                text = await ctx.llm("read", inner.read_values(entity, passages))
                trajectory.append({"search": entity, "observation": self._parse_observation(text)})
                if cycle == self.cycles - 1:
                    return  # NOTE: a cycle of this template ends with its read
            else:
                trajectory.append({"search": entity, "passages": passages})
            action = self._parse_action(await ctx.llm("think", inner.think_values(trajectory)))
            if action is None or action.kind != "search":
                return
            entity = action.argument


def run_ahead(cycles: int) -> Shape:
    """The shape that wraps every request of the workload's own stream."""

    def shape(inner: Any, data: DataConfig, n: int, seed: int, split: str) -> list[RunAheadRequest]:
        return [RunAheadRequest(r, cycles) for r in inner.requests(data, n, seed, split)]

    return shape


def consumed_by_cycle(stages: pd.DataFrame, cycles: int) -> list[int]:
    """Canonical stages served from a fill, by the cycle of the fill stage that served them."""
    spec = stages[stages["speculative"].astype(bool)].sort_values("start")
    cycle_of: dict[tuple[str, str], int] = {}
    for (_rid, _coord, _fill), rows in spec.groupby(
        ["request_id", "coordinate", "fill"], sort=False
    ):
        k = 0
        for r in rows.itertuples():
            k += r.stage == "retrieve"
            cycle_of.setdefault((r.request_id, r.reuse_name), max(k, 1))
    served = stages[
        stages["served_from"].isin(["shadow", "join"]) & ~stages["speculative"].astype(bool)
    ]
    counts = [0] * cycles
    for r in served.itertuples():
        k = cycle_of.get((r.request_id, r.reuse_name))
        if k is not None and 1 <= k <= cycles:
            counts[k - 1] += 1
    return counts


def cycles_of(instances: Sequence[Any]) -> int | None:
    """The run-ahead cycles a stream's requests were wrapped with (``None``: not wrapped)."""
    found = {getattr(r, "cycles", None) for r in instances}
    return found.pop() if len(found) == 1 else None
