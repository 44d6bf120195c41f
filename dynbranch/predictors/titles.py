"""Page titles of the passage index a workload searches, found in a question's words.

A search that names a page finds it best, and MuSiQue's recorded searches are often the
supporting page's title rather than the question's words (``"Capote"`` → ``"Capote
(film)"``, ``"Miracle on 34th street"`` → ``"Miracle on 34th Street"``). A
:class:`TitleIndex` maps any phrase to the titles it names: both are compared by
:func:`title_key` — lower case, accents and punctuation dropped, a possessive ``'s`` folded,
a leading ``the`` and a title's trailing ``(disambiguation)`` ignored.

The titles are branch-time knowledge: they come from the corpus the workload's ``retrieve``
tool searches (read through :class:`PassageIndex`, the part of the workload's index a
predictor may use), never from a trace. An index is built once per corpus version.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Iterable, Sequence
from typing import Any, Protocol

from dynbranch.predictors.spans import STOP_STARTS

MAX_TITLE_WORDS = 10
"""The longest phrase looked up (MuSiQue's longest supporting titles have 9-10 words)."""
_PARENTHESIS = re.compile(r"\s*\([^)]*\)\s*$")
_PHRASE_WORD = re.compile(r"[\w'’\-.&]+")


class Titled(Protocol):
    """A retrieved passage: what a ranker reads of it is its title."""

    title: str


class PassageIndex(Protocol):
    """The workload's passage index as a predictor sees it: its corpus (``digest`` and
    ``passages``, each with a ``title``) and its search."""

    @property
    def corpus(self) -> Any: ...

    def search(self, query: str, k: int) -> Sequence[Titled]: ...


def title_key(text: str) -> str:
    """The form phrases and titles are compared in (see the module docstring)."""
    text = unicodedata.normalize("NFKD", text)
    text = "".join(c for c in text if not unicodedata.combining(c)).lower()
    text = re.sub(r"['’]s\b", "s", text)
    key = " ".join(re.findall(r"\w+", text))
    return key[4:] if key.startswith("the ") else key


class TitleIndex:
    """Every page title of a corpus, looked up by :func:`title_key`."""

    def __init__(self, titles: Iterable[str]) -> None:
        by_key: dict[str, dict[str, None]] = {}
        self._titles: set[str] = set()
        for title in titles:
            if title in self._titles or not title.strip():
                continue
            self._titles.add(title)
            for key in {title_key(title), title_key(_PARENTHESIS.sub("", title))}:
                if key:
                    by_key.setdefault(key, {})[title] = None
        self._by_key = {k: tuple(v) for k, v in by_key.items()}

    def __contains__(self, title: object) -> bool:
        return title in self._titles

    def __len__(self) -> int:
        return len(self._titles)

    def named(self, phrase: str) -> tuple[str, ...]:
        """The titles ``phrase`` names (corpus order), ``()`` for none or a stop word."""
        key = title_key(phrase)
        if not key or all(w in STOP_STARTS for w in key.split()):
            return ()
        return self._by_key.get(key, ())

    def mentioned(self, text: str) -> list[tuple[str, str, int]]:
        """``(title, phrase, offset)`` for every title a run of up to
        :data:`MAX_TITLE_WORDS` words of ``text`` names (``phrase``, at ``offset``), longest
        phrases first, each title once (its first phrase)."""
        words = [(m.group(0).rstrip(".,'’"), m.start()) for m in _PHRASE_WORD.finditer(text)]
        found: dict[str, tuple[str, int]] = {}
        for n in range(min(MAX_TITLE_WORDS, len(words)), 0, -1):
            for i in range(len(words) - n + 1):
                start, last = words[i][1], words[i + n - 1]
                phrase = text[start : last[1] + len(last[0])]
                for title in self.named(phrase):
                    found.setdefault(title, (phrase, start))
        return [(title, phrase, offset) for title, (phrase, offset) in found.items()]


_INDEXES: dict[str, TitleIndex] = {}


def titles_of(index: PassageIndex) -> TitleIndex:
    """The title index of ``index``'s corpus, built on first use and kept by corpus digest
    (like the workload's BM25 index: one per corpus version in a process)."""
    digest = index.corpus.digest
    if digest not in _INDEXES:
        _INDEXES[digest] = TitleIndex(p.title for p in index.corpus.passages)
    return _INDEXES[digest]
