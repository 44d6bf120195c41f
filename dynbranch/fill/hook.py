"""C2 as the orchestrator sees it: the :class:`BranchHook` contract.

When a workflow opens a branch the orchestrator opens a
:class:`~dynbranch.fill.runner.BranchSession` and calls :meth:`BranchHook.opened`, which may
start fills on it; when the branch resolves, :meth:`~BranchHook.resolved`. When a request
ends, :meth:`~BranchHook.request_ending` stops whatever could still start a fill for it,
the runner ends every fill of the request, and :meth:`~BranchHook.request_done` learns from
them. :class:`NoSpeculation` (the floor) starts no fills.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from dynbranch.fill.model import Fill
from dynbranch.fill.runner import BranchSession

if TYPE_CHECKING:
    from dynbranch.workload import DataConfig, Workload


class BranchHook:
    """C2's entry points. The defaults start no fills."""

    name = "none"

    async def prepopulate(self, workload: Workload, data: DataConfig | None, seed: int, *,
                          split: str, requests: int) -> None:
        """Before the clock starts, with the run's workload settings (default: nothing; the
        ``oracle`` bound learns the trace's branch outcomes here)."""

    async def opened(self, session: BranchSession) -> None:
        """The workflow opened a branch and is now deciding it. Runs beside the branch's
        canonical stage, which never waits for it; :meth:`resolved` comes after it ended."""

    async def resolved(self, session: BranchSession, chosen: tuple[str, ...]) -> None:
        """The branch resolved to ``chosen``."""

    async def request_ending(self, request_id: str) -> None:
        """The request finished: stop anything that could still start one of its fills."""

    async def request_done(self, request_id: str, fills: Sequence[Fill]) -> None:
        """Every fill of the request has ended (``fills``, in start order): learn, release."""

    def stats(self) -> dict[str, Any]:
        """Counters for the run's summary (fills issued, consumed, discarded, …)."""
        return {}

    async def snapshot(self) -> dict[str, Any]:
        """Counters plus what the mechanism holds at the end of a run (before shutdown)."""
        return self.stats()

    def close(self) -> None:
        """The run is over: stop background work (probes); nothing else happens after."""


class NoSpeculation(BranchHook):
    """The floor's branch hook: no fills."""

    def __init__(self, run: Any = None, reuse: Any = None) -> None:
        """``run``, ``reuse``: the run's context and reuse hook (unused)."""
