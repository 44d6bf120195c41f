"""What a serving model decodes around a replayed stage's decision.

A replayed trace records only the *decision* of an LLM stage: the text that decides the
branch (a handler's name, a call with its arguments, a search action, a reply). A Qwen3
agent decodes far more than that — its reasoning first, in thinking mode, then the
decision and the prose around it — and that decode is what a branch's resolution window
and a fill's execution are made of. A :class:`DecodeModel` puts it back: for each stage it
draws a number of reasoning tokens from the stage's :class:`LengthModel` and emits
``<think>`` + that many tokens of deterministic filler + ``</think>`` + the recorded
decision, the layout Qwen3's chat template gives a thinking turn.

The draw is a deterministic function of the stage's complete rendered input and its
parameters (``theta``), never of anything else: a fill and the canonical execution of one
reuse name decode byte-identical text, so value equivalence holds and the splice checker
keeps checking it. What the workflow reads of a stage's output is the part after the
reasoning (:func:`decision_of`), as an agent framework strips the thinking block before it
parses a call or appends a turn to the conversation.

Real engines (``hf``, ``vllm``) generate and never see any of this.
"""

from __future__ import annotations

import functools
import hashlib
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field

from dynbranch.workflow import RenderedInput

THINK_OPEN = "<think>\n"
THINK_CLOSE = "\n</think>\n\n"
MODES = ("modelled", "recorded")
"""``modelled``: decisions wrapped in modelled reasoning; ``recorded``: the trace's text only."""

# NOTE: short words (at most six letters), so each is one token under the sim tokenizer
# stand-in (dynbranch.engines.tokenizer) and a filler of n words is n tokens long.
_VOCABULARY = """
the user wants to call which tool first then check list file path name value need
must look at this that args given task step next so now we can use it if not else
one two all each call make sure order data query read find match field type field
number count total sum unit area result answer output return json format key quote
should would could maybe likely seems since because given also only just still wait
maybe right wrong check again verify option choose select best pick this case here
prior turn said asked about from into with over under before after while until when
api func method param input string int float bool array object schema state system
"""
_WORDS = tuple(w for w in _VOCABULARY.split() if len(w) <= 6)


@dataclass(frozen=True)
class LengthModel:
    """Reasoning tokens decoded before one stage kind's decision: log-normal, clipped.

    ``median_tokens`` and ``sigma`` (the log-space standard deviation) set the draw;
    ``min_tokens`` / ``max_tokens`` clip it (a serving config caps a turn's output);
    ``source`` says where the numbers come from.
    """

    median_tokens: float
    sigma: float = 0.5
    min_tokens: int = 0
    max_tokens: int = 8192
    source: str = ""

    def __post_init__(self) -> None:
        if not (self.median_tokens >= 0 and math.isfinite(self.median_tokens)):
            raise ValueError(f"LengthModel.median_tokens={self.median_tokens} must be >= 0")
        if not (self.sigma >= 0 and math.isfinite(self.sigma)):
            raise ValueError(f"LengthModel.sigma={self.sigma} must be >= 0")
        if not 0 <= self.min_tokens <= self.max_tokens:
            raise ValueError(f"LengthModel needs 0 <= min_tokens ({self.min_tokens}) <= "
                             f"max_tokens ({self.max_tokens})")

    def tokens(self, z: float, scale: float = 1.0) -> int:
        """The length at standard-normal quantile ``z``, scaled by ``scale``."""
        if self.median_tokens == 0:
            return self.min_tokens
        n = round(scale * self.median_tokens * math.exp(self.sigma * z))
        return min(self.max_tokens, max(self.min_tokens, n))


@dataclass(frozen=True)
class DecodeModel:
    """Per stage name, the reasoning a serving model decodes before the stage's decision.

    ``scale`` multiplies every median (the calibration knob). Routing's is fitted on the
    paper's published durations (``scripts/calibrate_routing_decode.py``); ReAct's, Sub-Agent's
    and HCI's stay 1.0, their medians read from their data and the models' recommended
    settings (each workload's lengths module), and the paper publishes no request time for
    ReAct or HCI; Sub-Agent's requests run 2.2–2.4× the paper's (README, ``fig9a``); a stage
    without a :class:`LengthModel` is emitted as recorded.
    """

    stages: Mapping[str, LengthModel] = field(default_factory=dict)
    scale: float = 1.0
    salt: str = "decode-v1"

    def __post_init__(self) -> None:
        if not (self.scale >= 0 and math.isfinite(self.scale)):
            raise ValueError(f"DecodeModel.scale={self.scale} must be >= 0")

    def reasoning_tokens(self, rendered: RenderedInput, theta: str = "") -> int:
        """How many reasoning tokens the stage of ``rendered`` decodes (0: none modelled)."""
        model = self.stages.get(rendered.stage)
        if model is None:
            return 0
        return model.tokens(_normal(self._seed(rendered, theta)), self.scale)

    def wrap(self, rendered: RenderedInput, decision: str, theta: str = "") -> str:
        """The full output of the stage of ``rendered`` whose recorded decision is
        ``decision``: modelled reasoning first, then the decision."""
        n = self.reasoning_tokens(rendered, theta)
        if n == 0:
            return decision
        return f"{THINK_OPEN}{filler(n, self._seed(rendered, theta))}{THINK_CLOSE}{decision}"

    def _seed(self, rendered: RenderedInput, theta: str) -> int:
        digest = hashlib.sha256(
            f"{self.salt}\0{rendered.stage}\0{rendered.input_digest}\0{theta}".encode()).digest()
        return int.from_bytes(digest[:8], "big")


RECORDED = DecodeModel()
"""The trace's text only (``--decode-lengths recorded``)."""


def check_mode(mode: str) -> str:
    """``mode`` (``--decode-lengths``) if it is one of :data:`MODES`; a typed error if not."""
    if mode not in MODES:
        from dynbranch.errors import ConfigError

        raise ConfigError(f"decode lengths {mode!r}: choose from {list(MODES)}")
    return mode


def choose(mode: str, modelled: DecodeModel) -> DecodeModel:
    """The decode model a workload runs under ``mode``: its own ``modelled`` one, or
    :data:`RECORDED`."""
    return modelled if check_mode(mode) == "modelled" else RECORDED


def decision_of(text: str) -> str:
    """What a workflow reads of a stage's output: the text after its reasoning block."""
    i = text.rfind(THINK_CLOSE)
    return text[i + len(THINK_CLOSE):] if i >= 0 else text


def _normal(seed: int) -> float:
    """A standard-normal draw fixed by ``seed`` (inverse CDF of a uniform in (0, 1))."""
    u = ((seed >> 11) + 0.5) / float(1 << 53)
    return _inv_norm_cdf(u)


def _inv_norm_cdf(p: float) -> float:
    # NOTE: Acklam's rational approximation (relative error < 1.2e-9), pure Python so a
    # replay needs no SciPy and the draw is identical on every platform.
    a = (-3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02,
         1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00)
    b = (-5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02,
         6.680131188771972e01, -1.328068155288572e01)
    c = (-7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00,
         -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00)
    d = (7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00,
         3.754408661907416e00)
    lo = 0.02425
    if p < lo:
        q = math.sqrt(-2 * math.log(p))
        return (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) / \
            ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1)
    if p > 1 - lo:
        return -_inv_norm_cdf(1 - p)
    q = p - 0.5
    r = q * q
    return (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q / \
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1)


@functools.lru_cache(maxsize=4096)
def filler(tokens: int, seed: int) -> str:
    """``tokens`` tokens of deterministic reasoning-like text (one word per token under the
    sim tokenizer stand-in), fixed by ``seed``."""
    rng = random.Random(seed)
    return " ".join(rng.choices(_WORDS, k=tokens))
