"""The plain-dict model of the subgraph store that ``tests/test_reuse_stateful.py`` drives.

It predicts every result of the store exactly: lookups, puts with their evictions,
promotions, invalidation levels, write marks and their contention, counters.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from dynbranch.reuse import MissReason, Record, ReuseKey, Ticket

KEYS = [ReuseKey("fp", {"i": i}, "m", "r", {}, None, tenant)
        for tenant in ("a", "b") for i in range(6)]
INDEX = {k.key_bytes(): i for i, k in enumerate(KEYS)}
RESOURCES = ("r0", "r1", "r2")


def tiny_hash(data: bytes) -> str:
    return f"n{hashlib.sha256(data).digest()[0] % 7}"


@dataclass
class M:
    """The model of one stored record."""

    key: int
    committed: bool
    reads: dict[str, str]
    upstream: tuple[str, ...]
    size: int
    cost: float
    value: Any
    used: float
    hits: int = 0


@dataclass
class Model:
    capacity: int
    policy: str
    versions: dict[str, str] = field(default_factory=dict)
    external: dict[str, bool] = field(default_factory=dict)
    recs: dict[str, M] = field(default_factory=dict)
    gone: dict[str, MissReason] = field(default_factory=dict)
    pins: dict[str, set[int]] = field(default_factory=dict)
    inflight: dict[str, Ticket] = field(default_factory=dict)
    open: set[int] = field(default_factory=set)
    writing: dict[int, frozenset[str] | None] = field(default_factory=dict)
    contended: dict[int, set[str]] = field(default_factory=dict)  # overlapped on these
    contended_all: set[int] = field(default_factory=set)  # overlapped on everything
    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(
        ("hits", "misses", "collisions", "stale", "writing", "shadow_matches", "joins", "puts",
         "refused", "promotions", "drops", "lost", "evictions", "invalidated_direct",
         "invalidated_cascade", "writes_announced", "writes_committed"), 0))

    @property
    def bytes(self) -> int:
        return sum(m.size for m in self.recs.values())

    def remove(self, name: str, reason: MissReason | None) -> None:
        del self.recs[name]
        self.pins.pop(name, None)
        if reason is not None:
            self.gone[name] = reason

    def stale_reads(self, name: str) -> dict[str, tuple[str, str | None]]:
        m = self.recs[name]
        return {r: (v, self.versions.get(r)) for r, v in m.reads.items()
                if self.versions.get(r) != v}

    def closure(self, name: str) -> set[str]:
        closure, todo = {name}, [name]
        while todo:
            for u in self.recs[todo.pop()].upstream:
                if u in self.recs and u not in closure:
                    closure.add(u)
                    todo.append(u)
        return closure

    def stale_roots(self, name: str) -> dict[str, dict]:
        return {n: self.stale_reads(n) for n in self.closure(name) if self.stale_reads(n)}

    def announce(self, rid: int, resources: frozenset[str] | None) -> None:
        for other, theirs in self.writing.items():
            if resources is None and theirs is None:
                self.contended_all |= {rid, other}
                continue
            shared = set(theirs if resources is None else resources if theirs is None
                         else resources & theirs)
            for r in (rid, other):
                self.contended.setdefault(r, set()).update(shared)
        self.writing[rid] = resources

    def contend(self, res: str) -> None:
        for rid, theirs in self.writing.items():
            if theirs is None or res in theirs:
                self.contended.setdefault(rid, set()).add(res)

    def is_contended(self, rid: int, res: str) -> bool:
        return rid in self.contended_all or res in self.contended.get(rid, ())

    def marked(self, res: str) -> bool:
        return any(rs is None or res in rs for rs in self.writing.values())

    def being_written(self, name: str) -> bool:
        return any(self.marked(r) for n in self.closure(name) for r in self.recs[n].reads)

    def cascade(self, roots) -> tuple[tuple[str, ...], ...]:
        levels, level, seen = [], sorted(set(roots)), set(roots)
        while level:
            for n in level:
                self.remove(n, MissReason.INVALIDATED)
            levels.append(tuple(level))
            nxt = {n for n, m in self.recs.items() if n not in seen
                   and any(u in level for u in m.upstream)}
            seen |= nxt
            level = sorted(nxt)
        if levels:
            self.counts["invalidated_direct"] += len(levels[0])
            self.counts["invalidated_cascade"] += sum(len(lv) for lv in levels[1:])
        return tuple(levels)

    def order(self, name: str) -> tuple:
        m = self.recs[name]
        prio = (m.used,) if self.policy == "lru" else (m.cost / m.size, m.used)
        return (int(m.committed), prio)

    def expect_put(self, r: Record, key: int) -> tuple[str, list[str]]:
        for res, v in r.read_set.items():
            self.versions.setdefault(res, v)
        if any(self.marked(res) for res in r.read_set):
            return "writing", []
        if any(self.versions[res] != v for res, v in r.read_set.items()):
            return "stale", []
        if any(self.gone.get(u) is MissReason.INVALIDATED for u in r.provenance.upstream):
            return "stale", []  # rendered from a record a write already invalidated
        if r.size > self.capacity:
            return "too_large", []
        old = self.recs.get(r.name)
        if old and not r.committed and old.committed and old.key == key:
            return "kept_committed", []
        extra = r.size - (old.size if old else 0)
        protected = {n for n in self.recs if n in self.pins or n in self.inflight
                     or n == r.name}
        held = self.bytes
        if held + extra - self.capacity > 0 and \
                held - sum(self.recs[n].size for n in protected) < held + extra - self.capacity:
            return "no_room", []
        evicted = []
        for n in sorted((n for n in self.recs if n not in protected), key=self.order):
            if held + extra <= self.capacity:
                break
            evicted.append(n)
            held -= self.recs[n].size
        return ("replaced" if old else "stored"), evicted
