"""Name spans: the capitalised names a text mentions, as open-vocabulary candidates.

A *name span* is a maximal run of capitalised words (letters, digits, ``'’.&-`` inside; an
initial's or a title's full stop allowed), joined by single lower-case name connectors
(``of``, ``the``, ``de``, ``von``, …), without a leading sentence word (``The``, ``In``,
``He``…), plus its shorter sub-spans (``"Count of Barcelona"`` also yields
``"Barcelona"``). Spans of sentence words alone are skipped. The entity ranker
(:mod:`dynbranch.predictors.entity`) proposes them; pure text functions, no state.
"""

from __future__ import annotations

import re


def words(text: str) -> frozenset[str]:
    """The whitespace-separated words of ``text``, as a set."""
    return frozenset(text.split())


# NOTE: only connectors that occur inside names; "and", "in", "on", "at" more often join two
# names ("Natalie Wood and Edmund Gwenn", "Golestan Province in Iran") than form one.
CONNECTORS = words("""of the de du des la le von van der den di da del""")
# Words that start sentences in capitals but do not start names on their own.
STOP_STARTS = words(
    """a an the in on at of for from by to as it its he she his her they their this that
    these those there after before during when while where which who whom whose what
    with within however although though but and or if since until also both each many
    most some such one two three four five six seven eight nine ten first second third
    january february march april may june july august september october november
    december i we you our is was are were be being been has have had not no yes how why"""
)
ABBREVIATIONS = words("""St Mt Dr Mr Mrs Ms Jr Sr Co Inc Ltd Gen Col Lt Sgt Capt Rev""")
_WORD = re.compile(r"[\w'’.&\-]+", re.UNICODE)
_SENTENCE_END = re.compile(r"[.!?]\s")

Word = tuple[str, int, int]
"""A word of a text: ``(word, start, end)``."""


def name_spans(text: str) -> list[tuple[str, int, bool]]:
    """The name spans of ``text``: ``(span, offset, maximal)`` in order of occurrence.

    Each maximal span comes first, then its shorter sub-spans (``maximal`` false) that start
    and end on a capitalised word: ``"Count of Barcelona"`` also yields ``"Barcelona"``.
    """
    spans: list[tuple[str, int, bool]] = []
    for words in _runs(text):
        n = len(words)
        for length in range(n, 0, -1):
            for i in range(n - length + 1):
                part = words[i : i + length]
                if not (capitalised(part[0][0]) and capitalised(part[-1][0])):
                    continue
                if length > 1 and part[0][0].lower() in STOP_STARTS:
                    continue
                if all(w.lower() in STOP_STARTS for w, _, _ in part):
                    continue
                spans.append((text[part[0][1] : part[-1][2]], part[0][1], length == n))
    return spans


def words_of(text: str) -> list[Word]:
    """The words of ``text`` without trailing punctuation or a possessive ``'s``."""
    return [_strip(m) for m in _WORD.finditer(text)]


def _runs(text: str) -> list[list[Word]]:
    """Maximal runs of capitalised words joined by spaces and single connectors."""
    words = words_of(text)
    runs, i = [], 0
    while i < len(words):
        if not capitalised(words[i][0]):
            i += 1
            continue
        j = i + 1
        while j < len(words) and not _closes(text, words[j - 1]):
            if capitalised(words[j][0]) and _adjacent(text, words[j - 1], words[j]):
                j += 1
            elif (
                words[j][0] in CONNECTORS
                and j + 1 < len(words)
                and capitalised(words[j + 1][0])
                and _adjacent(text, words[j - 1], words[j])
                and _adjacent(text, words[j], words[j + 1])
                and not _closes(text, words[j])
            ):
                j += 2
            else:
                break
        start = i + 1 if words[i][0].lower() in STOP_STARTS and j - i > 1 else i
        if start < j:
            runs.append(words[start:j])
        i = j
    return runs


def _strip(match: re.Match[str]) -> Word:
    """A word without trailing punctuation or a possessive ``'s``."""
    word, start = match.group(0), match.start()
    for suffix in ("'s", "’s"):
        if word.endswith(suffix) and len(word) > 2:
            word = word[: -len(suffix)]
            break
    word = word.rstrip(".'’-&")
    return word, start, start + len(word)


def _closes(text: str, word: Word) -> bool:
    """Whether the span must end after ``word`` (a possessive or a sentence end follows)."""
    after = text[word[2] : word[2] + 2]
    if after[:1] in ("'", "’"):
        return True
    initial = len(word[0]) == 1 or word[0] in ABBREVIATIONS
    return after[:1] == "." and not initial


def capitalised(word: str) -> bool:
    """A word that can be part of a name: a capital first, or a digit with letters (``4th``)."""
    return word[:1].isupper() or (word[:1].isdigit() and any(c.isalpha() for c in word))


def _adjacent(text: str, a: Word, b: Word) -> bool:
    """Two words separated by spaces only, or by the full stop of an initial or a title
    (``Glenn L. Martin``, ``St. Louis``); a comma, bracket or sentence end separates."""
    gap = text[a[2] : b[1]].strip()
    return gap == "" or (gap == "." and (len(a[0]) == 1 or a[0] in ABBREVIATIONS))


def norm(text: str) -> str:
    """Lower-case word characters, single-spaced: the form names are compared in."""
    return " ".join(re.findall(r"\w+", text.lower()))


def sentences(text: str) -> list[tuple[int, str]]:
    """``(start offset, sentence)`` pairs, split after ``.``, ``!`` or ``?`` and a space."""
    out, start = [], 0
    for m in _SENTENCE_END.finditer(text):
        out.append((start, text[start : m.end()]))
        start = m.end()
    out.append((start, text[start:]))
    return out


def sentence_at(found: list[tuple[int, str]], offset: int) -> str:
    """The sentence of ``found`` (from :func:`sentences`) that holds ``offset``."""
    at = found[0][1]
    for start, sentence in found:
        if start > offset:
            break
        at = sentence
    return at


# NOTE: title connectors: the small words that occur inside work and place titles ("King of
# the Mountain", "Nicole and Natalie", "Goss Stadium at Coleman Field").
TITLE_CONNECTORS = CONNECTORS | words("""and or at in on for a an to with from by""")
_QUOTED = re.compile(r"[\"“]([^\"”]{2,80})[\"”]")


def title_phrases(text: str) -> list[str]:
    """Title-like phrases of ``text``, each once, in order of first occurrence: quoted
    strings, and runs of capitalised words or numbers joined by title connectors or by a
    comma before a capitalised word (``"The Red Tree"``, ``"1967 Federation Cup"``,
    ``"Push, Nevada"``), with and without a leading ``The``/``A``; then the name spans."""
    found: dict[str, None] = {m.group(1).strip(): None for m in _QUOTED.finditer(text)}
    tokens = words_of(text)
    i = 0
    while i < len(tokens):
        if not _title_word(tokens[i][0]):
            i += 1
            continue
        j, last = i + 1, i
        while j < len(tokens):
            gap = text[tokens[j - 1][2] : tokens[j][1]]
            if gap.strip() not in ("", ",") or (
                gap.strip() == "," and not _title_word(tokens[j][0])
            ):
                break
            if _title_word(tokens[j][0]):
                last = j
            elif tokens[j][0].lower() not in TITLE_CONNECTORS or gap.strip():
                break
            j += 1
        phrase = text[tokens[i][1] : tokens[last][2]]
        if not all(w.lower() in STOP_STARTS for w, _, _ in tokens[i : last + 1]):
            found[phrase] = None
            head = tokens[i][0].lower()
            if head in ("the", "a", "an") and last > i:
                found[text[tokens[i + 1][1] : tokens[last][2]]] = None
        i = last + 1
    for span, _, _ in name_spans(text):
        found[span] = None
    return list(found)


def _title_word(word: str) -> bool:
    return capitalised(word) or word.isdigit()
