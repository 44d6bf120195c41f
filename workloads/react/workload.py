"""The ReAct workload: MuSiQue multi-hop questions over a local BM25 corpus.

Questions: the 200 dev questions with paragraphs (``musique/dev_200_full.jsonl``), then the
100 HippoRAG train questions (``musique/hipporag_train_100.json``). Split by question id
(:func:`workloads.musique.split_of`): runs are measured on ``test``; predictors and
pre-populated caches may learn from ``train`` only.

Drawing: :meth:`ReActWorkload.requests` permutes the split's records (file order) with
``random.Random(seed)``, re-shuffling for every further cycle when ``n`` exceeds the pool.
Request ids are ``react-{index:05d}-{question id}``. Loading validates every record and the
corpus and builds the BM25 index before any request runs, so the first retrieval of a run is
not charged the index build.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynbranch.datasets import require_dataset
from dynbranch.errors import ConfigError, DataError, MalformedRecordError
from dynbranch.workload import DataConfig, Workload
from workloads.musique import DEV_FULL, TRAIN_FULL, MusiqueRecord, draw, in_split, load_full
from workloads.react.request import ReActRequest
from workloads.react.retrieval import (
    MAX_K,
    TOOL_TIMES,
    Bm25Index,
    Corpus,
    RetrieveTool,
    index_for,
    load_corpus,
)
from workloads.react.template import TEMPLATE

SPLITS = ("train", "test")
DEFAULT_TOP_K = 3


@dataclass(frozen=True)
class ReActData:
    """The validated questions of one data directory, its corpus and the corpus's index."""

    records: tuple[MusiqueRecord, ...]
    corpus: Corpus
    index: Bm25Index


def load_react_questions(data_dir: Path | None) -> tuple[MusiqueRecord, ...]:
    """The 300 ReAct questions, validated: dev (200) then HippoRAG train (100)."""
    musique = require_dataset(data_dir, "musique")
    dev = load_full(musique / DEV_FULL, "dev200")
    train = load_full(musique / TRAIN_FULL, "train100")
    seen = {r.id for r in dev}
    for r in train:
        if r.id in seen:
            raise MalformedRecordError(str(musique / TRAIN_FULL), r.id, f"id also in {DEV_FULL}")
    return dev + train


class ReActWorkload(Workload):
    """ReAct over MuSiQue. Options: ``tool_time`` (``measured``, the default: retrieval is
    charged its real duration; or ``modelled``) and ``top_k`` (passages per search)."""

    name = "react"
    predictor = "entity"
    template = TEMPLATE

    def __init__(self, tool_time: str = "measured", top_k: int = DEFAULT_TOP_K) -> None:
        if tool_time not in TOOL_TIMES:
            raise ConfigError(f"tool_time {tool_time!r}: choose from {list(TOOL_TIMES)}")
        if not 1 <= top_k <= MAX_K:
            raise ConfigError(f"top_k {top_k} must be in [1, {MAX_K}]")
        self.tool_time, self.top_k = tool_time, top_k
        self._loaded: dict[Path | None, ReActData] = {}

    def load(self, data: DataConfig) -> ReActData:
        """Questions, corpus and index of ``data.data_dir`` (validated once, then kept)."""
        if data.data_dir not in self._loaded:
            records = load_react_questions(data.data_dir)
            corpus = load_corpus(data.data_dir)
            self._loaded[data.data_dir] = ReActData(records, corpus, index_for(corpus))
        return self._loaded[data.data_dir]

    def check_data(self, data: DataConfig) -> None:
        self.load(data)

    def records(self, data: DataConfig, split: str) -> list[MusiqueRecord]:
        """The records of one split in file order (``all`` for both)."""
        if split not in (*SPLITS, "all"):
            raise ConfigError(f"split {split!r}: choose from {list(SPLITS)}")
        return in_split(self.load(data).records, split)

    def requests(
        self, data: DataConfig, n: int, seed: int, split: str = "test"
    ) -> Sequence[ReActRequest]:
        if n < 0:
            raise ConfigError(f"requests: n={n} must be >= 0")
        loaded = self.load(data)
        pool = self.records(data, split)
        if not pool and n:
            raise DataError(f"react: the {split} split of {data.data_dir} has no questions")
        return [
            ReActRequest(
                f"react-{i:05d}-{r.id}", r, RetrieveTool(loaded.index, self.tool_time), self.top_k
            )
            for i, r in enumerate(draw(pool, n, seed))
        ]
