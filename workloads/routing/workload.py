"""The Routing workload: BFCL records as requests, split once and for all into train and test.

Split: a record belongs to ``train`` when the first 8 bytes of SHA-256 of its scenario's id
(:func:`scenario_of`), read as a big-endian integer, are divisible by 4 (25 % of scenarios in
expectation), and to ``test`` otherwise (75 %). The split depends on the id alone, so it
never changes with the seed, the categories chosen or the data's order; predictors and
pre-populated caches may learn from ``train`` only, and runs are measured on ``test``.

A scenario groups the records that are variants of one another: BFCL's four multi-turn
categories are the same 200 scenarios (``multi_turn_miss_func_N``, ``_miss_param_N`` and
``_long_context_N`` are ``multi_turn_base_N`` with a function held back, a parameter left
out, or a long context added: in the shipped data 578 of the 600 variants have their base's
initial configuration and 501 its first user turn). Splitting record by record put variants
of 363 of the 590 multi-turn test records' scenarios on the train side, so the predictor
learnt their turns' answers from a sibling: over 250 multi-turn test records of that split,
the router's top-1 read 0.757 learning the train split as it was, 0.561 without those
records' variants (129 train records), and 0.742 without 65 other train records instead (a
scratch measurement on 2026-12-07). A single-turn record is its own scenario.

Drawing: :meth:`RoutingWorkload.requests` takes the split's records (categories in order,
records in file order), permutes them with ``random.Random(seed)`` and takes them in that
order, re-shuffling for every further cycle when ``n`` exceeds the pool. Request ids are
``routing-{index:05d}-{record id}``.
"""

from __future__ import annotations

import hashlib
import math
import random
from collections.abc import Callable, Sequence
from pathlib import Path

from dynbranch.decode_lengths import check_mode, choose
from dynbranch.errors import ConfigError, DataError
from dynbranch.workload import DataConfig, LazyTrace, Workload
from workloads.routing.apis import ApiState
from workloads.routing.bfcl_data import BFCLData, Record, load_bfcl
from workloads.routing.bfcl_wheel import bfcl_root, fetch_bfcl
from workloads.routing.categories import DEFAULT_CATEGORIES, resolve_categories
from workloads.routing.conflicts import EXCLUDED
from workloads.routing.decode import SCALE, decode_model
from workloads.routing.request import RoutingRequest
from workloads.routing.template import TEMPLATE
from workloads.routing.tools import TOOL_TIMES

SPLITS = ("train", "test")


_MULTI_TURN_VARIANTS = ("multi_turn_miss_func_", "multi_turn_miss_param_",
                        "multi_turn_long_context_")
"""The multi-turn categories whose record ``N`` is a variant of ``multi_turn_base_N``."""


def scenario_of(record_id: str) -> str:
    """The id of the scenario a record is a variant of: ``multi_turn_base_N`` for every
    multi-turn record ``N``, the record's own id otherwise (see the module docstring)."""
    for prefix in _MULTI_TURN_VARIANTS:
        if record_id.startswith(prefix) and record_id[len(prefix):].isdigit():
            return "multi_turn_base_" + record_id[len(prefix):]
    return record_id


def split_of(record_id: str) -> str:
    """``train`` or ``test``: the record's fixed side of the split, its scenario's (see the
    module docstring)."""
    scenario = scenario_of(record_id)
    head = int.from_bytes(hashlib.sha256(scenario.encode("utf-8")).digest()[:8], "big")
    return "train" if head % 4 == 0 else "test"


def draw(pool: Sequence[Record], n: int, seed: int) -> list[Record]:
    """``n`` records from ``pool``: seeded permutations, re-shuffled each cycle."""
    rng = random.Random(seed)
    out: list[Record] = []
    while len(out) < n:
        cycle = list(pool)
        rng.shuffle(cycle)
        out.extend(cycle[: n - len(out)])
    return out


def few_scenarios(pool: Sequence[Record], k: int, seed: int) -> list[Record]:
    """The records of ``pool`` that act on ``k`` of its workspaces (seeded; all of them when
    it has fewer), in ``pool``'s order. A single-turn record acts on none: it counts as one
    of its own."""
    names = list(dict.fromkeys(r.scenario or r.id for r in pool))
    chosen = set(random.Random(f"scenarios|{seed}").sample(names, min(k, len(names))))
    return [r for r in pool if (r.scenario or r.id) in chosen]


class RoutingWorkload(Workload):
    """BFCL function routing over every category it can score (:mod:`workloads.routing.categories`).

    Options: ``categories`` (categories or BFCL collection names; default every replayable
    category, BFCL's own default ``all``; a refused one raises
    :class:`~workloads.routing.categories.UnscorableCategoryError`), ``tool_time`` (``modelled`` or
    ``measured``), ``root`` (a BFCL tree to read instead of the cache, e.g. a test fixture)
    ``decode_scale`` (the decode model's calibration knob, default
    :data:`~workloads.routing.decode.SCALE`; ``scripts/calibrate_routing_decode.py`` fits it)
    and ``fetch`` (fetch the wheel from PyPI on first use; otherwise a missing tree is a
    :class:`~dynbranch.errors.DataMissingError`). ``shared_state=True`` gives multi-turn
    requests of the same scenario (same classes and initial configuration) ONE workspace
    that they all read and write, as a tenant's file system would be: their calls interleave,
    so one request's writes change what another reads (Table 1's write variant). Accuracy
    against BFCL's per-record ground truth then no longer applies and is not a result.
    ``scenarios=N`` draws a stream from the records of N of the split's workspaces only (a
    seeded choice; a single-turn record is a workspace of its own), so that a stream shorter
    than the split still sends several requests to one workspace: with ``shared_state``
    those interleave their reads and writes, which a stream that never repeats a workspace
    would not test.
    """

    name = "routing"
    template = TEMPLATE
    predictor = "logit"  # NOTE: the frequency model ranks the end of the turn first nearly always

    def __init__(
        self,
        categories: Sequence[str] = DEFAULT_CATEGORIES,
        tool_time: str = "modelled",
        root: str | Path | None = None,
        fetch: bool = True,
        progress: Callable[[str], None] = print,
        shared_state: bool = False,
        decode_lengths: str = "modelled",
        decode_scale: float = SCALE,
        scenarios: int | None = None,
    ) -> None:
        if scenarios is not None and (isinstance(scenarios, bool) or not isinstance(scenarios, int)
                                      or scenarios < 1):
            raise ConfigError(f"scenarios={scenarios!r} must be a whole number >= 1")
        self.scenarios = scenarios
        self.decode_lengths = check_mode(decode_lengths)
        if not (decode_scale >= 0 and math.isfinite(decode_scale)):
            raise ConfigError(f"decode_scale={decode_scale} must be a finite number >= 0")
        self.decode_scale = float(decode_scale)
        self.shared_state = shared_state
        if isinstance(categories, str):
            categories = categories.split(",")
        self.categories = resolve_categories(categories)
        if tool_time not in TOOL_TIMES:
            raise ConfigError(f"tool_time {tool_time!r}: choose from {list(TOOL_TIMES)}")
        self.tool_time, self.root, self.fetch, self.progress = (
            tool_time,
            Path(root) if root else None,
            fetch,
            progress,
        )
        self._loaded: dict[Path, BFCLData] = {}

    def load(self, data: DataConfig) -> BFCLData:
        """The validated records (fetching BFCL into the cache first if allowed and needed)."""
        if self.root is not None:
            root = self.root
        elif self.fetch:
            root = fetch_bfcl(data.cache_dir, self.progress)
        else:
            root = bfcl_root(data.cache_dir)
        if root not in self._loaded:
            self._loaded[root] = load_bfcl(root, self.categories)
        return self._loaded[root]

    def fetch_data(self, data: DataConfig, progress: Callable[[str], None] = print) -> None:
        """Fetch the pinned bfcl-eval wheel into ``data.cache_dir`` unless it is there already
        (or the workload reads a given ``root``, or was told not to fetch)."""
        if self.root is None and self.fetch:
            fetch_bfcl(data.cache_dir, progress)

    def check_data(self, data: DataConfig) -> None:
        self.load(data)

    def records(self, data: DataConfig, split: str) -> list[Record]:
        """The records of one split, categories in order, records in file order, without
        the records no replayed model could answer (:data:`~workloads.routing.conflicts.EXCLUDED`)."""
        if split not in SPLITS:
            raise ConfigError(f"split {split!r}: choose from {list(SPLITS)}")
        return [r for r in self.load(data).all()
                if split_of(r.id) == split and r.id not in EXCLUDED]

    def split_size(self, data: DataConfig, split: str) -> int:
        return len(self.records(data, split))

    def requests(
        self, data: DataConfig, n: int, seed: int, split: str = "test"
    ) -> Sequence[RoutingRequest]:
        if n < 0:
            raise ConfigError(f"requests: n={n} must be >= 0")
        bfcl = self.load(data)
        pool = self.records(data, split)
        if not pool and n:
            raise DataError(
                f"routing: the {split} split of {bfcl.root} has no records "
                f"in categories {list(self.categories)}"
            )
        if self.scenarios is not None:
            pool = few_scenarios(pool, self.scenarios, seed)
        workspaces: dict[str, tuple[str, ApiState]] = {}
        drawn = draw(pool, n, seed)

        def make(i: int) -> RoutingRequest:
            r = drawn[i]
            return RoutingRequest(f"routing-{i:05d}-{r.id}", r, bfcl.suite, self.tool_time,
                                  self._workspace(r, bfcl, workspaces),
                                  choose(self.decode_lengths, decode_model(self.decode_scale)))

        # NOTE: made at first read: a replay reads each at its arrival (see LazyTrace)
        return LazyTrace(len(drawn), make)

    def _workspace(self, record: Record, bfcl: BFCLData,
                   workspaces: dict[str, tuple[str, ApiState]]) -> tuple[str, ApiState] | None:
        """The shared workspace of ``record``'s scenario (``shared_state`` only)."""
        if not (self.shared_state and record.multi_turn):
            return None
        scenario = record.scenario
        if scenario not in workspaces:
            state = ApiState(bfcl.suite, record.classes, record.initial_config,
                             record.long_context)
            workspaces[scenario] = (f"shared-{scenario}", state)
        return workspaces[scenario]
