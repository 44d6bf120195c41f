"""scripts/bench_speed_pair.py: its row comparison, which is what makes a speed pair's
"identical" mean something, and how a pair's two replays are run (with stand-ins for the
replays, which are the CLI's, tested elsewhere)."""

from __future__ import annotations

import subprocess
import sys
import time
from argparse import Namespace
from pathlib import Path

import pandas as pd
import pytest

from tests import scripts

pair = scripts.load("bench_speed_pair")


def _run(where: Path, *, start: float = 1.5, wall: float = 0.25, rows: int = 3) -> Path:
    where.mkdir(parents=True)
    for table in pair.TABLES:
        pd.DataFrame({"request_id": [f"r{i}" for i in range(rows)],
                      "start": [start + i for i in range(rows)],
                      "wall_s": [wall] * rows}).to_parquet(where / f"{table}.parquet")
    return where


def test_rows_equal_but_for_wall_clock_columns_are_identical(tmp_path: Path) -> None:
    verdict = pair.compare(_run(tmp_path / "a"), _run(tmp_path / "b", wall=9.0))
    assert verdict == {t: "identical (3 rows)" for t in pair.TABLES}


def test_a_changed_value_or_row_count_is_reported(tmp_path: Path) -> None:
    a = _run(tmp_path / "a")
    shifted = pair.compare(a, _run(tmp_path / "b", start=1.5 + 1e-9))
    assert all(v == "differ in start" for v in shifted.values())
    shorter = pair.compare(a, _run(tmp_path / "c", rows=2))
    assert all(v.startswith("differ: 3 rows / 2 rows") for v in shorter.values())


def _sleeper(seconds: float) -> subprocess.Popen:
    """A stand-in replay: a process that only sleeps."""
    return subprocess.Popen([sys.executable, "-c", f"import time; time.sleep({seconds})"])


def test_together_runs_a_pairs_replays_at_the_same_time(tmp_path: Path, monkeypatch) -> None:
    """``--together`` starts both replays before waiting for either; the default runs base,
    then head. Stand-in replays record when they start and end."""
    spans: dict[str, list[float]] = {}

    def start(tree, out, args, data_dir):
        spans[out.name] = [time.monotonic()]
        return _sleeper(0.5)

    def finish(proc, tree, out):
        proc.wait()
        spans[out.name].append(time.monotonic())
        return {"cpu_s": 1.0}

    monkeypatch.setattr(pair, "start", start)
    monkeypatch.setattr(pair, "finish", finish)
    trees = {"base": tmp_path / "b", "head": tmp_path / "h"}
    for together in (False, True):
        spans.clear()
        got = list(pair.run_pair(trees, tmp_path, 1, Namespace(together=together), None))
        assert [side for side, _ in got] == ["base", "head"]
        (b0, b1), (h0, h1) = spans["base_1"], spans["head_1"]
        overlap = min(b1, h1) - max(b0, h0)
        assert (overlap > 0.3) if together else (h0 >= b1), (together, spans)


def test_together_stops_the_other_replay_when_one_fails(tmp_path: Path, monkeypatch) -> None:
    started: dict[str, subprocess.Popen] = {}

    def start(tree, out, args, data_dir):
        started[out.name] = _sleeper(60)
        return started[out.name]

    def finish(proc, tree, out):
        raise SystemExit(f"replay in {tree} failed")

    monkeypatch.setattr(pair, "start", start)
    monkeypatch.setattr(pair, "finish", finish)
    trees = {"base": tmp_path / "b", "head": tmp_path / "h"}
    with pytest.raises(SystemExit):
        list(pair.run_pair(trees, tmp_path, 1, Namespace(together=True), None))
    assert all(p.poll() is not None for p in started.values())  # neither left running


def _tree_with_mypyc(tmp_path: Path, main: str) -> Path:
    """A tree holding a stand-in ``mypyc`` package, which ``python -m mypyc`` run from the
    tree's root finds before any installed one."""
    (tmp_path / "mypyc").mkdir()
    (tmp_path / "mypyc" / "__init__.py").write_text("")
    (tmp_path / "mypyc" / "__main__.py").write_text(main)
    return tmp_path


def test_mypyc_compiles_the_named_modules_in_the_head_tree(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pair, "_has_mypyc", lambda: True)
    tree = _tree_with_mypyc(tmp_path, "import sys, pathlib\n"
                                      "pathlib.Path('argv.txt').write_text(' '.join(sys.argv[1:]))\n")
    took = pair.compile_tree(tree, ["dynbranch/a.py", "dynbranch/b.py"])
    assert took > 0
    assert (tree / "argv.txt").read_text().split() == [
        "--follow-imports=silent", "--ignore-missing-imports", "dynbranch/a.py", "dynbranch/b.py"]


def test_a_failed_compile_stops_the_pairs_with_mypyc_s_output(tmp_path: Path,
                                                              monkeypatch) -> None:
    monkeypatch.setattr(pair, "_has_mypyc", lambda: True)
    tree = _tree_with_mypyc(tmp_path, "import sys\n"
                                      "print('dynbranch/a.py:3: error: async generators')\n"
                                      "sys.exit(2)\n")
    with pytest.raises(SystemExit, match=r"mypyc failed .*\(2\)[\s\S]*async generators"):
        pair.compile_tree(tree, ["dynbranch/a.py"])


def test_mypyc_missing_is_named_with_how_to_install_it(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(pair, "_has_mypyc", lambda: False)
    with pytest.raises(SystemExit, match="pip install mypy"):
        pair.compile_tree(tmp_path, ["dynbranch/a.py"])


def test_compiled_core_modules_exist() -> None:
    root = scripts.SCRIPTS.parent
    assert all((root / module).is_file() for module in pair.COMPILED_CORE)
