"""The prefix memory behind the tokenizer's, the block hashes' and affinity's reuse."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.prefix_memo import RecentPrefixes, RecentPrefixesByKey, shared_prefix


def naive_shared(a, b) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_shared_prefix_lengths_are_exact() -> None:
    a = "x" * 5000 + "abc" + "y" * 10
    for b, n in [(a, len(a)), (a[:4999] + "z", 4999), ("", 0), ("xy", 1), (a + "!", len(a))]:
        assert shared_prefix(a, b) == n
        assert shared_prefix(b, a) == n
        assert shared_prefix(a.encode(), b.encode()) == n


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=3000), st.integers(0, 3000), st.binary(max_size=50))
def test_shared_prefix_of_bytes_matches_a_plain_loop(a: bytes, cut: int, tail: bytes) -> None:
    b = a[:cut] + tail
    assert shared_prefix(a, b) == naive_shared(a, b)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet="ab", max_size=12), min_size=1, max_size=40),
       st.text(alphabet="ab", max_size=12))
def test_nearest_finds_the_longest_shared_prefix_among_the_kept(keys, probe) -> None:
    memo: RecentPrefixes[str, int] = RecentPrefixes(8)
    for i, key in enumerate(keys):
        memo.add(key, i)
    kept = memo.keys()
    assert len(kept) == min(8, len(set(keys)))
    value, shared = memo.nearest(probe)
    best = max((naive_shared(k, probe) for k in kept), default=0)
    assert shared == best
    if best:
        assert naive_shared(kept[[memo.get(k) for k in kept].index(value)], probe) == best
    else:
        assert value is None


def test_the_oldest_key_is_forgotten_first_and_a_hit_refreshes() -> None:
    memo: RecentPrefixes[str, int] = RecentPrefixes(2)
    memo.add("alpha", 1)
    memo.add("beta", 2)
    assert memo.get("alpha") == 1  # alpha is now the most recent
    memo.add("gamma", 3)
    assert memo.keys() == ["alpha", "gamma"]
    assert memo.nearest("bet") == (None, 0)
    assert memo.nearest("gam") == (3, 3)
    memo.add("alpha", 4)  # replacing keeps one entry
    assert memo.keys() == ["gamma", "alpha"] and len(memo) == 2


def test_each_key_has_its_own_memory_and_their_number_is_bounded() -> None:
    book: RecentPrefixesByKey[str, int] = RecentPrefixesByKey(4, keys=2)
    book["salt-a"].add("shared prompt", 1)
    assert book["salt-b"].nearest("shared prompt") == (None, 0)  # never across keys
    assert book["salt-a"].nearest("shared prompt") == (1, 13)
    assert book["salt-a"] is book["salt-a"] and len(book) == 2
    book["salt-c"]  # one key too many: every memory is forgotten
    assert len(book) == 1 and book["salt-a"].nearest("shared prompt") == (None, 0)
    assert book["salt-a"].capacity == 4


def test_a_memory_needs_room_for_one_key() -> None:
    with pytest.raises(ValueError, match="capacity"):
        RecentPrefixes(0)
    with pytest.raises(ValueError, match="keys"):
        RecentPrefixesByKey(4, keys=0)


# -- its users: what they reuse equals what they would compute afresh ------------------------

token_lists = st.lists(st.integers(0, 151_935), max_size=200)


@settings(max_examples=150, deadline=None)
@given(token_lists, st.lists(st.tuples(st.integers(0, 200), token_lists, st.sampled_from(
    [None, "tenant-a", "tenant-b"]), st.sampled_from([4, 16])), min_size=1, max_size=6))
def test_block_keys_reused_from_a_recent_prompt_equal_a_fresh_chain(base, variants) -> None:
    import struct

    from dynbranch.engines.blocks import block_hash, root_hash
    from dynbranch.engines.scheduler import first_block_hashes

    for cut, tail, salt, size in variants:
        ids = base[:cut] + tail
        full = len(ids) // size * size
        packed = struct.pack(f"<{full}I", *ids[:full])
        expected, parent = [], root_hash(salt)
        for i in range(0, full, size):
            parent = block_hash(parent, ids[i:i + size])
            expected.append(parent)
        assert first_block_hashes(salt, packed, 4 * size) == expected


@settings(max_examples=100, deadline=None)
@given(st.text(alphabet="ab{}\" \n", max_size=900),
       st.lists(st.tuples(st.integers(0, 900), st.text(alphabet="abc", max_size=300),
                          st.sampled_from([None, "t1"])), min_size=1, max_size=6))
def test_affinity_keys_reused_from_a_recent_prompt_equal_a_fresh_chain(base, variants) -> None:
    from dynbranch.runtime.affinity import AffinityConfig, PrefixAffinity, blake2b_16

    affinity = PrefixAffinity(AffinityConfig(block_chars=16, max_blocks=40))
    for cut, tail, salt in variants:
        prompt = base[:cut] + tail
        n = min(len(prompt) // 16, 40)
        key, expected = blake2b_16(b"salt:" + (salt or "").encode()), []
        for i in range(n):
            key = blake2b_16(key + prompt[i * 16:(i + 1) * 16].encode())
            expected.append(key)
        assert affinity.block_keys(prompt, salt) == expected
