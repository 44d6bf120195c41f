"""C3, the load-priced admission gate: pure, synchronous, clock-free.

* :mod:`~dynbranch.gate.beta` — Beta posteriors and Bayes-UCB quantiles;
* :mod:`~dynbranch.gate.load` — the load view, its budget and its causal envelope (eq. 3);
* :mod:`~dynbranch.gate.price` — the contention price ``C_s(V)`` from the roofline;
* :mod:`~dynbranch.gate.returns` — Action 0's per-coordinate return (eq. 4);
* :mod:`~dynbranch.gate.reservations` — atomic KV reservations and their receipts;
* :mod:`~dynbranch.gate.policy` — the four policies (:data:`POLICIES`): ``priced``
  (DynBranch, both levels priced), ``fixed_threshold`` (neither: Action 0 always open,
  Action 1 ``p~ > p*``), and the attribution variants that price one level only,
  ``priced_a1_only`` (Action 0 always open, Action 1 priced) and ``priced_a0_fixed``
  (Action 0 learned, Action 1 ``p~ > p*``);
* :mod:`~dynbranch.gate.client` — the :class:`~dynbranch.gate.client.GateClient` the priced
  fill policy talks to (in process here; over the central actor in :mod:`dynbranch.cluster`);
* :mod:`~dynbranch.gate.gate` — the :class:`Gate` (Actions 0 and 1, eq. 5, greedy).

Nothing here drives an engine: the check of the price against the sim engine, which fits
its ``scale``, is :func:`dynbranch.calibrate.calibrate_price`.
"""

from dynbranch.gate.beta import (
    BetaPosterior,
    bayes_ucb_level,
    beta_quantile,
    betainc,
    betaincc,
)
from dynbranch.gate.gate import (
    ADMITTED,
    AUDIT,
    FANOUT,
    NO_KV,
    REASONS,
    Admission,
    Candidate,
    Gate,
    GateConfig,
)
from dynbranch.gate.load import LoadBudget, LoadEnvelope, LoadView
from dynbranch.gate.policy import BELOW_THRESHOLD, NEGATIVE_UTILITY, POLICIES
from dynbranch.gate.price import ContentionModel, FillShape
from dynbranch.gate.reservations import KvLedger, Reservation, ReservationError
from dynbranch.gate.returns import BranchReturn, GenerationDecision, Observation, Settlement

__all__ = [
    "ADMITTED",
    "AUDIT",
    "BELOW_THRESHOLD",
    "FANOUT",
    "NEGATIVE_UTILITY",
    "NO_KV",
    "POLICIES",
    "REASONS",
    "Admission",
    "BetaPosterior",
    "BranchReturn",
    "Candidate",
    "ContentionModel",
    "FillShape",
    "Gate",
    "GateConfig",
    "GenerationDecision",
    "KvLedger",
    "LoadBudget",
    "LoadEnvelope",
    "LoadView",
    "Observation",
    "Reservation",
    "ReservationError",
    "Settlement",
    "bayes_ucb_level",
    "beta_quantile",
    "betainc",
    "betaincc",
]
