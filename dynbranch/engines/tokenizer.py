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

import numpy as np

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


VECTOR_MIN_CHARS = 2048
"""Texts at least this long are counted with :func:`piece_ends` (numpy) rather than the regex:
a 23,000-character Routing prompt in 0.55 ms against 1.1 ms. (Encoding them stays with the
regex: the pieces' strings cost what the matching saves.)"""

# NOTE: the pattern's character classes: 0 anything else (``[^\sA-Za-z\d]``), 1 an ASCII
# letter, 2 a decimal digit (``\d`` is ``str.isdecimal``), 3 whitespace (``\s`` is
# ``str.isspace``); the longest piece of each class (whitespace: the whole run).
_OTHER, _LETTER, _DIGIT, _SPACE = 0, 1, 2, 3
_ASCII_CLASS = np.array([_LETTER if chr(c).isalpha() else _DIGIT if chr(c).isdecimal()
                         else _SPACE if chr(c).isspace() else _OTHER for c in range(128)],
                        dtype=np.int8)
_LONGEST = np.array([2, 6, 3, 1 << 62], dtype=np.int64)


def _class_of(c: str) -> int:
    return _DIGIT if c.isdecimal() else _SPACE if c.isspace() else _OTHER


def _runs(text: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``text``'s runs of one character class: where each starts and ends, the longest piece
    of its class, and how many pieces it ends (see :func:`piece_ends`)."""
    n = len(text)
    if text.isascii():  # NOTE: one byte a character, and no class to look up beyond 127
        codes = np.frombuffer(text.encode("ascii"), dtype=np.uint8)
        cls = _ASCII_CLASS[codes]
    else:
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        ascii_ = codes < 128
        cls = np.empty(n, dtype=np.int8)
        cls[ascii_] = _ASCII_CLASS[codes[ascii_]]
        wide, where = np.unique(codes[~ascii_], return_inverse=True)
        cls[~ascii_] = np.array([_class_of(chr(c)) for c in wide.tolist()], np.int8)[where]
    cut = np.flatnonzero(cls[1:] != cls[:-1]) + 1
    starts = np.concatenate(([0], cut))
    ends = np.concatenate((cut, [n]))
    longest = _LONGEST[cls[starts]]
    chunks = (ends - starts + longest - 1) // longest
    # NOTE: a run that is one space, followed by a run that is not whitespace, ends no piece:
    # it is the first piece of the run after it (whose pieces are cut as if it were not there)
    chunks[:-1][(chunks[:-1] == 1) & (ends[:-1] - starts[:-1] == 1)
                & (codes[starts[:-1]] == 32) & (cls[cut] != _SPACE)] = 0
    return starts, ends, longest, chunks


def piece_ends(text: str) -> np.ndarray:
    """Where each of ``text``'s pieces ends (``pieces(text)``'s running lengths), computed on
    the characters as arrays: the same pieces as the pattern, without matching it piece by
    piece or making their strings (a test compares the two).

    The pattern cuts a run of one class into its longest pieces from the left (letters 6,
    digits 3, other characters 2, whitespace whole), and a lone space before a run of
    letters, digits or other characters goes with that run's first piece (`` ?``); a longer
    run of whitespace is one piece, so the run after it starts bare.
    """
    if not text:
        return np.zeros(0, dtype=np.int64)
    starts, ends, longest, chunks = _runs(text)
    run = np.repeat(np.arange(len(starts)), chunks)
    k = np.arange(len(run)) - np.repeat(np.cumsum(chunks) - chunks, chunks)
    return np.minimum(starts[run] + (k + 1) * longest[run], ends[run])


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
    if len(text) < VECTOR_MIN_CHARS:
        return len(_PIECE.findall(text))
    return int(_runs(text)[3].sum())  # NOTE: the pieces each run ends, not where they end
