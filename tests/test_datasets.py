"""Data locations: the data directory's resolution order, checksums, missing-set messages,
and the one JSON Lines reader. (BFCL's wheel in the cache is tested in test_bfcl.py.)"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch import datasets
from dynbranch.datasets import (
    DATASETS,
    cache_dir,
    data_dir_candidates,
    fetch,
    read_jsonl,
    read_sha256sums,
    require_dataset,
    resolve_data_dir,
    verify_checksums,
)
from dynbranch.errors import (
    DataFetchError,
    DataMissingError,
    MalformedRecordError,
    UnknownNameError,
)

SHARED = Path(__file__).resolve().parent.parent.parent / "shared" / "data"
needs_shared = pytest.mark.skipif(
    not (SHARED / "SHA256SUMS").is_file(),
    reason=f"the shared data copy is not at {SHARED}: checksum checks on it are skipped",
)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    """No data/cache variables, a fake home, and a checkout whose ../shared/data is absent."""
    monkeypatch.delenv("DYNBRANCH_DATA", raising=False)
    monkeypatch.delenv("DYNBRANCH_CACHE", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    checkout = tmp_path / "checkout"
    (checkout / "dynbranch").mkdir(parents=True)
    (checkout / "setup.cfg").write_text("[metadata]\n")
    monkeypatch.setattr(datasets, "__file__", str(checkout / "dynbranch" / "datasets.py"))
    work = tmp_path / "elsewhere" / "cwd"
    work.mkdir(parents=True)
    monkeypatch.chdir(work)
    return tmp_path


def test_cache_dir(clean_env, monkeypatch):
    assert cache_dir() == clean_env / "home" / ".cache" / "dynbranch"
    monkeypatch.setenv("DYNBRANCH_CACHE", str(clean_env / "c"))
    assert cache_dir() == clean_env / "c"


def test_data_dir_resolution_order(clean_env, monkeypatch):
    tmp = clean_env
    assert resolve_data_dir(None) is None
    cached = tmp / "home" / ".cache" / "dynbranch" / "data"
    cached.mkdir(parents=True)
    assert resolve_data_dir(None) == cached
    beside_cwd = tmp / "elsewhere" / "shared" / "data"
    beside_cwd.mkdir(parents=True)
    assert resolve_data_dir(None) == beside_cwd
    beside_checkout = tmp / "shared" / "data"
    beside_checkout.mkdir(parents=True)
    assert resolve_data_dir(None) == beside_checkout
    assert [why for why, _ in data_dir_candidates(None)] == [
        "checkout",
        "current directory",
        "cache",
    ]
    env = tmp / "env-data"
    monkeypatch.setenv("DYNBRANCH_DATA", str(env))
    assert resolve_data_dir(None) is None  # an explicit choice that is absent is not replaced
    env.mkdir()
    assert resolve_data_dir(None) == env
    flag = tmp / "flag-data"
    assert resolve_data_dir(str(flag)) is None
    flag.mkdir()
    assert resolve_data_dir(str(flag)) == flag
    assert data_dir_candidates(str(flag)) == [("--data-dir", flag)]


def test_every_set_names_its_source_licence_and_files():
    # NOTE: BFCL is the routing workload's (workloads.routing.bfcl_wheel), not the core's.
    assert set(DATASETS) == {"musique", "hotpotqa", "sgd", "swe_agent"}
    for info in DATASETS.values():
        assert info.source.startswith("https://") and info.licence and info.files
    assert "musique" in DATASETS["musique"].source
    assert "dstc8-schema-guided-dialogue" in DATASETS["sgd"].source


@needs_shared
def test_shared_copy_matches_its_checksums_and_the_declared_files():
    assert verify_checksums(SHARED) == []
    listed = set(read_sha256sums(SHARED / "SHA256SUMS"))
    for name, info in DATASETS.items():
        declared = {f"{name}/{f}" for f in info.files}
        assert declared == {p for p in listed if p.startswith(f"{name}/")}, name
        assert require_dataset(SHARED, name) == SHARED / name


@needs_shared
def test_checksum_problems_are_listed(tmp_path):
    copy = tmp_path / "data"
    copy.mkdir()
    shutil.copy(SHARED / "SHA256SUMS", copy / "SHA256SUMS")
    shutil.copytree(SHARED / "hotpotqa", copy / "hotpotqa")
    (copy / "hotpotqa" / "migres_200.jsonl").chmod(0o644)
    (copy / "hotpotqa" / "migres_200.jsonl").write_text("{}\n")
    (copy / "hotpotqa" / "amor_test_500.jsonl").unlink()
    problems = verify_checksums(copy, ("hotpotqa",))
    assert problems[0] == "missing: hotpotqa/amor_test_500.jsonl"
    assert problems[1].startswith("mismatch: hotpotqa/migres_200.jsonl has sha256 ")
    assert len(problems) == 2
    assert "missing: musique/dev_200_full.jsonl" in verify_checksums(copy)
    assert verify_checksums(tmp_path)[0].startswith("missing: ")  # no SHA256SUMS at all


def test_missing_set_says_where_it_looked_and_how_to_get_it(tmp_path):
    with pytest.raises(DataMissingError) as err:
        require_dataset(tmp_path, "musique")
    message = str(err.value)
    assert str(tmp_path / "musique") in message
    assert "https://github.com/StonyBrookNLP/musique" in message
    assert "dev_2417_decompositions.json" in message and "place the files under" in message
    assert err.value.looked == [str(tmp_path / "musique")]


def test_missing_data_dir_lists_every_candidate(clean_env):
    with pytest.raises(DataMissingError) as err:
        require_dataset(None, "sgd")
    assert len(err.value.looked) == 3
    assert str(clean_env / "shared" / "data") in str(err.value)
    assert "--data-dir" in str(err.value)
    with pytest.raises(UnknownNameError, match="known data sets: hotpotqa, musique, sgd"):
        require_dataset(None, "imagenet")


def test_fetch_of_an_unreachable_source_names_it(tmp_path):
    with pytest.raises(DataFetchError) as err:
        fetch("hotpotqa", data_dir=tmp_path)
    assert "https://hotpotqa.github.io/" in str(err.value)
    assert f"place the files under {tmp_path / 'hotpotqa'}/" in str(err.value)


# -- the JSON Lines reader ----------------------------------------------------------------------

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=8,
)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.dictionaries(st.text(), _JSON, max_size=4), st.integers(0, 2))))
def test_read_jsonl_returns_every_record_with_its_line_number(tmp_path_factory, rows):
    # NOTE: ensure_ascii=False writes U+2028 and friends raw: they must not split a record.
    path = tmp_path_factory.mktemp("jsonl") / "rows.jsonl"
    lines, expected = [], []
    for record, blanks in rows:
        lines += [" "] * blanks
        lines.append(json.dumps(record, ensure_ascii=False))
        expected.append((len(lines), record))
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    assert list(read_jsonl(path, "toy")) == expected


def test_read_jsonl_names_the_file_and_line_of_bad_input(tmp_path):
    path = tmp_path / "rows.jsonl"
    path.write_text('{"a": 1}\n\n{oops\n')
    with pytest.raises(MalformedRecordError, match=r"rows\.jsonl: record line 3: not JSON") as err:
        list(read_jsonl(path, "toy"))
    assert (err.value.path, err.value.record) == (str(path), "line 3")
    path.write_text('{"a": 1}\n[1, 2]\n')
    with pytest.raises(MalformedRecordError, match="record line 2: not a JSON object"):
        list(read_jsonl(path, "toy"))
    with pytest.raises(DataMissingError, match="data set 'toy' not found") as err:
        list(read_jsonl(tmp_path / "absent.jsonl", "toy", "Ask for it."))
    assert err.value.looked == [str(tmp_path / "absent.jsonl")] and err.value.how == "Ask for it."
