"""The gate as the fill policy sees it: async, wherever the gate lives.

:class:`LocalGateClient` wraps a :class:`~dynbranch.gate.Gate` in the caller's process (the
``local`` backend); the Ray backend's central gate actor has a client with the same
coroutines (``dynbranch.cluster``), so the priced policy runs unchanged on both.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dynbranch.gate.gate import Admission, Candidate, Gate
from dynbranch.gate.load import LoadView
from dynbranch.gate.returns import GenerationDecision, Observation, Settlement


@dataclass(frozen=True)
class BranchDecision:
    """Actions 0 and 1 of one branch entry in one answer: whether it predicts at all and,
    when it does, the gate's admission of each candidate (none when it does not)."""

    generation: GenerationDecision
    admissions: tuple[Admission, ...] = ()


class GateClient(ABC):
    """Async access to one gate's Actions 0 and 1 and its learning."""

    policy: str
    batches_decisions = False
    """Whether :meth:`decide` costs one round trip where ``generation`` then ``admit`` cost
    two (a remote gate); the priced policy then ranks before Action 0 and asks once."""

    @abstractmethod
    async def generation(self, coordinate: str, now: float) -> GenerationDecision: ...

    @abstractmethod
    async def admit(self, coordinate: str, candidates: Sequence[Candidate], view: LoadView,
                    now: float) -> list[Admission]: ...

    async def decide(self, coordinate: str, candidates: Sequence[Candidate], view: LoadView,
                     now: float) -> BranchDecision:
        """Action 0 at ``now`` and, if it opens, Action 1 on ``candidates`` at the same
        ``now``: exactly ``generation`` then ``admit`` (what this default does), with nothing
        between the two."""
        generation = await self.generation(coordinate, now)
        if not generation.open:
            return BranchDecision(generation)
        return BranchDecision(generation,
                              tuple(await self.admit(coordinate, candidates, view, now)))

    @abstractmethod
    async def release(self, reservations: Sequence[Any]) -> int:
        """Release receipts; returns how many were still held."""

    @abstractmethod
    async def learn(self, observations: Sequence[Observation],
                    settlements: Sequence[Settlement]) -> None:
        """Rank/usability observations and one return per settled branch entry, in one call."""

    @abstractmethod
    async def stats(self) -> dict[str, Any]: ...

    async def close(self) -> None:
        """Release what the client holds (default: nothing)."""


class LocalGateClient(GateClient):
    """A gate in the caller's own process."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.policy = gate.policy

    async def generation(self, coordinate: str, now: float) -> GenerationDecision:
        return self.gate.generation(coordinate, now)

    async def admit(self, coordinate: str, candidates: Sequence[Candidate], view: LoadView,
                    now: float) -> list[Admission]:
        return self.gate.admit(coordinate, list(candidates), view, now)

    async def release(self, reservations: Sequence[Any]) -> int:
        return sum(self.gate.release(r) for r in reservations)

    async def learn(self, observations: Sequence[Observation],
                    settlements: Sequence[Settlement]) -> None:
        apply_learning(self.gate, observations, settlements)

    async def stats(self) -> dict[str, Any]:
        return {"reserved_blocks": self.gate.reserved_blocks, **self.gate.counters}


def apply_learning(gate: Gate, observations: Sequence[Observation],
                   settlements: Sequence[Settlement]) -> None:
    """Feed a batch of observations and settlements to ``gate`` (shared by every client)."""
    for o in observations:
        gate.observe(o.stage_key, o.rank, selected=o.selected, usable=o.usable,
                     confidence=o.confidence)
    for s in settlements:
        gate.settle(s.coordinate, s.ret)
