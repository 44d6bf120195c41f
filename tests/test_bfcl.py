"""The Routing workload on BFCL: loading, split, drawing, replay, the ``bfcl`` tool, scoring.

Fixture tests (``tests/fixtures/bfcl``: hand-written records, docs and toy API classes in
BFCL's layout) always run. Tests marked ``network`` need the real ``bfcl-eval`` wheel: they
fetch it once per session into ``$DYNBRANCH_CACHE`` (or a temporary cache) and skip, saying
so, only when PyPI cannot be reached.
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from collections import Counter
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from dynbranch.canonical import FrozenMap
from dynbranch.cli import main
from dynbranch.errors import (
    ChecksumError,
    ConfigError,
    DataFetchError,
    DataMissingError,
    MalformedRecordError,
    ToolExecutionError,
    ToolInputError,
    UnknownNameError,
)
from dynbranch.workflow import BranchCoordinate
from dynbranch.workload import DataConfig, LazyTrace, MeasuredCost, ModelledCost
from workloads import WORKLOAD_NAMES, get_workload
from workloads.routing import (
    END_OF_TURN,
    TEMPLATE,
    RoutingRequest,
    RoutingWorkload,
    bfcl_wheel,
    draw,
    load_bfcl,
    scenario_of,
    split_of,
)
from workloads.routing.apis import ApiState, state_snapshot
from workloads.routing.bfcl_wheel import BFCL, BFCL_SHA256, bfcl_dir, bfcl_root, fetch_bfcl
from workloads.routing.calls import CallSyntaxError, ParsedCall, parse_call
from workloads.routing.conflicts import EXCLUDED, find_conflicts
from workloads.routing.effects import MUTATING, READ_ONLY
from workloads.routing.schema import (
    SchemaViolation,
    matches_answer,
    plausible_call,
    validate_call,
)
from workloads.routing.template import TOOL_NAME

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
REPO = Path(__file__).resolve().parent.parent


# -- a sequential test context ----------------------------------------------------------------


class SeqContext:
    """A minimal StageContext: renders each stage, answers LLM stages from replay, runs tools.

    It records every rendered input (so tests can replay them again) and every branch.
    """

    def __init__(self, request: RoutingRequest, yield_in_llm: bool = False) -> None:
        self.request, self.request_id = request, request.request_id
        self.rendered, self.branches, self.tool_results, self.events = [], [], [], []
        self._yield = yield_in_llm

    async def llm(self, stage, values):
        rendered = self.request.template.stage(stage).render(values)
        rendered.input_digest  # noqa: B018 - every input must be canonically encodable
        self.rendered.append(rendered)
        self.events.append(("start", stage))
        if self._yield:
            await asyncio.sleep(0)
        text = self.request.replay_text(rendered)
        assert text is not None, f"replay has no answer for {stage}: {rendered.text[-300:]}"
        self.events.append(("end", stage))
        return text

    async def tool(self, stage, values):
        spec = self.request.template.stage(stage)
        rendered = spec.render(values)
        rendered.input_digest  # noqa: B018
        result = self.request.tool(spec.tool).call(rendered.fields)
        self.tool_results.append((rendered, result))
        return result.value

    async def human(self, stage, values, think_s):
        raise AssertionError("routing has no human stage")

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


def run(request: RoutingRequest, **kw) -> tuple[SeqContext, object]:
    ctx = SeqContext(request, **kw)
    return ctx, asyncio.run(request.run(ctx))


ORIGINAL = ("multi_turn_base", "multiple", "parallel_multiple")


def fixture_requests(split: str = "test", n: int | None = None, seed: int = 0, **options):
    # NOTE: the fixture's first three categories, replayed as recorded, unless a test asks
    # otherwise (tests/test_routing_categories.py covers the rest and the decode model).
    options.setdefault("categories", ORIGINAL)
    options.setdefault("decode_lengths", "recorded")
    workload = RoutingWorkload(root=FIXTURE, **options)
    data = DataConfig(None, Path("/nonexistent-cache"))
    pool = workload.records(data, split)
    return workload.requests(data, n if n is not None else len(pool), seed, split)


def by_record(requests, record_id):
    return next(r for r in requests if r.record.id == record_id)


# -- sessions with the real wheel -------------------------------------------------------------


@pytest.fixture(scope="session")
def bfcl_tree(tmp_path_factory) -> Path:
    env = os.environ.get("DYNBRANCH_CACHE")
    cache = Path(env) if env else tmp_path_factory.mktemp("dynbranch-cache")
    try:
        return fetch_bfcl(cache, progress=lambda message: None)
    except ChecksumError:
        raise
    except DataFetchError as e:
        pytest.skip(f"PyPI unreachable, cannot fetch the bfcl-eval wheel: {e}")


@pytest.fixture(scope="session")
def real(bfcl_tree):
    return load_bfcl(bfcl_tree)


# -- loading ----------------------------------------------------------------------------------


def test_fixture_loads_every_category():
    data = load_bfcl(FIXTURE)
    assert {c: [r.id for r in rs] for c, rs in data.records.items()} == {
        "multi_turn_base": ["multi_turn_base_0", "multi_turn_base_1"],
        "multi_turn_miss_func": ["multi_turn_miss_func_0"],
        "multi_turn_miss_param": ["multi_turn_miss_param_0"],
        "multi_turn_long_context": ["multi_turn_long_context_0"],
        "simple_python": ["simple_python_0"],
        "multiple": ["multiple_0"],
        "parallel": ["parallel_0"],
        "parallel_multiple": ["parallel_multiple_0"],
        "live_simple": ["live_simple_0-0-0"],
        "live_multiple": ["live_multiple_0-0-0"],
        "live_parallel": ["live_parallel_0-0-0"],
        "live_parallel_multiple": ["live_parallel_multiple_0-0-0"],
        "irrelevance": ["irrelevance_0"],
        "live_irrelevance": ["live_irrelevance_0-0-0"],
    }
    data = load_bfcl(FIXTURE, ORIGINAL)
    mt0, mt1 = data.records["multi_turn_base"]
    assert mt0.classes == ("GorillaFileSystem", "MathAPI") and mt0.multi_turn
    assert mt0.turns[1] == "Write 'buy milk' into todo.txt and show me what it says."
    assert mt0.recorded[2] == ("mean(numbers=[3.0, 5.0, 10.0])",)
    assert "touch" not in mt1.function_names and "touch" in mt0.function_names  # excluded
    assert mt1.recorded[1] == ()  # a turn that needs no call
    (multiple,), (parallel,) = data.records["multiple"], data.records["parallel_multiple"]
    assert multiple.recorded == (("kitchen.timer(minutes=12.5)",),)  # optional label omitted
    assert parallel.parallel and parallel.recorded[0] == (
        "recipe.scale(recipe='pancake', servings=6, units='imperial')",
        "kitchen.timer(minutes=3.0)",
        "kitchen.timer(minutes=8.0)",
    )


def _broken_copy(tmp_path: Path) -> Path:
    root = tmp_path / "bfcl"
    shutil.copytree(FIXTURE, root)
    return root


def _rewrite(path: Path, record_id: str, change) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        if row["id"] == record_id:
            change(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


Q, A = "bfcl_eval/data/BFCL_v4_{}.json", "bfcl_eval/data/possible_answer/BFCL_v4_{}.json"
BROKEN = {
    "missing field": (
        Q,
        "multi_turn_base",
        "multi_turn_base_0",
        lambda r: r.pop("question"),
        "missing field 'question'",
    ),
    "wrong type": (
        Q,
        "multi_turn_base",
        "multi_turn_base_1",
        lambda r: r.update(involved_classes="GorillaFileSystem"),
        "field 'involved_classes' is str, expected list",
    ),
    "unknown class": (
        Q,
        "multi_turn_base",
        "multi_turn_base_1",
        lambda r: r.update(involved_classes=["NoSuchAPI"]),
        "NoSuchAPI",
    ),
    "turns not aligned": (
        A,
        "multi_turn_base",
        "multi_turn_base_0",
        lambda r: r["ground_truth"].pop(),
        "ground truth has 2 turns",
    ),
    "unparseable call": (
        A,
        "multi_turn_base",
        "multi_turn_base_0",
        lambda r: r["ground_truth"][0].append("cd(folder='x'"),
        "unparseable ground-truth call",
    ),
    "non-literal call": (
        A,
        "multi_turn_base",
        "multi_turn_base_0",
        lambda r: r["ground_truth"][0].append("cd(folder=os.getcwd())"),
        "not a literal",
    ),
    "excluded function": (
        A,
        "multi_turn_base",
        "multi_turn_base_1",
        lambda r: r["ground_truth"][1].append("touch(file_name='x')"),
        "names no offered function",
    ),
    "unknown single-turn function": (
        A,
        "multiple",
        "multiple_0",
        lambda r: r.update(ground_truth=[{"nope": {}}]),
        "names no offered function",
    ),
    "required without value": (
        A,
        "multiple",
        "multiple_0",
        lambda r: r["ground_truth"][0]["kitchen.timer"].update(minutes=[""]),
        "required 'minutes' has no allowed value",
    ),
    "two calls in multiple": (
        A,
        "multiple",
        "multiple_0",
        lambda r: r["ground_truth"].append(r["ground_truth"][0]),
        "2 expected calls in a multiple record",
    ),
    "doc without type": (
        Q,
        "parallel_multiple",
        "parallel_multiple_0",
        lambda r: r["function"][0]["parameters"]["properties"]["minutes"].pop("type"),
        "parameter 'minutes' has no type",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_malformed_record_names_file_record_and_problem(tmp_path, case):
    template, category, record_id, change, problem = BROKEN[case]
    root = _broken_copy(tmp_path)
    path = root / template.format(category)
    _rewrite(path, record_id, change)
    with pytest.raises(MalformedRecordError) as err:
        load_bfcl(root)
    assert (err.value.path, err.value.record) == (str(path), record_id)
    assert problem in err.value.problem
    assert str(path) in str(err.value) and record_id in str(err.value)


def test_malformed_json_line_and_missing_ground_truth(tmp_path):
    root = _broken_copy(tmp_path)
    questions = root / Q.format("multiple")
    questions.write_text(questions.read_text() + "{not json\n")
    with pytest.raises(MalformedRecordError, match=r"record line 2: not JSON"):
        load_bfcl(root, ("multiple",))
    questions.write_text(
        questions.read_text().replace(
            "{not json\n",
            json.dumps(
                {
                    "id": "multiple_7",
                    "question": [[{"role": "user", "content": "hi"}]],
                    "function": [],
                }
            )
            + "\n",
        )
    )
    with pytest.raises(MalformedRecordError, match="multiple_7: no ground truth"):
        load_bfcl(root, ("multiple",))


def test_missing_tree_is_a_data_missing_error(tmp_path):
    with pytest.raises(DataMissingError, match="dynbranch data bfcl"):
        load_bfcl(tmp_path, ("multiple",))
    with pytest.raises(DataMissingError, match="dynbranch data bfcl") as err:
        RoutingWorkload(fetch=False).check_data(DataConfig(None, tmp_path))
    assert str(bfcl_dir(tmp_path)) in str(err.value)


def test_fetch_data_fetches_into_the_cache_unless_a_root_is_given_or_fetch_is_off(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setattr(
        "workloads.routing.workload.fetch_bfcl",
        lambda cache, progress: calls.append((cache, progress)),
    )
    data = DataConfig(None, tmp_path)
    RoutingWorkload(root=FIXTURE).fetch_data(data, print)
    assert calls == []
    RoutingWorkload(fetch=False).fetch_data(data, print)
    assert calls == []
    RoutingWorkload().fetch_data(data, print)
    assert calls == [(tmp_path, print)]


# -- split and drawing ------------------------------------------------------------------------


def test_split_is_a_fixed_function_of_the_id():
    assert [
        split_of(i)
        for i in ("multi_turn_base_0", "multi_turn_base_1", "multiple_0", "parallel_multiple_0")
    ] == ["train", "test", "test", "test"]
    ids = [f"record_{i}" for i in range(4000)]
    share = Counter(split_of(i) for i in ids)["train"] / len(ids)
    assert 0.22 < share < 0.28
    assert [split_of(i) for i in ids] == [split_of(i) for i in ids]


def test_a_multi_turn_variant_is_on_its_base_scenarios_side():
    # NOTE: the variants of scenario N share its initial configuration and mostly its turns;
    # record by record, a test record's answers could be learnt from a train sibling
    sides = set()
    for n in range(200):
        base = f"multi_turn_base_{n}"
        variants = [f"multi_turn_{v}_{n}" for v in ("miss_func", "miss_param", "long_context")]
        assert [scenario_of(v) for v in variants] == [base] * 3
        assert {split_of(v) for v in variants} == {split_of(base)}
        sides.add(split_of(base))
    assert sides == {"train", "test"}
    # records of other categories are scenarios of their own, whatever their number
    for other in ("multiple_7", "live_multiple_7-3-1", "multi_turn_composite_7",
                  "multi_turn_miss_func_x"):
        assert scenario_of(other) == other


def test_splits_are_disjoint_and_requests_stay_in_theirs():
    workload = RoutingWorkload(root=FIXTURE, categories=ORIGINAL)
    data = DataConfig(None, Path("/nonexistent-cache"))
    train = {r.id for r in workload.records(data, "train")}
    test = {r.id for r in workload.records(data, "test")}
    assert train == {"multi_turn_base_0"} and train.isdisjoint(test) and len(test) == 3
    for split, pool in (("train", train), ("test", test)):
        assert {r.record.id for r in workload.requests(data, 9, 3, split)} <= pool
    with pytest.raises(ConfigError, match="split 'dev'"):
        workload.requests(data, 1, 0, "dev")


def test_request_drawing_is_deterministic_and_cycles():
    first = [r.request_id for r in fixture_requests(n=7, seed=11)]
    assert first == [r.request_id for r in fixture_requests(n=7, seed=11)]
    assert first[0].startswith("routing-00000-") and first[6].startswith("routing-00006-")
    ids = [i.split("-", 2)[2] for i in first]
    pool = {"multi_turn_base_1", "multiple_0", "parallel_multiple_0"}
    assert set(ids[0:3]) == set(ids[3:6]) == pool  # each cycle is a permutation
    orders = {tuple(draw(list("abcdef"), 6, seed)) for seed in range(10)}
    assert len(orders) > 1  # the seed matters
    assert draw(list("abc"), 0, 1) == []


def test_requests_have_their_own_api_state():
    requests = fixture_requests(n=6, seed=0)
    same = [r for r in requests if r.record.id == "multi_turn_base_1"]
    assert len(same) == 2 and same[0].state is not same[1].state
    run(same[0])
    assert same[0].state.versions["GorillaFileSystem"] > 0
    assert same[1].state.versions["GorillaFileSystem"] == 0


def test_a_request_builds_its_apis_when_first_used(monkeypatch):
    # NOTE: a trace made in full before its first request starts (a run that keeps its
    # log, a shaped stream): built eagerly, a Routing request's APIs held about 4 KB each
    built = []
    original = ApiState.__init__

    def counted(self, *args, **kwargs):
        built.append(self)
        original(self, *args, **kwargs)

    monkeypatch.setattr(ApiState, "__init__", counted)
    requests = fixture_requests(n=6, seed=0)
    assert built == []  # making the trace builds no API instance
    request = by_record(requests, "multi_turn_base_1")
    tool = request.tool(TOOL_NAME)
    assert built == [request.state] and tool.state is request.state
    assert request.state is request.state and request.tool(TOOL_NAME) is tool
    single = next(r for r in requests if not r.record.multi_turn)
    assert single.state is None and single.tool(TOOL_NAME) is single.tool(TOOL_NAME)
    assert len(built) == 1
    assert request.functions == [dict(f) for f in request.record.functions]


def test_a_trace_makes_each_request_when_first_read_in_any_order():
    """The trace is a LazyTrace: nothing made until read, each request made once and then
    the same object, made alike whatever order it is read in (shared workspaces too), and
    let go only by setting it to None."""
    forward = fixture_requests(n=9, seed=4, shared_state=True)
    backward = fixture_requests(n=9, seed=4, shared_state=True)
    assert isinstance(forward, LazyTrace) and forward.made() == backward.made() == 0
    a = list(forward)
    b = [backward[i] for i in reversed(range(9))][::-1]
    assert forward.made() == backward.made() == 9
    assert [r.request_id for r in a] == [r.request_id for r in b]
    assert [r.request_input() for r in a] == [r.request_input() for r in b]
    assert [r.scope for r in a] == [r.scope for r in b]

    def sharing(trace):  # NOTE: per request, the positions of those sharing its workspace
        return [[j for j, x in enumerate(trace) if x._state is r._state]
                for r in trace if r.scope is not None and "shared" in r.scope]

    assert sharing(a) == sharing(b) and any(len(group) > 1 for group in sharing(a))
    assert forward[-1] is forward[8] is a[8] and forward[2:4] == a[2:4]
    assert forward + [None] == [*a, None] and [None] + forward == [None, *a]
    forward[3] = None
    assert forward[3] is None and forward.made() == 8
    with pytest.raises(TypeError, match="let go"):
        forward[4] = a[5]
    with pytest.raises(IndexError):
        forward[9]


# -- the template and the workflow ------------------------------------------------------------


def test_template_declares_the_routing_stages():
    router, handler, executor = (TEMPLATE.stage(s) for s in ("router", "handler", "executor"))
    assert (TEMPLATE.name, TEMPLATE.version) == ("routing", "2")
    assert router.inputs == ("workspace", "functions", "conversation")
    assert handler.inputs == ("workspace", "history", "offered", "function", "turn", "calls",
                              "occurrence")
    assert router.kind == handler.kind == "llm" and router.model == "target"
    assert router.speculable and handler.speculable and executor.speculable
    assert router.sampling.greedy and handler.sampling.greedy
    assert executor.tool == "bfcl" and executor.inputs == ("call", "scope")
    assert TEMPLATE.subgraphs["handle"].root == "handler"
    assert TEMPLATE.subgraphs["handle"].children == ("executor",)


def test_fixture_floor_scores_one_on_every_record():
    for split in ("train", "test"):
        for request in fixture_requests(split):
            _, outcome = run(request)
            assert request.score(outcome) == 1.0, request.request_id


def test_branches_count_router_decisions_and_offer_the_functions():
    request = by_record(fixture_requests(), "multi_turn_base_1")
    ctx, outcome = run(request)
    points = [p for p, _ in ctx.branches]
    assert [p.coordinate for p in points] == [
        BranchCoordinate("routing", "router", s) for s in range(7)
    ]
    assert outcome.router_decisions == 7  # (1 + 1) + (0 + 1) + (3 + 1)
    assert points[0].candidates == (*request.record.function_names, END_OF_TURN)
    assert [c for _, c in ctx.branches] == [
        ("ls",),
        (END_OF_TURN,),
        (END_OF_TURN,),
        ("mkdir",),
        ("cd",),
        ("pwd",),
        (END_OF_TURN,),
    ]
    assert not any(p.multi_valued for p in points)
    assert outcome.turns[2][2].value == {"current_working_directory": "/home/backup"}


def test_parallel_calls_are_one_multi_valued_branch_with_concurrent_handlers():
    request = by_record(fixture_requests(), "parallel_multiple_0")
    ctx, outcome = run(request, yield_in_llm=True)
    (point, chosen), (_, end) = ctx.branches
    assert (
        point.multi_valued and chosen == ("recipe.scale", "kitchen.timer") and end == (END_OF_TURN,)
    )
    handler_events = [e for e in ctx.events if e[1] == "handler"]
    assert handler_events[:3] == [("start", "handler")] * 3  # all started before any ended
    occurrences = [r.fields["occurrence"] for r in ctx.rendered if r.stage == "handler"]
    assert occurrences == [0, 0, 1]
    assert [c.call for c in outcome.turns[0]] == list(request.record.recorded[0])
    assert request.score(outcome) == 1.0


def test_router_output_off_the_vocabulary_is_ignored_and_kept():
    request = by_record(fixture_requests(), "multi_turn_base_1")

    class Noisy(SeqContext):
        async def llm(self, stage, values):
            text = await super().llm(stage, values)
            if stage == "router" and text != END_OF_TURN:
                return f"rm_everything, {text}, cat"
            return text

    outcome = asyncio.run(request.run(Noisy(request)))
    assert request.score(outcome) == 1.0
    assert outcome.ignored_routes == ["rm_everything", "cat"] * 4


# -- replay -----------------------------------------------------------------------------------


def test_replay_is_a_pure_function_of_the_rendered_input():
    requests = fixture_requests("train") + fixture_requests("test")
    for request in requests:
        ctx, _ = run(request)
        twin = RoutingRequest("routing-99999-twin", request.record, request._suite)
        for rendered in ctx.rendered:
            expected = request.replay_text(rendered)
            assert request.replay_text(rendered) == expected  # after the run: no hidden state
            assert twin.replay_text(rendered) == expected  # another instance, same record


def test_replay_of_off_trace_inputs():
    request = by_record(fixture_requests("train"), "multi_turn_base_0")
    turn = request.record.turns[0]
    handler = TEMPLATE.stage("handler")
    # a function the trace does not call next: a plausible, deterministic call of it
    cat = handler.render(request.handler_values("cat", 0, turn, []))
    text = request.replay_text(cat)
    assert text == request.replay_text(cat) and parse_call(text).name == "cat"
    assert validate_call(request.record.doc("cat"), parse_call(text))
    # the trace's next call
    cd = handler.render(request.handler_values("cd", 0, turn, []))
    assert request.replay_text(cd) == "cd(folder='notes')"
    # calls that left the recorded path, a turn not in the record, a foreign doc
    off = [{"call": "ls()", "result": {}}]
    assert request.replay_text(handler.render(request.handler_values("cd", 0, turn, off))) is None
    assert (
        request.replay_text(handler.render(request.handler_values("cd", 0, "another turn", [])))
        is None
    )
    router = TEMPLATE.stage("router")
    convo = [{"role": "user", "content": turn}, {"role": "assistant", "content": "ls()"}]
    assert (
        request.replay_text(router.render(request.router_values(request.functions, convo)))
        is None
    )
    convo[1]["content"] = "cd(folder='notes')"
    assert (
        request.replay_text(router.render(request.router_values(request.functions, convo)))
        == "touch"
    )
    assert (
        request.replay_text(
            router.render(request.router_values(request.functions, convo[:1]))
        )
        == "cd"
    )
    assert (
        request.replay_text(
            TEMPLATE.stage("executor").render(request.executor_values("cd(folder='notes')"))
        )
        is None
    )


def test_workspace_history_and_offered_functions_separate_records_that_read_alike():
    request = by_record(fixture_requests("train"), "multi_turn_base_0")
    ctx, _ = run(request)
    record = request.record
    decided = [r for r in ctx.rendered if r.stage in ("router", "handler")]
    later = [r for r in decided if r.stage == "handler" and r.fields["history"]]
    assert decided and later
    # the same turns acting on another workspace (as long_context does): no input is shared
    elsewhere = dataclasses.replace(record, long_context=True)
    twin = RoutingRequest("routing-99998-elsewhere", elsewhere, request._suite)
    assert elsewhere.scenario != record.scenario
    assert all(twin.replay_text(r) is None for r in decided)
    # the same later turns after another first turn: the handlers' history tells them apart
    reworded = dataclasses.replace(record, turns=("Something else first.", *record.turns[1:]))
    twin = RoutingRequest("routing-99997-reworded", reworded, request._suite)
    assert all(twin.replay_text(r) is None for r in later)
    # a function held back at turn 1 (as miss_func does): turn 1's handlers are not shared
    held = dataclasses.replace(record, held_out={2: ("cat",)})
    twin = RoutingRequest("routing-99996-held", held, request._suite)
    at_turn_1 = [r for r in later if len([m for m in r.fields["history"] if m["role"] == "user"]) == 1]
    assert at_turn_1 and all(twin.replay_text(r) is None for r in at_turn_1)


def test_fixture_records_answer_no_input_two_ways():
    requests = fixture_requests("train") + fixture_requests("test")
    records = [r.record for r in requests]
    assert find_conflicts(records, requests[0]._suite) == {}
    # the check itself: two records answering one input differently are found
    base = by_record(requests, "multi_turn_base_0").record
    copy = dataclasses.replace(base, id="multi_turn_copy_0", recorded=((), *base.recorded[1:]))
    found = find_conflicts([base, copy], requests[0]._suite)
    assert list(found) == ["multi_turn_copy_0"] and "router input" in found["multi_turn_copy_0"]


def test_fill_values_match_the_canonical_handler_input():
    request = by_record(fixture_requests("train"), "multi_turn_base_0")
    seen = {}

    class Spy(SeqContext):
        @asynccontextmanager
        async def branch(self, point):
            seen[point.coordinate] = {
                c: request.fill_values(point.coordinate, c) for c in point.candidates
            }
            async with super().branch(point) as scope:
                yield scope

    ctx = Spy(request)
    asyncio.run(request.run(ctx))
    first = BranchCoordinate("routing", "router", 0)
    handler_inputs = [r for r in ctx.rendered if r.stage == "handler"]
    assert (
        TEMPLATE.stage("handler").render(seen[first]["cd"]).input_digest
        == handler_inputs[0].input_digest
    )
    assert seen[first][END_OF_TURN] is None
    assert request.fill_values(first, "cd") is None  # the branch is closed now


def test_a_call_s_result_is_one_frozen_value_in_the_conversation_and_the_handlers_calls():
    # NOTE: so its canonical encoding, kept on it, is made once for every later stage input
    request = by_record(fixture_requests("train"), "multi_turn_base_0")
    ctx, _ = run(request)
    results = [m["content"] for r in ctx.rendered if r.stage == "router"
               for m in r.fields["conversation"] if m["role"] == "tool"]
    entries = [c["result"] for r in ctx.rendered if r.stage == "handler"
               for c in r.fields["calls"]]
    assert results and entries
    assert all(isinstance(v, FrozenMap) for v in results if isinstance(v, dict))
    by_id = {id(v) for v in results}
    assert all(id(v) in by_id for v in entries)  # the very objects, not equal copies


# -- the bfcl tool ----------------------------------------------------------------------------


def _tool(record_id="multi_turn_base_0", split="train"):
    request = by_record(fixture_requests(split), record_id)
    return request, request.tool("bfcl")


def test_executor_parse_and_argument_errors_are_clear():
    request, tool = _tool()
    cases = {
        "cd(folder='notes'": "not python call syntax",
        "cd": "not a function call",
        "cd(folder=open('x'))": "not a literal",
        "rm(file_name='x')": "no involved class",
        "cd(folder='x', path='y')": "unexpected keyword",
        "cd(*x)": "*args are not allowed",
    }
    for text, message in cases.items():
        with pytest.raises(ToolInputError, match=re.escape(message)) as err:
            tool.call(request.executor_values(text))
        assert err.value.call == text and err.value.tool == "bfcl"
        assert not tool.is_read_only(request.executor_values(text))
    with pytest.raises(KeyError, match="one tool"):
        request.tool("search")


def test_api_exception_becomes_a_recordable_tool_error():
    request, tool = _tool()
    with pytest.raises(ToolExecutionError, match="ZeroDivisionError") as err:
        tool.call(request.executor_values("divide(a=1.0, b=0.0)"))
    assert isinstance(err.value.__cause__, ZeroDivisionError)
    assert "divide(a=1.0, b=0.0)" in str(err.value)


def test_read_set_names_the_state_by_lineage_and_declared_effects():
    request, tool = _tool()
    values = request.executor_values
    start = request.state.lineage["GorillaFileSystem"]
    key = f"state:{start}/GorillaFileSystem"
    before_cd = values("cd(folder='notes')")
    ls = tool.call(values("ls()"))
    assert ls.reads == {key: "0"} and ls.writes == {}
    cd = tool.call(before_cd)
    assert cd.reads == {key: "0"} and cd.writes == {}  # a lineage is immutable: no write
    moved = request.state.lineage["GorillaFileSystem"]
    assert moved != start
    assert tool.call(values("pwd()")).reads == {f"state:{moved}/GorillaFileSystem": "0"}
    assert values("pwd()")["scope"] != before_cd["scope"]  # the rendered input moved too
    math_lineage = request.state.lineage["MathAPI"]
    assert tool.call(values("mean(numbers=[1.0, 2.0])")).reads == {
        f"state:{math_lineage}/MathAPI": "0"
    }
    again, _ = _tool()  # a second request on the same record starts on the same lineage
    assert again.state.lineage["GorillaFileSystem"] == start
    assert tool.is_read_only(values("ls(a=True)")) and tool.is_read_only(values("echo('hi')"))
    assert not tool.is_read_only(values("echo(content='hi', file_name='ideas.txt')"))
    assert not tool.is_read_only(values("cd('..')")) and not tool.is_read_only(values("mkdir('x')"))


def test_a_read_on_a_state_the_request_has_left_is_not_recordable():
    # a parallel call (or the request's own path, while a fill waited) moved the state on
    # between rendering a read and running it: the value answers another input than its name
    request, tool = _tool()
    values = request.executor_values
    ls_before = values("ls()")
    assert tool.answers(ls_before) and tool.call(ls_before).recordable
    tool.call(values("cd(folder='notes')"))
    assert not tool.answers(ls_before)  # a fill asks this first, and does not run it
    late = tool.call(ls_before)
    assert not late.recordable
    moved = request.state.lineage["GorillaFileSystem"]
    assert late.reads == {f"state:{moved}/GorillaFileSystem": "0"}  # what it did read
    assert tool.call(values("ls()")).recordable  # rendered on the state it runs on
    # another class's lineage did not move: its reads still name their state
    assert tool.call(ls_before | {"call": "mean(numbers=[1.0, 2.0])"}).recordable
    assert tool.answers(ls_before | {"call": "mean(numbers=[1.0, 2.0])"})
    assert tool.answers(values("ls()")) and tool.answers(ls_before | {"call": "nope("})


def fresh(state):
    """A fresh deep copy of every instance's public attributes (what public_state copied
    before it kept copies by lineage)."""
    return {c: {k: copy.deepcopy(v) for k, v in vars(i).items() if not k.startswith("_")}
            for c, i in state.instances.items()}


def test_states_are_copied_once_per_lineage_and_shared():
    request, tool = _tool()
    other, _ = _tool()  # a second request on the same record, on the same lineages
    first = request.state.public_state()
    assert first == fresh(request.state)
    shared = other.state.public_state()["GorillaFileSystem"]
    root = first["GorillaFileSystem"]["root"]
    assert shared == first["GorillaFileSystem"] and shared["root"] is root  # copied once
    assert shared is not first["GorillaFileSystem"]  # each its own dict of attributes
    tool.call(request.executor_values("ls()"))  # read-only: the same lineage, the same copy
    assert request.state.public_state()["GorillaFileSystem"]["root"] is root
    tool.call(request.executor_values("mkdir(dir_name='backup')"))  # a write: a new lineage
    moved = request.state.public_state()
    assert moved == fresh(request.state) != first
    assert moved["GorillaFileSystem"]["root"] is not root
    assert other.state.public_state() == first == fresh(other.state)  # the other is unmoved


def test_kept_state_copies_are_bounded(monkeypatch):
    from workloads.routing import apis

    monkeypatch.setattr(apis, "_SNAPSHOTS", {})
    monkeypatch.setattr(apis, "_SNAPSHOTS_MAX", 3)
    request, tool = _tool()
    state = request.state

    def key():
        return (state.suite_root, "GorillaFileSystem", state.lineage["GorillaFileSystem"])

    state.public_state()
    first = key()
    for name in ("a", "b", "c", "d"):  # each write a new lineage, whose copy is kept
        tool.call(request.executor_values(f"mkdir(dir_name='{name}')"))
        assert state.public_state() == fresh(state)
        assert key() in apis._SNAPSHOTS
    assert len(apis._SNAPSHOTS) == 3 and first not in apis._SNAPSHOTS  # the oldest left


def test_tool_cost_is_modelled_per_class_or_measured():
    request, tool = _tool()
    tool.call(request.executor_values("ls()"))
    assert tool.cost == ModelledCost(31e-6) and tool.cost.charge_s(5.0) == 31e-6
    single = by_record(fixture_requests(), "multiple_0").tool("bfcl")
    assert single.cost == ModelledCost(0.150) and single.is_read_only({"call": "x("})
    measured = by_record(fixture_requests(tool_time="measured"), "multiple_0").tool("bfcl")
    assert isinstance(measured.cost, MeasuredCost)
    with pytest.raises(ConfigError, match="tool_time"):
        RoutingWorkload(tool_time="guessed")


def test_schema_validator():
    doc = {
        "name": "f",
        "parameters": {
            "type": "dict",
            "required": ["n", "x"],
            "properties": {
                "n": {"type": "integer"},
                "x": {"type": "float"},
                "mode": {"type": "string", "enum": ["a", "b"]},
                "tags": {"type": "array", "items": {"type": "string"}},
                "where": {
                    "type": "dict",
                    "properties": {"zip": {"type": "integer"}},
                    "required": ["zip"],
                },
                "pair": {"type": "tuple", "items": {"type": "integer"}},
            },
        },
    }
    ok = validate_call(
        doc, parse_call("f(3, 2, mode='b', tags=['t'], where={'zip': 1}, pair=(1, 2))")
    )
    assert ok == {
        "name": "f",
        "arguments": {
            "n": 3,
            "x": 2.0,
            "mode": "b",
            "tags": ["t"],
            "where": {"zip": 1},
            "pair": [1, 2],
        },
    }
    assert isinstance(ok["arguments"]["x"], float)
    bad = {
        "f(n=1)": "missing required parameters ['x']",
        "f(n=1, x=2, y=3)": "unknown parameters ['y']",
        "f(n=1.5, x=2)": "f.n: expected an integer",
        "f(n=True, x=2)": "f.n: expected an integer",
        "f(n=1, x=2, tags=[{}])": "f.tags[0]: expected a string",
        "f(n=1, x=2, where={})": "missing keys",
        "g(n=1, x=2)": "the schema is 'f'",
        "f(1, 2, 'a', [], {}, (), 7)": "takes 6 arguments",
    }
    for text, message in bad.items():
        with pytest.raises(SchemaViolation, match=re.escape(message)):
            validate_call(doc, parse_call(text))
    # BFCL's answers pass variables as text where another type is declared
    assert validate_call(doc, parse_call("f(n='count', x=\"data['x']\")"))
    # like BFCL's checker: enums unchecked, scalars and None accepted for strings
    assert validate_call(doc, parse_call("f(n=1, x=2, mode='c', tags=[1, None])"))
    with pytest.raises(SchemaViolation):
        validate_call(doc, parse_call("f(n='12', x=1)"))
    # plausible calls are valid and deterministic
    for key in ("a", "b", "c"):
        text = plausible_call(doc, key)
        assert text == plausible_call(doc, key) and validate_call(doc, parse_call(text))


def test_single_turn_tool_returns_the_normalised_call_and_refuses_bad_ones():
    request = by_record(fixture_requests(), "multiple_0")
    tool = request.tool("bfcl")
    result = tool.call(request.executor_values("kitchen.timer(12)"))
    assert result.value == {"name": "kitchen.timer", "arguments": {"minutes": 12.0}}
    assert result.reads == {} and result.writes == {}
    with pytest.raises(ToolInputError, match="not an offered function"):
        tool.call(request.executor_values("oven.on(temp=200)"))
    with pytest.raises(ToolInputError, match="expected a number"):
        tool.call(request.executor_values("kitchen.timer(minutes='12 min')"))


def test_ast_check_against_possible_answers():
    doc = {
        "name": "f",
        "parameters": {
            "type": "dict",
            "required": ["city"],
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "integer"},
                "opts": {"type": "dict"},
            },
        },
    }
    answer = {"f": {"city": ["New York", "NYC"], "days": ["", 3], "opts": ["", {"a": [1]}]}}
    call = validate_call
    assert matches_answer(doc, call(doc, parse_call("f(city='new york')")), answer)
    assert matches_answer(
        doc, call(doc, parse_call("f(city='NYC', days=3, opts={'a': 1})")), answer
    )
    assert not matches_answer(doc, call(doc, parse_call("f(city='Boston')")), answer)
    assert not matches_answer(doc, call(doc, parse_call("f(city='NYC', days=4)")), answer)
    assert not matches_answer(doc, call(doc, parse_call("f(city='NYC', opts={'b': 1})")), answer)
    strict = {"f": {"city": ["NYC"], "days": [3]}}
    assert not matches_answer(doc, call(doc, parse_call("f(city='NYC')")), strict)


def test_scores_zero_when_the_outcome_is_wrong():
    request = by_record(fixture_requests(), "multi_turn_base_1")
    _, outcome = run(request)
    outcome.turns[2].pop()  # drop pwd's result
    assert request.score(outcome) == 0.0
    _, outcome = run(by_record(fixture_requests(), "multi_turn_base_1"))
    outcome.states[0]["GorillaFileSystem"]["root"] = {}
    assert request.score(outcome) == 0.0
    single = by_record(fixture_requests(), "parallel_multiple_0")
    _, outcome = run(single)
    outcome.turns[0].pop()
    assert single.score(outcome) == 0.0


def test_call_parser():
    assert parse_call(" math.hypot(3, y=-4.5) ") == ParsedCall("math.hypot", (3,), {"y": -4.5})
    for bad in ("f(x=1, x=2)", "f(**k)", "(lambda: 1)()", "1 + 2", ""):
        with pytest.raises(CallSyntaxError):
            parse_call(bad)


# -- the registry and import boundary ---------------------------------------------------------


def test_workload_registry():
    assert WORKLOAD_NAMES == ("routing", "react", "subagent", "hci")
    workload = get_workload("routing", root=FIXTURE, categories=("multiple",))
    assert isinstance(workload, RoutingWorkload) and workload.categories == ("multiple",)
    with pytest.raises(UnknownNameError, match="known workloads: hci, react, routing, subagent"):
        get_workload("chat")
    with pytest.raises(ConfigError, match="routing category 'simple_java' is refused"):
        get_workload("routing", categories=("simple_java",))
    with pytest.raises(ConfigError, match="routing category 'chat'"):
        get_workload("routing", categories=("chat",))


def test_routing_imports_neither_ray_nor_vllm():
    code = (
        "import sys, workloads, workloads.routing, dynbranch.datasets; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# -- fetching ---------------------------------------------------------------------------------


def test_fetch_refuses_a_wheel_with_the_wrong_checksum(tmp_path, monkeypatch):
    def fake_download(dest: Path) -> Path:
        wheel = dest / bfcl_wheel.BFCL_WHEEL
        wheel.write_bytes(b"not the wheel")
        return wheel

    monkeypatch.setattr(bfcl_wheel, "_pip_download", fake_download)
    messages = []
    with pytest.raises(ChecksumError, match=BFCL_SHA256) as err:
        fetch_bfcl(tmp_path, progress=messages.append)
    assert err.value.expected == BFCL_SHA256
    assert messages and "fetching bfcl-eval 2026.3.23" in messages[0] and "from PyPI" in messages[0]
    assert not bfcl_dir(tmp_path).exists()
    assert list((tmp_path / "bfcl").iterdir()) == []  # the temporary folder is gone


def test_bfcl_is_a_data_set_the_data_command_knows(capsys):
    assert (BFCL.name, BFCL.licence, BFCL.source) == (
        "bfcl",
        "Apache-2.0",
        "https://pypi.org/project/bfcl-eval/2026.3.23/",
    )
    assert "bfcl_eval/data/BFCL_v4_multiple.json" in BFCL.files
    assert "bfcl_eval-2026.3.23.dist-info/METADATA" in BFCL.files  # it carries the licence
    assert main(["data", "imagenet"]) == 2
    err = capsys.readouterr().err
    assert "unknown data set 'imagenet'; known data sets: bfcl, hotpotqa, musique, sgd" in err


@pytest.mark.network
def test_fetch_is_idempotent_and_detects_a_broken_tree(bfcl_tree, tmp_path, monkeypatch, capsys):
    cache = bfcl_tree.parent.parent

    def no_download(dest):
        raise AssertionError("an intact tree must not be fetched again")

    monkeypatch.setattr(bfcl_wheel, "_pip_download", no_download)
    messages = []
    assert fetch_bfcl(cache, progress=messages.append) == bfcl_tree and messages == []
    assert bfcl_root(cache) == bfcl_tree and bfcl_wheel.verify_bfcl(cache) == []
    monkeypatch.setenv("DYNBRANCH_CACHE", str(cache))
    assert main(["data", "bfcl"]) == 0  # the command fetches nothing either
    assert capsys.readouterr().out == f"bfcl: ready at {bfcl_tree}\n"
    copy = tmp_path / "cache"
    shutil.copytree(cache / "bfcl", copy / "bfcl", ignore=shutil.ignore_patterns(".fetch-*"))
    (bfcl_dir(copy) / "bfcl_eval/data/BFCL_v4_multiple.json").unlink()
    with pytest.raises(DataMissingError, match="dynbranch data bfcl"):
        bfcl_root(copy)
    extracted = {p.relative_to(bfcl_tree).as_posix() for p in bfcl_tree.rglob("*") if p.is_file()}
    assert not any(p.startswith("bfcl_eval/model_handler") for p in extracted)
    assert "bfcl_eval/utils.py" not in extracted


# -- the real data ----------------------------------------------------------------------------


@pytest.mark.network
def test_real_data_loads_and_splits(real):
    counts = {c: len(rs) for c, rs in real.records.items()}
    assert counts == {
        "multi_turn_base": 200, "multi_turn_miss_func": 200, "multi_turn_miss_param": 200,
        "multi_turn_long_context": 200, "simple_python": 400, "multiple": 200, "parallel": 200,
        "parallel_multiple": 200, "live_simple": 258, "live_multiple": 1053,
        "live_parallel": 16, "live_parallel_multiple": 24, "irrelevance": 240,
        "live_irrelevance": 884,
    }
    train = [r for r in real.all() if split_of(r.id) == "train"]
    assert 0.2 < len(train) / 4275 < 0.3


@pytest.mark.network
def test_only_the_excluded_records_answer_an_input_two_ways(real):
    assert set(find_conflicts(real.all(), real.suite)) == EXCLUDED
    workload = RoutingWorkload(root=real.root)
    data = DataConfig(None, Path("/nonexistent-cache"))
    pool = {r.id for split in ("train", "test") for r in workload.records(data, split)}
    assert not pool & EXCLUDED and len(pool) == sum(len(rs) for rs in real.records.values()) - 6


@pytest.mark.network
def test_every_method_of_the_eight_classes_is_declared_once(real):
    assert set(real.suite.classes) == set(READ_ONLY) == set(MUTATING)
    for name, cls in real.suite.classes.items():
        public = {
            n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")
        }
        assert READ_ONLY[name] | MUTATING[name] == public, name
        assert not READ_ONLY[name] & MUTATING[name], name


@pytest.mark.network
def test_read_only_declarations_hold_on_every_ground_truth_call(real):
    checked = Counter()
    for record in real.records["multi_turn_base"]:
        state = ApiState(real.suite, record.classes, record.initial_config)
        request = RoutingRequest(f"ro-{record.id}", record, real.suite)
        tool = request.tool("bfcl")
        for calls in record.recorded:
            for text in calls:
                call = parse_call(text)
                cls, bound = state.bind(call)
                read_only = tool.is_read_only({"call": text})
                before = state_snapshot(state.instances[cls])
                state.execute(cls, call, bound)
                tool.call({"call": text})
                if read_only:
                    assert state_snapshot(state.instances[cls]) == before, (record.id, text)
                checked[read_only] += 1
    assert checked[True] > 300 and checked[False] > 300


# NOTE: records whose possible answer BFCL's own checker can satisfy with no call (see
# workloads/routing/bfcl_single.py): every model scores 0 on them, the replay too.
UNSATISFIABLE = {"live_simple_106-63-0", "live_simple_112-68-0", "live_multiple_862-181-3",
                 "live_multiple_964-207-0"}


@pytest.mark.network
def test_real_floor_scores_one_on_every_record(real):
    workload = RoutingWorkload(root=real.root, decode_lengths="recorded")
    data = DataConfig(None, Path("/nonexistent-cache"))
    scored = Counter()
    for split in ("train", "test"):
        pool = workload.records(data, split)
        for request in workload.requests(data, len(pool), 0, split):
            _, outcome = run(request)
            expected = 0.0 if request.record.id in UNSATISFIABLE else 1.0
            assert request.score(outcome) == expected, request.request_id
            scored[request.record.category] += 1
    assert scored == {c: sum(r.id not in EXCLUDED for r in rs) for c, rs in real.records.items()}


@pytest.mark.network
def test_real_executor_values_are_deterministic_per_request(real):
    record = next(r for r in real.records["multi_turn_base"] if "TravelAPI" in r.classes)
    outcomes = [run(RoutingRequest(f"det-{i}", record, real.suite))[1] for i in range(2)]
    assert [[c.value for c in t] for t in outcomes[0].turns] == [
        [c.value for c in t] for t in outcomes[1].turns
    ]


@pytest.mark.network
def test_real_remote_api_cost_and_raising_call(real):
    record = next(r for r in real.records["multi_turn_base"] if "TravelAPI" in r.classes)
    request = RoutingRequest("cost-0", record, real.suite)
    tool = request.tool("bfcl")
    tool.call({"call": "list_all_airports()"})
    assert tool.cost == ModelledCost(0.150)
    with pytest.raises(ToolExecutionError, match="No available route") as err:
        tool.call(
            {
                "call": "get_flight_cost(travel_from='XXX', travel_to='YYY', "
                "travel_date='2024-01-01', travel_class='economy')"
            }
        )
    assert isinstance(err.value.__cause__, ValueError)


def test_a_stream_drawn_from_few_workspaces_sends_several_requests_to_each():
    # NOTE: Table 1's write variant: a stream drawn from every workspace of a large split
    # would repeat none, and its interleaved writes would test nothing
    every = fixture_requests(n=12, seed=1, shared_state=True)
    few = fixture_requests(n=12, seed=1, shared_state=True, scenarios=2)
    workspace = lambda r: r.record.scenario or r.record.id  # noqa: E731
    assert len({workspace(r) for r in few}) == 2 < len({workspace(r) for r in every})
    shared = [r for r in few if r.scope is not None and "shared" in r.scope]
    states = {id(r._state) for r in shared}
    assert shared and len(states) <= 2 and len(shared) > len(states)  # requests share one
    again = fixture_requests(n=12, seed=1, shared_state=True, scenarios=2)
    assert [r.request_id for r in again] == [r.request_id for r in few]  # seeded
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ConfigError, match="scenarios"):
            fixture_requests(n=2, scenarios=bad)
