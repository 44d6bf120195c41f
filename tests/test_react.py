"""The ReAct workload: MuSiQue loading and hop chains, the split, EM/F1, the BM25 ``retrieve``
tool, options and registry (the request program and its replay: ``test_react_hops.py``).

Fixture tests (``tests/fixtures/musique``: a hand-written fictional world in MuSiQue's and
the data directory's layout) always run. Tests marked ``data`` read the shared data
directory and skip, saying so, when it is absent.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from dynbranch.errors import ConfigError, DataMissingError, MalformedRecordError, ToolInputError
from dynbranch.workload import DataConfig, MeasuredCost, ModelledCost
from tests.data_sets import shared_data
from workloads import get_workload
from workloads.analysis.trace import trace_request
from workloads.musique import (
    draw,
    exact_match,
    f1_score,
    load_full,
    normalize_answer,
    resolve_step,
    split_of,
)
from workloads.react import (
    CORPUS_RESOURCE,
    Bm25Index,
    Passage,
    ReActWorkload,
    RetrieveTool,
    index_for,
    load_corpus,
    make_corpus,
)
from workloads.react.retrieval import MODELLED_RETRIEVE_S, tokenize

FIXTURE = Path(__file__).parent / "fixtures" / "musique"
REPO = Path(__file__).resolve().parent.parent
DATA = DataConfig(FIXTURE, Path("/nonexistent-cache"))


def fixture_requests(split: str = "all", n: int | None = None, seed: int = 0, **options):
    workload = ReActWorkload(tool_time="modelled", **options)
    pool = workload.records(DATA, split)
    return workload.requests(DATA, len(pool) if n is None else n, seed, split)


def by_record(requests, record_id):
    return next(r for r in requests if r.record.id == record_id)


def _copy_fixture(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(FIXTURE, root)
    return root


@pytest.fixture(scope="module")
def real_dir() -> Path:
    return shared_data("musique", "hotpotqa")


# -- loading and hop chains -------------------------------------------------------------------


def test_fixture_questions_load_with_their_hop_chains():
    records = ReActWorkload().load(DATA).records
    assert [r.id for r in records] == [
        "2hop__1001_1002",
        "2hop__1003_1002",
        "3hop1__1004_1005_1006",
        "2hop__1007_1008",
        "2hop__2001_2002",
        "2hop__2003_2004",
    ]
    first, _, three, leak, train, _ = records
    assert first.chain == ("Lantern Song", "Mira Calloway") and first.source == "dev200"
    assert first.answers == ("Tobias Wren", "Toby Wren") and first.kind == "2hop"
    assert three.chain == ("Quillfeather Press", "Ansel Dunmore", "Port Verity")
    assert three.steps[0].subtopic == "Quillfeather Press >> Who founded Quillfeather Press?"
    # the supporting page of "what is the capital ..." is the answer's own: search the words
    assert leak.chain == ("what is the capital of elandria", "Port Verity")
    assert leak.steps[0].subtopic == "what is the capital of elandria"
    assert train.source == "train100" and train.steps[1].ask == "Who founded Quillfeather Press ?"


def test_step_resolution_rules():
    a = resolve_step(0, "Green >> performer", "Steve Hillage", "Green (album)", [])
    assert (a.entity, a.ask, a.subtopic) == ("Green", "performer", "Green >> performer")
    b = resolve_step(1, "#1 of France >> mother", "Marie", "Marie de' Medici", [a])
    assert (b.entity, b.refs) == ("Steve Hillage of France", (0,))
    c = resolve_step(0, "Who founded the Liberal Party?", "Robert Menzies", "Liberal Party", [])
    assert c.entity == "Liberal Party"
    x = resolve_step(0, "Yaxing Coach >> headquarters", "Yangzhou", "Yaxing Coach", [])
    y = resolve_step(1, "Pfrang >> headquarters", "Nanjing", "Pfrang", [x])
    z = resolve_step(2, "How long had #2 been the capital of #1 ?", "400 years", "Nanjing", [x, y])
    assert z.entity == "Nanjing" and z.ask == "How long had Nanjing been the capital of Yangzhou ?"
    tie = resolve_step(2, "when did #2 beat #1", "1 May", "Derby", [x, y])
    assert tie.entity == "Nanjing"  # no title overlap: the first reference mentioned
    with pytest.raises(ValueError, match="refers to #2"):
        resolve_step(1, "#2 >> spouse", "x", "t", [a])


def test_split_is_by_id_and_drawing_is_reproducible():
    workload = ReActWorkload()
    train, test = workload.records(DATA, "train"), workload.records(DATA, "test")
    assert {r.id for r in train} == {"2hop__1001_1002", "2hop__1007_1008"}
    assert len(test) == 4 and not {r.id for r in train} & {r.id for r in test}
    assert all(split_of(r.id) == "train" for r in train)
    first = [r.request_id for r in fixture_requests("test", 10, seed=3)]
    assert first == [r.request_id for r in fixture_requests("test", 10, seed=3)]
    assert first != [r.request_id for r in fixture_requests("test", 10, seed=4)]
    assert len({r.split("-", 2)[2] for r in first[:4]}) == 4  # a full cycle before repeats
    assert draw([1, 2, 3], 0, 0) == [] and sorted(draw([1, 2, 3], 3, 9)) == [1, 2, 3]
    with pytest.raises(ConfigError, match="split"):
        workload.records(DATA, "dev")


def test_the_step_split_keeps_questions_that_share_a_single_hop_step_on_one_side():
    def subtopics(records):
        return {normalize_answer(s.subtopic) for r in records for s in r.steps}

    sides = {}
    for name in ("react", "subagent"):
        by_question = get_workload(name)
        train_q, test_q = by_question.records(DATA, "train"), by_question.records(DATA, "test")
        assert subtopics(train_q) & subtopics(test_q)  # the fixture shares steps across them
        workload = get_workload(name, split_by="step")
        train, test = workload.records(DATA, "train"), workload.records(DATA, "test")
        assert train and test and not subtopics(train) & subtopics(test)
        assert len(train) + len(test) == len(train_q) + len(test_q)
        # 2hop__1003_1002 asks 1002's step with the train question 2hop__1001_1002
        assert "2hop__1003_1002" in {r.id for r in train}
        for r in train + test:
            sides.setdefault(r.id, set()).add("train" if r in train else "test")
    assert all(len(s) == 1 for s in sides.values())  # one side in both workloads
    # a Sub-Agent test run's planner history holds only the step split's train side
    subagent = get_workload("subagent", split_by="step")
    history = subagent.load(DATA).history
    assert len(history) == len(subagent.records(DATA, "train"))
    with pytest.raises(ConfigError, match="split_by"):
        get_workload("react", split_by="scenario")


def test_step_groups_join_through_shared_steps_and_name_each_group_by_its_smallest_id():
    from workloads.musique import MusiqueRecord, Step, step_groups

    def record(rid, *subtopics):
        steps = tuple(Step(i, t, "a", "t", t, t) for i, t in enumerate(subtopics))
        return MusiqueRecord(rid, "q", "a", (), steps, "test")

    records = [record("c", "X >> born"), record("b", "Y"), record("a", "Z", "x >> BORN"),
               record("d", "Y"), record("e", "W"), record("a", "Z", "x >> BORN")]
    assert step_groups(records) == {"a": "a", "b": "b", "c": "a", "d": "b", "e": "e"}


def test_exact_match_and_f1_use_squad_normalisation():
    assert normalize_answer("The  Silvermere River!") == "silvermere river"
    answers = ("the Silvermere River", "Silvermere")
    assert exact_match("Silvermere river.", answers) == 1.0
    assert exact_match("silvermere", answers) == 1.0
    assert exact_match("Silvermere Lake", answers) == 0.0 and exact_match(None, answers) == 0.0
    assert f1_score("Silvermere Lake", answers) == pytest.approx(2 / 3)
    assert f1_score("Silvermere River", answers) == 1.0 and f1_score(None, answers) == 0.0
    assert f1_score("", ("",)) == 1.0 and f1_score("x", ("",)) == 0.0


# -- malformed input --------------------------------------------------------------------------


def _rewrite_jsonl(path: Path, record_id: str, change) -> None:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        if row["id"] == record_id:
            change(row)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


DEV_BROKEN = {
    "missing question": (lambda r: r.pop("question"), "missing field 'question'"),
    "answer not text": (lambda r: r.update(answer=7), "field 'answer' is int, expected str"),
    "empty answer": (lambda r: r.update(answer="  "), "field 'answer' is empty"),
    "aliases": (lambda r: r.update(answer_aliases=["x", 1]), "list of strings"),
    "unanswerable": (lambda r: r.update(answerable=False), "not answerable"),
    "bad reference": (
        lambda r: r["question_decomposition"][0].update(question="#2 >> performer"),
        "step 1: '#2 >> performer' refers to #2",
    ),
    "support index": (
        lambda r: r["question_decomposition"][1].update(paragraph_support_idx=42),
        "step 2: paragraph_support_idx 42 names no paragraph",
    ),
    "step count": (
        lambda r: r["question_decomposition"].pop(),
        "a 2hop question with 1 decomposition steps",
    ),
    "paragraph": (lambda r: r["paragraphs"][0].pop("title"), "paragraph 0: missing field 'title'"),
    "step answer": (
        lambda r: r["question_decomposition"][0].pop("answer"),
        "step 1: missing field 'answer'",
    ),
}


@pytest.mark.parametrize("case", sorted(DEV_BROKEN))
def test_question_loader_names_file_record_and_problem(tmp_path, case):
    change, message = DEV_BROKEN[case]
    root = _copy_fixture(tmp_path)
    path = root / "musique" / "dev_200_full.jsonl"
    _rewrite_jsonl(path, "2hop__1003_1002", change)
    with pytest.raises(MalformedRecordError) as err:
        ReActWorkload().check_data(DataConfig(root, tmp_path))
    assert err.value.path == str(path) and err.value.record == "2hop__1003_1002"
    assert message in err.value.problem


def test_question_loader_rejects_broken_lines_duplicates_and_arrays(tmp_path):
    root = _copy_fixture(tmp_path)
    dev = root / "musique" / "dev_200_full.jsonl"
    lines = dev.read_text().splitlines()
    dev.write_text("\n".join([lines[0], "{not json", *lines[1:]]) + "\n")
    with pytest.raises(MalformedRecordError, match=r"record line 2: not JSON"):
        load_full(dev, "dev200")
    dev.write_text("\n".join([lines[0], lines[0]]) + "\n")
    with pytest.raises(MalformedRecordError, match="record 2hop__1001_1002: duplicate id"):
        load_full(dev, "dev200")
    dev.write_text("[1]\n")
    with pytest.raises(MalformedRecordError, match="line 1: not a JSON object"):
        load_full(dev, "dev200")
    train = root / "musique" / "hipporag_train_100.json"
    train.write_text('{"id": "x"}')
    with pytest.raises(MalformedRecordError, match="record file: not a JSON array"):
        load_full(train, "train100")
    train.write_text('[{"question": "q"}]')
    with pytest.raises(MalformedRecordError, match="record item 0: missing or empty field 'id'"):
        load_full(train, "train100")


def test_a_question_in_both_files_is_refused(tmp_path):
    root = _copy_fixture(tmp_path)
    train = root / "musique" / "hipporag_train_100.json"
    rows = json.loads(train.read_text())
    rows[0]["id"] = "2hop__1001_1002"
    train.write_text(json.dumps(rows))
    with pytest.raises(MalformedRecordError, match="id also in dev_200_full.jsonl"):
        ReActWorkload().check_data(DataConfig(root, tmp_path))


CORPUS_BROKEN = {
    "dev_200_paragraph_corpus.jsonl": (
        lambda rows: rows[2].pop("text"),
        "record line 3: missing field 'text'",
    ),
    "hipporag_train_100_corpus.json": (
        lambda rows: rows[1].update(title=None),
        "record item 1: NoneType field 'title'",
    ),
    "hotpotqa_corpus.jsonl": (
        lambda rows: rows[1].update(id=rows[0]["id"]),
        "record hotpotqa-00000: duplicate passage id",
    ),
}


@pytest.mark.parametrize("name", sorted(CORPUS_BROKEN))
def test_corpus_loader_names_file_record_and_problem(tmp_path, name):
    change, message = CORPUS_BROKEN[name]
    root = _copy_fixture(tmp_path)
    path = next(root.glob(f"*/{name}"))
    if name.endswith(".jsonl"):
        rows = [json.loads(line) for line in path.read_text().splitlines()]
        change(rows)
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    else:
        rows = json.loads(path.read_text())
        change(rows)
        path.write_text(json.dumps(rows))
    with pytest.raises(MalformedRecordError, match=message) as err:
        load_corpus(root)
    assert err.value.path == str(path)


def test_missing_data_is_a_clear_error(tmp_path):
    with pytest.raises(DataMissingError, match="data set 'musique' not found"):
        ReActWorkload().check_data(DataConfig(tmp_path, tmp_path))
    root = _copy_fixture(tmp_path)
    (root / "hotpotqa" / "hotpotqa_corpus.jsonl").unlink()
    with pytest.raises(DataMissingError, match="Missing: hotpotqa_corpus.jsonl"):
        ReActWorkload().check_data(DataConfig(root, tmp_path))
    with pytest.raises(DataMissingError, match="looked in"):
        ReActWorkload().check_data(DataConfig(None, tmp_path))


# -- the retrieve tool ------------------------------------------------------------------------


def test_corpus_is_combined_in_order_without_repeats():
    corpus = load_corpus(FIXTURE)
    assert corpus.sources == (("musique-dev200", 11), ("musique-train100", 1), ("hotpotqa", 4))
    ids = [p.id for p in corpus.passages]
    assert ids[0] == "musique-dev200-00000" and ids[11] == "musique-train100-00000"
    assert ids[-1] == "hotpotqa-00003" and len(set(ids)) == len(ids) == 16
    assert len({(p.title, p.text) for p in corpus.passages}) == 16
    assert load_corpus(FIXTURE) is corpus  # cached per file identity


def test_retrieval_returns_the_known_top_k():
    tool = RetrieveTool(index_for(load_corpus(FIXTURE)), "modelled")
    result = tool.call({"query": "Mira Calloway", "k": 3})
    assert [p["title"] for p in result.value] == [
        "Mira Calloway",
        "Harbor Lights Waltz",
        "Lantern Song",
    ]
    assert set(result.value[0]) == {"id", "title", "text"}
    assert [p["title"] for p in tool.call({"query": "Silvermere", "k": 2}).value] == [
        "Silvermere Lake",
        "Calloway Bridge",
    ]
    assert tool.call({"query": "Harbor Lights Waltz", "k": 5}).value[0]["title"] == (
        "Harbor Lights Waltz"
    )
    assert tool.call({"query": "zeppelin", "k": 3}).value == []  # nothing shares a token
    assert tool.call({"query": "the", "k": 3}).value == []  # stop words only, not indexed
    assert tokenize("The Who") == ["who"] and tokenize("of the") == ["of", "the"]
    assert tool.is_read_only({"query": "x", "k": 1})


def test_retrieval_is_deterministic_and_reads_the_corpus_version():
    corpus = load_corpus(FIXTURE)
    a, b = Bm25Index(corpus), Bm25Index(corpus)  # two independent builds
    for query in ("Mira Calloway", "Port Verity", "poet", "Silvermere River bridge"):
        assert a.search(query, 5) == b.search(query, 5) == a.search(query, 5)
    result = RetrieveTool(a).call({"query": "Port Verity", "k": 2})
    assert result.reads == {CORPUS_RESOURCE: corpus.digest} and not result.writes
    assert len(corpus.digest) == 64


def test_a_changed_corpus_has_another_version(tmp_path):
    base = load_corpus(FIXTURE)
    root = _copy_fixture(tmp_path)
    path = root / "hotpotqa" / "hotpotqa_corpus.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    rows[0]["text"] += " It was dammed in 1931."
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    changed = load_corpus(root)
    assert changed.digest != base.digest
    reads = RetrieveTool(index_for(changed)).call({"query": "Silvermere", "k": 1}).reads
    assert reads == {CORPUS_RESOURCE: changed.digest}
    # the digest covers order and ids, not just the set of texts
    p, q = Passage("a", "A", "x"), Passage("b", "B", "y")
    assert make_corpus([("s", [p, q])]).digest != make_corpus([("s", [q, p])]).digest
    assert make_corpus([("s", [p])]).digest != make_corpus([("s", [Passage("c", "A", "x")])]).digest


def test_retrieve_refuses_bad_calls_and_prices_them():
    index = index_for(load_corpus(FIXTURE))
    tool = RetrieveTool(index)
    assert isinstance(tool.cost, MeasuredCost)  # the default: retrieval burns real CPU
    modelled = RetrieveTool(index, "modelled").cost
    assert modelled == ModelledCost(MODELLED_RETRIEVE_S) and modelled.charge_s(3.0) == 0.4
    for fields, message in (
        ({"query": 3, "k": 1}, "the query must be a string"),
        ({"query": "x", "k": 0}, "k=0 must be an integer in"),
        ({"query": "x", "k": True}, "k=True"),
        ({"query": "x"}, "k=None"),
    ):
        with pytest.raises(ToolInputError, match=message):
            tool.call(fields)
    with pytest.raises(ValueError, match="tool_time"):
        RetrieveTool(index, "guessed")


def test_tools_and_options():
    request = fixture_requests()[0]
    assert request.tool("retrieve").name == "retrieve"
    with pytest.raises(KeyError, match="one tool"):
        request.tool("bfcl")
    with pytest.raises(ConfigError, match="tool_time"):
        ReActWorkload(tool_time="guessed")
    with pytest.raises(ConfigError, match="top_k"):
        ReActWorkload(top_k=0)
    with pytest.raises(ConfigError, match="n=-1"):
        ReActWorkload().requests(DATA, -1, 0)
    narrow = fixture_requests(top_k=1)[0]
    trace = trace_request(narrow)
    assert all(len(result.value) <= 1 for _, result in trace.tool_results)
    assert isinstance(ReActWorkload().requests(DATA, 1, 0)[0].tool("retrieve").cost, MeasuredCost)


def test_registry_builds_react():
    workload = get_workload("react", tool_time="modelled", top_k=2)
    assert isinstance(workload, ReActWorkload) and workload.top_k == 2


def test_react_imports_neither_ray_nor_vllm():
    code = (
        "import sys, workloads.react, workloads.subagent, workloads.analysis.recurrence, "
        "dynbranch.predictors.entity; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('ray', 'vllm')]; "
        "assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# -- the real data ----------------------------------------------------------------------------


@pytest.mark.data
def test_real_questions_corpus_and_split(real_dir):
    workload = ReActWorkload(tool_time="modelled")
    data = DataConfig(real_dir, Path("/nonexistent-cache"))
    loaded = workload.load(data)
    assert len(loaded.records) == 300 and len(loaded.corpus) == 16044
    assert dict(loaded.corpus.sources) == {
        "musique-dev200": 3141,
        "musique-train100": 1880,
        "hotpotqa": 11023,
    }
    assert len(workload.records(data, "train")) == 81
    assert len(workload.records(data, "test")) == 219
