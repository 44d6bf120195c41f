"""scripts/gpu_profile_check.py: its whole path on CPU with tiny shapes, and its refit maths.

The script is meant for a GPU machine; ``--device cpu --tiny`` runs every stage (layers,
timing, comparison with ``Profile.step_cost``, refit, JSON and markdown) in seconds.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")

from dynbranch.engines.profile import load_profile  # noqa: E402
from tests import scripts

check = scripts.load("gpu_profile_check")


def test_tiny_cpu_run_writes_the_comparison_and_proposes_a_refit(tmp_path: Path) -> None:
    assert check.main(["--device", "cpu", "--tiny", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "gpu_profile_check.json").read_text())
    profiles = {p.name: p for p, _ in check.profiles_for("cpu", tiny=True)}
    points = {name: check.TINY_GRID.points(p) for name, p in profiles.items()}
    assert len(report["rows"]) == sum(map(len, points.values())) == 3 * 8
    assert not report["stopped_at_budget"]
    for row in report["rows"]:
        profile = profiles[row["profile"]]
        point = check.Point(row["kind"], row["batch"], row["context"], row["new"])
        cost = profile.step_cost(point.work())
        assert row["sim_device_ms"] == max(cost.compute_s, cost.memory_s) * 1e3
        assert row["sim_bound"] == cost.bound
        assert row["measured_ms"] > 0 and row["timed_layers"] == 2
        assert row["ratio"] == pytest.approx(row["measured_ms"] / row["sim_device_ms"], rel=1e-12)
    assert {r["kind"] for r in report["rows"]} == {"decode", "prefill"}
    # A CPU is nowhere near an H200: every profile gets both knobs proposed, within (0, 1].
    assert set(report["proposals"]) == set(profiles)
    for proposal in report["proposals"].values():
        assert set(proposal["knobs"]) == {"bandwidth_efficiency", "mfu"}
        assert all(0 < k["proposed"] <= 1 for k in proposal["knobs"].values())
    md = (tmp_path / "gpu_profile_check.md").read_text()
    assert md.count("\n| qwen3-") == 24 and "Proposed calibration" in md


def _rows(profile, scale_memory: float, scale_compute: float) -> list[dict]:  # noqa: ANN001
    """Rows as if the GPU took ``scale`` times the roofline on each bound."""
    rows = []
    for point in check.Grid().points(profile):
        cost = profile.step_cost(point.work())
        scale = scale_memory if cost.bound == "memory" else scale_compute
        rows.append(check.compare(profile, point, max(cost.compute_s, cost.memory_s) * scale))
    return rows


def test_refit_recovers_the_efficiencies_that_explain_the_measurements() -> None:
    profile = load_profile("qwen3-32b@h200")
    rows = _rows(profile, scale_memory=1.25, scale_compute=0.8)
    knobs = check.propose(profile, rows)
    assert knobs is not None
    cal = profile.calibration
    assert knobs["bandwidth_efficiency"]["proposed"] == pytest.approx(
        cal.bandwidth_efficiency / 1.25, rel=1e-12
    )
    assert knobs["mfu"]["proposed"] == pytest.approx(cal.mfu / 0.8, rel=1e-12)
    decisive = [
        r
        for r in rows
        if max(r["sim_memory_ms"], r["sim_compute_ms"])
        >= check.DECISIVE * min(r["sim_memory_ms"], r["sim_compute_ms"])
    ]
    assert knobs["bandwidth_efficiency"]["points"] + knobs["mfu"]["points"] == len(decisive)
    refit = check.refit_rows(profile, decisive, knobs)
    assert all(math.isclose(r, 1.0, rel_tol=1e-9) for r in refit)


def test_no_refit_within_ten_percent_and_knobs_never_exceed_one() -> None:
    profile = load_profile("qwen3-0.6b@h200")
    assert check.propose(profile, _rows(profile, 1.09, 0.92)) is None
    knobs = check.propose(profile, _rows(profile, 0.1, 0.1))  # implausibly fast
    assert knobs is not None and all(k["proposed"] == 1.0 for k in knobs.values())


def test_a_profile_for_another_gpu_is_compared_on_this_one() -> None:
    here = {p.name for p, _ in check.profiles_for("NVIDIA H200", tiny=False)}
    assert here == {"qwen3-0.6b@h200", "qwen3-8b@h200", "qwen3-32b@h200"}
    pairs = {p.name: (p, note) for p, note in check.profiles_for("NVIDIA GeForce RTX 4090",
                                                                 tiny=False)}
    assert set(pairs) == {"qwen3-8b@rtx4090", "qwen3-32b@rtx4090 (derived)",
                          "qwen3-0.6b@rtx4090 (derived)"}
    derived, note = pairs["qwen3-32b@rtx4090 (derived)"]
    host = load_profile("qwen3-8b@rtx4090")  # the only profile of this GPU
    assert derived.model == load_profile("qwen3-32b@h200").model
    assert (derived.gpu, derived.calibration) == (host.gpu, host.calibration)
    assert "qwen3-8b@rtx4090" in note and pairs["qwen3-8b@rtx4090"][1] == ""


def test_the_grid_stays_within_the_kv_pool_and_the_context_limit() -> None:
    for name in ("qwen3-32b@h200", "qwen3-0.6b@h200"):
        profile = load_profile(name)
        points = check.Grid().points(profile)
        decode = [p for p in points if p.kind == "decode"]
        assert decode and all(p.batch * p.context <= profile.kv_pool_tokens for p in decode)
        assert all(p.context + p.new <= profile.model.max_model_len for p in points)


def test_without_a_gpu_it_says_so() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    assert check.main(["--device", "cuda"]) == 2


def test_it_runs_without_ray_or_vllm_which_the_gpu_machines_lack(tmp_path: Path) -> None:
    # NOTE: the GPU machines it is meant for hold PyTorch, NumPy and tqdm but neither Ray nor
    # vLLM, and fetch nothing: a fresh interpreter where importing either fails must run it.
    import subprocess
    import sys

    script = Path(__file__).resolve().parents[1] / "scripts" / "gpu_profile_check.py"
    code = ("import runpy, sys\n"
            "sys.modules['ray'] = sys.modules['vllm'] = None\n"
            f"sys.argv = [{str(script)!r}, '--device', 'cpu', '--tiny', '--out', "
            f"{str(tmp_path)!r}]\n"
            f"runpy.run_path({str(script)!r}, run_name='__main__')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "gpu_profile_check.json").is_file()
