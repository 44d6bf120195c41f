"""Eviction policies: one priority function each; the store owns the heap (as SGLang does).

The store evicts the entry with the *lowest* priority first. A priority may only depend on
what changes when the store touches the entry (insert, hit, promote), because the store
re-queues an entry exactly then.
"""

from __future__ import annotations

from typing import Protocol

from dynbranch.errors import UnknownNameError


class Evictable(Protocol):
    """What a policy may read about a stored record."""

    @property
    def size(self) -> int: ...

    @property
    def cost_ms(self) -> float: ...

    @property
    def last_used(self) -> float: ...

    @property
    def hits(self) -> int: ...


class EvictionPolicy(Protocol):
    """Orders records for eviction; lowest priority goes first."""

    name: str

    def priority(self, entry: Evictable) -> tuple[float, ...]: ...


class LRU:
    """Least recently used first (the default)."""

    name = "lru"

    def priority(self, entry: Evictable) -> tuple[float, ...]:
        return (entry.last_used,)


class CostAware:
    """Least execution saved per byte held first (``cost_ms / size``); ties go LRU.

    NOTE: this is Eq. (1)'s T^sub per byte: under a byte budget, keeping the records that
    save the most milliseconds per byte maximises the saving the budget can buy.
    """

    name = "cost"

    def priority(self, entry: Evictable) -> tuple[float, ...]:
        return (entry.cost_ms / max(entry.size, 1), entry.last_used)


POLICIES: dict[str, type[LRU] | type[CostAware]] = {"lru": LRU, "cost": CostAware}


def make_policy(name: str) -> EvictionPolicy:
    """The eviction policy called ``name`` (see :data:`POLICIES`)."""
    try:
        return POLICIES[name]()
    except KeyError:
        raise UnknownNameError("eviction policy", name, list(POLICIES)) from None
