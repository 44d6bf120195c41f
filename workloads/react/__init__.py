"""ReAct: multi-hop MuSiQue questions answered by think → search → read hops over BM25
(DESIGN.md §4).

Modules: :mod:`~workloads.react.retrieval` (the combined corpus, its BM25 index and the
``retrieve`` tool, shared with Sub-Agent), :mod:`~workloads.react.lengths` (what the
replayed LLM stages of both MuSiQue workloads decode), :mod:`~workloads.react.template`,
:mod:`~workloads.react.request` and :mod:`~workloads.react.workload`; data, hop chains,
split and EM/F1 in :mod:`workloads.musique`.
"""

from workloads.react.request import (
    MAX_THINKS,
    Action,
    ReActOutcome,
    ReActRequest,
    parse_action,
)
from workloads.react.retrieval import (
    CORPUS_RESOURCE,
    Bm25Index,
    Corpus,
    Passage,
    RetrieveTool,
    index_for,
    load_corpus,
    make_corpus,
)
from workloads.react.template import FINISH, INVALID, TEMPLATE
from workloads.react.workload import ReActWorkload, load_react_questions

__all__ = [
    "CORPUS_RESOURCE",
    "FINISH",
    "INVALID",
    "MAX_THINKS",
    "TEMPLATE",
    "Action",
    "Bm25Index",
    "Corpus",
    "Passage",
    "ReActOutcome",
    "ReActRequest",
    "ReActWorkload",
    "RetrieveTool",
    "index_for",
    "load_corpus",
    "load_react_questions",
    "make_corpus",
    "parse_action",
]
