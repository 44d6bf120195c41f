"""A deterministic tokenizer stand-in for simulated engines.

The sim engine needs token *counts* (prefill work, KV blocks, decode steps) and a way to
stream a recorded text piece by piece; it does not need a real vocabulary. This stand-in
splits text the way byte-level BPE tokenizers roughly do on English and code: a run of up
to six letters with its leading space is one token, so is a group of up to three digits or
of up to two punctuation characters, and a run of whitespace. On English prose it gives
about 4.1 characters per token and on JSON tool schemas about 3.6, close to what Qwen's
tokenizer gives on such text. It is a stand-in, documented as such: a real engine
(``hf``, ``vllm``) counts with its real tokenizer.

Token ids are stable across processes (CRC32 of the piece), so block hashes for prefix
caching agree between runs and between engines.

Agentic prompts share long prefixes (a system prompt, tool schemas, the conversation so
far), so :func:`encode` keeps the last long texts it encoded and reuses the pieces of
the longest prefix a new text shares with one of them; the result is the same as encoding
from scratch (a test checks it).
"""

from __future__ import annotations

import re
import zlib
from array import array
from bisect import bisect_right
from itertools import accumulate

from dynbranch.prefix_memo import RecentPrefixes

VOCAB_SIZE = 151_936  # Qwen3's vocabulary size; ids are folded into it.
_PIECE = re.compile(r" ?[A-Za-z]{1,6}| ?\d{1,3}| ?[^\sA-Za-z\d]{1,2}|\s+")

RECENT_TEXTS = 256
"""Long texts :func:`encode` remembers, to reuse the pieces of a shared prefix: enough for the
prompts of the requests in flight at a few requests per second, which interleave (16 kept
half of a 1,000-request Routing replay's prompts from finding their prefix)."""
MIN_CACHED_CHARS = 512
"""Texts shorter than this are encoded from scratch and not remembered."""
MAX_PIECE_IDS = 1 << 18
"""Distinct pieces whose ids are remembered (the table is cleared when it fills)."""


def pieces(text: str) -> list[str]:
    """Split ``text`` into token pieces whose concatenation is ``text``."""
    out = _PIECE.findall(text)
    # NOTE: the pattern matches every character, so nothing is lost; keep the check cheap.
    assert sum(map(len, out)) == len(text)
    return out


class _PieceIds(dict[str, int]):
    """Piece -> token id, computed on first sight."""

    def __missing__(self, piece: str) -> int:
        if len(self) >= MAX_PIECE_IDS:
            self.clear()
        token = self[piece] = zlib.crc32(piece.encode("utf-8")) % VOCAB_SIZE
        return token


class _Encoded:
    """A remembered text: its token ids and where each piece ends."""

    __slots__ = ("ends", "ids", "text")

    def __init__(self, text: str, ids: array[int], ends: array[int]) -> None:
        self.text, self.ids, self.ends = text, ids, ends


class _Encoder:
    """Encodes texts, reusing the pieces of a prefix shared with a recent text."""

    def __init__(self) -> None:
        self.ids = _PieceIds()
        self.recent: RecentPrefixes[str, _Encoded] = RecentPrefixes(RECENT_TEXTS)

    def encode(self, text: str) -> array[int]:
        """``text``'s ids as a fresh array (the caller may grow it)."""
        if len(text) < MIN_CACHED_CHARS:
            return array("i", list(map(self.ids.__getitem__, _PIECE.findall(text))))
        seen = self.recent.get(text)
        if seen is not None:
            return seen.ids[:]
        best, shared = self.recent.nearest(text)
        head_ids, head_ends, start = array("i"), array("i"), 0
        if best is not None:
            # NOTE: a piece is decided by its own characters and the one after it, so the
            # pieces ending before the last shared character are this text's pieces too.
            k = bisect_right(best.ends, shared - 2)
            head_ids, head_ends = best.ids[:k], best.ends[:k]
            start = head_ends[-1] if k else 0
        tail = _PIECE.findall(text, start)
        # NOTE: an array is built a quarter faster from a list than from an iterator
        ids = head_ids + array("i", list(map(self.ids.__getitem__, tail)))
        ends = head_ends + array("i", list(accumulate(map(len, tail), initial=start)))[1:]
        assert (ends[-1] if ends else 0) == len(text), "the pieces cover the text"
        self.recent.add(text, _Encoded(text, ids, ends))
        return ids[:]


_ENCODER = _Encoder()


def encode(text: str) -> list[int]:
    """Stable token ids for ``text`` (a prompt: its pieces are remembered for reuse)."""
    return _ENCODER.encode(text).tolist()


def encode_array(text: str) -> array[int]:
    """:func:`encode` as a fresh ``array('i')``: what the sim engine keeps per request (a
    long prompt's ids copied as one block, and hashed from its bytes, not from a list)."""
    return _ENCODER.encode(text)


def tokenize(text: str) -> tuple[list[str], list[int]]:
    """``pieces(text)`` and ``encode(text)`` in one pass, remembering nothing.

    NOTE: for texts that are not prompts (a call's output), so they do not push the
    prompts whose prefixes later prompts share out of the encoder's memory.
    """
    out = pieces(text)
    return out, list(map(_ENCODER.ids.__getitem__, out))


def count_tokens(text: str) -> int:
    """Number of tokens ``text`` has under this stand-in."""
    return len(_PIECE.findall(text))
