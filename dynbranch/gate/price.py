"""The contention price ``C_s(V)``: what one fill costs canonical traffic, in milliseconds.

Derived from the sim engine's step model (:meth:`Profile.step_cost`): a step costs
``max(compute, memory) + overheads``, where memory is every weight once plus each scheduled
sequence's KV context, and compute is each scheduled token's FLOPs. A fill co-resident
with ``n`` canonical sequences

* lengthens each step it decodes in by ``Δdecode`` — its KV read and KV write over the
  achieved bandwidth, plus the per-sequence host overhead (or its FLOPs, once the step is
  compute-bound) — for each of its ``output_tokens - 1`` decode steps;
* lengthens each step it prefills in by ``Δprefill`` — its prompt chunk's FLOPs, less what
  hides under the step's weight-read time.

Every canonical sequence sharing those steps waits that much longer, so the price is
``n · (decode_steps · Δdecode + Δprefill) · scale`` with ``n = rho · max_num_seqs``, as
DESIGN §3 specifies; ``queueing=True`` multiplies it by the queueing factor of a busy
engine (:func:`queueing_factor`), a departure from the design kept only as a switch.
``scale`` is the one factor :func:`dynbranch.calibrate.calibrate_price` fits against the
running sim engine.

NOTE: the marginal cost of adding work ``(a FLOP-seconds, b byte-seconds)`` to a step with
compute ``C`` and memory ``M`` is ``max(C + a, M + b) - max(C, M)``. We use the upper bound
``max(a - max(0, M_w - C), b)``, where ``M_w`` is the weight-read time alone: it equals the
exact marginal while the batch is memory-bound and far from the knee (the common case),
never undercharges, and — unlike the exact marginal, which *falls* when other sequences
add memory traffic that the prefill can hide under — never decreases as load rises. The
price is therefore monotone in every load component, fill size and context.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from typing import Any

from dynbranch.engines.profile import Profile
from dynbranch.gate.load import LoadBudget, LoadView

BUSY_CAP = 0.95
"""Utilisation at which the queueing factor stops growing (it is 20 there)."""


def queueing_factor(busy: float) -> float:
    """How much added work is amplified by queueing at engine utilisation ``busy``.

    NOTE: co-residency (what :meth:`ContentionModel.delay_per_canonical_ms` prices and the
    sim calibration fits) is only the idle-engine part of a fill's cost. As utilisation
    approaches 1, work added to an engine also delays every request queued behind it; in a
    single-server queue the mean wait grows as ``1 / (1 - u)`` (the Pollaczek–Khinchine
    form), so the co-residency price is scaled by that factor, capped at ``BUSY_CAP``. It
    is 1 on an idle engine, so the calibrated co-residency price is unchanged there.
    """
    return 1.0 / (1.0 - min(max(busy, 0.0), BUSY_CAP))


DEFAULT_CANONICAL_CONTEXT = 1024
"""Tokens of KV a typical canonical sequence holds mid-decode (agentic prompts are ~1-2k)."""


@dataclass(frozen=True)
class FillShape:
    """The work one fill puts on an engine.

    ``prompt_tokens`` are computed in prefill; ``context_tokens`` are already in the KV
    cache (a prefix the fill shares with its request) and are read but not recomputed;
    ``output_tokens`` are decoded, the first by the last prefill step.
    """

    prompt_tokens: int
    output_tokens: int
    context_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.output_tokens < 1 or self.context_tokens < 0:
            raise ValueError(
                f"FillShape needs prompt_tokens >= 1, output_tokens >= 1, context_tokens "
                f">= 0; got {self.prompt_tokens}, {self.output_tokens}, {self.context_tokens}"
            )

    @property
    def decode_steps(self) -> int:
        return self.output_tokens - 1

    def kv_blocks(self, block_size: int) -> int:
        """Blocks the fill allocates beyond its cached context (what to reserve)."""
        end = self.context_tokens + self.prompt_tokens + self.output_tokens - 1
        return math.ceil(end / block_size) - self.context_tokens // block_size


@dataclass(frozen=True)
class ContentionModel:
    """Per-token step costs read from a :class:`Profile`, and the load they are priced at.

    Times are seconds per unit; ``budget`` turns the view's normalised fill and KV
    occupancy back into sequences and tokens on one engine.
    """

    flop_s: float  # seconds per FLOP at the achieved peak (1 / (peak x mfu))
    flops_per_token: float
    lm_head_flops: float
    attention_flops_per_pair: float
    kv_token_s: float  # seconds to move one token's K and V at the achieved bandwidth
    weight_read_s: float  # seconds to read the weights once (the memory floor of a step)
    seq_overhead_s: float
    max_num_batched_tokens: int
    budget: LoadBudget
    canonical_context: int = DEFAULT_CANONICAL_CONTEXT
    scale: float = 1.0
    queueing: bool = False  # NOTE: off by default: DESIGN §3's price has no such factor
    stretched: bool = True  # the price times the view's step stretch (see price_ms)

    def __post_init__(self) -> None:
        if not (math.isfinite(self.scale) and self.scale > 0.0):
            raise ValueError(f"contention scale must be finite and > 0, got {self.scale}")
        if self.canonical_context < 0:
            raise ValueError(f"canonical_context must be >= 0, got {self.canonical_context}")

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        budget: LoadBudget | None = None,
        *,
        canonical_context: int = DEFAULT_CANONICAL_CONTEXT,
        scale: float = 1.0,
        queueing: bool = False,
    ) -> ContentionModel:
        """The model of ``profile``'s step costs, priced against ``budget``."""
        cal = profile.calibration
        bandwidth = profile.bandwidth_bytes_s * cal.bandwidth_efficiency
        return cls(
            flop_s=1.0 / (profile.peak_flops * cal.mfu),
            flops_per_token=float(profile.flops_per_token),
            lm_head_flops=float(profile.lm_head_flops),
            attention_flops_per_pair=float(profile.attention_flops_per_pair),
            kv_token_s=profile.kv_bytes_per_token / bandwidth,
            weight_read_s=profile.weight_read_bytes / bandwidth,
            seq_overhead_s=cal.seq_overhead_us * 1e-6,
            max_num_batched_tokens=profile.scheduler.max_num_batched_tokens,
            budget=budget or LoadBudget.from_profile(profile),
            canonical_context=canonical_context,
            scale=scale,
            queueing=queueing,
        )

    def with_scale(self, scale: float) -> ContentionModel:
        return replace(self, scale=scale)

    # -- the batch at a projected load ------------------------------------------------------

    def canonical_sequences(self, view: LoadView) -> float:
        """Canonical sequences sharing one engine's steps at ``view``."""
        return view.rho * self.budget.max_num_seqs

    def _compute_s(self, context: float, new: float) -> float:
        """Compute time of one sequence computing ``new`` tokens over ``context``."""
        pairs = new * context + new * (new + 1) / 2
        flops = (
            self.flops_per_token * new + self.lm_head_flops + self.attention_flops_per_pair * pairs
        )
        return flops * self.flop_s

    def batch_compute_s(self, view: LoadView) -> float:
        """Compute time of one decode step of the batch ``view`` implies on one engine."""
        canonical = self.canonical_sequences(view) * self._compute_s(self.canonical_context, 1)
        fills = view.o_fill * self.budget.fill_slots
        fill_context = view.o_kv * self.budget.spec_kv_blocks * self.budget.block_size
        per_fill = (self.flops_per_token + self.lm_head_flops) * self.flop_s
        attention = self.attention_flops_per_pair * (fill_context + fills) * self.flop_s
        return canonical + fills * per_fill + attention

    def hideable_s(self, view: LoadView) -> float:
        """Compute a fill may add to a step before the step stops being weight-read bound."""
        return max(0.0, self.weight_read_s - self.batch_compute_s(view))

    # -- one fill's marginal step costs -----------------------------------------------------

    def _marginal_s(self, context: float, new: int, hide: float) -> float:
        a = self._compute_s(context, new)
        b = self.kv_token_s * (context + new)
        return max(a - hide, b) + self.seq_overhead_s

    def decode_step_s(self, fill: FillShape, view: LoadView) -> float:
        """How much one of the fill's decode steps lengthens a shared step (seconds)."""
        if fill.decode_steps == 0:
            return 0.0
        # NOTE: KV reads and attention are linear in context, so the mean context over the
        # decode steps gives the exact total of the memory term.
        mean_context = fill.context_tokens + fill.prompt_tokens + (fill.decode_steps - 1) / 2
        return self._marginal_s(mean_context, 1, self.hideable_s(view))

    def prefill_s(self, fill: FillShape, view: LoadView) -> float:
        """How much the fill's prefill lengthens the steps it runs in (seconds, all chunks).

        NOTE: chunks are cut at the full token budget, i.e. as few and as large as possible:
        each chunk hides under one step's weight read, so fewer chunks is the costlier case.
        """
        hide = self.hideable_s(view)
        total, done = 0.0, 0
        while done < fill.prompt_tokens:
            n = min(self.max_num_batched_tokens, fill.prompt_tokens - done)
            total += self._marginal_s(fill.context_tokens + done, n, hide)
            done += n
        return total

    def delay_per_canonical_ms(self, fill: FillShape, view: LoadView) -> float:
        """The delay one co-resident canonical sequence suffers over the fill's life."""
        seconds = fill.decode_steps * self.decode_step_s(fill, view) + self.prefill_s(fill, view)
        return 1e3 * self.scale * seconds

    def price_ms(self, fill: FillShape, view: LoadView) -> float:
        """``C_s(V)``: the total delay the fill imposes on canonical traffic at ``view``.

        NOTE: summed over the ``rho``-scaled canonical sequences, because the gain it is
        weighed against is one request's saved latency: both sides are then latency summed
        over requests, the quantity mean latency is made of. Zero when no canonical work
        is (or, through the envelope, recently was) present.

        NOTE: times the view's ``stretch`` (mean recent step time over an idle step, 1 on a
        lightly loaded engine), a refinement of DESIGN §3's co-residency price. An engine
        batches every sequence into each step, so it serves them like a processor-sharing
        server: a canonical sequence the fill slows stays longer, shares steps with more
        arrivals and slows them in turn. With step time ``T(n) = T_0 + c n`` the share of a
        step spent on per-sequence work is ``u = 1 - T_0 / T(n)``, and work added to the
        batch is amplified by ``1 / (1 - u) = T(n) / T_0`` — the stretch. Measured on
        Routing (`fig14 --quick`, 480 requests per rate): co-residency alone prices a fill
        within 1 % of the sim's delay to one co-resident sequence (`calibrate_price`), yet
        `full` ran +17.1 % and +38.5 % over the floor at 4 and 16 req/s; with the stretch
        +9.1 % and +23.2 %, and −12.3 % (was −12.2 %) at 0.5 req/s, where it stays near 1.
        """
        price = self.canonical_sequences(view) * self.delay_per_canonical_ms(fill, view)
        if self.stretched:
            price *= view.stretch
        return price * queueing_factor(view.busy) if self.queueing else price

    # -- serialisation -------------------------------------------------------------------------

    def to_state(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> ContentionModel:
        return cls(**{**state, "budget": LoadBudget(**state["budget"])})
