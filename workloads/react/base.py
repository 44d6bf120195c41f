"""What the two MuSiQue workloads (ReAct and Sub-Agent) share: options, splits, the pool."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

from dynbranch.decode_lengths import check_mode
from dynbranch.errors import ConfigError, DataError
from dynbranch.workload import DataConfig, Workload
from workloads.musique import SPLITS, MusiqueRecord, in_split
from workloads.react.retrieval import MAX_K, TOOL_TIMES

DEFAULT_TOP_K = 3


class MusiqueWorkload(Workload):
    """A workload over MuSiQue questions and the combined BM25 corpus.

    Options: ``tool_time`` (``measured``, the class's default: retrieval is charged its real
    duration; or ``modelled``, what a replay passes unless ``--tool-time`` says otherwise:
    a hosted search's median, :mod:`workloads.react.retrieval`) and ``top_k`` (passages per
    search).
    """

    def __init__(
        self,
        tool_time: str = "measured",
        top_k: int = DEFAULT_TOP_K,
        decode_lengths: str = "modelled",
    ) -> None:
        if tool_time not in TOOL_TIMES:
            raise ConfigError(f"tool_time {tool_time!r}: choose from {list(TOOL_TIMES)}")
        if not 1 <= top_k <= MAX_K:
            raise ConfigError(f"top_k {top_k} must be in [1, {MAX_K}]")
        self.tool_time, self.top_k = tool_time, top_k
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
        return in_split(self.load(data).records, split)

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
