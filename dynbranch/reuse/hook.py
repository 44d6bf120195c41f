"""C1 as the orchestrator sees it: the :class:`ReuseHook` contract and its typed results.

The orchestrator and the fill runner talk to C1 only through this contract:

* **canonical stages** — :meth:`ReuseHook.lookup` answers a :class:`StageLookup`: the stage's
  reuse name (computed once, carried from here on), and either the :class:`Served` value or
  a :class:`Claim` receipt. The stage then executes, and the receipt is consumed by
  :meth:`~ReuseHook.record` (it succeeded) or :meth:`~ReuseHook.abandon` (it failed).
* **writes** — before a tool call that may write runs, :meth:`~ReuseHook.announce` marks its
  declared :class:`~dynbranch.workload.WriteSet` as being written and answers a
  :class:`WriteAnnouncement` receipt; once its charged time is over (or it failed or was
  cancelled), :meth:`~ReuseHook.commit` consumes the receipt with the versions the call
  really left behind. :meth:`~ReuseHook.writes` reports changed resources no announcement
  covered.
* **fills (C2)** — :meth:`~ReuseHook.claim_fill` answers a :class:`FillSlot`: a value the
  store already holds, or a claim the fill executes under and consumes with
  :meth:`~ReuseHook.shadow` (a shadow only a canonical lookup of the same name can promote)
  or :meth:`~ReuseHook.abandon`; :meth:`~ReuseHook.drop_shadow` discards a loser's shadow.
  Only hooks with :attr:`~ReuseHook.keeps_shadows` support fills.
* **whole requests** — :meth:`~ReuseHook.serve_request` may answer a request whole before
  it runs (InstCache); :meth:`~ReuseHook.prepopulate` fills such a cache before the clock
  starts.

:class:`NoReuse` (the floor) serves nothing and records nothing. The store-backed hook of
C1 and its variants is :class:`~dynbranch.reuse.store_hook.StoreReuseHook`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynbranch.errors import NotSpeculable
from dynbranch.runtime.stage import StageCall

if TYPE_CHECKING:
    from dynbranch.reuse.lookups import Ticket, WriteReceipt
    from dynbranch.reuse.names import ReuseKey
    from dynbranch.runtime.runlog import StageRecord
    from dynbranch.workload import DataConfig, RequestInstance, Workload, WriteSet


@dataclass(frozen=True)
class Served:
    """A stage served without executing it: its value and where it came from."""

    value: Any
    served_from: str  # cache | shadow | join
    reuse_name: str
    read_set: dict[str, str]


@dataclass(frozen=True)
class StageOutcome:
    """A stage that executed: what C1 may record about it (``recordable`` false: nothing,
    see :class:`~dynbranch.workload.ToolResult`)."""

    value: Any
    read_set: Mapping[str, str]
    writes: Mapping[str, str]
    engine: str
    duration_s: float
    recordable: bool = True


@dataclass(frozen=True)
class Claim:
    """The receipt for executing one reuse name: the hook that issued it consumes it once,
    in :meth:`ReuseHook.record`, :meth:`ReuseHook.shadow` or :meth:`ReuseHook.abandon`.

    It carries the key it was issued for, so recording never derives the name again.
    """

    call: StageCall
    reuse_name: str
    key: ReuseKey
    ticket: Ticket


@dataclass(frozen=True)
class WriteAnnouncement:
    """The receipt for a write in progress: :meth:`ReuseHook.commit` consumes it once.

    ``receipt`` is the store's, when the hook marked the resources there; ``None`` when
    it holds nothing (an empty write set, or a hook that does not track reads).
    """

    request_id: str
    write_set: WriteSet
    receipt: WriteReceipt | None = None


@dataclass(frozen=True)
class StageLookup:
    """C1's answer for a canonical stage: its reuse name (``""``: not reusable) and either
    the value that serves it or, when it must execute, the claim it executes under
    (``None`` when nothing is recorded, e.g. after too many joins). ``joined``: the lookup
    waited on an equal execution in flight (whether or not that ended in a value)."""

    reuse_name: str = ""
    served: Served | None = None
    claim: Claim | None = None
    joined: bool = False


@dataclass(frozen=True)
class FillSlot:
    """C1's answer for one stage of a fill: a value the store already holds
    (``claim is None``), or the claim the fill executes the stage under."""

    reuse_name: str
    value: Any = None
    claim: Claim | None = None


@dataclass(frozen=True)
class WholeRequest:
    """A request answered whole by a whole-request cache: its stage rows and its outcome."""

    rows: Sequence[StageRecord]
    outcome: Any


EXECUTE = StageLookup()
"""The answer of a hook that serves nothing: execute, record nothing."""


class ReuseHook:
    """C1's entry points. The defaults serve nothing, record nothing and keep no shadows."""

    name = "none"
    keeps_shadows = False
    """Whether :meth:`claim_fill` and :meth:`shadow` work (fills need them)."""

    # -- canonical stages ----------------------------------------------------------------

    async def lookup(self, call: StageCall) -> StageLookup:
        """Serve the stage, or hand back the claim it executes under."""
        return EXECUTE

    async def record(self, claim: Claim, outcome: StageOutcome) -> None:
        """The claimed stage executed: keep its result (consumes ``claim``)."""

    async def abandon(self, claim: Claim) -> None:
        """The claimed stage (canonical or fill) failed or was cancelled: release it."""

    async def announce(self, request_id: str, write_set: WriteSet) -> WriteAnnouncement:
        """A tool call that may write ``write_set`` is about to run (default: hold nothing)."""
        return WriteAnnouncement(request_id, write_set)

    async def commit(self, announcement: WriteAnnouncement,
                     writes: Mapping[str, str | None] | None) -> None:
        """The announced call is over: these resources changed (resource → new version,
        ``None``: changed to a version nobody reported); ``writes=None``: the call failed,
        and whatever it announced may have changed. Consumes ``announcement``; the default
        reports ``writes`` through :meth:`writes`."""
        if writes:
            await self.writes(announcement.request_id, writes)

    async def writes(self, request_id: str, writes: Mapping[str, str | None]) -> None:
        """A stage changed these external resources (resource → new version) outside any
        announcement."""

    # -- fills (C2) ----------------------------------------------------------------------

    async def claim_fill(self, call: StageCall) -> FillSlot:
        """One stage of a fill: a value already held, or a claim to execute under."""
        raise NotSpeculable(f"the {self.name} reuse hook keeps no shadows; fills need them")

    async def shadow(self, claim: Claim, outcome: StageOutcome) -> None:
        """The fill executed the claimed stage: leave its result as a shadow."""
        raise NotSpeculable(f"the {self.name} reuse hook keeps no shadows")

    async def drop_shadow(self, name: str) -> bool:
        """Discard a fill's unconsumed shadow; whether one was dropped."""
        return False

    def when_joined(self, claim: Claim, joined: Callable[[], None]) -> None:
        """Call ``joined`` (once, synchronously) when a canonical stage first waits on the
        fill's execution ``claim`` names, so the fill can run it at canonical priority from
        then on. The default never calls it: a hook that joins nothing."""

    # -- whole requests ------------------------------------------------------------------

    def serve_request(self, instance: RequestInstance, at: float, *,
                      audit: bool) -> WholeRequest | None:
        """Answer ``instance`` whole at ``at`` (``audit``: with the splice checker's
        digests), or ``None`` to run it."""
        return None

    async def prepopulate(self, workload: Workload, data: DataConfig | None, seed: int, *,
                          measured_split: str = "test") -> None:
        """Fill whatever the hook pre-computes, before the clock starts (default: nothing)."""

    # -- reporting -----------------------------------------------------------------------

    def stats(self) -> dict[str, Any]:
        """Counters for the run's summary."""
        return {}

    async def snapshot(self) -> dict[str, Any]:
        """Counters plus what the mechanism holds at the end of a run (before shutdown)."""
        return self.stats()


class NoReuse(ReuseHook):
    """The floor's reuse hook: nothing is served or recorded."""

    def __init__(self, run: Any = None) -> None:
        """``run``: the run's context (unused; the floor needs nothing of it)."""
