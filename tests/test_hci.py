"""The HCI workload on SGD: loading, usable pairs, the ``sgd`` tool, think times, replay,
scoring, the frequency predictor and the overlap share.

Fixture tests (``tests/fixtures/sgd``: hand-written, fictional dialogues, schema and pairs in
SGD's layout) always run. Tests marked by the ``sgd`` fixture read the real data set from
the data directory and skip, saying where they looked, when it is absent.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import shutil
import statistics
import subprocess
import sys
from contextlib import asynccontextmanager
from pathlib import Path

import pandas as pd
import pytest

from dynbranch.datasets import require_dataset, resolve_data_dir
from dynbranch.decode_lengths import decision_of
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.engines.tokenizer import count_tokens
from dynbranch.errors import (
    ConfigError,
    DataMissingError,
    MalformedRecordError,
    ToolInputError,
)
from dynbranch.predictors.base import BranchContext
from dynbranch.predictors.frequency import FrequencyPredictor
from dynbranch.workflow import BranchCoordinate, BranchPoint
from dynbranch.workload import DataConfig, MeasuredCost, ModelledCost
from workloads import get_workload
from workloads.hci import (
    FEATURES_KEY,
    KLM_MENU_PICK_S,
    READ_S,
    TEMPLATE,
    TRANSACTION_S,
    Call,
    HCIRequest,
    HCIWorkload,
    ServiceDB,
    ServiceTool,
    ServiceVersions,
    ThinkTime,
    call_fields,
    load_sgd,
    overlap_share,
    split_of,
    top_k_match,
)
from workloads.hci.thinktime import uniform

FIXTURE = Path(__file__).parent / "fixtures" / "sgd"
NO_CACHE = DataConfig(None, Path("/nonexistent-cache"))


# -- a sequential test context ----------------------------------------------------------------


class SeqContext:
    """A minimal StageContext: replays LLM stages, runs the tool, records everything."""

    def __init__(self, request: HCIRequest) -> None:
        self.request, self.request_id = request, request.request_id
        self.rendered, self.branches, self.thinks = [], [], []

    async def llm(self, stage, values):
        rendered = self.request.template.stage(stage).render(values)
        rendered.input_digest  # noqa: B018 - every input must be canonically encodable
        self.rendered.append(rendered)
        text = self.request.replay_text(rendered)
        assert text is not None, f"no replay for {stage}: {rendered.text[-200:]}"
        return text

    async def tool(self, stage, values):
        spec = self.request.template.stage(stage)
        rendered = spec.render(values)
        self.rendered.append(rendered)
        return self.request.tool(spec.tool).call(rendered.fields).value

    async def human(self, stage, values, think_s):
        self.request.template.stage(stage).render(values)
        self.thinks.append(think_s)

    @asynccontextmanager
    async def branch(self, point):
        resolved = []

        class Scope:
            def resolve(self, *chosen):
                assert chosen and all(c in point.candidates for c in chosen), chosen
                resolved.extend(chosen)

        yield Scope()
        assert resolved, f"branch {point.coordinate} was not resolved"
        self.branches.append((point, tuple(resolved)))


def run(request: HCIRequest):
    ctx = SeqContext(request)
    return ctx, asyncio.run(request.run(ctx))


def fixture_workload(**options) -> HCIWorkload:
    return HCIWorkload(root=FIXTURE, **options)


def fixture_requests(split="test", seed=0, **options) -> list[HCIRequest]:
    workload = fixture_workload(**options)
    n = len(workload.episodes(NO_CACHE, split))
    return list(workload.requests(NO_CACHE, n, seed, split))


def by_pair(requests, pair_id) -> HCIRequest:
    return next(r for r in requests if r.episode.pair_id == pair_id)


# -- loading and usable pairs -----------------------------------------------------------------


def test_fixture_loads_and_joins():
    data = load_sgd(FIXTURE)
    assert sorted(data.services) == ["Cafes_9", "Trains_9"]
    assert data.services["Cafes_9"].intents["BookTable"].transactional
    assert not data.services["Cafes_9"].intents["FindCafes"].transactional
    assert sorted(data.dialogues) == ["9_00001", "9_00002", "9_00004", "9_00006", "9_00007"]
    assert len(data.pairs) == 9 and len(list(data.joined())) == 8  # one test pair: no raw file


def test_usable_pairs_per_split_with_their_pick_and_lookup():
    workload = fixture_workload()
    assert workload.usability(NO_CACHE).table() == [
        ("usable", 2, 4),
        ("declined", 1, 0),
        ("offers an intent", 1, 0),
    ]
    got = {
        s: [
            (e.pair_id, e.kind, e.pick, e.offered, e.booking)
            for e in workload.episodes(NO_CACHE, s)
        ]
        for s in ("train", "test")
    }
    assert got == {
        "train": [
            ("9_00001.t01.Trains_9", "select", 1, (0, 1, 2), False),
            ("9_00002.t01.Cafes_9", "accept", 0, (0,), False),
        ],
        "test": [
            ("9_00004.t01.Cafes_9", "alternative", 1, (0,), False),
            ("9_00004.t03.Cafes_9", "accept", 1, (1,), False),
            ("9_00006.t01.Cafes_9", "booking", 0, (0,), True),
            ("9_00007.t01.Cafes_9", "accept", 0, (0,), False),
        ],
    }


def test_split_is_by_dialogue_and_draw_is_seeded():
    assert [split_of(f"9_{i:05d}") for i in (1, 2, 4, 6, 7)] == [
        "train",
        "train",
        "test",
        "test",
        "test",
    ]
    workload = fixture_workload()
    a = [r.request_id for r in workload.requests(NO_CACHE, 9, 5)]
    assert a == [r.request_id for r in workload.requests(NO_CACHE, 9, 5)]
    assert a != [r.request_id for r in workload.requests(NO_CACHE, 9, 6)]
    assert a[0].startswith("hci-00000-9_0000") and len(set(a)) == 9
    assert {r.split("-", 2)[2] for r in a} == {
        e.pair_id for e in workload.episodes(NO_CACHE, "test")
    }
    with pytest.raises(ConfigError, match="split"):
        workload.episodes(NO_CACHE, "dev")


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "sgd"
    shutil.copytree(FIXTURE, root)
    return root


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _edit_pair(path: Path, line: int, change) -> None:
    rows = path.read_text().splitlines()
    row = json.loads(rows[line - 1])
    change(row)
    rows[line - 1] = json.dumps(row)
    path.write_text("\n".join(rows) + "\n")


PAIRS, DIALOGUES, SCHEMA = (
    "offer_pick_pairs_dev_test.jsonl",
    "dev/dialogues_001.json",
    "dev/schema.json",
)


def _set(key, value):
    return lambda row: row.__setitem__(key, value)


def _pop(key):
    return lambda row: row.pop(key)


def _turn(d, t, change):
    return lambda data: change(data[d]["turns"][t])


BROKEN = {
    "pair not json": (
        PAIRS,
        "line 3",
        lambda p: p.write_text("\n".join(p.read_text().splitlines()[:2] + ["{oops"]) + "\n"),
        "not JSON",
    ),
    "pair missing field": (
        PAIRS,
        "line 2",
        lambda p: _edit_pair(p, 2, _pop("user_actions")),
        "missing field 'user_actions'",
    ),
    "pair wrong type": (
        PAIRS,
        "line 1",
        lambda p: _edit_pair(p, 1, _set("system_turn_index", "1")),
        "field 'system_turn_index' is str, expected int",
    ),
    "pair bool as int": (
        PAIRS,
        "line 1",
        lambda p: _edit_pair(p, 1, _set("user_turn_index", True)),
        "is bool, expected int",
    ),
    "pair utterance differs": (
        PAIRS,
        "line 4",
        lambda p: _edit_pair(p, 4, _set("system_utterance", "Something else.")),
        "utterances differ",
    ),
    "pair offered index": (
        PAIRS,
        "line 4",
        lambda p: _edit_pair(p, 4, _set("offered_result_index", 2)),
        "offered_result_index 2, the raw menu gives 0",
    ),
    "pair unknown dialogue": (
        PAIRS,
        "line 5",
        lambda p: _edit_pair(p, 5, _set("dialogue_id", "9_99999")),
        "dialogue 9_99999: not in dialogues_001.json",
    ),
    "pair turns out of order": (
        PAIRS,
        "line 1",
        lambda p: _edit_pair(p, 1, _set("user_turn_index", 5)),
        "does not follow system_turn_index",
    ),
    "pair negative turn": (
        PAIRS,
        "line 1",
        lambda p: _edit_pair(p, 1, lambda r: r.update(system_turn_index=-1, user_turn_index=0)),
        "must be >= 0",
    ),
    "dialogue speaker": (
        DIALOGUES,
        "9_00002",
        lambda p: _edit_json(p, _turn(1, 3, _set("speaker", "BOT"))),
        "turn 3: speaker 'BOT'",
    ),
    "dialogue unknown method": (
        DIALOGUES,
        "9_00002",
        lambda p: _edit_json(
            p, _turn(1, 1, lambda t: t["frames"][0]["service_call"].__setitem__("method", "Nope"))
        ),
        "Cafes_9.Nope is not in the schema",
    ),
    "dialogue result not text": (
        DIALOGUES,
        "9_00002",
        lambda p: _edit_json(
            p,
            _turn(1, 1, lambda t: t["frames"][0]["service_results"][0].__setitem__("has_wifi", 1)),
        ),
        "result 0 is not a map of slot to text",
    ),
    "dialogue duplicate id": (
        DIALOGUES,
        "9_00002",
        lambda p: _edit_json(p, lambda data: data.append(data[1])),
        "dialogue id also in dialogues_001.json",
    ),
    "schema flag": (
        SCHEMA,
        "Cafes_9 intent 1",
        lambda p: _edit_json(
            p, lambda s: s[0]["intents"][1].__setitem__("is_transactional", "yes")
        ),
        "field 'is_transactional' is str, expected bool",
    ),
    "schema not json": (SCHEMA, "file", lambda p: p.write_text("[{"), "not JSON"),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_a_malformed_record_is_rejected_before_any_run(tmp_path, case):
    name, record, breaker, problem = BROKEN[case]
    root = _copy(tmp_path)
    breaker(root / name)
    cfg = ReplayConfig(
        workload="hci",
        backend="local",
        clock="virtual",
        requests=2,
        out=tmp_path / "run",
        progress=False,
        workload_options={"root": str(root)},
    )
    with pytest.raises(MalformedRecordError) as err:
        prepare(cfg, progress=lambda _m: None)
    assert err.value.path == str(root / name) and err.value.record == record
    assert problem in err.value.problem
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("missing", [PAIRS, SCHEMA, DIALOGUES])
def test_missing_files_are_data_missing_errors(tmp_path, missing):
    root = _copy(tmp_path)
    (root / missing).unlink()
    with pytest.raises(DataMissingError, match="sgd") as err:
        HCIWorkload(root=root).check_data(NO_CACHE)
    assert str(root / missing) in str(err.value)


def test_a_data_dir_without_sgd_says_where_it_looked(tmp_path):
    with pytest.raises(DataMissingError, match=r"data set 'sgd' not found") as err:
        HCIWorkload().check_data(DataConfig(tmp_path, tmp_path / "cache"))
    assert str(tmp_path / "sgd") in str(err.value)


def test_registry_and_options():
    assert isinstance(get_workload("hci", root=FIXTURE), HCIWorkload)
    with pytest.raises(ConfigError, match="tool_time"):
        get_workload("hci", tool_time="guessed")
    with pytest.raises(ConfigError, match="median"):
        HCIWorkload(think_median_s=0)
    with pytest.raises(ConfigError, match="sigma"):
        HCIWorkload(think_sigma=-1)


# -- the sgd tool: recorded answers, effects, versions ----------------------------------------


def _tool(**kw) -> tuple[ServiceTool, ServiceDB]:
    data = load_sgd(FIXTURE)
    db = ServiceDB(data.services, data.dialogues.values())
    return ServiceTool(db, ServiceVersions(), **kw), db


FIND = Call("Cafes_9", "FindCafes", {"city": "Springfield"})
BOOK = Call(
    "Cafes_9",
    "BookTable",
    {"cafe_name": "Cup Runneth", "city": "Springfield", "time": "18:00", "party_size": "2"},
)
OGDEN = Call("Cafes_9", "FindCafes", {"city": "Ogdenville"})


def test_a_recorded_call_returns_its_recorded_results():
    tool, db = _tool()
    assert len(db) == 7 and db.ambiguous_calls == 1  # Ogdenville: two dialogues, two answers
    value = tool.call(call_fields(FIND)).value
    assert [e["cafe_name"] for e in value] == ["Bean There", "Cup Runneth", "Daily Grind"]
    assert tool.call(call_fields(FIND, result=2)).value["street_address"] == "5 Mill Road"
    value[0]["cafe_name"] = "changed"  # callers get copies
    assert tool.call(call_fields(FIND, result=0)).value["cafe_name"] == "Bean There"
    # parameters compare canonically: order does not matter, values do
    same = call_fields(Call("Cafes_9", "FindCafes", {"city": "Springfield"}))
    assert tool.call(same).value == tool.call(call_fields(FIND)).value


def test_calls_without_a_single_recorded_answer_are_tool_input_errors():
    tool, _ = _tool()
    cases = [
        (call_fields(Call("Cafes_9", "FindCafes", {"city": "Shelbyville"})), "no dialogue made"),
        (call_fields(OGDEN), "must name its session"),
        (call_fields(OGDEN, session="9_00004"), "has no single recorded result"),
        (call_fields(FIND, result=3), "result 3 out of range"),
        (call_fields(Call("Cafes_9", "Teleport", {})), "Cafes_9.Teleport is not in the schema"),
        ({**call_fields(FIND), "extra": 1}, "unknown fields ['extra']"),
        ({**call_fields(FIND), "parameters": {"city": 3}}, "parameters must map"),
        ({**call_fields(FIND), "result": True}, "result must be an index"),
    ]
    for fields, message in cases:
        with pytest.raises(ToolInputError, match=message.replace("[", r"\[").replace("]", r"\]")):
            tool.call(fields)
    assert tool.call(call_fields(OGDEN, session="9_00002")).value[1]["cafe_name"] == "Tea Total"
    assert tool.call(call_fields(OGDEN, session="9_00007")).value[0]["cafe_name"] == "Tea Total"


def test_transactional_methods_are_mutating_and_bump_the_service_version():
    tool, _ = _tool()
    assert tool.is_read_only(call_fields(FIND)) and not tool.is_read_only(call_fields(BOOK))
    assert not tool.is_read_only(call_fields(Call("Cafes_9", "Teleport", {})))
    first = tool.call(call_fields(FIND))
    assert first.reads == {"sgd:Cafes_9": "0"} and not first.writes
    assert isinstance(tool.cost, ModelledCost) and tool.cost.seconds == READ_S
    # NOTE: a service read is charged what Routing charges a SaaS REST call, whose sources
    # Routing's tools module gives
    from workloads.routing.tools import SAAS_API_S

    assert READ_S == SAAS_API_S and TRANSACTION_S == 2 * SAAS_API_S
    booking = tool.call(call_fields(BOOK))
    assert booking.reads == {"sgd:Cafes_9": "0"} and booking.writes == {"sgd:Cafes_9": "1"}
    assert tool.cost.seconds == TRANSACTION_S
    again = tool.call(call_fields(FIND))
    assert again.value == first.value and again.reads == {"sgd:Cafes_9": "1"}
    trains = call_fields(
        Call(
            "Trains_9",
            "FindTrains",
            {"from_city": "Shelbyville", "to_city": "Capital City", "date": "2019-03-04"},
        )
    )
    assert tool.call(trains).reads == {"sgd:Trains_9": "0"}  # other services untouched
    measured, _ = _tool(tool_time="measured")
    assert isinstance(measured.cost_for(call_fields(BOOK)), MeasuredCost)


def test_a_batch_shares_service_versions_and_each_batch_starts_fresh():
    requests = fixture_requests()
    booking = by_pair(requests, "9_00006.t01.Cafes_9")
    reader = by_pair(requests, "9_00004.t03.Cafes_9")
    fields = reader.lookup_values(reader.chosen)
    assert reader.tool("sgd").call(fields).reads == {"sgd:Cafes_9": "0"}
    run(booking)  # books Daily Grind: a write to Cafes_9
    assert reader.tool("sgd").call(fields).reads == {"sgd:Cafes_9": "1"}
    fresh = by_pair(fixture_requests(), "9_00004.t03.Cafes_9")
    assert fresh.tool("sgd").call(fields).reads == {"sgd:Cafes_9": "0"}
    with pytest.raises(KeyError, match="one tool"):
        reader.tool("search")


# -- think times ------------------------------------------------------------------------------


def test_think_times_are_paired_across_arms_and_differ_across_requests():
    arm_a = fixture_requests(seed=7)
    arm_b = fixture_requests(seed=7)
    assert [r.think_s for r in arm_a] == [r.think_s for r in arm_b]
    assert len({r.think_s for r in arm_a}) == len(arm_a)
    assert [r.think_s for r in fixture_requests(seed=8)] != [r.think_s for r in arm_a]
    r = arm_a[0]
    assert r.think_s == ThinkTime().seconds(7, r.request_id, r.episode.turn)
    ctx, _ = run(r)
    assert ctx.thinks == [r.think_s]


def test_think_time_distribution_has_the_cited_parameters():
    think = ThinkTime()
    assert think.median_s == pytest.approx(1.35 + 1.10 + 0.20) == KLM_MENU_PICK_S
    assert think.sigma == 0.21 and think.mean_s == pytest.approx(2.65 * math.exp(0.21**2 / 2))
    assert think.quantile(0.5) == pytest.approx(2.65)
    assert (think.quantile(0.05), think.quantile(0.95)) == pytest.approx((1.876, 3.743), abs=1e-3)
    logs = [math.log(think.seconds(0, f"r{i}", 1)) for i in range(4000)]
    assert statistics.median(logs) == pytest.approx(math.log(2.65), abs=0.01)
    assert statistics.stdev(logs) == pytest.approx(0.21, abs=0.01)
    assert think.seconds(0, "r1", 1) != think.seconds(0, "r1", 3)  # the turn is part of the key
    assert 0 < uniform(0, "", 0) < 1
    assert ThinkTime(4.0, 0.0).seconds(3, "x", 1) == 4.0


# -- the workflow: branch, evidence, fills, replay, score -------------------------------------


def test_template_declares_the_workflow():
    offer, pick, lookup, respond = (
        TEMPLATE.stage(s) for s in ("offer", "pick", "lookup", "respond")
    )
    assert (offer.kind, pick.kind, lookup.kind, respond.kind) == ("llm", "human", "tool", "llm")
    assert respond.speculable and respond.sampling.greedy and lookup.speculable
    assert not pick.speculable and lookup.tool == "sgd"
    assert respond.inputs[-1] == "utterance"  # the user's words, last (after the prefix)
    warmup = TEMPLATE.stage("respond_prefix")
    assert warmup.inputs == respond.inputs[:-1] and warmup.sampling.max_tokens == 1
    assert respond.prompt.startswith(warmup.prompt) and warmup.prompt.startswith(offer.prompt)
    assert TEMPLATE.subgraphs["next_turn"].children == ("respond",)
    assert HCIRequest.latency_origin == "last_human"


def test_every_fixture_request_scores_one_on_replay():
    for split in ("train", "test"):
        for request in fixture_requests(split):
            ctx, outcome = run(request)
            assert request.score(outcome) == 1.0, request.request_id
            assert outcome.response == request.episode.response
            assert request.score(dataclasses.replace(outcome, response="Hm.")) == 0.0


def test_the_pick_branch_offers_the_menu_and_never_the_pick():
    request = by_pair(fixture_requests("train"), "9_00001.t01.Trains_9")
    ctx, outcome = run(request)
    ((point, chosen),) = ctx.branches
    assert point.coordinate == BranchCoordinate("hci", "pick", 0)
    assert point.candidates == ("0", "1", "2", "3") and chosen == ("1",) == (outcome.pick,)
    assert point.evidence["offered"] == ["0", "1", "2"]
    assert point.evidence["dialogue"][-1] == {
        "speaker": "SYSTEM",
        "utterance": request.episode.offer,
    }
    assert point.evidence[FEATURES_KEY]["3"] == [
        "not-offered",
        "offset:3",
        "Trains_9:offset:3",
        "value:Trains_9:train_name=slow poke",
    ]
    # the same menu with another recorded pick opens the same branch
    other = HCIRequest(
        request.request_id,
        dataclasses.replace(request.episode, pick=2),
        request.db,
        ServiceVersions(),
        0,
    )
    assert other.branch_point(request.episode.offer) == point
    rotated = by_pair(fixture_requests(), "9_00004.t03.Cafes_9")
    assert rotated.candidates == ("1", "2", "0")  # offered first, the passed-over entry last


class Refused(Exception):
    """What the test's fill context raises where a real one raises NotSpeculable."""


class FillSpy(SeqContext):
    """A fill's context: like SeqContext, but refusing calls not declared read-only."""

    async def tool(self, stage, values):
        spec = self.request.template.stage(stage)
        if not self.request.tool(spec.tool).is_read_only(spec.render(values).fields):
            raise Refused(stage)
        return await super().tool(stage, values)

    async def human(self, stage, values, think_s):
        raise AssertionError("a fill never waits for the user")


def speculate(request: HCIRequest, point, candidate) -> FillSpy:
    spy = FillSpy(request)
    asyncio.run(request.speculate(spy, point, candidate))
    return spy


def test_a_fill_renders_the_canonical_lookup_and_the_replys_known_prefix():
    request = by_pair(fixture_requests(prefix_warmup=True), "9_00004.t01.Cafes_9")
    ctx, _ = run(request)
    ((point, _),) = ctx.branches
    lookup, respond = (r for r in ctx.rendered if r.stage in ("lookup", "respond"))
    fill = speculate(request, point, request.chosen)
    assert [r.stage for r in fill.rendered] == ["lookup", "respond_prefix"]
    assert fill.rendered[0].input_digest == lookup.input_digest
    warm = fill.rendered[1]
    assert respond.text.startswith(warm.text) and len(warm.text) < len(respond.text)
    assert respond.text[len(warm.text) :] == (
        f"The user said: {request.episode.utterance}\n\nYour next reply:"
    )
    other = speculate(request, point, "2")  # a pick the user did not make: its own inputs
    assert [r.stage for r in other.rendered] == ["lookup", "respond_prefix"]
    assert other.rendered[0].fields["result"] == 2
    assert not {r.input_digest for r in other.rendered} & {lookup.input_digest}
    assert speculate(request, point, "9").rendered == []  # not a candidate: nothing
    elsewhere = BranchPoint(BranchCoordinate("hci", "pick", 1), point.candidates)
    assert speculate(request, elsewhere, "1").rendered == []
    booking = by_pair(fixture_requests(), "9_00006.t01.Cafes_9")
    ctx, _ = run(booking)
    ((point, _),) = ctx.branches
    with pytest.raises(Refused):  # a booking is mutating: never filled
        speculate(booking, point, "0")


def test_replay_is_a_pure_function_of_the_rendered_input():
    for request in fixture_requests("train") + fixture_requests("test"):
        ctx, _ = run(request)
        twin = HCIRequest(
            "hci-99999-twin",
            request.episode,
            request.db,
            ServiceVersions(),
            3,
            decode=request.decode,
        )
        for rendered in ctx.rendered:
            expected = request.replay_text(rendered)
            assert request.replay_text(rendered) == expected
            assert twin.replay_text(rendered) == expected
            assert (expected is None) == (rendered.stage == "lookup")


def test_replay_of_off_trace_inputs():
    request = by_pair(fixture_requests(), "9_00004.t01.Cafes_9")
    respond, offer = TEMPLATE.stage("respond"), TEMPLATE.stage("offer")
    warmup = TEMPLATE.stage("respond_prefix")
    ep = request.episode
    chosen = request.tool("sgd").call(request.lookup_values("1")).value
    recorded = request.replay_text(
        respond.render(request.respond_values("1", chosen, ep.offer, ep.utterance))
    )
    assert decision_of(recorded) == ep.response and recorded != ep.response  # reasoning first
    details = request.tool("sgd").call(request.lookup_values("2")).value
    off_trace = [
        request.respond_values("2", details, ep.offer, ep.utterance),  # a pick not made
        request.respond_values("1", chosen, ep.offer, "Something else?"),  # other words
        request.respond_values("1", chosen, "Another offer.", ep.utterance),
        request.respond_values("7", chosen, ep.offer, ep.utterance),
    ]
    assert [request.replay_text(respond.render(v)) for v in off_trace] == [None] * 4
    for candidate, value in (("1", chosen), ("2", details)):  # any candidate's warm-up
        assert (
            request.replay_text(warmup.render(request.prefix_values(candidate, value, ep.offer)))
            == ""
        )
    assert request.replay_text(warmup.render(request.prefix_values("7", chosen, ep.offer))) is None
    values = request.offer_values()
    assert decision_of(request.replay_text(offer.render(values))) == ep.offer
    assert request.replay_text(offer.render({**values, "menu": []})) is None


# -- the frequency predictor ------------------------------------------------------------------


def _ctx(candidates, features=None, stage="router", step=0):
    evidence = {FEATURES_KEY: features} if features is not None else {}
    return BranchContext("r", BranchCoordinate("routing", stage, step), tuple(candidates), evidence)


def test_frequency_predictor_cold_start_keeps_candidate_order():
    p = FrequencyPredictor()
    assert p.rank(_ctx(["ls", "cd", "<end_of_turn>"]), 2) == ["ls", "cd"]
    assert p.rank(_ctx(["ls", "cd"]), 0) == [] and p.rank(_ctx(["ls", "ls", "cd"]), 5) == [
        "ls",
        "cd",
    ]


def test_frequency_predictor_learns_pick_rates_per_stage():
    p = FrequencyPredictor()
    for chosen in (("cd",), ("cd",), ("ls",), ("cd", "pwd")):
        p.observe(_ctx(["ls", "cd", "pwd", "mv"]), chosen)
    assert p.score(_ctx(["cd"]), "cd") == pytest.approx(3 / 5)
    assert p.rank(_ctx(["mv", "ls", "pwd", "cd"]), 4) == [
        "cd",
        "ls",
        "pwd",
        "mv",
    ]  # ls = pwd: order
    assert p.rank(_ctx(["mv", "pwd", "ls"]), 4) == ["pwd", "ls", "mv"]
    p.observe(_ctx(["ls", "cd"]), ("rm",))  # a choice off the candidates is not counted
    assert p.score(_ctx(["rm"]), "rm") == 0.0
    assert p.rank(_ctx(["mv", "cd"], stage="handler"), 2) == ["mv", "cd"]  # another stage
    assert p.rank(_ctx(["mv", "cd"], step=9), 1) == ["cd"]  # steps of one stage pool
    per_step = FrequencyPredictor(per_step=True)
    per_step.observe(_ctx(["mv", "cd"]), ("cd",))
    assert per_step.rank(_ctx(["mv", "cd"], step=1), 1) == ["mv"]
    assert p.observed == 5


def test_frequency_predictor_counts_listed_features():
    p = FrequencyPredictor()
    for menu in ("a", "b", "c"):  # three menus of fresh items; the first offered is picked
        items = [f"{menu}{i}" for i in range(3)]
        p.observe(_ctx(items, {c: [f"offset:{i}"] for i, c in enumerate(items)}), (items[0],))
    new = ["x2", "x0", "x1"]
    features = {"x0": ["offset:0"], "x1": ["offset:1"], "x2": ["offset:2"]}
    assert p.rank(_ctx(new, features), 3) == ["x0", "x2", "x1"]
    assert p.score(_ctx(new, features), "x0") == pytest.approx(3 / 4)
    assert p.rank(_ctx(new, {"x0": "offset:0"}), 1) == ["x2"]  # malformed features: ignored


def test_frequency_predictor_learns_hci_picks_from_train():
    train, test = fixture_requests("train"), fixture_requests("test")
    report = top_k_match(FrequencyPredictor(), train, test, k=1, online=False)
    assert (report.branches, report.learned_from, report.matched) == (4, 2, 3)
    assert report.rate == 0.75  # the "alternative" pick is the one miss
    assert top_k_match(FrequencyPredictor(), train, test, k=2).matched == 4


# -- floor replay and overlap share -----------------------------------------------------------


def test_floor_replay_on_the_fixture_measures_latency_after_the_click(tmp_path):
    cfg = ReplayConfig(
        workload="hci",
        backend="local",
        clock="virtual",
        requests=8,
        rate=0.5,
        seed=1,
        workers=2,
        out=tmp_path / "run",
        progress=False,
        workload_options={"root": str(FIXTURE)},
    )
    result = run_replay(prepare(cfg, progress=lambda _m: None))
    summary = result.summary
    assert (summary["completed"], summary["failed"], summary["accuracy"]) == (8, 0, 1.0)
    stages = pd.read_parquet(tmp_path / "run" / "stages.parquet")
    assert set(stages.stage) == {"offer", "pick", "lookup", "respond"}
    picks = stages[stages.stage == "pick"].set_index("request_id")
    for record in result.requests:
        assert record.measured_from == pytest.approx(picks.loc[record.request_id, "end"])
        assert record.latency == pytest.approx(record.end - record.measured_from)
    think = dict(zip(picks.index, picks.duration, strict=True))
    assert sorted(think) == sorted(r.request_id for r in prepare(cfg, lambda _m: None).instances)
    writes = stages[stages.stage == "lookup"].writes.map(lambda w: sorted(json.loads(w)))
    assert sum(w == ["sgd:Cafes_9"] for w in writes) == sum(
        "9_00006" in r for r in picks.index
    )  # only the bookings write
    share = overlap_share(stages)
    assert share.requests == 8 and 0 < share.share < share.post_click_share <= 1.0


def test_overlap_share_on_a_hand_built_stage_log():
    rows = [  # request, stage, start, end, speculative
        ("a", "offer", 0.0, 1.0, False),
        ("a", "pick", 1.0, 4.0, False),
        ("a", "lookup", 4.0, 4.1, False),
        ("a", "respond", 4.1, 5.0, False),
        ("b", "offer", 0.0, 1.0, False),
        ("b", "pick", 1.0, 1.5, False),
        ("b", "lookup", 1.5, 1.6, False),
        ("b", "respond", 1.6, 3.0, False),
        ("b", "respond", 0.2, 0.9, True),  # a fill: not on the critical path
        ("c", "offer", 0.0, 2.0, False),  # no human stage: wall time only
    ]
    frame = pd.DataFrame(rows, columns=["request_id", "stage", "start", "end", "speculative"])
    share = overlap_share(frame)
    assert share.requests == 3
    assert (share.think_s, share.exec_s) == pytest.approx((3.5, 2.5))
    assert share.overlap_s == pytest.approx(1.0 + 0.5)
    assert share.wall_s == pytest.approx(5.0 + 3.0 + 2.0)
    assert (share.share, share.post_click_share) == pytest.approx((0.15, 0.6))


def test_hci_imports_neither_ray_nor_vllm():
    code = (
        "import sys, workloads.hci, dynbranch.predictors.frequency\n"
        "print(sorted({n.split('.')[0] for n in sys.modules} & {'ray', 'vllm'}))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


# -- the real data set (skipped without it) ---------------------------------------------------


@pytest.fixture(scope="module")
def sgd() -> tuple[HCIWorkload, DataConfig]:
    data_dir = resolve_data_dir(None)
    try:
        require_dataset(data_dir, "sgd")
    except DataMissingError as e:
        pytest.skip(f"SGD data not available: {e}")
    workload, data = HCIWorkload(), DataConfig(data_dir, Path("/nonexistent-cache"))
    workload.check_data(data)
    return workload, data


@pytest.mark.data
def test_real_usable_pairs_per_split(sgd):
    workload, data = sgd
    usability = workload.usability(data)
    assert (usability.usable("train"), usability.usable("test")) == (532, 1463)
    assert sum(t + s for _, t, s in usability.table()) == 3302  # every joined dev pair
    db = workload.load(data).db
    assert (len(db), db.ambiguous_calls) == (2530, 51)


@pytest.mark.data
def test_real_episodes_replay_to_accuracy_one(sgd):
    workload, data = sgd
    limit = TEMPLATE.stage("respond").sampling.max_tokens
    for split in ("train", "test"):
        eps = workload.episodes(data, split)
        requests = workload.requests(data, len(eps), 0, split)
        for request in requests:
            _, outcome = run(request)
            assert request.score(outcome) == 1.0, request.request_id
        assert max(count_tokens(e.response) for e in eps) < limit
        assert max(count_tokens(e.offer) for e in eps) < limit


@pytest.mark.data
def test_real_floor_replay_of_thirty_requests(sgd, tmp_path):
    cfg = ReplayConfig(
        workload="hci",
        backend="local",
        clock="virtual",
        requests=30,
        out=tmp_path / "run",
        progress=False,
    )
    result = run_replay(prepare(cfg, progress=lambda _m: None))
    s = result.summary
    assert (s["completed"], s["failed"], s["accuracy"]) == (30, 0, 1.0)
    assert all(r.measured_from is not None for r in result.requests)
    stages = pd.read_parquet(tmp_path / "run" / "stages.parquet")
    gross, fillable = overlap_share(stages), overlap_share(stages, fillable=("lookup",))
    # the reply's reasoning mostly outlasts the think time: the gross bound is about it ...
    assert 0.9 * gross.think_s < gross.overlap_s <= gross.think_s and 0 < gross.share < 0.5
    # ... but a fill can run only the lookup (the reply reads the user's utterance)
    assert fillable.overlap_s == pytest.approx(READ_S * 30) and fillable.post_click_share < 0.03


@pytest.mark.data
def test_real_frequency_predictor_top1_on_the_test_split(sgd):
    workload, data = sgd
    train = workload.requests(data, len(workload.episodes(data, "train")), 0, "train")
    test = workload.requests(data, len(workload.episodes(data, "test")), 0, "test")
    report = top_k_match(FrequencyPredictor(), train, test, k=1)
    assert (report.matched, report.branches) == (1288, 1463)
