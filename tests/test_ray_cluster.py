"""Joining an existing Ray cluster: `dynbranch replay --address` against `ray start --head`."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def head_node(tmp_path_factory):
    ray_cli = shutil.which("ray", path=str(BIN)) or shutil.which("ray")
    if ray_cli is None:
        pytest.skip("the `ray` command is not installed beside this Python")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    port = 6391
    subprocess.run([ray_cli, "start", "--head", f"--port={port}", "--num-cpus=2",
                    "--include-dashboard=false", '--resources={"dynbranch_engine": 2}'],
                   check=True, capture_output=True, env=env, timeout=120)
    yield f"127.0.0.1:{port}", env
    subprocess.run([ray_cli, "stop", "--force"], capture_output=True, timeout=120)


def test_replay_joins_a_running_cluster_by_address(head_node, tmp_path):
    address, env = head_node
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "dynbranch", "replay", "--workload", "routing",
         "--requests", "3", "--rate", "5", "--workers", "2", "--profile", "qwen3-0.6b@h200",
         "--address", address, "--out", str(out), "--quiet"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "ray" and summary["completed"] == 3
    assert summary["address"] == address


def test_a_cluster_without_engine_slots_gets_a_hint(head_node, tmp_path):
    address, env = head_node
    proc = subprocess.run(
        [sys.executable, "-m", "dynbranch", "replay", "--requests", "2", "--workers", "3",
         "--address", address, "--out", str(tmp_path / "x"), "--quiet"],
        capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 2
    assert "dynbranch_engine: need 3, cluster has 2" in proc.stderr
    assert "--resources" in proc.stderr
