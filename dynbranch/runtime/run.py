"""What every mechanism of a run may know about it: :class:`RunContext` and typed options.

Each concern has one options object with its defaults written once here: C2's
:class:`FillOptions` (how wide and how deep fills go, which predictor ranks) and C3's
:class:`GateOptions` (which fill policy, its threshold, the profile it prices against). A
baseline arm's own settings ride in :attr:`RunContext.arm_config` as that arm's typed config.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Hashable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from dynbranch.clock import Clock

if TYPE_CHECKING:
    from dynbranch.gate.client import GateClient
    from dynbranch.gate.gate import GateConfig
    from dynbranch.gate.price import ContentionModel
    from dynbranch.reuse.client import StoreClient

DEFAULT_FANOUT = 2
"""Most fills one branch entry may start (the CLI's ``--fanout``; C3's ``GateConfig``)."""


def default_fanout(engines: int) -> int:
    """A run's fanout when none is set: one fill per engine but the request's own
    (``K = W - 1``, the paper's setting at ``W`` workers; at least 1)."""
    return max(1, engines - 1)


DEFAULT_DEPTH = 2
"""Stages one fill may run (e.g. handler + executor); deeper fills rarely finish in time."""
GATE_POLICIES = ("priced", "topk", "fixed-threshold", "priced-a1-only", "priced-a0-fixed")
"""Fill policies of the C2 arms: C3's priced gate, no gate, or a Fig. 13 attribution variant."""


@dataclass(frozen=True)
class ModelId:
    """The model (and revision) that serves a model role: part of every LLM reuse name."""

    model: str
    revision: str


@dataclass(frozen=True)
class FillOptions:
    """C2: how many candidates a branch may fill, how deep a fill runs, who ranks them.

    ``fanout`` (>= 0) bounds the fills of one branch entry; ``depth`` (>= 0) the stages of
    one fill; ``predictor`` names the ranker (:mod:`dynbranch.predictors`) and
    ``predictor_options`` its keyword arguments.
    """

    fanout: int = DEFAULT_FANOUT
    depth: int = DEFAULT_DEPTH
    predictor: str = "frequency"
    predictor_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.fanout < 0:
            raise ValueError(f"FillOptions.fanout={self.fanout} must be >= 0")
        if self.depth < 0:
            raise ValueError(f"FillOptions.depth={self.depth} must be >= 0")


@dataclass(frozen=True)
class GateOptions:
    """C3: the fill policy and what it prices against.

    ``policy`` is one of :data:`GATE_POLICIES`; ``p_star`` in [0, 1] is the fixed threshold of
    the attribution variants; ``profile`` the engine profile whose roofline prices contention;
    ``engines`` how many engines serve fills (the KV budget's size); ``seed`` the audit seed.
    """

    policy: str = "priced"
    p_star: float = 0.5
    profile: str = "qwen3-32b@h200"
    engines: int = 1
    seed: int = 0

    def __post_init__(self) -> None:
        if self.policy not in GATE_POLICIES:
            raise ValueError(f"GateOptions.policy={self.policy!r} not one of {GATE_POLICIES}")
        if not (math.isfinite(self.p_star) and 0.0 <= self.p_star <= 1.0):
            raise ValueError(f"GateOptions.p_star={self.p_star} outside [0, 1]")
        if self.engines < 1:
            raise ValueError(f"GateOptions.engines={self.engines} must be >= 1")


@dataclass(frozen=True)
class AdmissionOptions:
    """The serving side's admission control, applied by the driver at each arrival.

    ``max_inflight`` (>= 1, or ``None``: unbounded) is the most requests in flight at once: a
    request arriving when that many are running is rejected at once (a typed ``rejected``
    outcome, as an overloaded server answers 503), so the ones admitted see a bounded queue.
    ``deadline_s`` (> 0 and finite, or ``None``) cancels a request not done that long after
    its scheduled arrival (a typed ``deadline`` outcome). ``tenants`` (>= 1) spreads the
    requests over that many tenants, assigned by the serving side by arrival order.
    """

    max_inflight: int | None = None
    deadline_s: float | None = None
    tenants: int = 1

    def __post_init__(self) -> None:
        if self.max_inflight is not None and (isinstance(self.max_inflight, bool)
                                              or self.max_inflight < 1):
            raise ValueError(f"AdmissionOptions.max_inflight={self.max_inflight} must be >= 1")
        if self.deadline_s is not None and not (math.isfinite(self.deadline_s)
                                                and self.deadline_s > 0):
            raise ValueError(f"AdmissionOptions.deadline_s={self.deadline_s} must be finite "
                             f"and > 0")
        if self.tenants < 1:
            raise ValueError(f"AdmissionOptions.tenants={self.tenants} must be >= 1")

    def tenant(self, index: int, default: str = "default") -> str:
        """The tenant of the ``index``-th arriving request (``default`` when there is one)."""
        return default if self.tenants == 1 else f"tenant-{index % self.tenants}"


@dataclass(frozen=True)
class RunContext:
    """What an arm's hooks need to know about the run they serve.

    ``replay`` is true when engines replay the trace's text (``sim``, ``zero``) and false when
    a real model generates (the splice checker then cannot re-derive an LLM stage's output);
    ``replay_context`` is the context the replaying engine cuts outputs to (the sim profile's
    ``max_model_len``; ``None``: no cut, as the zero engine), which the checker applies too.
    ``make_store`` builds the backend's subgraph store; ``make_gate`` the backend's central
    gate (``None``: the gate lives in this process). ``workload_key`` is equal for two runs
    whose workloads generate the same requests from the same data (``None``: unknown), so a
    hook may reuse what it learnt offline from one run's train split in the next.
    """

    clock: Clock
    arm: str
    tenant: str = "default"
    models: Mapping[str, ModelId] = field(default_factory=dict)
    fill: FillOptions = field(default_factory=FillOptions)
    gate: GateOptions = field(default_factory=GateOptions)
    arm_config: Any = None  # a baseline's own typed settings (DSPConfig, SPAgentConfig, ...)
    replay: bool = True
    replay_context: int | None = None
    make_store: Callable[[], StoreClient] | None = None
    make_gate: Callable[[ContentionModel, GateConfig], GateClient] | None = None
    workload_key: Hashable | None = None
