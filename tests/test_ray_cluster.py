"""Joining an existing Ray cluster (`dynbranch replay --address` against `ray start --head`), and
what `ray_cluster/start_node.sh` guarantees: token auth on, the dashboard on localhost, no
`ray stop`."""

import contextlib
import json
import os
import shutil
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.ports import free_port

pytest.importorskip("ray")
pytestmark = pytest.mark.ray

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def head_node(tmp_path_factory):
    ray_cli = shutil.which("ray", path=str(BIN)) or shutil.which("ray")
    if ray_cli is None:
        pytest.skip("the `ray` command is not installed beside this Python")
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    port = free_port()
    # NOTE: --block keeps `ray start` in the foreground and makes it stop exactly the Ray
    # processes it started when terminated; `ray stop` would kill every Ray on the machine.
    head = subprocess.Popen(
        [
            ray_cli,
            "start",
            "--head",
            "--block",
            f"--port={port}",
            "--num-cpus=2",
            "--include-dashboard=false",
            '--resources={"dynbranch_engine": 2}',
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=env,
    )
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
        [
            sys.executable,
            "-m",
            "dynbranch",
            "replay",
            "--workload",
            "routing",
            "--requests",
            "3",
            "--rate",
            "5",
            "--workers",
            "2",
            "--profile",
            "qwen3-0.6b@h200",
            "--address",
            address,
            "--out",
            str(out),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["backend"] == "ray" and summary["completed"] == 3
    assert summary["address"] == address


def test_a_cluster_without_engine_slots_gets_a_hint(head_node, tmp_path):
    address, env = head_node
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "dynbranch",
            "replay",
            "--requests",
            "2",
            "--workers",
            "3",
            "--address",
            address,
            "--out",
            str(tmp_path / "x"),
            "--quiet",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )
    assert proc.returncode == 2
    assert "dynbranch_engine: need 3, cluster has 2" in proc.stderr
    assert "--resources" in proc.stderr


START_NODE = Path(__file__).parent.parent / "ray_cluster" / "start_node.sh"


def _listening(port: int) -> set[str]:
    """Local addresses (hex, as /proc/net/tcp writes them) listening on ``port``."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(FileNotFoundError), open(table) as f:
            for line in list(f)[1:]:
                local, state = line.split()[1], line.split()[3]
                address, hex_port = local.rsplit(":", 1)
                if state == "0A" and int(hex_port, 16) == port:
                    found.add(address)
    return found


def _get(url: str, token: str | None) -> int | None:
    """The HTTP status of a GET, or ``None`` while nothing listens yet."""
    import urllib.error
    import urllib.request

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except urllib.error.URLError:
        return None  # the dashboard is still starting (slow on a loaded machine)


def test_start_node_head_turns_token_auth_on_and_keeps_the_dashboard_local(head_node, tmp_path):
    address, _ = head_node  # another Ray instance on this machine, which must survive
    home = tmp_path / "home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    port, dashboard = free_port(), free_port()
    head = subprocess.Popen(
        [
            "bash",
            str(START_NODE),
            "--head",
            "1",
            "--port",
            str(port),
            "--dashboard-port",
            str(dashboard),
            "--block",
            "--",
            "--num-cpus=1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    try:
        _wait_for_port(port, head)
        token_file = home / ".ray" / "auth_token"
        token = token_file.read_text()
        assert len(token) == 64 and int(token, 16) >= 0
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        url = f"http://127.0.0.1:{dashboard}/api/jobs/"
        deadline = time.monotonic() + 120
        while _get(url, token) != 200:
            assert time.monotonic() < deadline, "the job API did not come up"
            time.sleep(1)
        assert _get(url, None) == 401, "the job API answers without the token"
        assert _listening(dashboard) == {"0100007F"}, "the dashboard listens beyond localhost"
        listed = subprocess.run(
            [str(BIN / "ray"), "job", "list", "--address", f"http://127.0.0.1:{dashboard}"],
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert listed.returncode != 0 and "no authentication token" in listed.stdout + listed.stderr
        env_token = {**env, "RAY_AUTH_MODE": "token"}
        listed = subprocess.run(
            [str(BIN / "ray"), "job", "list", "--address", f"http://127.0.0.1:{dashboard}"],
            env=env_token,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert listed.returncode == 0, listed.stderr[-1000:]
    finally:
        head.terminate()
        head.wait(timeout=60)
    with socket.socket() as s:  # NOTE: start_node.sh never runs `ray stop`
        assert s.connect_ex(("127.0.0.1", int(address.rsplit(":", 1)[1]))) == 0


def test_start_node_worker_needs_the_head_token_as_a_file(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(tmp_path), PATH=f"{BIN}{os.pathsep}{env.get('PATH', '')}")
    proc = subprocess.run(
        ["bash", str(START_NODE), "10.0.0.1:6379", "1", "--token-file", str(tmp_path / "missing")],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 1
    assert f"no token at {tmp_path / 'missing'}: copy the head's token file here" in proc.stderr


def test_start_node_finds_its_address_in_a_subnet_and_keeps_the_dashboard_local(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)
    run = ["bash", str(START_NODE), "--head", "4", "--node-ip-in", "127.0.0.0/8", "--dry-run"]
    done = subprocess.run(run, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [
        "ray",
        "start",
        "--head",
        "--port=6379",
        "--node-ip-address=127.0.0.1",
        "--dashboard-host=127.0.0.1",
        "--dashboard-port=8265",
        '--resources={"dynbranch_engine":',
        "4}",
    ]
    assert not (tmp_path / ".ray").exists(), "a dry run writes no token"
    done = subprocess.run(
        ["bash", str(START_NODE), "--head", "--node-ip-in", "10.255.254.0/24", "--dry-run"],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "no address of this node is in 10.255.254.0/24" in done.stderr


def test_single_box_starts_one_engine_per_gpu_and_submits_a_vllm_replay(tmp_path):
    script = START_NODE.parent / "single_box.sh"
    done = subprocess.run(
        ["bash", str(script), "--gpus", "4", "--dry-run", "--out", "runs/x", "--", "--fanout", "3"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert f"bash {START_NODE} --head 4 --port 6390 --dashboard-port 8266 --block" in [
        line.strip() for line in lines
    ]
    submit = next(line for line in lines if line.startswith("ray job submit")).split()
    assert submit[:6] == [
        "ray",
        "job",
        "submit",
        "--address",
        "http://127.0.0.1:8266",
        "--working-dir",
    ]
    replay = submit[submit.index("--") + 1 :]
    assert replay[:3] == ["python", "-m", "dynbranch"]
    flags = dict(zip(replay[4::2], replay[5::2], strict=False))
    assert flags["--engine"] == "vllm" and flags["--workers"] == "4"
    assert flags["--model"] == "Qwen/Qwen3-32B" and flags["--address"] == "auto"
    assert flags["--engine-config"].endswith("ray_cluster/engines/qwen3-32b@h200.toml")
    assert flags["--out"] == f"{tmp_path}/runs/x" and flags["--fanout"] == "3"
