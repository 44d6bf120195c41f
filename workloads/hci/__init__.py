"""HCI: an assistant offers a menu, the user thinks and picks, the next turn runs (DESIGN.md §4).

Requests come from Schema-Guided Dialogue (SGD) offer → pick pairs joined with the raw dev
dialogues that hold the full menus. Modules: :mod:`~workloads.hci.sgd_data` (loading and
validation), :mod:`~workloads.hci.services` (the ``sgd`` tool over the recorded service
calls), :mod:`~workloads.hci.episodes` (which pairs are usable; the pick and the lookup),
:mod:`~workloads.hci.thinktime` (paired log-normal think times),
:mod:`~workloads.hci.decode` (the reasoning the LLM stages decode around the recorded text),
:mod:`~workloads.hci.template`, :mod:`~workloads.hci.request`,
:mod:`~workloads.hci.workload` and :mod:`~workloads.hci.evaluate` (predictor match, overlap
share).
"""

from workloads.hci.decode import DIALOGUE_TURN, HCI_DECODE
from workloads.hci.episodes import Episode, Usability, classify, offered_indices
from workloads.hci.evaluate import MatchReport, OverlapShare, overlap_share, top_k_match
from workloads.hci.request import FEATURES_KEY, HCIOutcome, HCIRequest, candidate_features
from workloads.hci.services import (
    READ_S,
    TRANSACTION_S,
    ServiceDB,
    ServiceTool,
    ServiceVersions,
    call_fields,
    resource,
)
from workloads.hci.sgd_data import Call, SGDData, load_sgd
from workloads.hci.template import TEMPLATE
from workloads.hci.thinktime import KLM_MENU_PICK_S, KLM_RMS_ERROR, ThinkTime
from workloads.hci.workload import SPLITS, HCIWorkload, draw, split_of

__all__ = [
    "DIALOGUE_TURN",
    "FEATURES_KEY",
    "HCI_DECODE",
    "KLM_MENU_PICK_S",
    "KLM_RMS_ERROR",
    "READ_S",
    "SPLITS",
    "TEMPLATE",
    "TRANSACTION_S",
    "Call",
    "Episode",
    "HCIOutcome",
    "HCIRequest",
    "HCIWorkload",
    "MatchReport",
    "OverlapShare",
    "SGDData",
    "ServiceDB",
    "ServiceTool",
    "ServiceVersions",
    "ThinkTime",
    "Usability",
    "call_fields",
    "candidate_features",
    "classify",
    "draw",
    "load_sgd",
    "offered_indices",
    "overlap_share",
    "resource",
    "split_of",
    "top_k_match",
]
