"""What the MuSiQue workloads' LLM stages decode around their recorded decisions.

A replayed ReAct or Sub-Agent stage emits ``<think>`` + modelled reasoning + ``</think>`` +
the recorded decision (:mod:`dynbranch.decode_lengths`): a ReAct ``think`` its thought and
``search[...]`` / ``finish[...]``, a ``read`` its observation, a Sub-Agent ``plan`` its
sub-topics, a sub-agent's ``sub_think`` its search and its ``research`` the finding, and
``synthesise`` the answer. The workflow reads only the decision
(:func:`~dynbranch.decode_lengths.decision_of`).

**Where the lengths come from.** No published measurement gives Qwen3-32B's per-turn
thinking length on MuSiQue agent turns, so the medians are assumptions anchored on the
nearest published numbers:

* open-weight reasoning models (Qwen among them) spend "hundreds of tokens" of reasoning on
  a one-fact knowledge question ("the capital of Australia"), up to 10x what closed models
  spend (Nous Research, *Measuring Thinking Efficiency in Reasoning Models: The Missing
  Benchmark*, 2025); thinking models "overthink for hundreds of tokens on the simplest
  user queries" (Aggarwal et al., *OptimalThinkingBench*, arXiv:2508.13141, 2025). A
  single-hop step (a ReAct ``read``, a sub-agent's ``sub_think`` and ``research``) is such a
  question, so its median is 160-240 tokens;
* a vendor's serving guide puts Qwen3's reasoning before an answer at 300-500 tokens
  (Aspose.LLM, *MaxTokens*, docs.aspose.com), the range we give the turns that weigh the
  whole question: ReAct's ``think`` (which entity next, or the answer) and Sub-Agent's
  ``synthesise``; the ``plan``, which decomposes a 2-4-hop question, sits at its top;
* Qwen3's model card caps an ordinary turn's output at 32,768 tokens; an agent's serving
  config caps a step far lower, so every stage is clipped at 4,096 reasoning tokens and its
  ``max_tokens`` is :data:`STAGE_MAX_TOKENS`, which always fits reasoning and decision.

The log-space spread (``sigma`` 0.5-0.6: the middle 50 % of a stage's lengths within
x0.7-x1.5 of its median) is our assumption. The draw is keyed by the rendered input and
the stage's parameters, so a fill and the canonical execution of one reuse name decode
byte-identical text.
"""

from __future__ import annotations

import json

from dynbranch.decode_lengths import DecodeModel, LengthModel
from dynbranch.workflow import StageSpec

MAX_REASONING = 4096
STAGE_MAX_TOKENS = 8192
"""``max_tokens`` of every MuSiQue LLM stage: the reasoning clip plus room for the decision."""

_SINGLE_HOP = (
    "single-hop knowledge step: 'hundreds of tokens' of reasoning for a one-fact question "
    "(Nous Research 2025, thinking efficiency; OptimalThinkingBench, arXiv:2508.13141)"
)
_WHOLE_QUESTION = (
    "turn over the whole multi-hop question: Qwen3 reasons 300-500 tokens before an answer "
    "(Aspose.LLM MaxTokens guide); median assumed inside that range"
)

REACT_LENGTHS = {
    "think": LengthModel(320, 0.6, 24, MAX_REASONING, source=_WHOLE_QUESTION),
    "read": LengthModel(200, 0.5, 16, MAX_REASONING, source=_SINGLE_HOP),
}
SUBAGENT_LENGTHS = {
    "plan": LengthModel(
        480,
        0.5,
        48,
        MAX_REASONING,
        source=_WHOLE_QUESTION + "; the decomposition of 2-4 hops at its top",
    ),
    "sub_think": LengthModel(160, 0.5, 16, MAX_REASONING, source=_SINGLE_HOP),
    "research": LengthModel(240, 0.5, 16, MAX_REASONING, source=_SINGLE_HOP),
    "synthesise": LengthModel(320, 0.5, 24, MAX_REASONING, source=_WHOLE_QUESTION),
}
REACT_DECODE = DecodeModel(REACT_LENGTHS, salt="react-decode-v1")
SUBAGENT_DECODE = DecodeModel(SUBAGENT_LENGTHS, salt="subagent-decode-v1")


def theta(spec: StageSpec) -> str:
    """The parameters a stage's decode depends on besides its input: model role and
    sampling (what its reuse name covers as θ)."""
    return json.dumps([spec.model, spec.sampling.canonical()], sort_keys=True)
