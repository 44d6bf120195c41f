"""The load view C3 prices against, and its causal envelope (DESIGN.md §3, eq. 3).

A :class:`LoadView` is three normalised numbers: fill occupancy ``o_fill`` (speculative
sequences running or waiting over the fill slot budget), reservation-budget occupancy
``o_kv`` (speculative KV blocks over the speculative KV budget) and canonical-demand
pressure ``rho`` (canonical sequences running or waiting over the engines' sequence
slots). :class:`LoadEnvelope` keeps, per component, the maximum over the last ``H``
seconds of the piecewise-constant signal the observations describe: a rise counts at once,
a fall only once the higher value has been out of effect for a whole window.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, fields

from dynbranch.engines.client import DownSnapshot
from dynbranch.engines.profile import Profile
from dynbranch.engines.protocol import LoadSnapshot

DEFAULT_FILL_SLOTS = 48
"""Speculative sequences one engine may hold (Fig. 5b's largest co-resident count)."""
DEFAULT_SPEC_KV_FRACTION = 0.25
"""Share of an engine's KV pool fills may reserve (Fig. 5b's fills reach 24 %)."""


@dataclass(frozen=True)
class LoadBudget:
    """What the load view is normalised by: per-engine budgets, times ``engines``.

    ``fill_slots`` and ``spec_kv_blocks`` are the speculative budgets of one engine;
    ``max_num_seqs`` is its sequence-slot limit (vLLM's ``max_num_seqs``).
    """

    fill_slots: int
    spec_kv_blocks: int
    max_num_seqs: int
    block_size: int = 16
    engines: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LoadBudget.{f.name} must be an int >= 1, got {value!r}")

    @classmethod
    def from_profile(
        cls,
        profile: Profile,
        *,
        engines: int = 1,
        fill_slots: int = DEFAULT_FILL_SLOTS,
        spec_kv_fraction: float = DEFAULT_SPEC_KV_FRACTION,
    ) -> LoadBudget:
        """Budgets for ``engines`` engines serving ``profile``."""
        if not 0.0 < spec_kv_fraction <= 1.0:
            raise ValueError(f"spec_kv_fraction must be in (0, 1], got {spec_kv_fraction}")
        return cls(
            fill_slots=fill_slots,
            spec_kv_blocks=max(1, int(profile.kv_pool_blocks * spec_kv_fraction)),
            max_num_seqs=profile.scheduler.max_num_seqs,
            block_size=profile.scheduler.block_size,
            engines=engines,
        )

    @property
    def total_fill_slots(self) -> int:
        return self.fill_slots * self.engines

    @property
    def total_spec_kv_blocks(self) -> int:
        return self.spec_kv_blocks * self.engines

    @property
    def total_seq_slots(self) -> int:
        return self.max_num_seqs * self.engines


def _unit(name: str, value: float) -> None:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"LoadView.{name} must be in [0, 1], got {value!r}")


@dataclass(frozen=True)
class LoadView:
    """``V = (o_fill, o_kv, rho)``, each in [0, 1], the engines' utilisation ``busy`` and
    their step ``stretch``.

    ``busy`` (the share of recent time the engines spent executing steps) completes the
    canonical-demand pressure: ``rho`` counts sequences, ``busy`` says how close the engines
    are to saturation, where added work turns into queueing for everything behind it.
    ``stretch`` (>= 1) is the engines' mean recent step time over an idle engine's step:
    how much the batch they carry already slows every sequence in it.
    """

    o_fill: float = 0.0
    o_kv: float = 0.0
    rho: float = 0.0
    busy: float = 0.0
    stretch: float = 1.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name == "stretch":
                if not (math.isfinite(self.stretch) and self.stretch >= 1.0):
                    raise ValueError(f"LoadView.stretch must be finite and >= 1, got "
                                     f"{self.stretch!r}")
                continue
            _unit(f.name, getattr(self, f.name))

    @classmethod
    def from_snapshots(cls, snapshots: Sequence[LoadSnapshot], budget: LoadBudget) -> LoadView:
        """Aggregate the engines' snapshots into one view normalised by ``budget``.

        NOTE: every engine must report; a missing one would silently read as idle and
        underprice the fills placed on the others. An engine that is down reports a
        :class:`~dynbranch.engines.client.DownSnapshot`: it has no capacity, so the budget
        shrinks to the engines that are up (the load on them reads higher, as it is), and
        with none up the view is saturated (nothing can be admitted).
        """
        if len(snapshots) != budget.engines:
            raise ValueError(
                f"expected one snapshot per engine ({budget.engines}), got {len(snapshots)}"
            )
        up = [s for s in snapshots if not isinstance(s, DownSnapshot)]
        if not up:
            return cls(1.0, 1.0, 1.0, 1.0)
        share = len(up) / budget.engines
        spec = sum(s.spec_running + s.spec_waiting for s in up)
        spec_kv = sum(s.spec_kv_blocks for s in up)
        canonical = sum((s.running - s.spec_running) + (s.waiting - s.spec_waiting) for s in up)
        return cls(
            o_fill=_capped(spec / (budget.total_fill_slots * share)),
            o_kv=_capped(spec_kv / (budget.total_spec_kv_blocks * share)),
            rho=_capped(canonical / (budget.total_seq_slots * share)),
            busy=_capped(sum(s.busy for s in up) / len(up)),
            stretch=max(1.0, sum(s.stretch for s in up) / len(up)),
        )

    def max(self, other: LoadView) -> LoadView:
        """The per-component maximum of two views."""
        return LoadView(
            max(self.o_fill, other.o_fill), max(self.o_kv, other.o_kv),
            max(self.rho, other.rho), max(self.busy, other.busy),
            max(self.stretch, other.stretch),
        )

    def with_fill(self, fill_share: float, kv_share: float) -> LoadView:
        """This view with one more fill's slot and KV shares added (capped at 1)."""
        return LoadView(_capped(self.o_fill + fill_share), _capped(self.o_kv + kv_share),
                        self.rho, self.busy, self.stretch)

    def as_tuple(self) -> tuple[float, float, float, float, float]:
        return (self.o_fill, self.o_kv, self.rho, self.busy, self.stretch)


def _capped(x: float) -> float:
    return min(1.0, max(0.0, x))


class _WindowMax:
    """Max over ``[now - H, now]`` of a piecewise-constant signal, in bounded memory.

    Each observation holds until the next one. When a value is superseded it becomes a
    closed interval ``(end, value)``; closed intervals live in a deque with strictly
    decreasing values (a later-ending interval with a value at least as high makes an
    earlier one irrelevant), so memory is bounded by the observations of one window.
    """

    def __init__(self, window_s: float) -> None:
        self.window_s = window_s
        self.current: float | None = None
        self._closed: deque[tuple[float, float]] = deque()

    def observe(self, value: float, now: float) -> None:
        if self.current is not None:
            while self._closed and self._closed[-1][1] <= self.current:
                self._closed.pop()
            self._closed.append((now, self.current))
        self.current = value
        self._expire(now)

    def value(self, now: float) -> float:
        self._expire(now)
        if self.current is None:
            return 0.0
        return max(self.current, self._closed[0][1]) if self._closed else self.current

    def _expire(self, now: float) -> None:
        # NOTE: an interval that ended exactly at now - H no longer covers the window.
        start = now - self.window_s
        while self._closed and self._closed[0][0] <= start:
            self._closed.popleft()

    def __len__(self) -> int:
        return len(self._closed)


class LoadEnvelope:
    """The causal load envelope ``V_H(t) = max_{tau in [t-H, t]} V_tau`` (per component).

    ``H`` is the execution window used to estimate co-residency: a fill admitted now holds
    its slots for about that long, so a load that was high within the last ``H`` seconds is
    priced as if it still were. Before any observation the envelope reads as idle.
    """

    def __init__(self, window_s: float) -> None:
        if not (math.isfinite(window_s) and window_s >= 0.0):
            raise ValueError(f"envelope window must be finite and >= 0 s, got {window_s!r}")
        self.window_s = window_s
        self._parts = tuple(_WindowMax(window_s) for _ in fields(LoadView))
        self._last: float | None = None

    def set_window(self, window_s: float) -> None:
        """Set ``H`` (e.g. to the measured co-residency window); applies from now on."""
        if not (math.isfinite(window_s) and window_s >= 0.0):
            raise ValueError(f"envelope window must be finite and >= 0 s, got {window_s!r}")
        self.window_s = window_s
        for part in self._parts:
            part.window_s = window_s

    def observe(self, view: LoadView, now: float) -> None:
        """Record the view measured at ``now`` (time must not go backwards)."""
        self._advance(now)
        for part, value in zip(self._parts, view.as_tuple(), strict=True):
            part.observe(value, now)

    def priced(self, now: float) -> LoadView:
        """The view to price against at ``now``."""
        self._advance(now)
        *parts, stretch = (part.value(now) for part in self._parts)
        return LoadView(*parts, max(1.0, stretch))  # NOTE: no reading yet: an idle step

    @property
    def retained(self) -> int:
        """Closed intervals held across components (bounded by one window's observations)."""
        return sum(len(p) for p in self._parts)

    def _advance(self, now: float) -> None:
        if not math.isfinite(now):
            raise ValueError(f"time must be finite, got {now!r}")
        if self._last is not None and now < self._last:
            raise ValueError(f"time went backwards: {now} < {self._last}")
        self._last = now
