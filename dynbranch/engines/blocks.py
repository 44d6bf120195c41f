"""The simulated engine's KV memory: a fixed pool of blocks with vLLM-style prefix caching.

A full block's key chains through its parent's key (vLLM v1's block hashes), so two
requests share a cached block only when their whole prefixes up to it agree; the cache salt
seeds the chain, isolating tenants.
"""

from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from itertools import islice, takewhile
from operator import is_not


def block_hash(parent: bytes, token_ids: Sequence[int]) -> bytes:
    """The prefix-cache key of a full block: chained through its parent's key."""
    return hashlib.sha256(parent + struct.pack(f"<{len(token_ids)}I", *token_ids)).digest()


def root_hash(cache_salt: str | None) -> bytes:
    """The parent key of a request's first block: its cache salt isolates its prefixes."""
    return hashlib.sha256(b"salt:" + (cache_salt or "").encode("utf-8")).digest()


_is_block = partial(is_not, None)
"""Whether a cache lookup found a block (``None is not`` it)."""


class BlockPool:
    """A fixed pool of KV blocks with vLLM-style prefix caching.

    A block is *free* when no request references it. A free block may still hold the KV of
    a full, hashed block (it stays findable through :meth:`lookup`) until :meth:`allocate`
    reuses it; free blocks are reused least recently freed first.
    """

    def __init__(self, num_blocks: int, caching: bool = True) -> None:
        self.num_blocks = num_blocks
        self.caching = caching
        self._refs = [0] * num_blocks
        self._hash: list[bytes | None] = [None] * num_blocks
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._cached: dict[bytes, int] = {}

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_cached(self) -> int:
        """Blocks whose KV can be found by hash (referenced or not)."""
        return len(self._cached)

    def lookup(self, hashes: Sequence[bytes], limit: int | None = None) -> list[int]:
        """The cached blocks of the longest prefix of ``hashes`` (of its first ``limit``)."""
        if not self.caching:
            return []
        # NOTE: at C speed, up to the first miss (a long prompt has hundreds of blocks)
        # (typed as a map to blocks: the misses it yields stop the takewhile, never returned)
        cached: Callable[[bytes], int] = self._cached.get  # type: ignore[assignment]
        return list(takewhile(_is_block, map(cached, islice(hashes, limit))))

    def key_of(self, block: int) -> bytes | None:
        """The key of the full block whose KV ``block`` holds, if it is cached."""
        return self._hash[block]

    def free_order(self) -> Iterator[int]:
        """Free blocks in the order :meth:`allocate` will hand them out (do not allocate
        while iterating)."""
        return iter(self._free)

    def free_among(self, blocks: Sequence[int]) -> int:
        """How many of ``blocks`` are free (and would stop being so if touched)."""
        return sum(1 for b in blocks if self._refs[b] == 0)

    def touch(self, blocks: Sequence[int]) -> None:
        """Take a reference on cached blocks a request reuses."""
        refs, free = self._refs, self._free
        for b in blocks:
            if refs[b] == 0:
                del free[b]
            refs[b] += 1

    def allocate(self, n: int) -> list[int]:
        """``n`` fresh blocks, evicting the cached KV they held."""
        assert n <= self.num_free, "caller checks num_free first"
        out = []
        pop, refs, keys, cached = self._free.popitem, self._refs, self._hash, self._cached
        for _ in range(n):
            b, _ = pop(last=False)
            key = keys[b]
            if key is not None:  # it held a cached block: that KV is gone now
                del cached[key]
                keys[b] = None
            refs[b] = 1
            out.append(b)
        return out

    def release(self, blocks: Sequence[int]) -> None:
        """Drop a request's references; unused blocks become free but stay cached."""
        # NOTE: tail first, so a prefix's last blocks are evicted before its first (vLLM).
        refs, free = self._refs, self._free
        for b in reversed(blocks):
            left = refs[b] = refs[b] - 1
            if left == 0:
                free[b] = None

    def cache(self, block: int, key: bytes) -> None:
        """Record that ``block`` holds the full block ``key`` (first holder wins)."""
        if self.caching and key not in self._cached:
            self._cached[key] = block
            self._hash[block] = key
