"""The ReAct workload: MuSiQue multi-hop questions over a local BM25 corpus.

Questions: the 200 dev questions with paragraphs (``musique/dev_200_full.jsonl``), then the
100 HippoRAG train questions (``musique/hipporag_train_100.json``). Split by question id
(:func:`workloads.musique.split_of`): runs are measured on ``test``; predictors and
pre-populated caches may learn from ``train`` only.

Drawing: :meth:`ReActWorkload.requests` permutes the split's records (file order) with
``random.Random(seed)``, re-shuffling for every further cycle when ``n`` exceeds the pool.
Request ids are ``react-{index:05d}-{question id}``. Loading validates every record and the
corpus and builds the BM25 index before any request runs, so the first retrieval of a run is
not charged the index build. Replayed LLM stages decode the reasoning of
:data:`~workloads.react.lengths.REACT_DECODE` around their decisions (``decode_lengths``
``modelled``, the default) or the decisions alone (``recorded``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynbranch.datasets import require_dataset
from dynbranch.decode_lengths import choose
from dynbranch.errors import MalformedRecordError
from dynbranch.workload import DataConfig, LazyTrace
from workloads.musique import DEV_FULL, TRAIN_FULL, MusiqueRecord, draw, load_full
from workloads.react.base import MusiqueWorkload
from workloads.react.lengths import REACT_DECODE
from workloads.react.request import ReActRequest
from workloads.react.retrieval import (
    Bm25Index,
    Corpus,
    RetrieveTool,
    index_for,
    load_corpus,
)
from workloads.react.template import TEMPLATE


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


class ReActWorkload(MusiqueWorkload):
    """ReAct over MuSiQue (options: see :class:`~workloads.react.base.MusiqueWorkload`)."""

    name = "react"
    predictor = "entity"
    template = TEMPLATE

    def load(self, data: DataConfig) -> ReActData:
        """Questions, corpus and index of ``data.data_dir`` (validated once, then kept)."""
        if data.data_dir not in self._loaded:
            records = load_react_questions(data.data_dir)
            corpus = load_corpus(data.data_dir)
            self._loaded[data.data_dir] = ReActData(records, corpus, index_for(corpus))
        return self._loaded[data.data_dir]

    def requests(
        self, data: DataConfig, n: int, seed: int, split: str = "test"
    ) -> Sequence[ReActRequest]:
        loaded, pool = self.load(data), self.pool(data, n, split)
        decode = choose(self.decode_lengths, REACT_DECODE)
        drawn = draw(pool, n, seed)

        def make(i: int) -> ReActRequest:
            r = drawn[i]
            return ReActRequest(f"react-{i:05d}-{r.id}", r,
                                RetrieveTool(loaded.index, self.tool_time), self.top_k, decode)

        return LazyTrace(len(drawn), make)  # NOTE: each made at first read (its arrival)
