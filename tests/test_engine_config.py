"""Engine settings: the TOML file and flags, the KV fit check, and where a model comes from.

None of these needs vLLM or a GPU: the fit check runs on recorded model configs (the public
Qwen3-8B and Qwen3-32B ``config.json``, no weights) against a stated device size, and model
resolution runs on a local directory and on a fake hub cache, offline.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dynbranch.clock import RealClock  # noqa: E402
from dynbranch.engines.config import (  # noqa: E402
    KV_RESERVE_GIB,
    EngineConfig,
    EngineConfigError,
    check_engine_config,
    engine_config_from,
)
from dynbranch.engines.kv_fit import (  # noqa: E402
    GIB,
    KVCacheTooSmallError,
    ModelShape,
    check_kv_fits,
    plan_kv,
)
from dynbranch.engines.model_ref import (  # noqa: E402
    ModelUnavailableError,
    check_model_ref,
    is_hub_id,
    resolve_model,
)
from dynbranch.engines.vllm_engine import VLLMEngine  # noqa: E402
from dynbranch.errors import ConfigError, ModelNotFoundError  # noqa: E402

MODELS = Path(__file__).parent / "fixtures" / "models"
RTX4090_GIB = 24564 / 1024  # 24,564 MiB: the card's total as CUDA reports it
H200_GIB = 143771 / 1024


def shape(name: str) -> ModelShape:
    return ModelShape.from_dir(MODELS / name)


# -- the config ------------------------------------------------------------------------------


def test_toml_and_flags_make_one_config_passed_to_vllm(tmp_path: Path):
    path = tmp_path / "engine.toml"
    path.write_text(
        'max_model_len = 16384\ngpu_memory_utilization = 0.9\ndtype = "bfloat16"\n'
        "enforce_eager = true\n[engine_args]\nmax_num_batched_tokens = 4096\n"
    )
    config = engine_config_from(path, max_model_len=8192, tensor_parallel_size=2, quantization=None)
    assert config == EngineConfig(
        max_model_len=8192,
        gpu_memory_utilization=0.9,
        dtype="bfloat16",
        enforce_eager=True,
        tensor_parallel_size=2,
        engine_args={"max_num_batched_tokens": 4096},
    )
    assert config.vllm_args() == {
        "dtype": "bfloat16",
        "tensor_parallel_size": 2,
        "kv_cache_dtype": "auto",
        "enforce_eager": True,
        "max_model_len": 8192,
        "gpu_memory_utilization": 0.9,
        "distributed_executor_backend": "mp",
        "max_num_batched_tokens": 4096,
    }
    assert engine_config_from(None) is None
    assert engine_config_from(None, dtype="float16") == EngineConfig(dtype="float16")


def test_the_vllm_engine_hands_its_config_to_vllm_unchanged(tmp_path: Path):
    config = EngineConfig(
        max_model_len=4096,
        gpu_memory_utilization=0.85,
        quantization="awq",
        kv_cache_dtype="fp8",
        max_num_seqs=64,
    )
    engine = VLLMEngine("Qwen/Qwen3-8B", RealClock(), "v1", config, enforce_eager=True)
    assert engine.engine_args == {
        "model": "Qwen/Qwen3-8B",
        "seed": 0,
        "enable_prefix_caching": True,
        "scheduling_policy": "priority",
        "dtype": "auto",
        "tensor_parallel_size": 1,
        "kv_cache_dtype": "fp8",
        "enforce_eager": True,
        "max_model_len": 4096,
        "gpu_memory_utilization": 0.85,
        "quantization": "awq",
        "max_num_seqs": 64,
    }


@pytest.mark.parametrize(
    "text,match",
    [
        ("max_model_len = 0", "max_model_len must be >= 1, got 0"),
        ("gpu_memory_utilization = 1.5", r"gpu_memory_utilization must be in \(0, 1\], got 1.5"),
        ("tensor_parallel_size = 0", "tensor_parallel_size must be >= 1, got 0"),
        ('dtype = "int3"', "dtype must be one of .*'int3'"),
        ('kv_cache_dtype = "int2"', "kv_cache_dtype must be one of .*'int2'"),
        ('max_model_len = "long"', "max_model_len must be int, got 'long'"),
        ("enforce_eager = 1", "enforce_eager must be bool, got 1"),
        ("max_modle_len = 4096", r"unknown keys \['max_modle_len'\]"),
        ("[engine_args]\nmax_model_len = 4", r"engine_args \['max_model_len'\] have fields"),
        ("max_model_len = ", "engine.toml: "),
    ],
)
def test_bad_engine_settings_are_typed_errors_naming_the_value(
    tmp_path: Path, text: str, match: str
):
    path = tmp_path / "engine.toml"
    path.write_text(text + "\n")
    with pytest.raises(EngineConfigError, match=match) as caught:
        EngineConfig.from_toml(path)
    assert isinstance(caught.value, ConfigError) and str(path) in str(caught.value)


def test_settings_an_engine_cannot_honour_are_refused():
    check_engine_config("sim", None)
    check_engine_config("vllm", EngineConfig(tensor_parallel_size=4, quantization="fp8"))
    with pytest.raises(ConfigError, match="are for --engine hf|vllm; --engine sim"):
        check_engine_config("sim", EngineConfig(max_model_len=4096))
    with pytest.raises(
        ConfigError, match="--engine hf does not support tensor_parallel_size, quantization"
    ):
        check_engine_config("hf", EngineConfig(tensor_parallel_size=2, quantization="awq"))
    check_engine_config("hf", EngineConfig(max_model_len=4096, dtype="bfloat16"))


# -- the KV fit check ------------------------------------------------------------------------


def test_qwen3_8b_on_a_4090_at_its_default_context_does_not_fit_and_says_why():
    config = EngineConfig(device_memory_gib=RTX4090_GIB)
    plan = plan_kv(shape("qwen3-8b"), config, device_bytes=round(RTX4090_GIB * GIB))
    assert plan.kv_bytes_per_token == 2 * 36 * 8 * 128 * 2 == 147_456
    assert plan.max_model_len == 40_960
    assert plan.needed_kv_bytes == 40_960 * 147_456  # 5.62 GiB
    assert plan.weights_bytes == 8_190_427_136 * 2  # the config's parameters in bf16
    expected = int(0.92 * RTX4090_GIB * GIB) - 8_190_427_136 * 2 - round(KV_RESERVE_GIB * GIB)
    assert abs(plan.available_kv_bytes - expected) <= 1
    assert not plan.fits and plan.max_fitting_len == 31_984
    with pytest.raises(KVCacheTooSmallError) as caught:
        check_kv_fits("vllm-target-0", MODELS / "qwen3-8b", config)
    message = str(caught.value)
    assert message.startswith(
        "engine vllm-target-0: qwen3-8b at max_model_len 40,960 needs "
        "5.62 GiB of KV cache for one sequence (144 KiB per token)"
    )
    assert (
        "0.92 × 23.99 GiB of device memory leaves 4.39 GiB after 15.26 GiB of weights and "
        "a 2.42 GiB activation reserve" in message
    )
    assert "fits up to max_model_len 31,984: lower --max-model-len" in message


def test_the_same_model_fits_with_a_shorter_context_or_fp8_kv_and_32b_fits_an_h200():
    device = round(RTX4090_GIB * GIB)
    for config in (
        EngineConfig(max_model_len=16_384),
        EngineConfig(kv_cache_dtype="fp8"),
        EngineConfig(gpu_memory_utilization=0.98, max_model_len=32_768),
    ):
        plan = plan_kv(shape("qwen3-8b"), config, device_bytes=device)
        assert plan.fits, plan.explain()
    plan = plan_kv(shape("qwen3-32b"), EngineConfig(), device_bytes=round(H200_GIB * GIB))
    assert plan.fits and plan.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2
    assert plan.max_fitting_len > 40_960 * 6  # room for several full-length sequences
    # The 32B model on one 4090 does not even hold its weights; split over four it does.
    assert not plan_kv(
        shape("qwen3-32b"), EngineConfig(max_model_len=4096), device_bytes=device
    ).fits
    tp4 = plan_kv(
        shape("qwen3-32b"),
        EngineConfig(max_model_len=4096, tensor_parallel_size=4),
        device_bytes=device,
    )
    assert tp4.fits and tp4.kv_bytes_per_token == 2 * 64 * 2 * 128 * 2


@pytest.mark.parametrize(
    "toml,model,gib",
    [
        ("qwen3-8b@rtx4090.toml", "qwen3-8b", RTX4090_GIB),
        ("qwen3-32b@h200.toml", "qwen3-32b", H200_GIB),
    ],
)
def test_the_shipped_engine_configs_fit_their_gpus(toml: str, model: str, gib: float):
    config = EngineConfig.from_toml(Path(__file__).parent.parent / "ray_cluster" / "engines" / toml)
    plan = plan_kv(shape(model), config, device_bytes=round(gib * GIB))
    assert plan.fits and plan.available_kv_bytes >= 1.9 * plan.needed_kv_bytes, plan.explain()


def test_weights_are_measured_from_the_files_and_a_fixed_pool_is_checked_alone(tmp_path: Path):
    model = tmp_path / "m"
    shutil.copytree(MODELS / "qwen3-8b", model)
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    config = EngineConfig(max_model_len=1000, kv_reserve_gib=0, device_memory_gib=1.0)
    plan = check_kv_fits("e", model, config)
    assert plan is not None and plan.weights_bytes == 1000
    with pytest.raises(
        KVCacheTooSmallError, match="the KV pool .kv_cache_memory_bytes. holds 0.00 GiB"
    ):
        check_kv_fits("e", model, EngineConfig(kv_cache_memory_bytes=1 << 20))
    assert check_kv_fits("e", model, EngineConfig(check_kv=False)) is None


# -- where a model comes from ----------------------------------------------------------------


def test_a_directory_or_a_hub_id_is_accepted_and_anything_else_is_refused(tmp_path: Path):
    check_model_ref(str(MODELS / "qwen3-8b"))
    check_model_ref("Qwen/Qwen3-8B")
    assert is_hub_id("Qwen/Qwen3-8B") and not is_hub_id(str(MODELS / "qwen3-8b"))
    assert not is_hub_id("./models/x") and not is_hub_id("/abs/path")
    for bad in (str(tmp_path / "missing"), "just-a-name", "a/b/c"):
        with pytest.raises(ModelNotFoundError, match="no model at .*make-tiny"):
            check_model_ref(bad)
    assert resolve_model(str(MODELS / "qwen3-8b")) == MODELS / "qwen3-8b"


def test_a_hub_id_not_in_the_cache_fails_offline_with_a_typed_error(tmp_path: Path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    with pytest.raises(ModelUnavailableError) as caught:
        resolve_model("dynbranch-test/no-such-model")
    error = caught.value
    assert error.model_id == "dynbranch-test/no-such-model"
    assert error.cache == str(tmp_path / "hub") and "HF_HUB_OFFLINE is set" in str(error)
    assert "hf download dynbranch-test/no-such-model" in str(error)
    assert isinstance(error, ConfigError)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    with pytest.raises(ModelUnavailableError, match="downloads are off"):
        resolve_model("dynbranch-test/no-such-model", download=False)
    clock = RealClock()
    with pytest.raises(ModelUnavailableError):
        clock.run(VLLMEngine("dynbranch-test/no-such-model", clock, download=False).start())


def test_a_hub_id_in_the_cache_resolves_to_its_snapshot_without_network(
    tmp_path: Path, monkeypatch
):
    from huggingface_hub import constants

    hub = tmp_path / "hub"
    repo = hub / "models--dynbranch-test--qwen3-8b"
    snapshot = repo / "snapshots" / ("ab" * 20)
    shutil.copytree(MODELS / "qwen3-8b", snapshot)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("ab" * 20)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    path = resolve_model("dynbranch-test/qwen3-8b")
    assert path == snapshot
    assert json.loads((path / "config.json").read_text())["num_hidden_layers"] == 36
