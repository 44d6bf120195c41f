"""What a workload gives the orchestrator: request instances, their tools, their scoring.

A workload (``workloads/`` at the top of the repository) loads its data, and for each
request builds a :class:`RequestInstance`: the request's control flow as an ``async``
program over a :class:`StageContext`, the tools it calls (with their own per-request state),
the replay oracle that tells a simulated engine which text the recorded model produced, and
the scorer that turns the request's outcome into accuracy.

The replay oracle is consulted only by the orchestrator when it builds an engine request,
and only engines read what it returns. Predictors never see it.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from dynbranch.workflow import BranchPoint, RenderedInput, Template


@dataclass(frozen=True)
class ToolResult:
    """A tool call's value and its external effects.

    ``reads`` maps each external resource the call read to the version it saw before any
    write of its own (C1's read-set); ``writes`` maps each resource it changed to the
    version it left behind (its owner's new version), so C1 can invalidate what read the
    old one and keep serving what reads the new one.

    ``recordable`` false: the value does not answer the input the call was named by, e.g.
    the input named a state the request had left by the time the call ran (a parallel call
    or the request's own path moved it on while this one waited on C1). The caller still
    gets the value; C1 records nothing under that name, and a fill stops (a fill asks
    :meth:`Tool.answers` first, so it does not run such a call at all).
    """

    value: Any
    reads: Mapping[str, str] = field(default_factory=dict)
    writes: Mapping[str, str] = field(default_factory=dict)
    recordable: bool = True


@dataclass(frozen=True)
class WriteSet:
    """The external resources a tool call may write, declared before it runs.

    C1 marks them as being written from just before the call until its writes are
    committed (lookups of records that read them miss; records that overlapped the write
    are refused), so a write is never observable before C1 knows of it. ``unbounded``: the
    call may write resources it cannot name, and every resource counts as being written
    while it runs. Empty (false): the call writes nothing.
    """

    resources: frozenset[str] = frozenset()
    unbounded: bool = False

    @classmethod
    def of(cls, *resources: str) -> WriteSet:
        """The write set naming exactly ``resources``."""
        return cls(frozenset(resources))

    def __bool__(self) -> bool:
        return self.unbounded or bool(self.resources)

    def covers(self, resource: str) -> bool:
        """Whether a write of ``resource`` was declared."""
        return self.unbounded or resource in self.resources


NO_WRITES = WriteSet()
"""A call that writes nothing."""

ANY_WRITES = WriteSet(unbounded=True)
"""A call that may write anything (the safe declaration of an undeclared mutating call)."""


class ToolCost(ABC):
    """How a tool stage's duration is charged on the injected clock."""

    name: str

    @abstractmethod
    def charge_s(self, measured_s: float) -> float:
        """Seconds to charge for a call that really took ``measured_s``."""


class MeasuredCost(ToolCost):
    """Charge what the call really took (tools that burn real CPU, e.g. retrieval)."""

    name = "measured"

    def charge_s(self, measured_s: float) -> float:
        return measured_s


@dataclass(frozen=True)
class ModelledCost(ToolCost):
    """Charge a fixed modelled latency, for in-memory stand-ins of remote services.

    The measured time is not added: on the virtual clock that keeps runs deterministic; on
    the real clock the measured part has elapsed and only the remainder is waited out.
    """

    seconds: float
    name: str = "modelled"

    def charge_s(self, measured_s: float) -> float:
        return self.seconds


class Tool(ABC):
    """A tool a request calls. One object per request instance (it may hold state)."""

    name: str
    schema_version: str
    cost: ToolCost

    @abstractmethod
    def is_read_only(self, fields: Mapping[str, Any]) -> bool:
        """Whether a call with these rendered fields is declared free of external effects.

        Declared, not observed: a fill may only run calls for which this is true.
        """

    def write_set(self, fields: Mapping[str, Any]) -> WriteSet:
        """The resources a call with these rendered fields may write, declared before it runs.

        The default is safe, not precise: nothing for a call declared read-only, anything
        (:data:`ANY_WRITES`: C1 serves no record while it runs) for every other call. A tool
        whose mutating calls name what they write overrides it; a write the call then
        reports outside its declared set is still committed, but C1 could not protect its
        window (the reuse hook counts it as ``undeclared_writes``).
        """
        return NO_WRITES if self.is_read_only(fields) else ANY_WRITES

    def answers(self, fields: Mapping[str, Any]) -> bool:
        """Whether a call with these rendered fields, run now, would answer the input it
        was named by (its result :attr:`~ToolResult.recordable`). Asked before a fill runs
        a call: a value that answers another input is no use to it, so it stops first.

        The default: every call answers its own input. A tool whose input names a state the
        call may no longer run on (a lineage its request has moved on from) overrides it.
        """
        return True

    @abstractmethod
    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        """Execute the call synchronously. Any exception fails the request's stage."""


class BranchScope(Protocol):
    """An open branch: the workflow resolves it with the candidate(s) it took."""

    def resolve(self, *chosen: str) -> None: ...


class BranchResolution:
    """The plain :class:`BranchScope`: records what a branch resolved to, once."""

    def __init__(self) -> None:
        self.chosen: tuple[str, ...] | None = None

    def resolve(self, *chosen: str) -> None:
        if self.chosen is not None:
            raise RuntimeError("a branch resolves once")
        self.chosen = tuple(chosen)


class StageContext(Protocol):
    """What a request's program uses to run stages; the orchestrator implements it."""

    request_id: str

    async def llm(self, stage: str, values: Mapping[str, Any]) -> str:
        """Run an LLM stage on ``values`` and return its output text."""

    async def tool(self, stage: str, values: Mapping[str, Any]) -> Any:
        """Run a tool stage on ``values`` and return its value."""

    async def human(self, stage: str, values: Mapping[str, Any], think_s: float) -> None:
        """Wait for a human decision that takes ``think_s`` seconds."""

    def branch(self, point: BranchPoint) -> AbstractAsyncContextManager[BranchScope]:
        """Open a branch; fills (C2) run while the body decides, and it must resolve."""


class RequestInstance(ABC):
    """One request of a workload, ready to run once.

    ``latency_origin`` says where the request's latency is measured from: its scheduled
    ``arrival`` (the default), or ``last_human``, the end of its last human stage (HCI:
    the latency a user feels is the one after their click, not their own think time).
    """

    request_id: str
    template: Template
    latency_origin: str = "arrival"

    @abstractmethod
    async def run(self, ctx: StageContext) -> Any:
        """The request's control flow; returns the outcome :meth:`score` reads."""

    def request_input(self) -> Any | None:
        """The request's entire input, canonically encodable and known before it runs (what
        a whole-request cache such as InstCache keys on); ``None``: no such input exists."""
        return None

    def fillable(self, point: BranchPoint, candidate: str) -> bool:
        """Whether :meth:`speculate` has anything to run for ``candidate`` (default: yes).

        Lets C2 skip candidates such as an end-of-turn marker without spending a fill slot.
        """
        return True

    async def speculate(self, ctx: StageContext, point: BranchPoint, candidate: str) -> None:
        """Run, as a fill, what the workflow would run next if ``point`` resolved to
        ``candidate`` (C2's early fill), through ``ctx`` exactly as :meth:`run` would render it.

        Only what is known at branch time may be used. The default fills nothing. A stage
        that may not run speculatively raises :class:`~dynbranch.errors.NotSpeculable`
        from ``ctx``, which ends the fill there.
        """

    @abstractmethod
    def tool(self, name: str) -> Tool:
        """The instance's tool called ``name``."""

    @abstractmethod
    def replay_text(self, rendered: RenderedInput) -> str | None:
        """The recorded output of an LLM stage with this rendered input (sim engines only).

        ``None`` when the trace has no output for this input (a real engine is needed).
        """

    @abstractmethod
    def score(self, outcome: Any) -> float:
        """Accuracy of the outcome in [0, 1] against the data set's ground truth."""


_UNMADE = object()


class LazyTrace(Sequence[RequestInstance]):
    """A workload's trace whose requests are made when first read, then kept.

    A replay draws every request of its trace before the first one arrives. Made then, a
    long trace's requests that have not started hold memory in proportion to its length
    (Routing about 630 bytes each, 32 MB for 50,000; HCI 2.4 KB each); made here at first
    read, the trace holds one pointer per request until then. ``make(i)`` makes request
    ``i`` (the draw that decides it was made up front), so when a request is made changes
    nothing about it.

    The one change allowed is letting a read request go, ``trace[i] = None``, which the
    launcher does once the request has ended (it reads as ``None`` from then on, as an
    entry of a list would).
    """

    __slots__ = ("_items", "_make")

    def __init__(self, n: int, make: Callable[[int], RequestInstance]) -> None:
        self._make = make
        self._items: list[Any] = [_UNMADE] * n

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self._items)))]
        item = self._items[i]  # NOTE: raises IndexError as a list does
        if item is _UNMADE:
            item = self._items[i] = self._make(i % len(self._items))
        return item

    def __setitem__(self, i: int, value: None) -> None:
        if value is not None:
            raise TypeError(f"a trace's request can only be let go (set to None), "
                            f"not replaced by a {type(value).__name__}")
        self._items[i] = None

    def __add__(self, other: Sequence[Any]) -> list[Any]:
        """A list of both (every request of this trace made), as a list's ``+`` gives."""
        return [*self, *other]

    def __radd__(self, other: Sequence[Any]) -> list[Any]:
        return [*other, *self]

    def made(self) -> int:
        """How many requests were made and are still held."""
        return sum(1 for item in self._items if item is not _UNMADE and item is not None)

    def __repr__(self) -> str:
        return f"LazyTrace({len(self._items)} requests, {self.made()} held)"


@dataclass(frozen=True)
class DataConfig:
    """Where workloads read data from and cache what they fetch."""

    data_dir: Path | None
    cache_dir: Path


class Workload(ABC):
    """A named workload: a template and a pool of requests built from real data."""

    name: str
    template: Template
    predictor: str = "frequency"  # the predictor C2 ranks this workload's branches with
    fill_depth: int | None = None
    """Stages one fill runs when the run sets no ``--depth`` (``None``: the run's default);
    a workload whose unit of fill is longer (a whole sub-agent) says so here."""
    unfillable_stages: frozenset[str] = frozenset()
    """Speculable stages that no fill can run before their branch resolves, because their
    input holds what only the resolution brings besides the chosen candidate (HCI's reply
    reads the user's words). C1 may still serve them; Eq. 2's bound
    (:func:`dynbranch.stagelog.overlap_bound`) stops at them."""

    def fetch_data(self, data: DataConfig, progress: Callable[[str], None] = print) -> None:
        """Fetch what this workload can fetch by itself into ``data.cache_dir`` (default: nothing)."""

    @abstractmethod
    def check_data(self, data: DataConfig) -> None:
        """Raise :class:`~dynbranch.errors.DataError` now if the data is missing or malformed."""

    def split_size(self, data: DataConfig, split: str) -> int | None:
        """How many records ``split`` holds: the distinct requests :meth:`requests` draws
        before it repeats one (default: ``None``, not known)."""
        return None

    @abstractmethod
    def requests(self, data: DataConfig, n: int, seed: int,
                 split: str = "test") -> Sequence[RequestInstance]:
        """``n`` request instances drawn reproducibly (same ``seed`` ⇒ same requests).

        ``split`` is ``test`` (what runs are measured on) or ``train`` (what predictors and
        pre-populated caches may learn from); the two never share a record.

        A list will do; the shipped workloads return a :class:`LazyTrace` (draw the records
        here, make each request when it is first read), so a long replay holds only the
        requests in flight.
        """
