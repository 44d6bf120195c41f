"""The experiment command writes to a path or a filesystem URI: a remote destination gets the
files (each atomically) once the experiment has finished, and an unwritable one is refused
before the experiment runs."""

import json
from pathlib import Path

import pandas as pd

import experiments
from dynbranch.cli import main
from dynbranch.outdir import OutDir
from experiments.common import Experiment, staged, upload_tree, write_experiment


class _Remote:
    """A local filesystem that does not look local (as S3 would not)."""

    def __init__(self, fs) -> None:
        self._fs = fs

    def __getattr__(self, name):
        return getattr(self._fs, name)


def _remote(path: Path) -> OutDir:
    local = OutDir.parse(path)
    return OutDir(_Remote(local.fs), local.path, f"s3://bucket{local.path}")


def _experiment() -> Experiment:
    def plot(path: Path) -> None:
        path.write_bytes(b"\x89PNG fake")

    return Experiment(
        "tiny",
        [{"workload": "routing", "arm": "floor", "x": 1.0}],
        {},
        "# tiny\n",
        {"tiny.png": plot},
    )


def test_a_remote_destination_gets_every_file_after_the_run(tmp_path):
    dest = _remote(tmp_path / "remote")
    assert dest.local is None
    with staged(dest) as local:
        assert local != tmp_path / "remote"
        (local / "replays" / "cell").mkdir(parents=True)
        (local / "replays" / "cell" / "summary.json").write_text("{}")
        write_experiment(_experiment(), local)
        assert not (tmp_path / "remote").exists()  # nothing uploaded before the end
    got = sorted(
        str(p.relative_to(tmp_path / "remote"))
        for p in (tmp_path / "remote").rglob("*")
        if p.is_file()
    )
    assert got == [
        "replays/cell/summary.json",
        "report.md",
        "results.parquet",
        "summary.json",
        "tiny.png",
    ]
    assert json.loads((tmp_path / "remote" / "summary.json").read_text())["experiment"] == "tiny"
    assert (tmp_path / "remote" / "tiny.png").read_bytes() == b"\x89PNG fake"


def test_summaries_are_uploaded_last(tmp_path):
    (tmp_path / "a").mkdir()
    for name in ("summary.json", "b.parquet", "a/summary.json", "report.md"):
        (tmp_path / name).write_text(name)
    order = upload_tree(tmp_path, OutDir.parse(tmp_path.parent / "copy"))
    assert order == ["b.parquet", "report.md", "a/summary.json", "summary.json"]


def test_the_experiment_command_takes_a_file_uri(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(
        experiments, "get_experiment", lambda name: lambda quick, out: _experiment()
    )
    target = tmp_path / "shared" / "exp"
    assert main(["experiment", "tiny", "--quick", "--out", f"file://{target}"]) == 0
    assert pd.read_parquet(target / "results.parquet").x.tolist() == [1.0]
    assert f"results in file://{target}/" in capsys.readouterr().out


def test_an_unwritable_experiment_destination_is_refused_before_it_runs(monkeypatch, capsys):
    ran = []
    monkeypatch.setattr(
        experiments,
        "get_experiment",
        lambda name: lambda quick, out: ran.append(out) or _experiment(),
    )
    assert main(["experiment", "tiny", "--out", "/proc/dynbranch-cannot"]) == 2
    err = capsys.readouterr().err
    assert "--out /proc/dynbranch-cannot: not writable" in err and err.count("\n") == 1
    assert ran == []
