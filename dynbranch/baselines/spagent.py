"""The ``spagent`` arm: SPAgent, the next action speculated into an in-request buffer, throttled
by engine load.

**Taken from SPAgent** (Huang et al., 2025, arXiv 2511.20048): a search agent's next
action is predicted while the model is still reasoning, the predicted action (the search)
is executed ahead, and its result is kept in an in-request buffer (its Action Server) that
the real action reads when it matches; the buffer dies with the request. A two-level
scheduler regulates speculative requests by engine load so speculation stays beneficial:
speculation is admitted only while the engines have headroom, and inside an engine
speculative requests yield to normal ones.

**How it maps onto the stack.**

* *Predicted next action* = the workload's predictor's top-ranked candidate at a branch,
  filled once (top-1, the one action SPAgent predicts); *buffer* = the fill's shadows
  under request-scoped names (``StoreReuseHook(cross_request=False)``), promoted only by
  the same request's canonical stage on an exact name match, dropped when it ends.
* *Level 1, admission by load* (:class:`LoadThrottle`): before filling, the branch hook
  reads every engine's load (``session.loads()``) and admits the fill only if the least
  loaded engine has fewer than ``max_sequences`` sequences (running + waiting) and less
  than ``max_kv_usage`` of its KV pool in use; otherwise the branch is not speculated
  (counted ``throttled``). No milliseconds, no price, no learned posteriors: a threshold.
* *Level 2, inside the engine*: fills are issued at speculative priority, which the
  engines schedule after canonical work — already the stack's behaviour, nothing added.

**Decided here.**

* *Thresholds.* ``max_sequences = 8``: on the ``qwen3-32b@h200`` profile a decode step at
  2k context is 5.6 % slower with 8 sequences than with one (12.6 % on
  ``qwen3-8b@rtx4090``) and grows linearly beyond, so 8 is about where a speculative
  sequence stops riding for free on a memory-bound step. ``max_kv_usage = 0.8``: above
  it a fill's KV could push canonical sequences into preemption. Run options
  ``spagent_max_sequences``, ``spagent_max_kv_usage``.
* *Exactness is kept.* SPAgent's first phase lets early evidence-gathering steps skip
  verification where the value cannot change; we never skip it (BASELINES.md), so every
  speculated result is verified by the canonical resolution, and SPAgent's two phases
  collapse into its verified one.
* *What a fill runs.* On a search agent the speculated action is the search: a fill that
  runs a search tool (``search_tools``: default the ``retrieve`` tool of ReAct and
  Sub-Agent; run option ``spagent_search_tools``) stops right after it — the next
  reasoning step on an unverified observation is what only the skipped-verification
  phase would run. Routing and HCI are not search agents; there the arm runs its nearest
  meaningful behaviour, the predicted action's downstream as the workload's ``speculate``
  renders it (Routing: handler then executor; HCI: lookup then the reply), up to the
  run's fill depth. On Sub-Agent the plan branch has an open vocabulary the workload's
  default predictor cannot rank, so no fill is ever proposed there (as for ``c2``) and
  the arm runs as the floor.
* Session-affinity placement, as the floor.
"""

from __future__ import annotations

import asyncio
import math
import weakref
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dynbranch.engines.protocol import LoadSnapshot
from dynbranch.errors import NotSpeculable
from dynbranch.hooks import BranchSession, RunContext, StageCall, StageOutcome
from dynbranch.placement import SessionAffinity
from dynbranch.reuse.hook import StoreReuseHook
from dynbranch.speculation import FillChoice, FillPolicy, Speculator

if TYPE_CHECKING:
    from dynbranch.arms import Arm

SPAGENT_DESCRIPTION = ("SPAgent: top-1 predicted next action filled into a request-scoped "
                       "buffer when engine load is under a threshold; search fills stop "
                       "after the search")


@dataclass(frozen=True)
class SPAgentConfig:
    """Settings of the ``spagent`` arm; each is checked when the config is made.

    ``max_sequences`` (>= 1): a fill is admitted only while the least loaded engine runs
    or queues fewer sequences than this. ``max_kv_usage`` in (0, 1]: ... and uses less
    than this share of its KV pool. ``search_tools``: tools whose call is a search
    agent's search action (a fill stops right after one).
    """

    max_sequences: int = 8
    max_kv_usage: float = 0.8
    search_tools: tuple[str, ...] = ("retrieve",)

    def __post_init__(self) -> None:
        if self.max_sequences < 1:
            raise ValueError(f"SPAgentConfig.max_sequences={self.max_sequences} must be >= 1")
        if not (0.0 < self.max_kv_usage <= 1.0 and math.isfinite(self.max_kv_usage)):
            raise ValueError(f"SPAgentConfig.max_kv_usage={self.max_kv_usage} outside (0, 1]")

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SPAgentConfig:
        """The config a run's options ask for (``spagent_max_sequences``,
        ``spagent_max_kv_usage``, ``spagent_search_tools``), defaults elsewhere."""
        d = cls()
        tools = options.get("spagent_search_tools", d.search_tools)
        return cls(max_sequences=int(options.get("spagent_max_sequences", d.max_sequences)),
                   max_kv_usage=float(options.get("spagent_max_kv_usage", d.max_kv_usage)),
                   search_tools=(tools,) if isinstance(tools, str) else tuple(tools))


@dataclass(frozen=True)
class Headroom:
    """The load throttle's reading: the least loaded engine and whether it has room."""

    engine_id: str
    sequences: int
    kv_usage: float
    admit: bool


class LoadThrottle:
    """SPAgent's first scheduling level: admit speculation only under a load threshold."""

    def __init__(self, config: SPAgentConfig) -> None:
        self.config = config

    def headroom(self, loads: Sequence[LoadSnapshot]) -> Headroom:
        """Read ``loads``; no engines (nothing to run a fill on) admits nothing.

        NOTE: the least loaded engine, because that is where the floor's session-affinity
        placement sends a fill (the least loaded engine other than the request's home).
        ``loads`` holds every engine ``session.loads()`` reports; in our runs that is the
        ``target`` role only.
        """
        if not loads:
            return Headroom("", 0, 0.0, False)
        least = min(loads, key=lambda s: (s.running + s.waiting, s.kv_usage, s.engine_id))
        sequences = least.running + least.waiting
        admit = (sequences < self.config.max_sequences
                 and least.kv_usage < self.config.max_kv_usage)
        return Headroom(least.engine_id, sequences, least.kv_usage, admit)


class SPAgentPolicy(FillPolicy):
    """Fill the top-ranked candidate iff the engines have headroom (no pricing)."""

    name = "spagent"

    def __init__(self, config: SPAgentConfig) -> None:
        self.config, self.throttle = config, LoadThrottle(config)
        self.counts = {"admitted": 0, "throttled": 0, "no_candidate": 0}
        self.peak_sequences = 0

    async def choose(self, session: BranchSession, ranked: Sequence[str]) -> list[FillChoice]:
        if not ranked:
            self.counts["no_candidate"] += 1
            return []
        room = self.throttle.headroom(list(await session.loads()))
        self.peak_sequences = max(self.peak_sequences, room.sequences)
        if not room.admit:
            self.counts["throttled"] += 1
            return []
        self.counts["admitted"] += 1
        return [FillChoice(ranked[0], 0)]

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "max_sequences": self.config.max_sequences,
                "max_kv_usage": self.config.max_kv_usage,
                "peak_least_loaded_sequences": self.peak_sequences}


class SPAgentReuseHook(StoreReuseHook):
    """The in-request buffer: request-scoped shadows (``cross_request=False``), and a fill
    that has run a search action stops there (see the module docstring)."""

    name = "spagent"

    def __init__(self, store, run: RunContext, *,
                 search_tools: Sequence[str] = SPAgentConfig.search_tools) -> None:
        super().__init__(store, run, cross_request=False)
        self.search_tools = frozenset(search_tools)
        self._searched: weakref.WeakSet[asyncio.Task] = weakref.WeakSet()
        self.counts["after_search_stops"] = 0

    async def fill_stage(self, call: StageCall, execute: Callable[[], Awaitable[StageOutcome]],
                         claimed: Callable[[str], None]) -> Any:
        # NOTE: a fill's stages all run inside the fill's own asyncio task, so the task
        # identifies the fill; a weak set, so an ended fill's task leaves no entry behind.
        task = asyncio.current_task()
        if task in self._searched:
            self.counts["after_search_stops"] += 1
            raise NotSpeculable(f"spagent buffers the search action only; {call.stage.name} "
                                "would reason on an unverified observation")
        value = await super().fill_stage(call, execute, claimed)
        if call.stage.kind == "tool" and call.stage.tool in self.search_tools and task:
            self._searched.add(task)
        return value


class SPAgentSpeculator(Speculator):
    """The ``spagent`` branch hook: the speculator with the SPAgent policy."""

    name = "spagent"

    def __init__(self, run: RunContext, predictor, policy: SPAgentPolicy) -> None:
        super().__init__(run, predictor, policy)
        self.spagent = policy

    def stats(self) -> dict[str, Any]:
        # NOTE: merged flat, as Speculator merges its policy's stats where it does so itself
        return {**super().stats(), **self.spagent.stats()}


def spagent_reuse(run: RunContext) -> SPAgentReuseHook:
    """The ``spagent`` arm's reuse hook: the request-scoped buffer over the run's store."""
    if run.make_store is None:
        raise ValueError(f"the {run.arm} arm needs a store; the backend provides none")
    config = SPAgentConfig.from_options(run.options)
    return SPAgentReuseHook(run.make_store(), run, search_tools=config.search_tools)


def spagent_branch(run: RunContext, reuse) -> SPAgentSpeculator:
    """The ``spagent`` arm's branch hook over the workload's predictor."""
    from dynbranch.predictors import make_predictor

    predictor = make_predictor(run.options.get("predictor", "frequency"))
    return SPAgentSpeculator(run, predictor, SPAgentPolicy(SPAgentConfig.from_options(run.options)))


def spagent_arm() -> Arm:
    """The ``spagent`` arm."""
    from dynbranch.arms import Arm  # NOTE: here, not above: dynbranch.arms lists this arm

    return Arm("spagent", SPAGENT_DESCRIPTION, spagent_reuse, spagent_branch, SessionAffinity)
