"""C2, early fill: at a branch, run predicted downstream stages while the model decides.

* :mod:`~dynbranch.fill.hook` — the :class:`BranchHook` contract the orchestrator calls,
  and :class:`NoSpeculation` (the floor);
* :mod:`~dynbranch.fill.model` — the typed objects from admission to learning:
  :class:`FillChoice`, :class:`Fill`, :class:`FillStage`, :class:`Consumption`, and the
  :class:`FillBudget` s that bound a fill;
* :mod:`~dynbranch.fill.runner` — the mechanism: :class:`BranchSession` per branch entry,
  :class:`FillRunner` starting, cancelling and accounting fills;
* :mod:`~dynbranch.fill.context` — the stage context a fill runs its stages through;
* :mod:`~dynbranch.fill.speculator` — the policy side: :class:`Speculator` (predict →
  admit → fill), :class:`FillPolicy` and :class:`TopK`. C3's load-priced policy lives with
  the gate (:mod:`dynbranch.gate.priced`).

A fill's results are shadows in C1's store (:mod:`dynbranch.reuse`), promoted only when the
canonical stage renders the same reuse name.
"""

from dynbranch.fill.hook import BranchHook, NoSpeculation
from dynbranch.fill.model import (
    Consumption,
    DepthBudget,
    Fill,
    FillBudget,
    FillChoice,
    FillStage,
    Ranked,
)
from dynbranch.fill.runner import BranchSession, FillRunner
from dynbranch.fill.speculator import FillPolicy, Speculator, TopK

__all__ = [
    "BranchHook", "BranchSession", "Consumption", "DepthBudget", "Fill", "FillBudget",
    "FillChoice", "FillPolicy", "FillRunner", "FillStage", "NoSpeculation", "Ranked",
    "Speculator", "TopK",
]
