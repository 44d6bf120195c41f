"""BFCL's test categories: which the routing workload replays and scores, and why the rest not.

BFCL (``bfcl_eval.constants.category_mapping`` in the pinned wheel) scores 21 categories.
The workload replays and scores every one whose ground truth it can check the way BFCL's
``eval_checker`` does:

* multi-turn (``multi_turn_checker``: per turn with a non-empty ground truth, every API
  instance's public state equals the ground truth's and the ground truth's results are
  among the model's results so far): ``multi_turn_base``, ``multi_turn_miss_func`` (a
  held-out function is offered from a later turn on, whose user message is BFCL's
  ``DEFAULT_USER_PROMPT_FOR_ADDITIONAL_FUNCTION_FC``), ``multi_turn_miss_param`` (a turn
  lacks a parameter: its ground truth is empty, as BFCL's), ``multi_turn_long_context``
  (the API classes load their long-context scenario);
* single-turn AST (``ast_checker``): ``simple_python``, ``multiple``, ``parallel``,
  ``parallel_multiple`` and the ``live_`` versions of the four;
* relevance (``relevance_file_runner``): ``irrelevance`` and ``live_irrelevance``, correct
  when no call is made.

The others are refused with the reason in :data:`REFUSED`. Collections (BFCL's
``TEST_COLLECTION_MAPPING`` names, e.g. ``all``, ``multi_turn``, ``live``) expand to their
replayable members. The default is ``all``, BFCL's own default ``--test-category``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from types import MappingProxyType

from dynbranch.errors import ConfigError

MULTI_TURN = (
    "multi_turn_base",
    "multi_turn_miss_func",
    "multi_turn_miss_param",
    "multi_turn_long_context",
)
AST = (
    "simple_python",
    "multiple",
    "parallel",
    "parallel_multiple",
    "live_simple",
    "live_multiple",
    "live_parallel",
    "live_parallel_multiple",
)
IRRELEVANCE = ("irrelevance", "live_irrelevance")
SINGLE_TURN = (*AST, *IRRELEVANCE)
CATEGORIES = (*MULTI_TURN, *SINGLE_TURN)
"""Every category the workload replays and scores, in load order."""

REFUSED: Mapping[str, str] = MappingProxyType(
    {
        "simple_java": "BFCL scores it by converting Java-typed argument strings "
        "(java_type_converter); the executor validates Python-typed calls only",
        "simple_javascript": "BFCL scores it by converting JavaScript-typed argument strings "
        "(js_type_converter); the executor validates Python-typed calls only",
        "live_relevance": "it ships no call to replay (BFCL only checks that some call is made)",
        "memory_kv": "its API needs BFCL's memory prerequisite conversations, and BFCL scores "
        "the final answer's text, which a replay does not decode",
        "memory_vector": "its API needs faiss and sentence-transformers, which are never installed",
        "memory_rec_sum": "its API needs BFCL's memory prerequisite conversations, and BFCL "
        "scores the final answer's text, which a replay does not decode",
        "web_search_base": "its API searches the live web, which a replay cannot reach",
        "web_search_no_snippet": "its API searches the live web, which a replay cannot reach",
        "format_sensitivity": "BFCL does not score it",
    }
)
"""Categories BFCL has that the workload refuses, each with its one-line reason."""

COLLECTIONS: Mapping[str, tuple[str, ...]] = MappingProxyType(
    {
        "all": CATEGORIES,
        "all_scoring": CATEGORIES,
        "multi_turn": MULTI_TURN,
        "single_turn": SINGLE_TURN,
        "non_live": ("simple_python", "multiple", "parallel", "parallel_multiple", "irrelevance"),
        "live": (
            "live_simple",
            "live_multiple",
            "live_parallel",
            "live_parallel_multiple",
            "live_irrelevance",
        ),
        "python": SINGLE_TURN,
    }
)
"""BFCL's collection names, restricted to the replayable categories."""

DEFAULT_CATEGORIES = CATEGORIES
"""BFCL's default ``--test-category all``, less what :data:`REFUSED` lists."""


class UnscorableCategoryError(ConfigError):
    """A BFCL category the routing workload cannot replay and score, with the reason."""

    def __init__(self, category: str, reason: str) -> None:
        self.category, self.reason = category, reason
        super().__init__(f"routing category {category!r} is refused: {reason}")


def resolve_categories(names: Iterable[str]) -> tuple[str, ...]:
    """The categories ``names`` select (categories or collections), in load order.

    Raises :class:`UnscorableCategoryError` for a refused category and
    :class:`~dynbranch.errors.ConfigError` for an unknown name or an empty selection.
    """
    names = [n.strip() for n in names if n.strip()]
    chosen: set[str] = set()
    for name in names:
        if name in REFUSED:
            raise UnscorableCategoryError(name, REFUSED[name])
        if name in COLLECTIONS:
            chosen.update(COLLECTIONS[name])
        elif name in CATEGORIES:
            chosen.add(name)
        else:
            raise ConfigError(
                f"routing category {name!r}: choose from {list(CATEGORIES)} "
                f"or a collection {list(COLLECTIONS)}"
            )
    if not chosen:
        raise ConfigError(f"routing categories {names}: choose at least one of {list(CATEGORIES)}")
    return tuple(c for c in CATEGORIES if c in chosen)


def parse_categories(text: str) -> tuple[str, ...]:
    """``--categories`` text (comma-separated) resolved by :func:`resolve_categories`."""
    return resolve_categories(text.split(","))


def is_parallel(category: str) -> bool:
    """Whether a record's calls of one turn are all made at once (BFCL's no-order check)."""
    return "parallel" in category


def is_irrelevance(category: str) -> bool:
    """Whether a record is correct exactly when no call is made."""
    return category in IRRELEVANCE
