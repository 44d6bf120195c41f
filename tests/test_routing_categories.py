"""Routing over every BFCL category, with modelled decode lengths.

Fixture tests (``tests/fixtures/bfcl``: one hand-written record per category beside the
original ones) always run: each category replays at the floor through the real orchestrator
(local backend, virtual clock, sim engines) with zero failures and full accuracy; refused
categories are refused with their reason (exit status 2 through the CLI); the decode model
wraps each decision in deterministic reasoning that the workflow strips. Tests on the real
wheel (marked ``network``; skipped when PyPI is unreachable) check value equivalence of a
promoted handler and zero unsafe splices on a 100-request ``full`` replay.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import pickle
import re
import weakref
from pathlib import Path

import pandas as pd
import pytest

from dynbranch.cli import main as cli_main
from dynbranch.decode_lengths import THINK_CLOSE, THINK_OPEN, decision_of
from dynbranch.driver import ReplayConfig, prepare, run_replay
from dynbranch.errors import ConfigError, DataFetchError
from dynbranch.workload import DataConfig
from tests.test_bfcl import FIXTURE, by_record, run
from workloads.routing.bfcl_data import ADDITIONAL_FUNCTION_PROMPT, load_bfcl
from workloads.routing.bfcl_wheel import fetch_bfcl
from workloads.routing.categories import (
    CATEGORIES,
    REFUSED,
    UnscorableCategoryError,
    parse_categories,
)
from workloads.routing.decode import SCALE, category_medians, decode_model, stage_medians
from workloads.routing.request import ExecutedCall, _verb
from workloads.routing.tools import CONNECTED_CAR_S, IN_PROCESS_S, modelled_latency_s
from workloads.routing.workload import RoutingWorkload, split_of


def fixture_pool(categories, decode_lengths="modelled"):
    workload = RoutingWorkload(root=FIXTURE, categories=categories, decode_lengths=decode_lengths)
    data = DataConfig(None, Path("/nonexistent-cache"))
    requests = []
    for split in ("train", "test"):
        n = len(workload.records(data, split))
        requests += workload.requests(data, n, 0, split) if n else []
    return requests


def replay(
    out: Path, arm: str = "floor", requests: int = 6, split: str = "test", **options
) -> dict:
    cfg = ReplayConfig(
        workload="routing",
        arm=arm,
        backend="local",
        clock="virtual",
        requests=requests,
        rate=0.5,
        seed=0,
        out=out,
        progress=False,
        split=split,
        workload_options=options,
    )
    return run_replay(prepare(cfg, progress=lambda _m: None)).summary


# -- the catalogue ----------------------------------------------------------------------------


def test_categories_and_collections_resolve_in_load_order():
    assert parse_categories("all") == CATEGORIES and len(CATEGORIES) == 14
    assert parse_categories("live_simple,multi_turn") == (
        "multi_turn_base",
        "multi_turn_miss_func",
        "multi_turn_miss_param",
        "multi_turn_long_context",
        "live_simple",
    )
    assert parse_categories("non_live") == (
        "simple_python",
        "multiple",
        "parallel",
        "parallel_multiple",
        "irrelevance",
    )
    for name, reason in REFUSED.items():
        with pytest.raises(UnscorableCategoryError) as err:
            parse_categories(f"multiple,{name}")
        assert str(err.value) == f"routing category {name!r} is refused: {reason}"
        assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match="choose at least one"):
        parse_categories(" , ")


def test_the_cli_refuses_an_unscorable_category_with_status_2(tmp_path, capsys):
    argv = [
        "replay",
        "--workload",
        "routing",
        "--backend",
        "local",
        "--clock",
        "virtual",
        "--requests",
        "2",
        "--quiet",
        "--out",
        str(tmp_path / "x"),
    ]
    assert cli_main([*argv, "--categories", "web_search_base"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        f"dynbranch: error: routing category 'web_search_base' is refused: "
        f"{REFUSED['web_search_base']}"
    ]
    assert cli_main([*argv, "--workload", "react", "--categories", "multiple"]) == 2
    assert not (tmp_path / "x").exists()


# -- each category at the floor ---------------------------------------------------------------


@pytest.mark.parametrize("category", CATEGORIES)
def test_each_category_replays_at_the_floor_with_zero_failures(tmp_path, category):
    record = load_bfcl(FIXTURE, (category,)).records[category][-1]
    summary = replay(
        tmp_path / category, split=split_of(record.id), root=str(FIXTURE), categories=(category,)
    )
    assert (summary["completed"], summary["failed"], summary["accuracy"]) == (6, 0, 1.0)
    stages = pd.read_parquet(tmp_path / category / "stages.parquet")
    assert (stages["error"] == "").all()
    llm = stages[stages["kind"] == "llm"]
    # every replayed LLM stage decoded modelled reasoning before its decision
    assert (llm["output_tokens"] > 8).all()


def test_miss_func_offers_a_held_out_function_from_its_turn_on():
    (request,) = fixture_pool(("multi_turn_miss_func",), "recorded")
    record = request.record
    assert record.held_out == {2: ("mean",)} and record.turns[2] == ADDITIONAL_FUNCTION_PROMPT
    assert [[f["name"] for f in record.offered(t)] for t in range(3)] == [
        ["pwd", "ls", "cd", "mkdir", "touch", "echo", "cat", "add", "divide"],
        ["pwd", "ls", "cd", "mkdir", "touch", "echo", "cat", "add", "divide"],
        ["pwd", "ls", "cd", "mkdir", "touch", "echo", "cat", "add", "divide", "mean"],
    ]
    ctx, outcome = run(request)
    routers = [r for r in ctx.rendered if r.stage == "router"]
    assert ["mean" in r.text for r in routers] == [False, False, False, True, True]
    assert [[c.call for c in t] for t in outcome.turns] == [
        ["ls()"],
        [],
        ["mean(numbers=[2.0, 4.0])"],
    ]
    assert request.score(outcome) == 1.0


def test_irrelevance_is_right_only_when_no_call_is_made():
    request = by_record(fixture_pool(("irrelevance",), "recorded"), "irrelevance_0")
    ctx, outcome = run(request)
    assert [r.stage for r in ctx.rendered] == ["router"] and outcome.turns == [[]]
    assert request.score(outcome) == 1.0
    outcome.turns[0].append(ExecutedCall("geometry.triangle_area(base=1.0, height=2.0)", {}))
    assert request.score(outcome) == 0.0


# -- decode lengths ---------------------------------------------------------------------------


def test_modelled_outputs_wrap_the_decision_and_the_workflow_strips_them():
    modelled = by_record(fixture_pool(("multi_turn_base",)), "multi_turn_base_1")
    recorded = by_record(fixture_pool(("multi_turn_base",), "recorded"), "multi_turn_base_1")
    ctx, outcome = run(modelled)
    _, plain = run(recorded)
    assert outcome.turns == plain.turns and modelled.score(outcome) == 1.0
    model = decode_model()
    for rendered in ctx.rendered:
        text = modelled.replay_text(rendered)
        assert text.startswith(THINK_OPEN) and THINK_CLOSE in text
        assert decision_of(text) == recorded.replay_text(rendered)
        assert text == modelled.replay_text(rendered)  # a function of the input alone
        n = model.reasoning_tokens(rendered)
        assert len(text[len(THINK_OPEN) : text.index(THINK_CLOSE)].split()) == n


def test_stage_medians_pool_the_published_lengths_under_the_fitted_scale():
    router, handler = category_medians("multiple")  # 750 published, 465.4 prompt, 35.9 answer
    assert router == pytest.approx(0.5 * 244.7 * 0.8824969, rel=1e-6) == handler
    r_par, h_par = category_medians("parallel")  # 2.70 calls share the handler half
    assert h_par == pytest.approx(r_par / 2.70, rel=1e-6)
    pooled = stage_medians()
    weights = {
        "simple_python": 400,
        "multiple": 200,
        "parallel": 200,
        "parallel_multiple": 200,
        "live_simple": 258,
        "live_multiple": 1053,
        "live_parallel": 16,
        "live_parallel_multiple": 24,
    }
    assert pooled[0] == pytest.approx(
        sum(w * category_medians(c)[0] for c, w in weights.items()) / 2351, rel=1e-9
    )
    model = decode_model()
    assert model.scale == SCALE and model.stages["router"].median_tokens == pooled[0]
    assert model.stages["handler"].median_tokens == pooled[1]
    assert "ThinkBrake" in model.stages["handler"].source


def test_tool_latency_is_per_family():
    assert modelled_latency_s("VehicleControlAPI", "startEngine") == CONNECTED_CAR_S
    assert modelled_latency_s("VehicleControlAPI", "liter_to_gallon") == IN_PROCESS_S
    assert modelled_latency_s("TradingBot", "place_order") == 0.025
    assert modelled_latency_s("GorillaFileSystem", "ls") == 31e-6
    assert modelled_latency_s(None, "anything") == 0.150


# -- the real wheel ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bfcl_cache(tmp_path_factory) -> Path:
    env = os.environ.get("DYNBRANCH_CACHE")
    cache = Path(env) if env else tmp_path_factory.mktemp("dynbranch-cache")
    try:
        fetch_bfcl(cache, progress=lambda message: None)
    except DataFetchError as e:
        pytest.skip(f"PyPI unreachable, cannot fetch the bfcl-eval wheel: {e}")
    return cache


@pytest.mark.network
def test_real_wheel_loads_every_category(bfcl_cache):
    from workloads.routing.bfcl_wheel import bfcl_dir

    data = load_bfcl(bfcl_dir(bfcl_cache))
    assert sum(len(v) for v in data.records.values()) == 4275


@pytest.mark.network
def test_full_replay_promotes_handlers_that_decode_what_canonical_execution_does(
    bfcl_cache, tmp_path, monkeypatch
):
    monkeypatch.setenv("DYNBRANCH_CACHE", str(bfcl_cache))
    summary = replay(tmp_path / "full", arm="full", requests=100)
    assert summary["failed"] == 0 and summary["unsafe_splices"] == 0
    stages = pd.read_parquet(tmp_path / "full" / "stages.parquet")
    promoted = stages[(stages["stage"] == "handler") & (stages["served_from"] == "shadow")]
    assert len(promoted) > 0, "no fill of a handler was promoted"
    spec = stages[stages["speculative"] & (stages["stage"] == "handler")]
    for row in promoted.itertuples():
        fill = spec[spec["reuse_name"] == row.reuse_name]
        assert len(fill) >= 1
        # the fill's output, the value served, and canonical execution's output are one text
        assert set(fill["output_digest"]) == {row.output_digest} == {row.audit_digest}
        assert row.output_tokens == 0 or fill["output_tokens"].iloc[0] > 8


def test_router_evidence_holds_branch_time_features_only():
    request = by_record(fixture_pool(("multi_turn_base",), "recorded"), "multi_turn_base_1")
    ctx, _ = run(request)
    (first, chosen), second = ctx.branches[0], ctx.branches[1][0]
    assert chosen == ("ls",)
    features = first.evidence["candidate_features"]
    # "... hidden files too": ls's description shares one content word ("file")
    said = sorted({w[:4] for w in re.findall(r"[a-z0-9]+", request.record.turns[0].lower())
                   if len(w) >= 3})
    words = [f"word:{w}>ls" for w in said]  # the turn's words, crossed with the candidate
    assert features["ls"] == ["<turn start> -> ls", "name-overlap=0", "doc-overlap=1",
                              "verb:<turn start>->ls", *words]
    assert "verb:<turn start>->mkdir" in features["mkdir"]
    # the verb pools across API classes and naming styles
    assert {_verb(n) for n in ("get_stock_info", "getWatchlist", "get")} == {"get"}
    assert _verb("displayCarStatus") == "display" and _verb("math.hypot") == "math"
    assert features["<end_of_turn>"] == [
        "<turn start> -> <end_of_turn>", "end-after=0", *(f"word:{w}>end-after=0" for w in said)]
    # "List everything in here" names no function; after ls ran, ls is marked (as called and
    # as the call just made) and END counts it
    assert second.evidence["candidate_features"]["ls"] == [
        "ls -> ls", "name-overlap=0", "doc-overlap=1", "verb:ls->ls", "called-this-turn",
        "repeat-previous", *words]
    assert "repeat-previous" not in second.evidence["candidate_features"]["cd"]
    assert second.evidence["candidate_features"]["<end_of_turn>"][1] == "end-after=1"
    # nothing of the resolved branch: the same features whatever the trace chose next
    assert set(first.evidence) == {"turn", "candidate_features", "evidence_key"}


def test_router_evidence_named_alike_is_alike():
    # every fixture request of every category, run twice from fresh instances: each name
    # stands for one evidence, and the second run names every branch as the first did
    named: dict = {}
    runs = []
    for _ in range(2):
        keys = []
        for request in fixture_pool(tuple(CATEGORIES)):
            ctx, _ = run(request)
            for point, _chosen in ctx.branches:
                key = point.evidence["evidence_key"]
                hash(key)
                evidence = {k: v for k, v in point.evidence.items() if k != "evidence_key"}
                assert named.setdefault(key, evidence) == evidence, key
                keys.append(key)
        runs.append(keys)
    assert runs[0] == runs[1] and len(runs[0]) > 20
    # different evidence, different names: what the calls so far were counts
    assert len(named) > len(set(k[1] for k in named))


def test_router_features_kept_per_turn_are_those_built_afresh():
    # a turn's router branches share what does not depend on the calls made so far
    # (_TurnFeatures); every branch's features must be what a build with nothing kept gives
    from workloads.routing import request as routing

    seen = []
    for request in fixture_pool(tuple(CATEGORIES)):
        ctx, _ = run(request)
        for point, _chosen in ctx.branches:
            _workflow, _record, turn, names = point.evidence["evidence_key"]
            seen.append((request, turn, names, point.evidence["candidate_features"]))
    assert len({(r.record.id, t) for r, t, _, _ in seen}) < len(seen)  # turns did repeat
    for request, turn, names, features in seen:
        routing._TURNS.clear()
        afresh = routing.RoutingRequest._features(request.record, request.candidates, turn,
                                                  names)
        assert features == afresh, (request.record.id, turn, names)
    # kept for one record object only: an equal id on another record is built again
    request, turn = seen[0][0], seen[0][1]
    kept = routing._TurnFeatures.of(request.record, request.candidates, turn)
    assert routing._TurnFeatures.of(request.record, request.candidates, turn) is kept
    other = dataclasses.replace(request.record)
    assert routing._TurnFeatures.of(other, request.candidates, turn).record is other


def test_router_evidence_never_read_keeps_no_request_alive():
    # a branch decided by C1 and learnt from a kept branch never reads its features: its
    # evidence outlives the request (held by the predictor's last branch, a branch log) and
    # must not hold the request's API instances and conversation
    request = by_record(fixture_pool(("multi_turn_base",), "recorded"), "multi_turn_base_1")
    evidence = request._evidence(request.record.turns[0], [])
    alive = weakref.ref(request)
    del request
    gc.collect()
    assert alive() is None
    assert pickle.loads(pickle.dumps(evidence)) == dict(evidence)
    assert set(evidence["candidate_features"]) >= {"ls", "<end_of_turn>"}
