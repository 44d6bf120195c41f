"""The tokenizer stand-in: reusing a shared prefix's pieces gives what encoding afresh gives."""

from __future__ import annotations

import zlib

from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.engines import tokenizer
from dynbranch.engines.tokenizer import (
    MIN_CACHED_CHARS,
    RECENT_TEXTS,
    VOCAB_SIZE,
    count_tokens,
    encode,
    pieces,
    tokenize,
)


def fresh(text: str) -> list[int]:
    """Token ids computed from scratch, the way the stand-in defines them."""
    return [zlib.crc32(p.encode("utf-8")) % VOCAB_SIZE for p in pieces(text)]


# Letters, digits, punctuation and whitespace runs in any mix: every piece kind and the
# places where a piece could change with the character after it.
fragments = st.sampled_from(
    [
        "a",
        "bc",
        "defghij",
        " ",
        "  ",
        "\n",
        "\t \n",
        "1",
        "234",
        "5678",
        ".",
        ",;",
        "{}",
        '"',
        "é",
        "日本",
    ]
)
texts = st.lists(fragments, max_size=400).map("".join)


@settings(max_examples=300, deadline=None)
@given(texts, st.lists(st.tuples(st.integers(0, 2000), texts), min_size=1, max_size=6))
def test_texts_sharing_prefixes_encode_as_from_scratch(base: str, variants: list) -> None:
    base = base * (1 + MIN_CACHED_CHARS // max(1, len(base)))  # long enough to be remembered
    for cut, tail in variants:
        text = base[: min(cut, len(base))] + tail
        assert encode(text) == fresh(text)
        assert len(encode(text)) == count_tokens(text)


@settings(max_examples=100, deadline=None)
@given(texts)
def test_tokenize_gives_pieces_and_ids_and_remembers_nothing(text: str) -> None:
    remembered = tokenizer._ENCODER.recent.keys()
    assert tokenize(text * 3) == (pieces(text * 3), fresh(text * 3))
    assert tokenizer._ENCODER.recent.keys() == remembered


def test_the_encoder_remembers_a_bounded_number_of_texts() -> None:
    for i in range(3 * RECENT_TEXTS):
        text = f"prompt {i} " * 200
        assert encode(text) == fresh(text)
    assert len(tokenizer._ENCODER.recent) == RECENT_TEXTS


# Every class the pattern knows, the characters where Python's ``\s`` and ``\d`` go beyond
# ASCII (a no-break space, an ideographic space, the ASCII separators, an Arabic-Indic digit),
# non-ASCII letters and symbols the pattern counts as "other", and a lone surrogate.
_CHARACTERS = st.sampled_from(
    list("abcXYZ0123456789 ,.;:{}\"'_-\t\n\r\x0b\x0c\x1c") + [" "] * 8
    + ["é", "ß", "٣", "\u00a0", "\u3000", "😀", "\ud800", "Ⅻ", "²"])


@settings(max_examples=400, deadline=None)
@given(st.lists(_CHARACTERS, max_size=80).map("".join))
def test_piece_ends_are_where_the_pattern_s_pieces_end(text: str) -> None:
    got = tokenizer.piece_ends(text).tolist()
    ends, at = [], 0
    for piece in pieces(text):
        at += len(piece)
        ends.append(at)
    assert got == ends


@settings(max_examples=100, deadline=None)
@given(st.lists(fragments, min_size=1, max_size=40).map("".join), st.integers(1, 200),
       st.sampled_from(["é ٣ x", " x", ""]))
def test_a_long_text_is_counted_on_arrays_as_the_pattern_counts_it(chunk: str, times: int,
                                                                  tail: str) -> None:
    # NOTE: an ASCII text is read a byte a character, any other as UTF-32: both are drawn
    text = chunk * times + tail
    if len(text) < tokenizer.VECTOR_MIN_CHARS:
        text *= tokenizer.VECTOR_MIN_CHARS // len(text) + 1
    assert count_tokens(text) == len(pieces(text)) == len(tokenizer.piece_ends(text))
