"""Placement policies: which engine of a role serves a call.

A policy is a small object that picks an index from the engines' outstanding-call counts
(kept by the orchestrator, so picking costs no round trip to the engines). Arms choose a
policy by name; cache-aware arms add their own.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

from dynbranch.engines.protocol import GenerateRequest


class PlacementPolicy(ABC):
    """Chooses an engine for a call."""

    name: str

    @abstractmethod
    def choose(self, outstanding: Sequence[int], request: GenerateRequest) -> int:
        """Index of the engine to send ``request`` to, given each engine's open calls."""


class LeastOutstanding(PlacementPolicy):
    """The engine with the fewest open calls; ties go to the lowest index (deterministic)."""

    name = "least-outstanding"

    def choose(self, outstanding: Sequence[int], request: GenerateRequest) -> int:
        return min(range(len(outstanding)), key=lambda i: (outstanding[i], i))
