"""The typed objects of early fill, from admission to what the gate learns.

A policy admits a :class:`FillChoice` (with the gate's reservation receipt and the budgets
that bound it); the runner turns it into a :class:`Fill`, which records each stage it ran
(:class:`FillStage`) and every time a canonical stage was served its result
(:class:`Consumption`). Policies learn from these objects when the request ends.
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynbranch.runtime.stage import StageCall


class FillBudget(ABC):
    """A bound on how far one fill may run; checked before each of its stages."""

    name: str

    @abstractmethod
    def stop_reason(self, trace: Sequence[FillStage], call: StageCall) -> str | None:
        """Why the fill that ran ``trace`` may not run ``call`` next (``None``: it may)."""


@dataclass(frozen=True)
class DepthBudget(FillBudget):
    """At most ``depth`` stages per fill (the run's ``--depth``, or a policy's own ``k``)."""

    depth: int
    name: str = "depth"

    def stop_reason(self, trace: Sequence[FillStage], call: StageCall) -> str | None:
        if len(trace) >= self.depth:
            return f"fill {self.name} {self.depth} reached at {call.stage.name}"
        return None


@dataclass(frozen=True)
class Ranked:
    """A fillable candidate and its rank in the predictor's whole ranking (unfillable ones,
    such as an end-of-turn marker, keep their places, so a rank means the same whatever the
    branch offered). ``confidence``: the predictor's own probability for it, when the
    predictor learns calibrated ones (:meth:`~dynbranch.predictors.base.Predictor.confidences`)."""

    name: str
    rank: int
    confidence: float | None = None


FillEnded = Callable[["Fill"], Awaitable[None]]
"""What a policy does when one of its fills ends (release its reservation, learn its load)."""


@dataclass(frozen=True)
class FillChoice:
    """A candidate a policy admitted: its rank, the gate's reservation receipt, the budgets
    that bound it beyond the run's depth, and ``on_end``, which the runner awaits once when
    the fill ends — done, stopped, failed or cancelled — so its receipt never outlives it."""

    candidate: str
    rank: int
    reservation: Any = None
    budgets: tuple[FillBudget, ...] = ()
    on_end: FillEnded | None = None


@dataclass
class FillStage:
    """One stage a fill ran: served from the store, or executed under a claimed name."""

    stage: str
    kind: str
    tool: str = ""
    claimed: str = ""  # the reuse name it executed under ("" when the store held it)
    duration_s: float = 0.0  # how long its execution took (0 when it did not execute)
    engine_s: float = 0.0
    prompt_tokens: int = 0  # uncached prompt tokens of an executed LLM stage
    output_tokens: int = 0
    done: bool = False  # it executed to the end (its result is a shadow)


@dataclass(frozen=True)
class Consumption:
    """A canonical stage of ``request_id`` served a fill's result (``how``: shadow | join)
    at ``at``, after waiting ``waited_s`` in its lookup — or, with ``how == "expired"``,
    waited ``waited_s`` on the fill's execution and was not served (the fill failed or was
    cancelled first)."""

    reuse_name: str
    request_id: str
    how: str
    at: float
    waited_s: float

    @property
    def served(self) -> bool:
        return self.how in ("shadow", "join")


@dataclass
class Fill:
    """One candidate's speculative run and its fate."""

    fill_id: str
    request_id: str
    coordinate: str
    candidate: str
    rank: int
    started_at: float
    budgets: tuple[FillBudget, ...] = ()
    reservation: Any = None  # the gate's KV reservation receipt, released when it ends
    on_end: FillEnded | None = None
    task: asyncio.Task | None = None
    trace: list[FillStage] = field(default_factory=list)
    consumptions: list[Consumption] = field(default_factory=list)
    state: str = "running"  # running | done | stopped | cancelled | failed
    ended_at: float | None = None
    error: str = ""

    @property
    def running(self) -> bool:
        return self.state == "running"

    @property
    def consumed(self) -> bool:
        """Whether a canonical stage was served this fill's result."""
        return any(c.served for c in self.consumptions)

    @property
    def covered(self) -> bool:
        """Whether the fill ran to its end having executed nothing: every stage it reached
        was already held by the store (a record, or another fill's shadow or execution), so
        it neither saved nor wasted any work (a Sub-Agent search branch whose sub-agent a
        plan fill already ran whole)."""
        return self.state == "done" and not self.names

    @property
    def saved_s(self) -> float:
        """The execution canonical stages were spared: each executed stage a canonical stage
        was served, its execution time (``G^Δ`` after C1: stages the store already held
        executed nothing and save nothing here)."""
        served = {c.reuse_name for c in self.consumptions if c.served}
        return sum(s.duration_s for s in self.trace if s.claimed in served and s.done)

    @property
    def waited_s(self) -> float:
        """Time canonical stages spent waiting on this fill, served or not (``W``)."""
        return sum(c.waited_s for c in self.consumptions)

    @property
    def names(self) -> list[str]:
        """The reuse names the fill executed under (its shadows, unless consumed)."""
        return [s.claimed for s in self.trace if s.claimed]

    @property
    def engine_s(self) -> float:
        """Engine time of the fill's executed LLM stages."""
        return sum(s.engine_s for s in self.trace)

    def waited_for(self, reuse_name: str) -> float | None:
        """How long the first canonical stage served ``reuse_name`` waited for it."""
        for c in self.consumptions:
            if c.reuse_name == reuse_name and c.served:
                return c.waited_s
        return None
