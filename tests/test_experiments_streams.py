"""Shaped streams for the sweeps: exact repeats at a set share, ReAct run-ahead cycles, and
the drafter whose votes are right with a set probability."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.arms.oracle import BranchOutcomes
from dynbranch.predictors import BranchContext
from dynbranch.workflow import BranchCoordinate, BranchPoint
from experiments.drafter_sweep import SweptDrafter
from experiments.runahead import RunAheadRequest, consumed_by_cycle
from experiments.streams import ShapedWorkload, exact_replay_share, repeating, repetition_stream


@dataclass
class _Instance:
    request_id: str
    record: str


class _Workload:
    """A workload whose requests are fresh objects over records r0, r1, … in order."""

    name = "toy"

    def __init__(self) -> None:
        self.calls = 0

    def requests(self, data, n, seed, split="test"):
        self.calls += 1
        return [_Instance(f"toy-{i:05d}-r{i}", f"r{i}") for i in range(n)]


@given(st.integers(1, 80), st.sampled_from([0.0, 0.22, 0.5, 0.77]), st.integers(0, 3))
@settings(max_examples=60, deadline=None)
def test_a_repetition_stream_has_the_share_and_every_repeat_follows_its_original(n, share, seed):
    stream = repetition_stream(_Workload(), None, n, seed, "test", share)
    repeats = min(round(share * n), n - 1)
    assert len(stream) == n and exact_replay_share(stream) == repeats / n
    assert len({r.request_id for r in stream}) == n  # every request its own id
    assert len({id(r) for r in stream}) == n  # and its own fresh instance
    first_seen: dict[str, int] = {}
    for i, r in enumerate(stream):
        if "-rep" in r.request_id:
            assert r.request_id.split("-rep")[0] in first_seen  # its original came first
            assert r.record == stream[first_seen[r.request_id.split("-rep")[0]]].record
        else:
            first_seen[r.request_id] = i


def test_a_repetition_stream_is_seeded():
    a = [r.request_id for r in repetition_stream(_Workload(), None, 30, 1, "test", 0.5)]
    b = [r.request_id for r in repetition_stream(_Workload(), None, 30, 1, "test", 0.5)]
    c = [r.request_id for r in repetition_stream(_Workload(), None, 30, 2, "test", 0.5)]
    assert a == b and a != c
    with pytest.raises(ValueError):
        repetition_stream(_Workload(), None, 10, 0, "test", 1.0)


def test_a_shaped_workload_hands_its_stream_to_every_caller():
    inner = _Workload()
    shaped = ShapedWorkload(inner, repeating(0.5), "half")
    assert shaped.name == "toy" and shaped.label == "half"
    assert exact_replay_share(shaped.requests(None, 10, 0, "test")) == 0.5


# -- run-ahead cycles -----------------------------------------------------------------------


class _Action:
    def __init__(self, kind, argument):
        self.kind, self.argument = kind, argument


def parse_action(text):
    kind, _, arg = text.partition(":")
    return _Action(kind, arg)


@dataclass
class _ReAct:
    """A ReAct-like request of the original template (hop = think, retrieve)."""

    request_id: str = "q1"
    chain: tuple = ("A", "B", "C", "D")
    _open: dict = field(default_factory=dict)

    def fill_values(self, coordinate, candidate):
        return {"query": candidate} if coordinate in self._open else None

    def retrieve_values(self, entity):
        return {"query": entity}

    def think_values(self, trajectory):
        return {"searched": [t["search"] for t in trajectory]}


class _Ctx:
    def __init__(self, chain):
        self.chain, self.calls = chain, []

    async def tool(self, stage, values):
        self.calls.append((stage, values["query"]))
        return [{"title": values["query"], "text": "."}]

    async def llm(self, stage, values):
        self.calls.append((stage, tuple(values["searched"])))
        h = len(values["searched"])
        return f"search:{self.chain[h]}" if h < len(self.chain) else "finish:x"


@pytest.fixture(autouse=True)
def _plain_module(monkeypatch):
    import sys
    import types

    module = types.ModuleType("toy_react")
    module.parse_action = parse_action
    monkeypatch.setitem(sys.modules, "toy_react", module)
    monkeypatch.setattr(_ReAct, "__module__", "toy_react")


def _speculate(cycles: int):
    inner = _ReAct()
    point = BranchPoint(BranchCoordinate("react", "think", 0), ())
    inner._open[point.coordinate] = []
    ctx = _Ctx(inner.chain)
    import asyncio

    asyncio.run(RunAheadRequest(inner, cycles).speculate(ctx, point, "A"))
    return ctx.calls


def test_one_cycle_is_the_templates_own_fill():
    assert _speculate(1) == [("retrieve", "A"), ("think", ("A",))]


def test_deeper_cycles_follow_the_fills_own_thinks():
    assert _speculate(3) == [
        ("retrieve", "A"),
        ("think", ("A",)),
        ("retrieve", "B"),
        ("think", ("A", "B")),
        ("retrieve", "C"),
        ("think", ("A", "B", "C")),
    ]


def test_run_ahead_rejects_no_cycles_and_delegates_the_rest():
    with pytest.raises(ValueError):
        RunAheadRequest(_ReAct(), 0)
    assert RunAheadRequest(_ReAct(), 2).chain == ("A", "B", "C", "D")


def test_consumed_results_are_counted_by_the_cycle_that_ran_them():
    rows = []

    def spec(start, stage, name, coord="react/think/0", fill="A"):
        rows.append(
            dict(
                request_id="q1",
                start=start,
                stage=stage,
                reuse_name=name,
                coordinate=coord,
                fill=fill,
                speculative=True,
                served_from="exec",
            )
        )

    def canon(start, stage, name, served):
        rows.append(
            dict(
                request_id="q1",
                start=start,
                stage=stage,
                reuse_name=name,
                coordinate="react/think/1",
                fill="",
                speculative=False,
                served_from=served,
            )
        )

    for i, (stage, name) in enumerate(
        [
            ("retrieve", "rA"),
            ("think", "t1"),
            ("retrieve", "rB"),
            ("think", "t2"),
            ("retrieve", "rC"),
        ]
    ):
        spec(float(i), stage, name)
    canon(10.0, "retrieve", "rA", "shadow")
    canon(11.0, "think", "t1", "join")
    canon(12.0, "retrieve", "rB", "shadow")
    canon(13.0, "retrieve", "rC", "exec")  # ran canonically: not consumed
    assert consumed_by_cycle(pd.DataFrame(rows), 3) == [2, 1, 0]


# -- the drafter sweep ----------------------------------------------------------------------


def _ctx(request_id="q", pool=("a", "b", "c", "d")):
    return BranchContext(request_id, BranchCoordinate("routing", "router", 0), pool)


_ROUTER = BranchPoint(BranchCoordinate("routing", "router", 0), ("a", "b", "c", "d"))


def test_a_sweep_of_one_makes_every_vote_the_resolved_candidate():
    outcomes = BranchOutcomes()
    outcomes.add("q", [(_ROUTER, ("c",))])
    drafter = SweptDrafter(outcomes, 1.0, samples=8, seed=0)
    _pool, _p, votes = drafter.sample(_ctx())
    assert votes == ["c"] * 8
    assert drafter.rank(_ctx(), 2)[0] == "c"


def test_a_sweep_of_zero_is_the_plain_drafter():
    from dynbranch.predictors.drafter import DrafterPredictor

    outcomes = BranchOutcomes()
    outcomes.add("q", [(_ROUTER, ("c",))])
    swept = SweptDrafter(outcomes, 0.0, samples=8, seed=3)
    plain = DrafterPredictor(samples=8, seed=3)
    assert swept.sample(_ctx())[2] == plain.sample(_ctx())[2]
    with pytest.raises(ValueError):
        SweptDrafter(outcomes, 1.5)


def test_the_sweep_scores_top1_before_learning_and_advances_the_outcomes():
    import asyncio

    from dynbranch.engines.protocol import GenerateResult

    outcomes = BranchOutcomes()
    outcomes.add("q", [(_ROUTER, ("b",)), (_ROUTER, ("a",))])
    drafter = SweptDrafter(outcomes, 1.0, samples=4, seed=0)

    async def generate(request):
        return GenerateResult(
            request.request_id, request.replay_text, 1, 1, 0, "stop", 0.0, 0.0, 0.0, 0.0
        )

    draft = asyncio.run(drafter.draft(_ctx(), 2, generate))
    assert draft.ranked[0] == "b"
    drafter.observe(_ctx(), ("b",))
    assert (drafter.scored, drafter.top1_hits) == (1, 1)
    assert outcomes.peek("q", "routing/router/0") == ("a",)  # the next entry's outcome
