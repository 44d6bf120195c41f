"""The Sub-Agent workload: MuSiQue's 2,417 dev decompositions as research requests.

Questions: ``musique/dev_2417_decompositions.json`` in file order. Split by question id
(:func:`workloads.musique.split_of`, the same rule and therefore the same side for the 200
questions ReAct shares): runs are measured on ``test``; anything tuned reads ``train`` only.
Sub-agents retrieve from the same combined corpus as ReAct (only the 200 dev questions of
``dev_200_full.jsonl`` have their paragraphs in it; the others read distractors — their
findings are replayed from the record either way).

Drawing: :meth:`SubAgentWorkload.requests` permutes the split's records with
``random.Random(seed)``, re-shuffling for every further cycle when ``n`` exceeds the pool.
Request ids are ``subagent-{index:05d}-{question id}``. Loading validates every record and
the corpus and builds the index before any request runs. Replayed LLM stages decode the
reasoning of :data:`~workloads.react.lengths.SUBAGENT_DECODE` around their decisions
(``decode_lengths`` ``modelled``, the default) or the decisions alone (``recorded``). A fill
runs a whole sub-agent: the workload's fill depth is its three stages.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dynbranch.datasets import require_dataset
from dynbranch.decode_lengths import choose
from dynbranch.errors import ConfigError
from dynbranch.predictors.plans import KnownPlan, KnownStep
from dynbranch.workload import DataConfig, LazyTrace
from workloads.musique import (
    DEV_DECOMPOSITIONS,
    SUBTOPIC_SEP,
    MusiqueRecord,
    draw,
    in_split,
    load_decompositions,
)
from workloads.react.base import DEFAULT_TOP_K, MusiqueWorkload
from workloads.react.lengths import SUBAGENT_DECODE
from workloads.react.retrieval import (
    Bm25Index,
    RetrieveTool,
    index_for,
    load_corpus,
)
from workloads.subagent.mix import partial_overlap_mix
from workloads.subagent.request import SubAgentRequest
from workloads.subagent.template import DEFAULT_PLAN, PLANS, SUBAGENT_STAGES, TEMPLATE, TEMPLATES


@dataclass(frozen=True)
class SubAgentData:
    """The validated decompositions of one data directory, the corpus index, and the
    ``train`` split's plans (the history the plan predictor learns from)."""

    records: tuple[MusiqueRecord, ...]
    index: Bm25Index
    history: tuple[KnownPlan, ...] = ()


def known_plan(record: MusiqueRecord, plan: str = DEFAULT_PLAN) -> KnownPlan:
    """``record``'s decomposition as a plan a predictor may remember: each step's
    sub-topic, entity, ask and answer; with ``plan="references"`` each step as its plan line
    (a later step's entity is its ``#k``)."""
    steps = []
    for s in record.steps:
        relation = SUBTOPIC_SEP.strip() in s.question
        if plan == "references" and s.plan_line != s.subtopic:
            entity, _, ask = s.plan_line.partition(SUBTOPIC_SEP)
            steps.append(KnownStep(s.plan_line, entity, ask, s.answer, relation))
        else:
            steps.append(KnownStep(s.subtopic, s.entity, s.ask, s.answer, relation))
    return KnownPlan(record.question, tuple(steps))


def load_subagent_questions(data_dir: Path | None) -> tuple[MusiqueRecord, ...]:
    """The 2,417 dev decompositions, validated."""
    return load_decompositions(require_dataset(data_dir, "musique") / DEV_DECOMPOSITIONS)


class SubAgentWorkload(MusiqueWorkload):
    """Sub-Agent research over MuSiQue. Options as :class:`~workloads.react.ReActWorkload`:
    ``tool_time`` (``measured`` by default, or ``modelled``, a replay's default) and
    ``top_k``; ``mix`` =
    ``"partial-overlap"`` draws Table 1's mix instead (:mod:`workloads.subagent.mix`);
    ``plan`` = ``"references"`` has the planner write a bridge as ``#k`` and each sub-agent
    wait for the findings it names (:data:`~workloads.subagent.template.PLANS`);
    ``split_by`` as :class:`~workloads.react.base.MusiqueWorkload`."""

    name = "subagent"
    template = TEMPLATE
    predictor = "subtopic"
    # NOTE: a fill is a whole sub-agent, so it may run all of its stages unless the run
    # says otherwise (--depth).
    fill_depth = len(SUBAGENT_STAGES)

    def __init__(
        self,
        tool_time: str = "measured",
        top_k: int = DEFAULT_TOP_K,
        mix: str | None = None,
        decode_lengths: str = "modelled",
        plan: str = DEFAULT_PLAN,
        split_by: str = "question",
    ) -> None:
        if mix not in (None, "partial-overlap"):
            raise ConfigError(f"subagent mix {mix!r}: choose 'partial-overlap' or none")
        if plan not in PLANS:
            raise ConfigError(f"subagent plan {plan!r}: choose one of {', '.join(PLANS)}")
        super().__init__(tool_time, top_k, decode_lengths, split_by)
        self.mix, self.plan = mix, plan
        self.template = TEMPLATES[plan]

    def load(self, data: DataConfig) -> SubAgentData:
        """Decompositions and index of ``data.data_dir`` (validated once, then kept)."""
        if data.data_dir not in self._loaded:
            records = load_subagent_questions(data.data_dir)
            train = in_split(records, "train", self.groups(data, records))
            history = tuple(known_plan(r, self.plan) for r in train)
            self._loaded[data.data_dir] = SubAgentData(
                records, index_for(load_corpus(data.data_dir)), history
            )
        return self._loaded[data.data_dir]

    def requests(
        self, data: DataConfig, n: int, seed: int, split: str = "test"
    ) -> Sequence[SubAgentRequest]:
        loaded, pool = self.load(data), self.pool(data, n, split)
        decode = choose(self.decode_lengths, SUBAGENT_DECODE)
        if self.mix == "partial-overlap":
            # NOTE: a train stream (what InstCache pre-populates from, what a predictor
            # learns) draws its popular share from train too: never a test question
            train = self.records(data, "train") if split == "test" else pool
            stream = partial_overlap_mix(pool, train, n, seed)
        else:
            stream = [(r, "") for r in draw(pool, n, seed)]

        def make(i: int) -> SubAgentRequest:
            r, category = stream[i]
            return SubAgentRequest(
                f"subagent-{i:05d}-{category + '-' if category else ''}{r.id}",
                r,
                RetrieveTool(loaded.index, self.tool_time),
                self.top_k,
                decode,
                # NOTE: only a test run learns from train; a train run has no history.
                loaded.history if split == "test" else (),
                self.plan,
            )

        return LazyTrace(len(stream), make)  # NOTE: each made at first read (its arrival)
