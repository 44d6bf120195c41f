"""Remember recent long keys, and find the one sharing the longest prefix with a new key.

Agentic prompts share long prefixes (a system prompt, tool schemas, the conversation so
far), so work that runs along a prompt from its start (splitting it into token pieces,
chaining block hashes through it) can reuse what it computed for an earlier prompt, up to
where the two part. :class:`RecentPrefixes` is the bounded memory behind that reuse: the
last ``capacity`` keys (``str`` or ``bytes``), each with a value, kept sorted so that the one
sharing the longest prefix with a new key sits next to where the new key would be inserted.
Finding it takes two prefix comparisons, not one per remembered key.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import OrderedDict
from collections.abc import Hashable
from typing import Generic, TypeVar

K = TypeVar("K", str, bytes)
V = TypeVar("V")


def shared_prefix(a: K, b: K) -> int:
    """Length of the longest common prefix of ``a`` and ``b`` (C-speed slice compares)."""
    if a[:64] != b[:64]:
        n = 0
        while n < 64 and n < len(a) and n < len(b) and a[n] == b[n]:
            n += 1
        return n
    limit = min(len(a), len(b))
    lo, step = 64, 1024  # a[:lo] == b[:lo]; gallop, then bisect the mismatching span
    while lo < limit:
        hi = min(limit, lo + step)
        if a[lo:hi] != b[lo:hi]:
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if a[lo:mid] == b[lo:mid]:
                    lo = mid
                else:
                    hi = mid
            return lo if a[lo] != b[lo] else hi
        lo, step = hi, step * 2
    return limit


class RecentPrefixes(Generic[K, V]):
    """The last ``capacity`` keys, each with a value; the oldest is forgotten first."""

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"RecentPrefixes capacity={capacity} must be >= 1")
        self.capacity = capacity
        self._values: OrderedDict[K, V] = OrderedDict()  # oldest first
        self._sorted: list[K] = []

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[K]:
        """The remembered keys, oldest first."""
        return list(self._values)

    def get(self, key: K) -> V | None:
        """The value remembered under exactly ``key`` (it becomes the most recent)."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def nearest(self, key: K) -> tuple[V | None, int]:
        """The value of the remembered key sharing the longest prefix with ``key``, and the
        length of that prefix (``(None, 0)`` when none shares a first item)."""
        keys = self._sorted
        at = bisect_left(keys, key)
        best, shared = None, 0
        for i in (at - 1, at):
            if 0 <= i < len(keys):
                n = shared_prefix(keys[i], key)
                if n > shared:
                    best, shared = self._values[keys[i]], n
        return best, shared

    def add(self, key: K, value: V) -> None:
        """Remember ``value`` under ``key``, forgetting the oldest keys past ``capacity``."""
        if key in self._values:
            self._values[key] = value
            self._values.move_to_end(key)
            return
        self._values[key] = value
        insort(self._sorted, key)
        while len(self._values) > self.capacity:
            old, _ = self._values.popitem(last=False)
            del self._sorted[bisect_left(self._sorted, old)]


class RecentPrefixesByKey(Generic[K, V]):
    """One :class:`RecentPrefixes` of ``capacity`` per key (a cache salt: prefixes are never
    shared across salts), for at most ``keys`` keys; all are forgotten when one more comes."""

    def __init__(self, capacity: int, keys: int) -> None:
        if keys < 1:
            raise ValueError(f"RecentPrefixesByKey keys={keys} must be >= 1")
        self.capacity, self.keys = capacity, keys
        self._memos: dict[Hashable, RecentPrefixes[K, V]] = {}

    def __getitem__(self, key: Hashable) -> RecentPrefixes[K, V]:
        memo = self._memos.get(key)
        if memo is None:
            if len(self._memos) >= self.keys:
                self._memos.clear()
            memo = self._memos[key] = RecentPrefixes(self.capacity)
        return memo

    def __len__(self) -> int:
        return len(self._memos)
