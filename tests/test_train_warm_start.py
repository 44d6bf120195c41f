"""Before a run: the predictor learns the train split, and C3's selection rates learn what
the predictor's rankings of it were worth (each branch ranked while open, before it is
learnt), unless those rankings are in-sample."""

import asyncio
from pathlib import Path

from dynbranch.clock import VirtualClock
from dynbranch.fill.model import Ranked
from dynbranch.fill.speculator import TRAIN_REQUESTS, FillPolicy, Speculator
from dynbranch.gate.priced import PricedPolicy
from dynbranch.predictors import BranchContext
from dynbranch.predictors.frequency import FrequencyPredictor
from dynbranch.runtime.run import FillOptions, GateOptions, RunContext
from dynbranch.workflow import BranchCoordinate, BranchPoint
from dynbranch.workload import DataConfig
from workloads.routing import RoutingWorkload
from workloads.routing.template import END_OF_TURN

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
DATA = DataConfig(None, Path("/nonexistent-cache"))
PROFILE = "qwen3-8b@rtx4090"


class Recording(FrequencyPredictor):
    """The frequency model, logging each rank and observe with the branch's coordinate."""

    def __init__(self, in_sample: bool = False) -> None:
        super().__init__()
        self.in_sample_on_train = in_sample
        self.calls: list[tuple[str, str, str]] = []

    def rank(self, ctx, k):
        self.calls.append(("rank", ctx.request_id, str(ctx.coordinate)))
        return super().rank(ctx, k)

    def observe(self, ctx, chosen):
        self.calls.append(("observe", ctx.request_id, str(ctx.coordinate)))
        super().observe(ctx, chosen)


class History(FillPolicy):
    name = "history"
    learns_history = True

    def __init__(self) -> None:
        self.learnt: list = []

    async def choose(self, session, ranked):
        return []

    async def learn_history(self, branches):
        self.learnt.append(list(branches))


def _prepopulate(predictor, policy, requests=3):
    run = RunContext(clock=VirtualClock(), arm="c2", fill=FillOptions(fanout=2))
    spec = Speculator(run, predictor, policy)
    workload = RoutingWorkload(root=FIXTURE)
    asyncio.run(spec.prepopulate(workload, DATA, 0, split="test", requests=requests))
    return spec


def test_each_train_branch_is_ranked_while_open_and_before_it_is_learnt():
    predictor, policy = Recording(), History()
    spec = _prepopulate(predictor, policy)
    [history] = policy.learnt
    assert len(history) == spec.counts["train_branches"] > 3
    ranks = [c for c in predictor.calls if c[0] == "rank"]
    observes = [c for c in predictor.calls if c[0] == "observe"]
    assert len(ranks) == len(observes) == len(history)
    for rank in ranks:  # every branch is ranked before the predictor learns it
        first_observe = predictor.calls.index(("observe", *rank[1:]))
        assert predictor.calls.index(rank) < first_observe
    for point, ranked, chosen in history:
        names = [r.name for r in ranked]
        assert END_OF_TURN not in names  # only what a live branch could fill is ranked
        assert set(names) <= set(point.candidates) and chosen
        assert [r.rank for r in ranked] == sorted(r.rank for r in ranked)


def test_the_train_split_is_learnt_whatever_the_runs_length():
    """A 1-request run and a 30-request run learn the same train requests, the whole split
    up to TRAIN_REQUESTS (InstCache's pre-population does not shrink with the run either)."""
    short, long = Recording(), Recording()
    a = _prepopulate(short, History(), requests=1)
    b = _prepopulate(long, History(), requests=30)
    assert a.counts["train_branches"] == b.counts["train_branches"] > 0
    assert short.calls == long.calls
    train = RoutingWorkload(root=FIXTURE)
    size = train.split_size(DATA, "train")
    assert 1 < size < TRAIN_REQUESTS
    assert len({c[1] for c in short.calls}) == size  # each train request once


def test_an_in_sample_predictor_learns_the_train_split_but_teaches_c3_nothing():
    predictor, policy = Recording(in_sample=True), History()
    spec = _prepopulate(predictor, policy)
    assert policy.learnt == [] and spec.counts["train_branches"] > 3
    assert {c[0] for c in predictor.calls} == {"observe"}


def test_a_policy_that_learns_nothing_from_history_gets_no_ranking_of_it():
    """DSP's and SPAgent's policies ignore the train split's rankings, so none is made."""

    class Deaf(History):
        learns_history = False

    predictor, policy = Recording(), Deaf()
    spec = _prepopulate(predictor, policy)
    assert policy.learnt == [] and spec.counts["train_branches"] > 3
    assert {c[0] for c in predictor.calls} == {"observe"}


def test_history_teaches_the_gate_selection_rates_per_decile_not_usability():
    run = RunContext(clock=VirtualClock(), arm="c2",
                     gate=GateOptions(policy="priced", profile=PROFILE))
    policy = PricedPolicy.for_run(run)
    point = BranchPoint(BranchCoordinate("w", "pick", 0), ("a", "b"))
    branches = [(point, [Ranked("a", 0, 0.95), Ranked("b", 1, 0.03)], ("a",))] * 40
    asyncio.run(policy.learn_history(branches))
    gate = policy.gate.gate
    sure, unsure = gate._sel[("w/pick", "p9")].posterior, gate._sel[("w/pick", "p0")].posterior
    assert sure.mean > 0.95 and unsure.mean < 0.05
    assert gate._sel[("w/pick", "p9")].decisions == 0  # Bayes-UCB's count is of live reads
    assert "w/pick" not in gate._use  # pi_use needs fills that ran
    assert policy.counts["history_observations"] == 80


def test_a_second_run_of_the_same_workload_takes_the_learnt_split_without_learning_it_again(
    monkeypatch,
):
    """An experiment's cells share a workload: the first learns the train split offline,
    the next ones start from the state it left (its own copy) and the same ranked
    branches; a different start (predictor settings, seed) or no workload key learns again."""
    from collections import OrderedDict

    from dynbranch.fill import speculator

    monkeypatch.setattr(speculator, "_TRAINED", OrderedDict())
    monkeypatch.setattr(speculator, "_kept", 4)  # as inside keeping_train_splits()
    ran: list[str] = []
    offline = speculator.precompute

    async def counting(instance, **kw):
        ran.append(instance.request_id)
        return await offline(instance, **kw)

    monkeypatch.setattr(speculator, "precompute", counting)

    def prepopulate(predictor, key=("routing", "fixture"), seed=0):
        policy = History()
        run = RunContext(clock=VirtualClock(), arm="c2", fill=FillOptions(fanout=2),
                         workload_key=key)
        spec = Speculator(run, predictor, policy)
        workload = RoutingWorkload(root=FIXTURE)
        asyncio.run(spec.prepopulate(workload, DATA, seed, split="test", requests=3))
        return spec, policy

    first, first_policy = prepopulate(FrequencyPredictor())
    learnt = len(ran)
    assert learnt > 0 and first.predictor.observed > 0
    second, second_policy = prepopulate(FrequencyPredictor())
    assert len(ran) == learnt  # nothing ran offline again
    assert vars(second.predictor) == vars(first.predictor)
    assert second_policy.learnt == first_policy.learnt and second_policy.learnt[0]
    assert second.counts["train_branches"] == first.counts["train_branches"]
    point, _ranked, chosen = second_policy.learnt[0][0]
    second.predictor.observe(BranchContext.of("r", point), chosen)  # its own copy
    third, _ = prepopulate(FrequencyPredictor())
    assert vars(third.predictor) == vars(first.predictor) != vars(second.predictor)
    assert len(ran) == learnt
    prepopulate(FrequencyPredictor(per_step=True))  # another start: learnt again
    prepopulate(FrequencyPredictor(), seed=1)
    prepopulate(FrequencyPredictor(), key=None)
    assert len(ran) == 4 * learnt
    monkeypatch.setattr(speculator, "_kept", 0)  # a lone replay keeps nothing
    prepopulate(FrequencyPredictor())
    assert len(ran) == 5 * learnt


def test_train_splits_are_kept_only_inside_keeping_train_splits(monkeypatch):
    from collections import OrderedDict

    from dynbranch.fill import speculator

    monkeypatch.setattr(speculator, "_TRAINED", OrderedDict())
    run = RunContext(clock=VirtualClock(), arm="c2", fill=FillOptions(fanout=2),
                     workload_key=("routing", "fixture"))
    workload = RoutingWorkload(root=FIXTURE)

    def learn():
        spec = Speculator(run, FrequencyPredictor(), History())
        asyncio.run(spec.prepopulate(workload, DATA, 0, split="test", requests=3))

    learn()
    assert not speculator._TRAINED
    with speculator.keeping_train_splits(2):
        learn()
        assert len(speculator._TRAINED) == 1
    assert not speculator._TRAINED and speculator._kept == 0
