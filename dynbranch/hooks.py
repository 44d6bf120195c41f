"""The two points where DynBranch's mechanisms enter the orchestrator.

* :class:`ReuseHook` — C1. Before a stage executes, ``lookup`` may serve it (from a
  committed record, by promoting a shadow, or by joining an execution in flight); after it
  executes, ``record`` may keep its result under its reuse name, and ``abandon`` releases
  the claim of a stage that failed. ``writes`` reports changed external resources.
* :class:`BranchHook` — C2/C3. When a workflow opens a branch, ``opened`` may start fills
  for predicted candidates; when the branch resolves, ``resolved`` cancels the losers.

The floor arm plugs in :class:`NoReuse` and :class:`NoSpeculation`, which do nothing: the
orchestrator's own path is the no-reuse floor.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dynbranch.clock import Clock
from dynbranch.workflow import BranchPoint, RenderedInput, StageSpec

if TYPE_CHECKING:
    from dynbranch.engines.protocol import GenerateRequest, GenerateResult


@dataclass(frozen=True)
class ModelId:
    """The model (and revision) that serves a model role: part of every LLM reuse name."""

    model: str
    revision: str


@dataclass(frozen=True)
class RunContext:
    """What an arm's hooks need to know about the run they serve."""

    clock: Clock
    arm: str
    tenant: str = "default"
    models: Mapping[str, ModelId] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    make_store: Callable[[], Any] | None = None  # a StoreClient where the backend keeps records


@dataclass(frozen=True)
class StageCall:
    """One stage about to run: its identity, its complete rendered input, its lineage.

    ``reusable`` is true when the stage may be served from a record at all: declared
    speculable (deterministic, safe to run twice) and, for a tool stage, this call declared
    read-only by its tool — a call with external effects must always execute. ``upstream``
    names the records of the same request whose outputs this input was rendered from (C1's
    provenance: a write reaches this stage's record through them, by cascade).
    """

    request_id: str
    stage: StageSpec
    fingerprint: str
    rendered: RenderedInput
    reusable: bool = False
    upstream: tuple[str, ...] = ()


def upstream_of(lineage: Sequence[tuple[str, str]], text: str) -> tuple[str, ...]:
    """Reuse names of the records in ``lineage`` whose output appears verbatim in ``text``.

    NOTE: containment over-approximates what an input was rendered from (a short output may
    occur by chance), which only widens the write cascade: safe, never unsafe.
    """
    return tuple(name for name, output in lineage if output in text)


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
    read_set: Mapping[str, str]
    writes: Mapping[str, str]
    engine: str
    duration_s: float


class ReuseHook:
    """C1's entry points. The default serves nothing and records nothing."""

    name = "none"

    async def lookup(self, call: StageCall) -> Served | None:
        """Serve the stage without executing it, or ``None`` to execute it."""
        return None

    async def record(self, call: StageCall, outcome: StageOutcome) -> None:
        """Keep an executed stage's result (no-op by default)."""

    async def abandon(self, call: StageCall) -> None:
        """The stage ``lookup`` let execute failed: release whatever it claimed."""

    async def writes(self, request_id: str, writes: Mapping[str, str]) -> None:
        """A stage changed these external resources (resource → new version)."""

    def reuse_name(self, call: StageCall) -> str:
        """The stage's reuse name, or ``""`` when reuse is off."""
        return ""

    def stats(self) -> dict[str, Any]:
        """Counters for the run's summary."""
        return {}

    async def snapshot(self) -> dict[str, Any]:
        """Counters plus what the mechanism holds at the end of a run (before shutdown)."""
        return self.stats()


class BranchSession:
    """An open branch as C2 sees it: who opened it, what it is, and how to start fills.

    The orchestrator makes one per branch entry. ``start_fill`` runs the request's
    :meth:`~dynbranch.workload.RequestInstance.speculate` for a candidate as a fill (an
    asyncio task whose stages run at speculative priority and leave shadows); ``loads``
    reads the load snapshot of every engine that serves stages; ``now`` is the run clock.
    ``generate`` runs one prediction call on the run's ``drafter`` engines (``None`` when
    the run has none), and ``setup_s`` is the prediction time this entry spent (Action 0's
    ``T_setup``).
    """

    def __init__(self, request_id: str, point: BranchPoint, *,
                 start_fill: Callable[..., Any], discard: Callable[[Any], Any],
                 loads: Callable[[], Any], now: Callable[[], float],
                 fillable: Callable[[str], bool] = lambda _c: True,
                 generate: Callable[[GenerateRequest], Awaitable[GenerateResult]] | None = None,
                 ) -> None:
        self.request_id, self.point, self.fillable = request_id, point, fillable
        self.start_fill, self.discard, self.loads, self.now = start_fill, discard, loads, now
        self.generate = generate
        self.opened_at = now()
        self.setup_s = 0.0
        self.fills: list[Any] = []


class BranchHook:
    """C2's entry points. The default starts no fills."""

    name = "none"

    async def opened(self, session: BranchSession) -> None:
        """The workflow opened a branch and is now deciding it."""

    async def resolved(self, session: BranchSession, chosen: tuple[str, ...]) -> None:
        """The branch resolved to ``chosen``."""

    async def request_done(self, request_id: str) -> None:
        """The request finished; nothing of its speculation may outlive it."""

    def stats(self) -> dict[str, Any]:
        """Counters for the run's summary (fills issued, consumed, discarded, …)."""
        return {}

    async def snapshot(self) -> dict[str, Any]:
        """Counters plus what the mechanism holds at the end of a run (before shutdown)."""
        return self.stats()

    def close(self) -> None:
        """The run is over: stop background work (probes); nothing else happens after."""


def NoReuse(run: RunContext) -> ReuseHook:  # noqa: N802 - a factory named like the hook
    """The floor's reuse hook: nothing is served or recorded."""
    return ReuseHook()


def NoSpeculation(run: RunContext, reuse: ReuseHook) -> BranchHook:  # noqa: N802
    """The floor's branch hook: no fills."""
    return BranchHook()
