"""scripts/fig14_saturation.py's table: full less c1 per seed, its mean and standard error."""

import importlib.util
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[1] / "scripts" / "fig14_saturation.py"


@pytest.fixture(scope="module")
def sat():
    spec = importlib.util.spec_from_file_location("fig14_saturation", _PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(mean, p99=100.0, fills=0):
    return {"mean_latency_s": mean, "p99_latency_s": p99, "fills_issued": fills}


def test_summarise_pairs_full_with_c1_seed_by_seed(sat):
    seeds = range(3)
    c1 = {(16.0, s): _row(m) for s, m in zip(seeds, [40.0, 42.0, 44.0], strict=True)}
    full = {0.5: {(16.0, s): _row(m, fills=10 * s) for s, m in
                  zip(seeds, [41.0, 42.5, 43.0], strict=True)}}
    c1_row, full_row = sat.summarise(c1, full, [16.0], seeds)
    assert c1_row["arm"] == "c1" and c1_row["mean_s"] == pytest.approx(42.0)
    assert full_row["per_seed_minus_c1_s"] == pytest.approx([1.0, 0.5, -1.0])
    assert full_row["minus_c1_s"] == pytest.approx(0.5 / 3)
    # sample standard deviation of (1, 0.5, -1) over sqrt(3)
    assert full_row["se_s"] == pytest.approx(1.0408329997 / 3 ** 0.5)
    assert full_row["fills"] == pytest.approx(10.0)
    text = sat.markdown([c1_row, full_row], seeds, 1200)
    assert "| 16 | full | 0.5 | 42.17 | +0.17 | 0.60 | 10 |" in text


def test_run_restores_the_pools_default_weight(sat, monkeypatch, tmp_path):
    seen = []

    def fake_run_cells(cells, out, jobs, customize):
        seen.append(sat.pool.FILL_LOAD)
        return [{"arm": c.arm, "rate": c.rate, "seed": c.seed} for c in cells]

    monkeypatch.setattr(sat, "run_cells", fake_run_cells)
    before = sat.pool.FILL_LOAD
    rows = sat.run("full", 0.25, [12.0], range(2), 10, tmp_path, 1)
    restored = sat.pool.FILL_LOAD
    assert seen == [0.25] and restored == before
    assert sorted(rows) == [(12.0, 0), (12.0, 1)]
