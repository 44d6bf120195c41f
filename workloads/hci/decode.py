"""What HCI's LLM stages decode around their recorded decision (``--decode-lengths modelled``).

HCI has two LLM stages that decode: ``offer`` (the assistant offers menu entries) and
``respond`` (the next turn: the reply to the user's pick and utterance, after the lookup).
Both are task-assistant dialogue turns. Served by Qwen3-32B in thinking mode (the model's
default: ``enable_thinking=True`` in its chat template, Qwen3 model card), each turn decodes
a ``<think>`` block before the reply; the recorded SGD utterance is the reply.
``respond_prefix`` (the prefix warm-up, :mod:`workloads.hci.template`) decodes one token and
has no reasoning.

**Grounding.** No published measurement of Qwen3's thinking length on SGD-style
task-oriented dialogue turns was found. The nearest published evidence:

* Aggarwal et al., "OptimalThinkingBench: Evaluating Over and Underthinking in LLMs"
  (arXiv:2508.13141, 2025), over 33 models including the Qwen3 family in thinking mode, on
  simple queries in 72 domains: "thinking models often overthink for hundreds of tokens on
  the simplest user queries without improving performance";
* Srivastava et al., "Do LLMs Overthink Basic Math Reasoning?" (LLMThinkBench,
  arXiv:2507.04023, 2025): reasoning models emit about 18x the tokens of non-reasoning ones
  on basic tasks.

A dialogue turn that reads a service answer and replies in one sentence is such a "simple
user query". **Assumption** (stated so it can be challenged): a log-normal reasoning length
with median 350 tokens ("hundreds") and log-space σ = 0.7, so that 90 % of turns think for
110–1,100 tokens, clipped to [32, 4,096] (a serving cap far below the model card's
recommended 32,768-token output, which no dialogue turn approaches). Offer and respond draw
from the same model, independently (each keyed by its own rendered input). At the
``qwen3-32b@h200`` profile's ~19 ms per decode step, the median reply decodes for ~6.7 s.

**Where the latency goes.** HCI measures latency from the click. The reply's reasoning
depends on the user's utterance, which no fill can see, so it stays on the critical path
under every arm; C2 can hide only the lookup and, with ``prefix_warmup`` (off by default),
the part of the reply's prefill known before the click (:mod:`workloads.hci.request`).
"""

from __future__ import annotations

from dynbranch.decode_lengths import DecodeModel, LengthModel

DIALOGUE_TURN = LengthModel(
    median_tokens=350,
    sigma=0.7,
    min_tokens=32,
    max_tokens=4096,
    source=(
        "assumed from Aggarwal et al. 2025, OptimalThinkingBench (arXiv:2508.13141): "
        "thinking models (Qwen3 family included) spend hundreds of tokens on simple user "
        "queries; Srivastava et al. 2025, LLMThinkBench (arXiv:2507.04023): ~18x the tokens "
        "of non-thinking models; no Qwen3 measurement on SGD dialogue turns is published"
    ),
)
"""Reasoning before a task-assistant dialogue turn (see the module docstring)."""

HCI_DECODE = DecodeModel({"offer": DIALOGUE_TURN, "respond": DIALOGUE_TURN})
"""The modelled decode of HCI's LLM stages."""
