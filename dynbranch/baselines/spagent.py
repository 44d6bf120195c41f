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
  it a fill's KV could push canonical sequences into preemption. Both are
  :class:`SPAgentConfig` fields (the run's ``arm_config``).
* *Exactness is kept.* SPAgent's first phase lets early evidence-gathering steps skip
  verification where the value cannot change; we never skip it (BASELINES.md), so every
  speculated result is verified by the canonical resolution, and SPAgent's two phases
  collapse into its verified one.
* *What a fill runs.* On a search agent the speculated action is the search: a fill that
  runs a search tool (``search_tools``: default the ``retrieve`` tool of ReAct and
  Sub-Agent; ``SPAgentConfig.search_tools``) stops right after it (a fill budget,
  :class:`StopAfterSearch`) — the next
  reasoning step on an unverified observation is what only the skipped-verification
  phase would run. Routing and HCI are not search agents; there the arm runs its nearest
  meaningful behaviour, the predicted action's downstream as the workload's ``speculate``
  renders it (Routing: handler then executor; HCI: lookup then the reply), up to the
  run's fill depth. On Sub-Agent each sub-agent is a search agent: at its search branch
  the arm fills the top-ranked entity's search and stops there (the ``research`` that reads
  it is the next reasoning step); at the plan branch it fills the top-ranked sub-topic's
  sub-agent up to its search.
* The floor's placement (:class:`~dynbranch.runtime.affinity.AffinityPlacement`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from dynbranch.arms.base import Arm, store_hook
from dynbranch.engines.protocol import LoadSnapshot
from dynbranch.fill import (
    BranchHook,
    BranchSession,
    FillBudget,
    FillChoice,
    FillPolicy,
    FillStage,
    Ranked,
    Speculator,
)
from dynbranch.predictors import make_predictor
from dynbranch.reuse.hook import ReuseHook
from dynbranch.runtime.affinity import AffinityPlacement
from dynbranch.runtime.run import RunContext
from dynbranch.runtime.stage import StageCall

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
    def for_run(cls, run: RunContext) -> SPAgentConfig:
        """The run's SPAgent settings (its ``arm_config``), else the defaults."""
        return run.arm_config if isinstance(run.arm_config, SPAgentConfig) else cls()


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

        NOTE: the least loaded engine, because that is where the floor's placement sends a
        fill (the least loaded engine other than the one serving the request).
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
        self.stop_after_search = StopAfterSearch(config.search_tools)
        self.counts = {"admitted": 0, "throttled": 0, "no_candidate": 0}
        self.peak_sequences = 0

    async def choose(self, session: BranchSession,
                     ranked: Sequence[Ranked]) -> list[FillChoice]:
        if not ranked:
            self.counts["no_candidate"] += 1
            return []
        room = self.throttle.headroom(list(await session.loads()))
        self.peak_sequences = max(self.peak_sequences, room.sequences)
        if not room.admit:
            self.counts["throttled"] += 1
            return []
        self.counts["admitted"] += 1
        return [FillChoice(ranked[0].name, ranked[0].rank, budgets=(self.stop_after_search,))]

    def stats(self) -> dict[str, Any]:
        return {**self.counts, "max_sequences": self.config.max_sequences,
                "max_kv_usage": self.config.max_kv_usage,
                "peak_least_loaded_sequences": self.peak_sequences,
                "after_search_stops": self.stop_after_search.stops}


class StopAfterSearch(FillBudget):
    """The in-request buffer holds the search action only: a fill that has run a search
    tool stops before its next stage (it would reason on an unverified observation).
    ``stops`` counts the fills it ended."""

    name = "spagent search"

    def __init__(self, search_tools: Sequence[str]) -> None:
        self.search_tools = frozenset(search_tools)
        self.stops = 0

    def stop_reason(self, trace: Sequence[FillStage], call: StageCall) -> str | None:
        if any(s.kind == "tool" and s.tool in self.search_tools for s in trace):
            self.stops += 1
            return (f"spagent buffers the search action only; {call.stage.name} would "
                    "reason on an unverified observation")
        return None


def spagent_reuse(run: RunContext) -> ReuseHook:
    """The ``spagent`` arm's reuse hook: the request-scoped buffer over the run's store."""
    return store_hook(run, cross_request=False, name="spagent")


def spagent_branch(run: RunContext, reuse: ReuseHook) -> BranchHook:
    """The ``spagent`` arm's branch hook over the workload's predictor."""
    predictor = make_predictor(run.fill.predictor)
    return Speculator(run, predictor, SPAgentPolicy(SPAgentConfig.for_run(run)))


def spagent_arm() -> Arm:
    """The ``spagent`` arm."""
    return Arm("spagent", SPAGENT_DESCRIPTION, spagent_reuse, spagent_branch, AffinityPlacement)
