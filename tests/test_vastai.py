"""The vast.ai flow (``scripts/vastai.py``) against recorded API answers, at the HTTP layer.

A fake ``requests`` transport serves the recorded answers in ``tests/fixtures/vastai/`` and
records every call, so the real client code (URLs, JSON bodies, paging) runs; SSH is a fake
that answers each node's ``ip -4 -o addr show`` from the recording. The cluster YAML ``up``
writes must pass Ray's own launcher validation; the generated SSH proxy is run for real
against a local TCP echo server.
"""

from __future__ import annotations

import json
import socket
import stat
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

pytest.importorskip("ray")
yaml = pytest.importorskip("yaml")
requests = pytest.importorskip("requests")

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import vastai  # noqa: E402
import vastai_cluster  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures" / "vastai"


def recorded(name: str) -> Any:
    return json.loads((FIXTURES / name).read_text())


class FakeVast(requests.adapters.BaseAdapter):
    """vast.ai's REST API from recorded answers; every request is kept in ``calls``."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[str, str, dict, Any]] = []
        self.contracts = iter(range(31000001, 31000005))
        self.listings = 0
        self.destroyed: set[int] = set()

    def send(self, request, **kwargs):  # noqa: ANN001 - requests' adapter signature
        url = urlsplit(request.url)
        query = {
            k: json.loads(v[0]) if v[0][:1] in "{[" else v[0]
            for k, v in parse_qs(url.query).items()
        }
        body = json.loads(request.body) if request.body else None
        assert request.headers["Authorization"] == "Bearer test-key"
        self.calls.append((request.method, url.path, query, body))
        status, answer = self.answer(request.method, url.path, query)
        response = requests.Response()
        response.status_code, response._content = status, json.dumps(answer).encode()
        response.url, response.request = request.url, request
        return response

    def answer(self, method: str, path: str, query: dict) -> tuple[int, Any]:
        if (method, path) == ("POST", "/api/v0/bundles/"):
            return 200, recorded("offers.json")
        if (method, path) == ("POST", "/api/v0/overlay/"):
            return 200, {"success": True, "msg": "overlay created"}
        if (method, path) == ("GET", "/api/v0/overlay/"):
            return 200, recorded("overlays.json")
        if method == "PUT" and path.startswith("/api/v0/asks/"):
            return 200, {"success": True, "new_contract": next(self.contracts)}
        if (method, path) == ("GET", "/api/v1/instances/"):
            self.listings += 1
            page = recorded("instances.json")["page2" if "after_token" in query else "page1"]
            for row in page["instances"]:
                if self.listings == 1:  # the first look finds them still loading
                    row["actual_status"] = "loading"
                if row["id"] in self.destroyed:
                    row["actual_status"] = "destroyed"
            return 200, page
        if method == "DELETE" and path.startswith("/api/v0/instances/"):
            self.destroyed.add(int(path.rstrip("/").rsplit("/", 1)[1]))
            return 200, {"success": True}
        if (method, path) == ("DELETE", "/api/v0/overlay/"):
            return 200, {"success": True}
        return 404, {"error": "not recorded", "path": path}


def fake_ssh(host: str, port: int, command: str) -> str:
    assert command == "ip -4 -o addr show"
    return recorded("ip_addr.json")[f"{host}:{port}"]


def args_for(tmp_path: Path, *extra: str):
    return vastai.build_parser().parse_args(
        ["up", "--yes", "--out", str(tmp_path / "runs"), "--ssh-key", "/keys/id_ed25519", *extra]
    )


@pytest.fixture
def rented(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """``up`` run to its end against the fake API; its files and the calls it made."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    fake = FakeVast()
    session = requests.Session()
    session.mount("https://", fake)
    api = vastai.VastAPI("test-key", session=session)
    monkeypatch.setattr(vastai.time, "sleep", lambda _s: None)
    state = vastai.cmd_up(api, args_for(tmp_path), fake_ssh, confirm=lambda _q: False)
    return state, tmp_path / "runs" / "dynbranch", fake, api


def test_up_rents_one_offer_per_machine_on_the_cheapest_cluster_with_enough(rented):
    state, _, fake, _ = rented
    puts = [(path, body) for method, path, _, body in fake.calls if method == "PUT"]
    # cluster 202 is cheaper but has only three machines; machine 51003's pricier GPU is unused
    assert [p for p, _ in puts] == [
        f"/api/v0/asks/{i}/" for i in (7001002, 7001001, 7001005, 7001003)
    ]
    for i, (_, body) in enumerate(puts):
        assert body["env"] == {"-n dynbranch": "1"} and body["label"] == f"dynbranch-{i}"
        assert body["image"] == "vllm/vllm-openai:v0.33.0" and body["disk"] == 80
        assert body["runtype"] == "ssh_direc ssh_proxy"
    search = next(b for m, p, _, b in fake.calls if p == "/api/v0/bundles/")
    assert search["gpu_name"] == {"eq": "RTX 4090"} and search["num_gpus"] == {"eq": 1}
    assert search["cluster_id"] == {"neq": None} and search["order"] == [["dph_total", "asc"]]
    overlay = next(b for m, p, _, b in fake.calls if (m, p) == ("POST", "/api/v0/overlay/"))
    assert overlay == {"cluster_id": 101, "name": "dynbranch"}
    assert fake.listings == 4, "two pages, looked at twice (loading, then running)"
    assert [(n.instance_id, n.public_ip, n.ssh_port, n.overlay_ip) for n in state.nodes] == [
        (31000001, "203.0.113.10", 41022, "10.0.12.11"),
        (31000002, "203.0.113.10", 41222, "10.0.12.12"),  # the same public IP, another port
        (31000003, "203.0.113.12", 27510, "10.0.12.13"),
        (31000004, "203.0.113.11", 50122, "10.0.12.14"),
    ]
    assert state.subnet == "10.0.12.0/24" and state.overlay_id == 812
    assert state.dph_total() == pytest.approx(0.398 + 0.402 + 0.409 + 0.415)


def test_the_cluster_yaml_passes_rays_validation_and_carries_no_secret(rented):
    state, out, _, _ = rented
    text = (out / "cluster.yaml").read_text()
    config = yaml.safe_load(text)
    vastai_cluster.validate_schema(config)  # the raw file: Ray's JSON schema
    prepared = vastai_cluster.validate_with_ray(config)  # what `ray up` does with it
    assert prepared["available_node_types"]["local.cluster.node"]["min_workers"] == 3
    assert config["provider"] == {
        "type": "local",
        "head_ip": "10.0.12.11",
        "worker_ips": ["10.0.12.12", "10.0.12.13", "10.0.12.14"],
    }
    proxy = "~/.cache/dynbranch/vastai/dynbranch/ssh-proxy"
    assert config["auth"] == {
        "ssh_user": "root",
        "ssh_private_key": "/keys/id_ed25519",
        "ssh_proxy_command": f"python3 {proxy} %h %p",
    }
    token = out / "secrets" / "auth_token"
    assert config["file_mounts"] == {
        "/root/dynbranch": str(ROOT),
        "/root/.dynbranch/secrets": str(token.parent.resolve()),
        proxy.rsplit("/", 1)[0]: str(Path.home() / proxy[2:].rsplit("/", 1)[0]),
    }
    assert config["setup_commands"][1:] == [
        "python3 -m pip install -q -e '/root/dynbranch[vllm]'",
        "python3 -m dynbranch model fetch Qwen/Qwen3-8B",
    ]
    start = "bash /root/dynbranch/ray_cluster/start_node.sh"
    node = "1 --node-ip-in 10.0.12.0/24 --token-file /root/.dynbranch/secrets/auth_token"
    assert config["head_start_ray_commands"] == [
        f"{start} --head {node} -- --autoscaling-config=~/ray_bootstrap_config.yaml"
    ]
    assert config["worker_start_ray_commands"] == [f"{start} $RAY_HEAD_IP:6379 {node}"]
    secret = token.read_text()
    assert len(secret) == 64 and stat.S_IMODE(token.stat().st_mode) == 0o600
    assert secret not in text and "RAY_AUTH_TOKEN" not in text and "ray stop" not in text
    assert "min_workers" not in config, "Ray's schema has no top-level min_workers"
    saved = vastai_cluster.ClusterState.from_json((out / "state.json").read_text())
    assert saved == state


def test_the_committed_example_is_the_render_of_the_recording_and_valid(rented, tmp_path):
    state, _, _, _ = rented
    config = vastai_cluster.render_cluster_yaml(
        state,
        ssh_key="~/.ssh/id_ed25519",
        repo=".",
        secrets_dir="runs/vastai/dynbranch/secrets",
        proxy_dir_local="~/.cache/dynbranch/vastai/dynbranch",
    )
    committed = yaml.safe_load((ROOT / "ray_cluster" / "vastai-4x4090.yaml").read_text())
    assert committed == config
    vastai_cluster.validate_schema(committed)
    vastai_cluster.validate_with_ray(committed)


def test_down_destroys_every_instance_and_the_overlay(rented, tmp_path):
    state, _, fake, api = rented
    args = vastai.build_parser().parse_args(["down", "--yes", "--out", str(tmp_path / "runs")])
    vastai.cmd_down(api, args, confirm=lambda _q: False)
    deletes = [p for m, p, _, _ in fake.calls if m == "DELETE"]
    assert deletes == [f"/api/v0/instances/{n.instance_id}/" for n in state.nodes] + [
        "/api/v0/overlay/"
    ]
    assert fake.calls[-1][:2] == ("GET", "/api/v1/instances/"), "checked they are gone"
    assert 29999999 not in fake.destroyed


def test_up_undoes_what_it_rented_when_a_step_fails(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    fake = FakeVast()
    session = requests.Session()
    session.mount("https://", fake)
    api = vastai.VastAPI("test-key", session=session)
    monkeypatch.setattr(vastai.time, "sleep", lambda _s: None)

    def broken_ssh(host: str, port: int, command: str) -> str:
        raise vastai_cluster.VastError(f"ssh root@{host} -p {port}: Connection refused")

    with pytest.raises(vastai_cluster.VastError, match="Connection refused"):
        vastai.cmd_up(api, args_for(tmp_path), broken_ssh, confirm=lambda _q: False)
    deletes = [p for m, p, _, _ in fake.calls if m == "DELETE"]
    assert deletes == [f"/api/v0/instances/{i}/" for i in range(31000001, 31000005)] + [
        "/api/v0/overlay/"
    ]
    assert not (tmp_path / "runs" / "dynbranch").exists()


def test_no_cluster_with_enough_machines_is_a_clear_refusal():
    offers = recorded("offers.json")["offers"]
    with pytest.raises(
        vastai_cluster.VastError,
        match=r"no physical cluster has 5 machines.*"
        r"\{101: 4, 202: 3\}.*--layout single",
    ):
        vastai_cluster.choose_cluster(offers, 5)


def test_a_refused_call_names_the_status_and_never_the_key():
    class Refusing(requests.adapters.BaseAdapter):
        def send(self, request, **kwargs):  # noqa: ANN001
            response = requests.Response()
            response.status_code, response._content = 401, b'{"error": "invalid api key"}'
            return response

    session = requests.Session()
    session.mount("https://", Refusing())
    with pytest.raises(vastai.VastAPIError) as caught:
        vastai.VastAPI("secret-key-123", session=session).overlays()
    assert "HTTP 401" in str(caught.value) and "secret-key-123" not in str(caught.value)


# -- the SSH proxy ---------------------------------------------------------------------------


def _echo_server() -> tuple[int, threading.Thread]:
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]

    def serve() -> None:
        conn, _ = server.accept()
        with conn, server:
            while data := conn.recv(4096):
                conn.sendall(data.upper())

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    return port, thread


@pytest.mark.parametrize("inside", [False, True])
def test_the_proxy_maps_an_overlay_address_outside_and_goes_direct_inside(tmp_path, inside):
    port, thread = _echo_server()
    if inside:  # this machine is "in the overlay": the target is reached as it is named
        node = vastai_cluster.Node(1, "n0", "192.0.2.1", 1, "127.0.0.1", 1, 0.4)
        subnet, target = "127.0.0.0/8", ("127.0.0.1", port)
    else:  # outside: the overlay address is mapped to the public endpoint (here loopback)
        node = vastai_cluster.Node(1, "n0", "127.0.0.1", port, "10.0.12.11", 1, 0.4)
        subnet, target = "10.0.12.0/24", ("10.0.12.11", 22)
    state = vastai_cluster.ClusterState("t", "overlay", 1, subnet, (node,), "m")
    script = tmp_path / "ssh-proxy"
    script.write_text(vastai_cluster.render_proxy(state))
    done = subprocess.run(
        [sys.executable, str(script), target[0], str(target[1])],
        input=b"ssh-2.0-hello\n",
        capture_output=True,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == b"SSH-2.0-HELLO\n"
    thread.join(timeout=10)
