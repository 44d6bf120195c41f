"""The HCI workload: SGD offer → pick episodes as requests, split once and for all by dialogue.

Split: an episode belongs to ``train`` when the first 8 bytes of SHA-256 of its *dialogue id*,
read as a big-endian integer, are divisible by 4 (25 % of dialogues in expectation), and to
``test`` otherwise. All episodes of one dialogue fall on the same side, so nothing a
predictor learns on ``train`` comes from a test dialogue; the split never changes with the
seed or the data's order. Predictors and pre-populated caches may learn from ``train`` only,
and runs are measured on ``test``.

Drawing: :meth:`HCIWorkload.requests` takes the split's episodes (file order), permutes
them with ``random.Random(seed)`` and takes them in that order, re-shuffling for every
further cycle when ``n`` exceeds the pool. Request ids are ``hci-{index:05d}-{pair id}``.
The requests of one call share one :class:`~workloads.hci.services.ServiceVersions` (the
services' state); each call starts from fresh versions, so every arm starts alike.
"""

from __future__ import annotations

import hashlib
import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from dynbranch.datasets import require_dataset
from dynbranch.decode_lengths import check_mode, choose
from dynbranch.errors import ConfigError, DataError
from dynbranch.workload import DataConfig, LazyTrace, Workload
from workloads.hci.decode import HCI_DECODE
from workloads.hci.episodes import Episode, Usability, classify_all
from workloads.hci.request import HCIRequest
from workloads.hci.services import TOOL_TIMES, ServiceDB, ServiceVersions
from workloads.hci.sgd_data import SGDData, load_sgd
from workloads.hci.template import TEMPLATE
from workloads.hci.thinktime import KLM_MENU_PICK_S, KLM_RMS_ERROR, ThinkTime

SPLITS = ("train", "test")


def split_of(dialogue_id: str) -> str:
    """``train`` or ``test``: the dialogue's fixed side of the split (module docstring)."""
    head = int.from_bytes(hashlib.sha256(dialogue_id.encode("utf-8")).digest()[:8], "big")
    return "train" if head % 4 == 0 else "test"


def draw(pool: Sequence[Episode], n: int, seed: int) -> list[Episode]:
    """``n`` episodes from ``pool``: seeded permutations, re-shuffled each cycle."""
    rng = random.Random(seed)
    out: list[Episode] = []
    while len(out) < n:
        cycle = list(pool)
        rng.shuffle(cycle)
        out.extend(cycle[: n - len(out)])
    return out


@dataclass(frozen=True)
class Loaded:
    """An SGD directory loaded once: its data, service database, episodes and usability."""

    data: SGDData
    db: ServiceDB
    episodes: dict[str, list[Episode]]
    usability: Usability


_LOADED: dict[Path, Loaded] = {}
"""Every SGD directory loaded in this process, shared by all HCI workload objects. NOTE: what
is loaded is immutable once built (the service database included), so a batch of replays
(an experiment) loads and validates it once instead of once per replay (~4 s each)."""


class HCIWorkload(Workload):
    """SGD menu offers, the user's pick after a think time, and the next system turn.

    Options: ``tool_time`` (``modelled`` or ``measured``), ``root`` (an SGD directory to read
    instead of ``<data dir>/sgd``, e.g. a test fixture), ``think_median_s`` and
    ``think_sigma`` (the log-normal think time, :mod:`workloads.hci.thinktime`),
    ``decode_lengths`` (``modelled``: the LLM stages decode the reasoning of
    :mod:`workloads.hci.decode`; ``recorded``: the trace's text alone), ``prefix_warmup``
    (whether a fill warms the reply's prefix after its lookup; off, the default, a fill is
    the lookup: see :class:`~workloads.hci.request.HCIRequest`).
    """

    name = "hci"
    template = TEMPLATE
    # NOTE: the reply's input holds the user's words, which exist only after the click
    unfillable_stages = frozenset({"respond"})

    def __init__(
        self,
        tool_time: str = "modelled",
        root: str | Path | None = None,
        think_median_s: float = KLM_MENU_PICK_S,
        think_sigma: float = KLM_RMS_ERROR,
        progress: Callable[[str], None] = print,
        decode_lengths: str = "modelled",
        prefix_warmup: bool = False,
    ) -> None:
        self.decode_lengths = check_mode(decode_lengths)
        if not isinstance(prefix_warmup, bool):
            raise ConfigError(f"hci prefix_warmup {prefix_warmup!r}: true or false")
        self.prefix_warmup = prefix_warmup
        if tool_time not in TOOL_TIMES:
            raise ConfigError(f"tool_time {tool_time!r}: choose from {list(TOOL_TIMES)}")
        try:
            self.think = ThinkTime(think_median_s, think_sigma)
        except ValueError as e:
            raise ConfigError(f"hci think time: {e}") from None
        self.tool_time, self.progress = tool_time, progress
        self.root = Path(root) if root else None
        self._loaded = _LOADED

    def sgd_root(self, data: DataConfig) -> Path:
        """The SGD directory read: ``root``, else ``<data dir>/sgd`` with every file present."""
        return self.root if self.root is not None else require_dataset(data.data_dir, "sgd")

    def load(self, data: DataConfig) -> Loaded:
        """Load and validate the SGD files once per directory."""
        root = self.sgd_root(data)
        if root not in self._loaded:
            sgd = load_sgd(root)
            db = ServiceDB(sgd.services, sgd.dialogues.values())
            by_split: dict[str, list[Episode]] = {s: [] for s in SPLITS}
            counts: Counter[tuple[str, str]] = Counter()
            for pair, out in classify_all(sgd, db):
                split = split_of(pair.dialogue_id)
                if isinstance(out, Episode):
                    by_split[split].append(out)
                    out = "usable"
                counts[(split, out)] += 1
            self._loaded[root] = Loaded(sgd, db, by_split, Usability(dict(counts)))
        return self._loaded[root]

    def check_data(self, data: DataConfig) -> None:
        self.load(data)

    def episodes(self, data: DataConfig, split: str) -> list[Episode]:
        """The usable episodes of one split, in file order."""
        if split not in SPLITS:
            raise ConfigError(f"split {split!r}: choose from {list(SPLITS)}")
        return list(self.load(data).episodes[split])

    def split_size(self, data: DataConfig, split: str) -> int:
        return len(self.episodes(data, split))

    def usability(self, data: DataConfig) -> Usability:
        """How many joined pairs each usability rule kept or dropped, per split."""
        return self.load(data).usability

    def requests(
        self, data: DataConfig, n: int, seed: int, split: str = "test"
    ) -> Sequence[HCIRequest]:
        if n < 0:
            raise ConfigError(f"requests: n={n} must be >= 0")
        loaded = self.load(data)
        pool = self.episodes(data, split)
        if not pool and n:
            raise DataError(f"hci: the {split} split of {loaded.data.root} has no usable episodes")
        versions = ServiceVersions()
        decode = choose(self.decode_lengths, HCI_DECODE)
        drawn = draw(pool, n, seed)

        def make(i: int) -> HCIRequest:
            ep = drawn[i]
            return HCIRequest(f"hci-{i:05d}-{ep.pair_id}", ep, loaded.db, versions, seed,
                              self.think, self.tool_time, decode, self.prefix_warmup)

        return LazyTrace(len(drawn), make)  # NOTE: each made at first read (its arrival)
