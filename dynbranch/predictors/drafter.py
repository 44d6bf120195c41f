"""The drafter: a small LM sampled N times at a branch, its candidates ranked by vote.

The paper's third predictor (§2 "Where candidates come from", §5.3 "Drafter variants"): a
draft model is asked N times which candidate the branch will take, and candidates rank by
how often they are named. Only the ordering is used downstream; a per-rank consumption rate
learned online replaces the uncalibrated vote counts (DESIGN.md §2).

A draft has two parts, kept apart so each can be real wherever it runs:

* **What each sample picks** — the :class:`ChoiceModel`, a conditional-logit (softmax) model
  over features of the branch context, learned online from resolved branches through
  :meth:`DrafterPredictor.observe` and sampled with a temperature. Per candidate it counts
  the candidate itself, the features the workflow lists for it
  (:data:`~dynbranch.predictors.frequency.FEATURES_KEY`: Routing's ``previous -> candidate``,
  HCI's offer position and entity), the request's previous choice at the same coordinate
  stage, the candidate's position, and the share of its words found in the evidence text.
  It never sees a branch's outcome before :meth:`observe` is called for it. With a real
  engine (``hf``, ``vllm``) the engine's own sampled text, parsed into a candidate, is the
  vote; the choice model's sample stands in when the text names no candidate.
* **What drafting costs** — each sample is one short generate call (a prompt rendering the
  evidence and the candidates, ``max_tokens`` enough for the longest candidate, priority
  ``SPECULATIVE``) on the run's ``drafter`` engines, through a ``generate`` callable the
  caller supplies (:meth:`DrafterPredictor.draft`). On the ``sim`` engine ``replay_text`` is
  the choice model's sample, so the engine emits exactly that candidate and the time it
  takes comes from the drafter's profile (``qwen3-0.6b@h200`` by default): prediction time
  is engine time, which Action 0 charges as ``T_setup`` (DESIGN.md §3, eq. 4).

:meth:`DrafterPredictor.rank` is the same draft without an engine (the choice model only,
no time): what tests, analyses and callers without a ``drafter`` role use. Both paths are
deterministic for a given seed and history: a branch's samples come from a generator seeded
by ``(seed, request, coordinate)``, never from global state.

Open-vocabulary branches (ReAct's next search) offer no candidates; the drafter then drafts
over the entities the :mod:`entity ranker <dynbranch.predictors.entity>` proposes from the
previous hop's passages (its rank is the position feature).

Its accuracy on held-out branches (the paper's Figure 11b statistic) is measured by
:func:`workloads.analysis.drafter.drafter_accuracy`, which runs workload data and so lives
above the core; the numbers it gave are in that module's docstring. On the ``sim`` engine
with the ``qwen3-0.6b@h200`` profile a draft of one branch takes about 23 ms alone (a
180-700 token prompt, 8 concurrent calls of a few tokens); with ``think_tokens=256``, about
0.75 s.
"""

from __future__ import annotations

import asyncio
import json
import math
import numbers
import random
import re
import zlib
from collections import Counter, OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dynbranch.engines.protocol import SPECULATIVE, GenerateRequest, GenerateResult
from dynbranch.engines.tokenizer import count_tokens
from dynbranch.predictors.base import (
    EVIDENCE_KEY,
    BranchContext,
    DraftingPredictor,
    softmax,
)
from dynbranch.predictors.entity import rank_entities
from dynbranch.predictors.frequency import FEATURES_KEY

Generate = Callable[[GenerateRequest], Awaitable[GenerateResult]]
"""Runs one drafter call on an engine (the Speculator wraps ``pool.generate("drafter", …)``)."""

NO_PREVIOUS = "<start>"
_WORD = re.compile(r"[a-z0-9]+")
_MAX_POSITION = 8  # NOTE: positions past this share one feature; later slots are rare


@dataclass(frozen=True)
class DrafterConfig:
    """The drafter's settings; every field is validated on construction.

    ``samples`` (N ≥ 1): draft calls per branch. ``temperature`` (> 0): the choice model's
    sampling temperature (1 samples the learned distribution itself; lower sharpens it).
    ``learning_rate`` (> 0) and ``l2`` (≥ 0): the online AdaGrad step and weight decay.
    ``proposals`` (≥ 1): candidates proposed for an open-vocabulary branch.
    ``max_context_chars`` (≥ 0): evidence kept in the drafter's prompt (its end).
    ``max_tokens`` (≥ 1): the cap on a draft call's output tokens.
    ``history`` (≥ 1): requests whose previous choice is remembered (least recent dropped).
    ``think_tokens`` (≥ 0): tokens a draft call reasons for before it answers (a thinking
    drafter; 0: it answers at once). On ``sim`` they are replayed as a neutral filler, so
    they cost decode steps and say nothing.
    ``pad``: append the candidates no sample named, by model probability, after the voted.
    """

    samples: int = 8
    temperature: float = 1.0
    learning_rate: float = 0.5
    l2: float = 1e-4
    proposals: int = 8
    max_context_chars: int = 4000
    max_tokens: int = 32
    history: int = 4096
    think_tokens: int = 0
    seed: int = 0
    pad: bool = False

    def __post_init__(self) -> None:
        for name in ("samples", "proposals", "max_tokens", "history"):
            if getattr(self, name) < 1:
                raise ValueError(f"drafter {name} must be >= 1, got {getattr(self, name)}")
        for name in ("temperature", "learning_rate"):
            value = getattr(self, name)
            if not (value > 0.0 and math.isfinite(value)):
                raise ValueError(f"drafter {name} must be finite and > 0, got {value}")
        for name in ("l2", "max_context_chars", "think_tokens"):
            if getattr(self, name) < 0:
                raise ValueError(f"drafter {name} must be >= 0, got {getattr(self, name)}")


@dataclass(frozen=True)
class Draft:
    """One branch's draft: the ranking and what producing it cost.

    ``samples`` are the N votes in issue order; ``engine_votes`` counts those the engine's
    text named (all of them on the ``sim`` engine); ``setup_s`` is the time from the first
    draft call's issue to the last one's end on the caller's clock (0 without an engine).
    """

    ranked: tuple[str, ...]
    setup_s: float
    samples: tuple[str, ...]
    engine_votes: int = 0
    output_tokens: int = 0


# -- the choice model -------------------------------------------------------------------------


class ChoiceModel:
    """A conditional-logit model of which candidate a branch takes, learned online.

    ``score(c) = Σ_f w_f φ_f(c)``; ``P(c) ∝ exp(score(c) / T)``. Weights are per coordinate
    stage (every feature name carries the stage key) and learned by AdaGrad on the
    log-likelihood of each resolved branch's choice (several chosen: a uniform target over
    them), so frequent patterns are learned in a few branches and rare features shrink.
    """

    def __init__(self, learning_rate: float = 0.5, l2: float = 1e-4) -> None:
        self.learning_rate, self.l2 = learning_rate, l2
        self._w: dict[str, float] = {}
        self._g2: dict[str, float] = {}
        self.learned = 0

    def features(
        self, ctx: BranchContext, pool: Sequence[str], previous: str, proposed: bool
    ) -> list[dict[str, float]]:
        """φ(c) for each candidate of ``pool`` (see the module docstring)."""
        c = ctx.coordinate
        stage = f"{c.workflow}/{c.stage}|"
        listed = ctx.evidence.get(FEATURES_KEY)
        listed = listed if isinstance(listed, Mapping) else {}
        # NOTE: a proposed pool was read out of the passages, so overlap with them is
        # trivially 1; only the rest of the evidence (the question) says anything then.
        words = _evidence_words(ctx.evidence, skip=("passages",) if proposed else ())
        out = []
        for i, candidate in enumerate(pool):
            phi = {
                f"{stage}cand={candidate}": 1.0,
                f"{stage}prev={previous}>{candidate}": 1.0,
                f"{stage}pos={min(i, _MAX_POSITION)}": 1.0,
            }
            extra = listed.get(candidate, ())
            if isinstance(extra, Sequence) and not isinstance(extra, str):
                phi.update({f"{stage}feat={f}": 1.0 for f in extra if isinstance(f, str)})
            own = set(_WORD.findall(candidate.lower().replace("_", " ")))
            if own:
                phi[f"{stage}overlap"] = len(own & words) / len(own)
            out.append(phi)
        return out

    def scores(self, phis: Sequence[Mapping[str, float]]) -> list[float]:
        return [sum(self._w.get(f, 0.0) * v for f, v in phi.items()) for phi in phis]

    def probabilities(
        self, phis: Sequence[Mapping[str, float]], temperature: float = 1.0
    ) -> list[float]:
        """The model's distribution over the candidates at ``temperature``."""
        return softmax([s / temperature for s in self.scores(phis)])

    def learn(self, phis: Sequence[Mapping[str, float]], chosen: Sequence[int]) -> None:
        """One AdaGrad step towards the candidates at indices ``chosen``."""
        if not chosen:
            return
        p = self.probabilities(phis)
        target = [0.0] * len(phis)
        for i in chosen:
            target[i] += 1.0 / len(chosen)
        grad: dict[str, float] = {}
        for phi, t, q in zip(phis, target, p, strict=True):
            for f, v in phi.items():
                grad[f] = grad.get(f, 0.0) + (t - q) * v
        for f, g in grad.items():
            g -= self.l2 * self._w.get(f, 0.0)
            self._g2[f] = self._g2.get(f, 0.0) + g * g
            self._w[f] = self._w.get(f, 0.0) + self.learning_rate * g / (
                math.sqrt(self._g2[f]) + 1e-8
            )
        self.learned += 1




_NOT_TEXT = frozenset((FEATURES_KEY, EVIDENCE_KEY))
"""Evidence entries that are not what the branch says: the listed features (read on their
own) and the workload's name for the evidence."""


def _evidence_words(evidence: Mapping[str, Any], skip: Sequence[str] = ()) -> set[str]:
    words: set[str] = set()
    for key in evidence:  # NOTE: by key, so features built when read are not built here
        if key not in _NOT_TEXT and key not in skip:
            for text in _strings(evidence[key]):
                words.update(_WORD.findall(text.lower().replace("_", " ")))
    return words


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, Sequence):
        return [s for v in value for s in _strings(v)]
    return []


# -- votes, prompts, parsing ------------------------------------------------------------------


def rank_by_votes(
    votes: Sequence[str],
    pool: Sequence[str],
    prior: Sequence[float] | None = None,
    pad: bool = False,
) -> list[str]:
    """Candidates of ``pool`` by vote count, best first.

    Ties break by ``prior`` (higher first), then by position in ``pool``, so equal votes
    always order the same way. Candidates no vote named are left out unless ``pad``, which
    appends them in the same tie order.
    """
    counts = Counter(v for v in votes if v in pool)
    prior = prior if prior is not None else [0.0] * len(pool)
    order = sorted(range(len(pool)), key=lambda i: (-counts[pool[i]], -prior[i], i))
    return [pool[i] for i in order if pad or counts[pool[i]]]


def render_prompt(ctx: BranchContext, pool: Sequence[str], max_context_chars: int) -> str:
    """The drafter's prompt: the branch, its evidence (the last ``max_context_chars``) and
    the candidates to choose from. The same for every sample of a branch, so an engine
    with prefix caching computes it once."""
    evidence = _plain({k: ctx.evidence[k] for k in ctx.evidence if k not in _NOT_TEXT})
    text = json.dumps(evidence, sort_keys=True, ensure_ascii=False)
    text = text[-max_context_chars:] if max_context_chars else ""
    options = "\n".join(f"- {c}" for c in pool)
    return (
        f"Predict the next decision of {ctx.coordinate}.\nContext: {text}\n"
        f"Candidates:\n{options}\nAnswer with exactly one candidate.\nAnswer: "
    )


_LEFT_OUT = object()


def _plain(value: Any) -> Any:
    """``value`` as JSON would write it, without what is not text or numbers (left out).

    NOTE: evidence may carry the objects a predictor reads (ReAct's passage index for the
    entity ranker); written with ``default=str`` they put their memory address into the
    prompt, so its token count, the draft's engine time and every later timestamp of a run
    varied with where the object landed in memory (three values of a 100-request ReAct
    drafter replay's mean latency across runs). A set is written sorted, as a list.
    """
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, numbers.Integral):  # e.g. numpy's, which JSON cannot write
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, Mapping):
        items = ((str(k), _plain(v)) for k, v in value.items()
                 if k is None or isinstance(k, str | int | float | bool))
        return {k: v for k, v in items if v is not _LEFT_OUT}
    if isinstance(value, list | tuple):
        return [v for v in map(_plain, value) if v is not _LEFT_OUT]
    if isinstance(value, set | frozenset):
        return sorted((v for v in map(_plain, value) if v is not _LEFT_OUT), key=repr)
    return _LEFT_OUT


THINK_END = "</think>"


def parse_vote(text: str, pool: Sequence[str]) -> str | None:
    """The candidate an engine's output names after any reasoning (``</think>``): an exact
    answer, else the candidate named earliest (the longer one at the same place), ignoring
    case; ``None`` if none is."""
    text = text.rsplit(THINK_END, 1)[-1]
    answer = text.strip().strip("\"'`.").strip()
    if answer in pool:
        return answer
    low = text.lower()
    found = [(low.find(c.lower()), -len(c), c) for c in pool if c and c.lower() in low]
    return min(found)[2] if found else None


# -- the predictor ----------------------------------------------------------------------------


class DrafterPredictor(DraftingPredictor):
    """Ranks a branch's candidates by N sampled drafts (see the module docstring)."""

    name = "drafter"

    def __init__(self, config: DrafterConfig | None = None, **options: Any) -> None:
        self.config = config or DrafterConfig(**options)
        if config is not None and options:
            raise ValueError("pass either a DrafterConfig or its fields, not both")
        self.model = ChoiceModel(self.config.learning_rate, self.config.l2)
        self._previous: OrderedDict[Hashable, str] = OrderedDict()
        self._calls = 0

    # -- what is drafted over -------------------------------------------------------------

    def pool(self, ctx: BranchContext) -> tuple[tuple[str, ...], bool]:
        """The candidates to draft over and whether they were proposed (open vocabulary)."""
        if ctx.candidates:
            return tuple(dict.fromkeys(ctx.candidates)), False
        if ctx.evidence.get("passages"):
            return tuple(rank_entities(ctx.evidence, self.config.proposals)), True
        return (), False

    def _key(self, ctx: BranchContext) -> Hashable:
        return (ctx.request_id, ctx.coordinate.workflow, ctx.coordinate.stage)

    def _features(self, ctx: BranchContext) -> tuple[tuple[str, ...], list[dict[str, float]]]:
        pool, proposed = self.pool(ctx)
        previous = self._previous.get(self._key(ctx), NO_PREVIOUS)
        return pool, self.model.features(ctx, pool, previous, proposed)

    def probabilities(self, ctx: BranchContext) -> dict[str, float]:
        """The choice model's distribution over the pool (at temperature 1)."""
        pool, phis = self._features(ctx)
        return dict(zip(pool, self.model.probabilities(phis), strict=True))

    def expected_ranking(self, ctx: BranchContext, k: int) -> list[str]:
        """The pool by model probability: the ranking N → ∞ samples converge to."""
        pool, phis = self._features(ctx)
        p = self.model.probabilities(phis)
        return rank_by_votes((), pool, p, pad=True)[: max(k, 0)]

    # -- drafting -------------------------------------------------------------------------

    def sample(self, ctx: BranchContext) -> tuple[tuple[str, ...], list[float], list[str]]:
        """The pool, its model probabilities, and N samples at the configured temperature
        (what :meth:`rank` and :meth:`draft` vote with; deterministic per branch)."""
        pool, phis = self._features(ctx)
        if not pool:
            return pool, [], []
        p = self.model.probabilities(phis)
        sharp = self.model.probabilities(phis, self.config.temperature)
        rng = random.Random(f"{self.config.seed}|{ctx.request_id}|{ctx.coordinate}")
        cumulative, total = [], 0.0
        for q in sharp:
            total += q
            cumulative.append(total)
        samples = []
        for _ in range(self.config.samples):
            x = rng.random() * total
            samples.append(
                pool[next((i for i, c in enumerate(cumulative) if x < c), len(pool) - 1)]
            )
        return pool, p, samples

    def rank(self, ctx: BranchContext, k: int) -> list[str]:
        """The draft's ranking with no engine: the choice model's N samples, by vote."""
        if k <= 0:
            return []
        pool, p, samples = self.sample(ctx)
        return rank_by_votes(samples, pool, p, self.config.pad)[:k]

    async def draft(
        self, ctx: BranchContext, k: int, generate: Generate, now: Callable[[], float] | None = None
    ) -> Draft:
        """Draft ``ctx`` on an engine: N concurrent calls through ``generate``, ranked by vote.

        ``now`` is the caller's clock for ``setup_s``; without it the engine's own times are
        used (first arrival to last finish). Cancelling the draft cancels its calls.
        """
        pool, p, samples = self.sample(ctx)
        if not pool or k <= 0:
            return Draft((), 0.0, ())
        requests = self._requests(ctx, pool, samples)
        start = now() if now is not None else None
        results = await asyncio.gather(*(generate(r) for r in requests))
        if start is not None:
            setup_s = now() - start
        else:
            setup_s = max(r.finished_at for r in results) - min(r.arrived_at for r in results)
        parsed = [parse_vote(r.text, pool) for r in results]
        votes = tuple(v if v is not None else s for v, s in zip(parsed, samples, strict=True))
        ranked = rank_by_votes(votes, pool, p, self.config.pad)[:k]
        return Draft(
            tuple(ranked),
            setup_s,
            votes,
            sum(v is not None for v in parsed),
            sum(r.output_tokens for r in results),
        )

    def _requests(
        self, ctx: BranchContext, pool: Sequence[str], samples: Sequence[str]
    ) -> list[GenerateRequest]:
        """One drafter call per sample: the same prompt, the sample as the replayed text."""
        prompt = render_prompt(ctx, pool, self.config.max_context_chars)
        think = self.config.think_tokens
        lead = f"<think>{' .' * think}{THINK_END}" if think else ""
        budget = min(self.config.max_tokens, max(count_tokens(c) for c in pool) + 1)
        budget += count_tokens(lead)
        # NOTE: per-sample engine seeds, so a real engine's N samples differ reproducibly
        base = zlib.crc32(f"{self.config.seed}|{ctx.request_id}|{ctx.coordinate}".encode())
        self._calls += 1
        return [
            GenerateRequest(
                request_id=f"draft/{ctx.request_id}/{ctx.coordinate}/{self._calls}/{i}",
                prompt=prompt,
                max_tokens=budget,
                replay_text=lead + sample,
                priority=SPECULATIVE,
                temperature=self.config.temperature,
                seed=(base + i) % 2**31,
                session=ctx.request_id,
            )
            for i, sample in enumerate(samples)
        ]

    # -- learning -------------------------------------------------------------------------

    def observe(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        """Learn the branch's choice, and remember it as the request's previous choice."""
        pool, phis = self._features(ctx)
        taken = set(chosen)
        self.model.learn(phis, [i for i, c in enumerate(pool) if c in taken])
        self.remember(ctx, chosen)

    def remember(self, ctx: BranchContext, chosen: tuple[str, ...]) -> None:
        """Keep ``chosen`` as the request's previous choice at this stage (no learning)."""
        key = self._key(ctx)
        self._previous[key] = ",".join(sorted(set(chosen))) or NO_PREVIOUS
        self._previous.move_to_end(key)
        while len(self._previous) > self.config.history:
            self._previous.popitem(last=False)
