"""`ray job submit` as the README gives it: a replay submitted to a head through the job API
writes its results to a filesystem URI (``--out file://…``), where the submitter finds them,
instead of stranding them in Ray's per-session copy of the working directory."""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ports import free_port

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parent.parent



@pytest.fixture(scope="module")
def job_head():
    ray_cli = shutil.which("ray", path=str(BIN)) or shutil.which("ray")
    if ray_cli is None:
        pytest.skip("the `ray` command is not installed beside this Python")
    gcs_port, dashboard_port, agent_port = free_port(), free_port(), free_port()
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    # NOTE: --block: terminating `ray start` stops exactly what it started (never `ray stop`).
    head = subprocess.Popen(
        [ray_cli, "start", "--head", "--block", f"--port={gcs_port}", "--num-cpus=2",
         "--include-dashboard=true", "--dashboard-host=127.0.0.1",
         f"--dashboard-port={dashboard_port}", f"--dashboard-agent-listen-port={agent_port}",
         "--disable-usage-stats", '--resources={"dynbranch_engine": 2}'],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    try:
        dashboard = f"http://127.0.0.1:{dashboard_port}"
        _wait_for_jobs(head, env, dashboard)
        yield dashboard, f"127.0.0.1:{gcs_port}", env
    finally:
        head.terminate()
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()


def _wait_for_jobs(head: subprocess.Popen, env: dict, dashboard: str,
                   timeout: float = 120.0) -> None:
    """Until the job API lists jobs (the dashboard answers before its job agent is up)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if head.poll() is not None:
            pytest.fail(f"`ray start --head` exited with {head.returncode}")
        probe = subprocess.run(
            [str(BIN / "ray"), "job", "list", "--address", dashboard],
            capture_output=True, text=True, env=env, timeout=60)
        if probe.returncode == 0:
            return
        time.sleep(2.0)
    pytest.fail(f"the job API did not answer within {timeout:.0f}s")


def test_a_submitted_replay_writes_its_results_to_a_file_uri(job_head, tmp_path):
    dashboard, gcs, env = job_head
    dest = tmp_path / "job results"  # a space: the URI is percent-encoded
    uri = dest.as_uri()
    entrypoint = [sys.executable, "-m", "dynbranch", "replay", "--workload", "routing",
                  "--arm", "full", "--requests", "4", "--rate", "5", "--workers", "2",
                  "--profile", "qwen3-0.6b@h200", "--address", gcs, "--out", uri, "--quiet"]
    # NOTE: the README's form: the job runs in Ray's copy of the working directory, so only
    # the URI brings its files back.
    proc = subprocess.run(
        [str(BIN / "ray"), "job", "submit", "--address", dashboard, "--working-dir", str(REPO),
         "--", *entrypoint],
        capture_output=True, text=True, env=env, timeout=600, cwd=REPO)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "succeeded" in proc.stdout + proc.stderr
    names = {p.name for p in dest.iterdir()}
    assert {"summary.json", "requests.parquet", "stages.parquet", "branches.parquet"} <= names
    summary = json.loads((dest / "summary.json").read_text())
    assert summary["backend"] == "ray" and summary["completed"] == 4
    assert summary["out"] == uri
