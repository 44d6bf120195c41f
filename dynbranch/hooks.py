"""The two points where DynBranch's mechanisms enter the orchestrator.

* :class:`ReuseHook` — C1. Before a stage executes, ``lookup`` may serve it (from a
  committed record, by promoting a shadow, or by joining a fill in flight); after it
  executes, ``record`` may keep its result under its reuse name.
* :class:`BranchHook` — C2/C3. When a workflow opens a branch, ``opened`` may start fills
  for predicted candidates; when the branch resolves, ``resolved`` cancels the losers.

The floor arm plugs in :class:`NoReuse` and :class:`NoSpeculation`, which do nothing: the
orchestrator's own path is the no-reuse floor.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from dynbranch.workflow import BranchPoint, RenderedInput, StageSpec


@dataclass(frozen=True)
class Served:
    """A stage served without executing it: its value and where it came from."""

    value: Any
    served_from: str  # cache | shadow | join
    reuse_name: str
    read_set: dict[str, str]


@dataclass(frozen=True)
class StageOutcome:
    """A stage that executed: what C1 may record about it."""

    value: Any
    read_set: dict[str, str]
    writes: tuple[str, ...]
    engine: str


class ReuseHook:
    """C1's entry points. The default serves nothing and records nothing."""

    name = "none"

    async def lookup(self, request_id: str, stage: StageSpec, fingerprint: str,
                     rendered: RenderedInput) -> Served | None:
        """Serve the stage without executing it, or ``None`` to execute it."""
        return None

    async def record(self, request_id: str, stage: StageSpec, fingerprint: str,
                     rendered: RenderedInput, outcome: StageOutcome) -> None:
        """Keep an executed stage's result (no-op by default)."""

    async def writes(self, request_id: str, resources: tuple[str, ...]) -> None:
        """A stage changed these external resources (no-op by default)."""

    def reuse_name(self, stage: StageSpec, fingerprint: str, rendered: RenderedInput) -> str:
        """The stage's reuse name, or ``""`` when reuse is off."""
        return ""


class BranchHook:
    """C2's entry points. The default starts no fills."""

    name = "none"

    async def opened(self, request_id: str, point: BranchPoint) -> None:
        """The workflow opened a branch and is now deciding it."""

    async def resolved(self, request_id: str, point: BranchPoint,
                       chosen: tuple[str, ...]) -> None:
        """The branch resolved to ``chosen``."""

    async def request_done(self, request_id: str) -> None:
        """The request finished; nothing of its speculation may outlive it."""


NoReuse = ReuseHook
NoSpeculation = BranchHook
