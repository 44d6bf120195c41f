"""Every value the replay command takes is checked before anything starts: one line naming
the flag, exit status 2, no Ray instance, no result directory (one case per option)."""

import importlib.util
import sys
from pathlib import Path

import pytest

from dynbranch.cli import main

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
WORKLOADS = ("routing", "react", "subagent", "hci")


def refused(argv: list[str], capsys, tmp_path: Path) -> str:
    """Run ``dynbranch replay ARGV`` (Ray backend unless ARGV says otherwise) and return
    its one-line error after checking it started nothing."""
    out = tmp_path / "never"
    rc = main(["replay", "--quiet", "--out", str(out), *argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("dynbranch: error: ") and err.count("\n") == 1, err
    assert not out.exists()
    if "ray" in sys.modules:
        import ray

        assert not ray.is_initialized()
    return err


@pytest.mark.parametrize(
    "argv,named",
    [
        (["--rate", "nan"], "--rate must be a finite number > 0 (got nan)"),
        (["--rate", "inf"], "--rate must be a finite number > 0 (got inf)"),
        (["--rate", "0"], "--rate must be a finite number > 0 (got 0.0)"),
        (["--cv", "0"], "--cv must be a finite number > 0 (got 0.0)"),
        (["--cv", "-1"], "--cv must be a finite number > 0 (got -1.0)"),
        (["--cv", "nan"], "--cv must be a finite number > 0 (got nan)"),
        (["--seed", "-1"], "--seed must be an integer >= 0 (got -1)"),
        (["--fanout", "-1"], "--fanout must be an integer >= 0 (got -1)"),
        (["--depth", "-5"], "--depth must be an integer >= 0 (got -5)"),
        (["--p-star", "7"], "--p-star must be in [0, 1] (got 7.0)"),
        (["--p-star", "nan"], "--p-star must be in [0, 1] (got nan)"),
        (["--store-mb", "-1"], "--store-mb must be an integer >= 0 (got -1)"),
        (["--requests", "0"], "--requests must be >= 1 (got 0)"),
        (["--workers", "0"], "--workers must be >= 1 (got 0)"),
        (["--max-inflight", "0"], "--max-inflight must be an integer >= 1 (got 0)"),
        (["--deadline-s", "nan"], "--deadline-s must be a finite number > 0 (got nan)"),
        (["--deadline-s", "-3"], "--deadline-s must be a finite number > 0 (got -3.0)"),
        (["--tenants", "0"], "--tenants must be an integer >= 1 (got 0)"),
        (["--profile", "nope"], "unknown profile 'nope'; known profiles: gemma-3-27b@h200"),
        (["--drafter-profile", "nope", "--predictor", "drafter"], "unknown profile 'nope'"),
        (["--predictor", "drafter", "--drafter-samples", "0"], "--drafter-samples >= 1"),
        (["--predictor", "drafter", "--drafter-think-tokens", "-1"],
         "--drafter-think-tokens >= 0"),
        (["--workload", "chess"], "unknown workload 'chess'"),
        (["--arm", "magic"], "unknown arm 'magic'"),
        (["--plan", "references"], "--plan sets how the subagent workload's planner"),
        (["--split-by", "step"], "--split-by sets how MuSiQue's questions are split"),
    ],
)
def test_a_bad_value_is_one_line_and_status_2_before_anything_starts(argv, named, capsys, tmp_path):
    assert named in refused(argv, capsys, tmp_path)


@pytest.mark.parametrize("workload", WORKLOADS)
def test_a_missing_data_dir_is_named_for_every_workload(workload, capsys, tmp_path):
    err = refused(["--workload", workload, "--data-dir", "/nonexistent"], capsys, tmp_path)
    assert "--data-dir /nonexistent: no such directory" in err


@pytest.mark.parametrize(
    "out,named",
    [
        ("/proc/dynbranch-cannot", "--out /proc/dynbranch-cannot: not writable"),
        ("nosuchfs://bucket/run", "--out nosuchfs://bucket/run: not a filesystem pyarrow can open"),
    ],
)
def test_an_unwritable_out_is_refused_before_anything_starts(out, named, capsys):
    rc = main(["replay", "--quiet", "--out", out])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and named in err, err


def _fake_model(tmp_path: Path) -> str:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    return str(model)


def test_the_hf_engine_without_its_extra_is_refused_on_the_ray_backend(
    capsys, tmp_path, monkeypatch
):
    real = importlib.util.find_spec

    def missing(name, *args, **kwargs):  # the hf extra not installed
        if name in ("torch", "transformers", "tokenizers"):
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", missing)
    err = refused(["--engine", "hf", "--model", _fake_model(tmp_path)], capsys, tmp_path)
    assert "--engine hf needs torch, transformers, tokenizers, not installed here" in err
    assert "pip install '.[hf]'" in err


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--max-model-len", "0"], "max_model_len must be >= 1, got 0"),
        (["--gpu-memory-utilization", "1.5"], "gpu_memory_utilization must be in (0, 1], got 1.5"),
        (["--gpu-memory-utilization", "nan"], "gpu_memory_utilization must be in (0, 1], got nan"),
        (["--tensor-parallel-size", "0"], "tensor_parallel_size must be >= 1, got 0"),
        (["--quantization", "awq"], "--engine hf does not support quantization"),
        (["--engine-config", "/nonexistent.toml"], "/nonexistent.toml"),
    ],
)
def test_every_engine_setting_is_checked_before_anything_starts(flags, named, capsys, tmp_path):
    err = refused(["--engine", "hf", "--model", _fake_model(tmp_path), *flags], capsys, tmp_path)
    assert named in err


def test_engine_settings_on_the_sim_engine_are_refused(capsys, tmp_path):
    err = refused(["--max-model-len", "4096"], capsys, tmp_path)
    assert "engine settings (--engine-config, --max-model-len, ...) are for --engine hf|vllm" in err
