"""scripts/bench_speed_pair.py: its row comparison, which is what makes a speed pair's
"identical" mean something (the replays themselves are the CLI's, tested elsewhere)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_speed_pair.py"
_spec = importlib.util.spec_from_file_location("bench_speed_pair", SCRIPT)
assert _spec is not None and _spec.loader is not None
pair = importlib.util.module_from_spec(_spec)
sys.modules.setdefault("bench_speed_pair", pair)
_spec.loader.exec_module(pair)


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
