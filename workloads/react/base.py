"""What the two MuSiQue workloads (ReAct and Sub-Agent) share: options, splits, the pool."""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from dynbranch.decode_lengths import check_mode
from dynbranch.errors import ConfigError, DataError
from dynbranch.workload import DataConfig, Workload
from workloads.musique import (
    DEV_DECOMPOSITIONS,
    SPLIT_BY,
    SPLITS,
    TRAIN_FULL,
    MusiqueRecord,
    in_split,
    load_decompositions,
    load_full,
    step_groups,
)
from workloads.react.retrieval import MAX_K, TOOL_TIMES

DEFAULT_TOP_K = 3


class MusiqueWorkload(Workload):
    """A workload over MuSiQue questions and the combined BM25 corpus.

    Options: ``tool_time`` (``measured``, the class's default: retrieval is charged its real
    duration; or ``modelled``, what a replay passes unless ``--tool-time`` says otherwise:
    a hosted search's median, :mod:`workloads.react.retrieval`), ``top_k`` (passages per
    search) and ``split_by`` (``question``, the default, or ``step``: questions sharing a
    single-hop step stay on one side, :mod:`workloads.musique`).
    """

    def __init__(
        self,
        tool_time: str = "measured",
        top_k: int = DEFAULT_TOP_K,
        decode_lengths: str = "modelled",
        split_by: str = "question",
    ) -> None:
        if tool_time not in TOOL_TIMES:
            raise ConfigError(f"tool_time {tool_time!r}: choose from {list(TOOL_TIMES)}")
        if not 1 <= top_k <= MAX_K:
            raise ConfigError(f"top_k {top_k} must be in [1, {MAX_K}]")
        if split_by not in SPLIT_BY:
            raise ConfigError(f"split_by {split_by!r}: choose from {list(SPLIT_BY)}")
        self.tool_time, self.top_k, self.split_by = tool_time, top_k, split_by
        self.decode_lengths = check_mode(decode_lengths)
        self._loaded: dict[Any, Any] = {}

    @abstractmethod
    def load(self, data: DataConfig) -> Any:
        """The validated questions (``.records``) and the corpus index (``.index``)."""

    def check_data(self, data: DataConfig) -> None:
        self.load(data)

    def records(self, data: DataConfig, split: str) -> list[MusiqueRecord]:
        """The records of one split in file order (``all`` for both)."""
        if split not in (*SPLITS, "all"):
            raise ConfigError(f"split {split!r}: choose from {list(SPLITS)}")
        return in_split(self.load(data).records, split, self.groups(data))

    def groups(self, data: DataConfig,
               records: tuple[MusiqueRecord, ...] | None = None) -> Mapping[str, str] | None:
        """The step groups the split goes by (``None``: by question), computed once over this
        workload's ``records`` (default: its loaded ones) and every MuSiQue question file
        both workloads read (the dev decompositions and the HippoRAG train questions), so a
        question has one side in every workload whatever the data directory holds."""
        if self.split_by == "question":
            return None
        key = ("step_groups", data.data_dir)
        if key in self._loaded:
            return self._loaded[key]
        own = self.load(data).records if records is None else records
        if key in self._loaded:  # NOTE: loading computed them (Sub-Agent's train history)
            return self._loaded[key]
        universe = list(own)
        musique = Path(data.data_dir) / "musique"  # NOTE: loading found it
        if (musique / DEV_DECOMPOSITIONS).is_file():
            universe += load_decompositions(musique / DEV_DECOMPOSITIONS)
        if (musique / TRAIN_FULL).is_file():
            universe += load_full(musique / TRAIN_FULL, "train100")
        self._loaded[key] = step_groups(universe)
        return self._loaded[key]

    def split_size(self, data: DataConfig, split: str) -> int:
        return len(self.records(data, split))

    def pool(self, data: DataConfig, n: int, split: str) -> list[MusiqueRecord]:
        """The split's records to draw ``n`` requests from (typed errors when it cannot)."""
        if n < 0:
            raise ConfigError(f"requests: n={n} must be >= 0")
        pool = self.records(data, split)
        if not pool and n:
            raise DataError(f"{self.name}: the {split} split of {data.data_dir} has no questions")
        return pool
