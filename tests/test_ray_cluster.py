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
    # NOTE: --block keeps `ray start` in the foreground and makes it stop exactly the Ray
    # processes it started when terminated; `ray stop` would kill every Ray on the machine.
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={port}", "--num-cpus=2",
         "--include-dashboard=false", '--resources={"dynbranch_engine": 2}'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        _wait_for_port(port, head)
        yield f"127.0.0.1:{port}", env
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()


def _wait_for_port(port: int, head: subprocess.Popen, timeout: float = 90.0) -> None:
    import socket
    import time

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            pytest.fail(f"`ray start --head` exited with {head.returncode}")
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                time.sleep(3.0)  # the GCS answers before the raylet has registered
                return
        time.sleep(0.5)
    pytest.fail(f"the Ray head did not listen on port {port} within {timeout:.0f}s")


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
