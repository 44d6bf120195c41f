"""The retrieval corpus, its BM25 index and the ``retrieve`` tool (ReAct and Sub-Agent).

**Corpus.** The MuSiQue paragraphs (``musique/dev_200_paragraph_corpus.jsonl``, then
``musique/hipporag_train_100_corpus.json`` numbered ``musique-train100-NNNNN`` in file order)
followed by the HotpotQA-derived passages (``hotpotqa/hotpotqa_corpus.jsonl``) as
distractors. A passage whose (title, text) pair already occurred is dropped, so the order
is fixed by the files. Its **version** is the SHA-256 of every kept passage's
``[id, title, text]`` in that order: every retrieval reports it in its read-set as
``{"corpus:musique-hotpotqa": <digest>}``, which C1's freshness guard checks.

**Index.** BM25 (Lucene variant, k1 = 1.5, b = 0.75) from the ``bm25s`` package over
``title + "\\n" + text``. Tokens are lower-cased ``\\w\\w+`` runs without Lucene's 33 English
stop words (a query of stop words only keeps them). Scores are computed for every passage
and ordered by score, ties by corpus position, and passages that share no token with the
query are never returned, so results are deterministic. An index is built once per process
per corpus version and kept in memory (building it takes well under a second on two cores;
see ``index_for``).

**Cost.** A replay charges every call :data:`MODELLED_RETRIEVE_S` (``--tool-time``'s
default, ``modelled``), the median latency of a hosted web-search API: the paper's agents
search a local corpus, but a deployed research agent searches a service, and the local BM25
scoring (below) would charge a search almost nothing, which no deployment sees; it is also
deterministic on the virtual clock. With ``tool_time="measured"`` (the workload classes'
own default when built directly) a call is charged its measured duration instead: the BM25
scoring really runs on the replay's CPU, and the stopwatch around it is what the clock is
charged (0.08 ms median, 0.2 ms p90 over the 715 chain searches of the 16k-passage corpus
on the two-core development machine).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bm25s
import numpy as np

from dynbranch.datasets import read_jsonl, require_dataset
from dynbranch.errors import MalformedRecordError, ToolInputError
from dynbranch.workload import MeasuredCost, ModelledCost, Tool, ToolCost, ToolResult

CORPUS_RESOURCE = "corpus:musique-hotpotqa"
TOOL_NAME = "retrieve"
K1, B = 1.5, 0.75
TOKENIZER_VERSION = "1"
TOOL_SCHEMA_VERSION = f"bm25s-{bm25s.__version__}/lucene-k1-{K1}-b-{B}/tok-{TOKENIZER_VERSION}"
TOOL_TIMES = ("measured", "modelled")
# NOTE: p50 of the Serper web-search API, the search service open deep-research agents call,
# from a 2026 survey of search-API latencies (scavio.dev, "Search API latency budget": p50
# Brave 250 ms, Serper 400 ms, Exa 600 ms, Tavily 800 ms, SerpAPI 1,200 ms). A benchmark of
# ten search APIs on fresh news queries puts their median at about 1.2 s (Seltz, 2026), so
# 400 ms sits at the fast end of what an agent's search call costs.
MODELLED_RETRIEVE_S = 0.400
MAX_K = 20
DEV_CORPUS = "dev_200_paragraph_corpus.jsonl"
TRAIN_CORPUS = "hipporag_train_100_corpus.json"
HOTPOT_CORPUS = "hotpotqa_corpus.jsonl"
_DIGEST_PREFIX = b"musique-hotpotqa/1\n"
_TOKEN = re.compile(r"(?u)\b\w\w+\b")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Lucene's default English stop words (the list bm25s calls STOPWORDS_EN), written out so an
# upgrade of the package cannot change the tokens silently.
STOPWORDS = _words(
    """a an and are as at be but by for if in into is it no not of on or such that the
    their then there these they this to was will with"""
)


@dataclass(frozen=True)
class Passage:
    """One retrievable passage."""

    id: str
    title: str
    text: str


@dataclass(frozen=True)
class Corpus:
    """The passages in retrieval order and their content digest (the corpus version)."""

    passages: tuple[Passage, ...]
    digest: str
    sources: tuple[tuple[str, int], ...] = ()

    def __len__(self) -> int:
        return len(self.passages)


def tokenize(text: str) -> list[str]:
    """The BM25 tokens of ``text`` (see the module docstring)."""
    tokens = _TOKEN.findall(text.lower())
    kept = [t for t in tokens if t not in STOPWORDS]
    return kept or tokens


def corpus_digest(passages: Sequence[Passage]) -> str:
    """SHA-256 over every passage's ``[id, title, text]`` in order."""
    h = hashlib.sha256(_DIGEST_PREFIX)
    for p in passages:
        h.update(json.dumps([p.id, p.title, p.text], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def make_corpus(
    parts: Sequence[tuple[str, Sequence[Passage]]],
) -> Corpus:
    """A corpus from named parts in order, dropping repeated (title, text) pairs."""
    seen: set[tuple[str, str]] = set()
    kept: list[Passage] = []
    sources = []
    for name, passages in parts:
        before = len(kept)
        for p in passages:
            if (p.title, p.text) not in seen:
                seen.add((p.title, p.text))
                kept.append(p)
        sources.append((name, len(kept) - before))
    return Corpus(tuple(kept), corpus_digest(kept), tuple(sources))


# -- loading ----------------------------------------------------------------------------------

_CORPORA: dict[tuple, Corpus] = {}


def corpus_paths(data_dir: Path | None) -> tuple[Path, Path, Path]:
    """The three corpus files; :class:`~dynbranch.errors.DataMissingError` when absent."""
    musique = require_dataset(data_dir, "musique")
    hotpot = require_dataset(data_dir, "hotpotqa")
    return musique / DEV_CORPUS, musique / TRAIN_CORPUS, hotpot / HOTPOT_CORPUS


def load_corpus(data_dir: Path | None) -> Corpus:
    """The combined corpus of ``data_dir``, validated; cached per file identity."""
    paths = corpus_paths(data_dir)
    key = tuple((str(p.resolve()), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)
    if key not in _CORPORA:
        dev, train, hotpot = paths
        _CORPORA[key] = make_corpus(
            [
                ("musique-dev200", list(_jsonl_passages(dev))),
                ("musique-train100", list(_array_passages(train, "musique-train100"))),
                ("hotpotqa", list(_jsonl_passages(hotpot))),
            ]
        )
    return _CORPORA[key]


def _text_fields(path: Path, rid: str | int, raw: Any, need_id: bool) -> tuple[str, str, str]:
    if not isinstance(raw, dict):
        raise MalformedRecordError(str(path), rid, "not a JSON object")
    names = ("id", "title", "text") if need_id else ("title", "text")
    for name in names:
        value = raw.get(name)
        if not isinstance(value, str):
            problem = "missing field" if name not in raw else f"{type(value).__name__} field"
            raise MalformedRecordError(str(path), rid, f"{problem} {name!r}, expected a string")
    if not raw["text"].strip() and not raw["title"].strip():
        raise MalformedRecordError(str(path), rid, "empty passage (no title, no text)")
    return raw.get("id", ""), raw["title"], raw["text"]


def _jsonl_passages(path: Path) -> Iterator[Passage]:
    ids: set[str] = set()
    for n, raw in read_jsonl(path, path.parent.name):
        pid, title, text = _text_fields(path, f"line {n}", raw, need_id=True)
        if pid in ids:
            raise MalformedRecordError(str(path), pid, "duplicate passage id")
        ids.add(pid)
        yield Passage(pid, title, text)


def _array_passages(path: Path, prefix: str) -> Iterator[Passage]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as e:
        raise MalformedRecordError(str(path), "file", f"not JSON: {e}") from None
    if not isinstance(data, list):
        raise MalformedRecordError(str(path), "file", "not a JSON array of passages")
    for n, raw in enumerate(data):
        _, title, text = _text_fields(path, f"item {n}", raw, need_id=False)
        yield Passage(f"{prefix}-{n:05d}", title, text)


# -- the index --------------------------------------------------------------------------------


class Bm25Index:
    """A BM25 index over one corpus version; :meth:`search` is deterministic."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus
        tokens = [tokenize(f"{p.title}\n{p.text}") for p in corpus.passages]
        self._bm25 = bm25s.BM25(k1=K1, b=B, method="lucene")
        self._bm25.index(tokens, show_progress=False)
        self._vocab: Mapping[str, int] = self._bm25.vocab_dict

    def search(self, query: str, k: int) -> list[Passage]:
        """The ``k`` best passages for ``query``: by score, ties by corpus position."""
        ids = [self._vocab[t] for t in tokenize(query) if t in self._vocab]
        if not ids or k < 1:
            return []
        scores = self._bm25.get_scores(ids)
        order = np.argsort(-scores, kind="stable")[:k]
        return [self.corpus.passages[i] for i in order if scores[i] > 0]


_INDEXES: dict[str, Bm25Index] = {}


def index_for(corpus: Corpus) -> Bm25Index:
    """The process's index of ``corpus`` (built on first use, then kept by corpus digest)."""
    if corpus.digest not in _INDEXES:
        _INDEXES[corpus.digest] = Bm25Index(corpus)
    return _INDEXES[corpus.digest]


# -- the tool ---------------------------------------------------------------------------------


def passage_values(passages: Sequence[Mapping[str, Any]]) -> list[dict[str, str]]:
    """What a reading stage renders of retrieved passages: title and text, in rank order."""
    return [{"title": p["title"], "text": p["text"]} for p in passages]


class RetrieveTool(Tool):
    """``retrieve``: ``{"query": str, "k": int}`` → the top-k passages as
    ``[{"id", "title", "text"}]``. Read-only (speculable); reads the corpus version."""

    name, schema_version = TOOL_NAME, TOOL_SCHEMA_VERSION

    def __init__(self, index: Bm25Index, tool_time: str = "measured") -> None:
        if tool_time not in TOOL_TIMES:
            raise ValueError(f"tool_time {tool_time!r}: choose from {list(TOOL_TIMES)}")
        self.index = index
        self.cost: ToolCost = (
            MeasuredCost() if tool_time == "measured" else ModelledCost(MODELLED_RETRIEVE_S)
        )

    def is_read_only(self, fields: Mapping[str, Any]) -> bool:
        return True

    def call(self, fields: Mapping[str, Any]) -> ToolResult:
        query, k = fields.get("query"), fields.get("k")
        if not isinstance(query, str):
            raise ToolInputError(TOOL_NAME, repr(query), "the query must be a string")
        if not isinstance(k, int) or isinstance(k, bool) or not 1 <= k <= MAX_K:
            raise ToolInputError(TOOL_NAME, query, f"k={k!r} must be an integer in [1, {MAX_K}]")
        found = self.index.search(query, k)
        value = [{"id": p.id, "title": p.title, "text": p.text} for p in found]
        return ToolResult(value, reads={CORPUS_RESOURCE: self.index.corpus.digest})
