"""The offline half of ``scripts/vastai.py``: vast.ai answers in, a Ray cluster YAML out.

Nothing here talks to the network. It reads vast.ai's answers (offer searches, the instance
listing, the overlay listing) as the JSON the REST API returns, picks offers, derives each
node's addresses, and renders the two files ``ray up`` needs:

* the cluster YAML (Ray's on-premise ``local`` provider), validated here exactly as the
  launcher validates it (``prepare_config`` then ``validate_config``);
* an SSH proxy script. vast.ai maps every container's port 22 to a random port of a public
  IP that instances share, while Ray's local provider knows one address per node and SSHes
  to port 22 there. The YAML names nodes by their *overlay* address (unique, and the one Ray
  must use between nodes) and its ``ssh_proxy_command`` runs the proxy, which connects to the
  node's mapped public port when it runs outside the overlay (the operator's machine) and to
  ``overlay address:22`` when it runs inside it (the head's autoscaler starting workers).

Why an overlay: Ray advertises one ``address:port`` per service and connects to it from the
node itself and from every other node; behind vast.ai's NAT no public address works for both
(vast.ai's "identity ports" keep port numbers but not the address). vast.ai's own overlay
network (``vastai create overlay``, instances created with ``-n NAME``) gives instances on one
physical cluster a private LAN with every port open, so Ray runs there unchanged.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

RAY_PORT = 6379
DASHBOARD_PORT = 8265
REMOTE_REPO = "/root/dynbranch"
REMOTE_SECRETS = "/root/.dynbranch/secrets"
"""Where the cluster's secrets directory (the Ray token alone) lands on every node."""
REMOTE_TOKEN = f"{REMOTE_SECRETS}/auth_token"
PROXY_NAME = "ssh-proxy"
"""The proxy script's name under ``~/.cache/dynbranch/vastai/CLUSTER/`` (laptop and head)."""


class VastError(Exception):
    """A vast.ai answer or choice the cluster cannot be built from (says what and why)."""


@dataclass(frozen=True)
class Node:
    """One rented instance as the cluster sees it."""

    instance_id: int
    label: str
    public_ip: str
    ssh_port: int
    overlay_ip: str
    gpus: int
    dph_total: float  # $/hour, all costs of the instance
    gpu_name: str = ""


@dataclass(frozen=True)
class ClusterState:
    """Everything ``up`` learned: written to ``state.json``, read by ``status`` and ``down``."""

    name: str
    layout: str  # "overlay" (one node per GPU) or "single" (one multi-GPU node)
    overlay_id: int | None
    subnet: str | None
    nodes: tuple[Node, ...]
    model: str
    engine_config: str | None = None

    @property
    def head(self) -> Node:
        return self.nodes[0]

    def dph_total(self) -> float:
        """The cluster's cost in $/hour while it exists (stopped instances still bill disk)."""
        return sum(n.dph_total for n in self.nodes)

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2) + "\n"

    @classmethod
    def from_json(cls, text: str) -> ClusterState:
        data = json.loads(text)
        nodes = tuple(Node(**n) for n in data.pop("nodes"))
        return cls(nodes=nodes, **data)


# -- offers ----------------------------------------------------------------------------------


def offer_query(gpu_name: str, gpus: int, disk_gb: int, *, clustered: bool) -> dict[str, Any]:
    """The body of ``POST /api/v0/bundles/`` (vast.ai's offer search), cheapest first."""
    query: dict[str, Any] = {
        "verified": {"eq": True},
        "external": {"eq": False},
        "rentable": {"eq": True},
        "rented": {"eq": False},
        "gpu_name": {"eq": gpu_name},
        "num_gpus": {"eq": gpus},
        "order": [["dph_total", "asc"]],
        "type": "on-demand",
        "allocated_storage": disk_gb,
        "limit": 500,
    }
    if clustered:  # NOTE: only machines of a physical cluster can share an overlay network
        query["cluster_id"] = {"neq": None}
    return query


def choose_cluster(offers: Sequence[Mapping[str, Any]], nodes: int) -> tuple[int, list[dict]]:
    """The physical cluster whose ``nodes`` cheapest offers cost least, and those offers.

    One offer per machine: two instances on one machine would share its GPUs' host and gain
    nothing over one multi-GPU instance.
    """
    by_cluster: dict[int, dict[int, dict]] = defaultdict(dict)
    for offer in offers:
        cluster, machine = offer.get("cluster_id"), offer.get("machine_id")
        if cluster is None:
            continue
        best = by_cluster[cluster].get(machine)
        if best is None or offer["dph_total"] < best["dph_total"]:
            by_cluster[cluster][machine] = dict(offer)
    ranked = []
    for cluster, per_machine in by_cluster.items():
        cheapest = sorted(per_machine.values(), key=lambda o: o["dph_total"])[:nodes]
        if len(cheapest) == nodes:
            ranked.append((sum(o["dph_total"] for o in cheapest), cluster, cheapest))
    if not ranked:
        seen = {c: len(m) for c, m in sorted(by_cluster.items())} or "none"
        raise VastError(
            f"no physical cluster has {nodes} machines with a matching offer "
            f"(machines per cluster: {seen}); try other filters later, or "
            f"--layout single for one {nodes}-GPU instance"
        )
    _, cluster, chosen = min(ranked, key=lambda r: r[0])
    return cluster, chosen


# -- instances and addresses -----------------------------------------------------------------


def ssh_endpoint(instance: Mapping[str, Any]) -> tuple[str, int]:
    """``(address, port)`` that reaches the instance's sshd: the public IP's port mapped to
    22/tcp ("direct"), else vast.ai's SSH proxy host."""
    mapped = (instance.get("ports") or {}).get("22/tcp") or []
    if instance.get("public_ipaddr") and mapped:
        return str(instance["public_ipaddr"]).strip(), int(mapped[0]["HostPort"])
    if instance.get("ssh_host") and instance.get("ssh_port"):
        return str(instance["ssh_host"]), int(instance["ssh_port"])
    raise VastError(
        f"instance {instance.get('id')} has no SSH endpoint yet "
        f"(status {instance.get('actual_status')!r})"
    )


def overlay_address(ip_addr_output: str, subnet: str) -> str:
    """This node's IPv4 address in ``subnet``, from ``ip -4 -o addr show`` output."""
    network = ipaddress.ip_network(subnet, strict=False)
    for line in ip_addr_output.splitlines():
        fields = line.split()
        if "inet" in fields:
            address = ipaddress.ip_interface(fields[fields.index("inet") + 1]).ip
            if address in network:
                return str(address)
    raise VastError(f"no interface in the overlay subnet {subnet}: {ip_addr_output.strip()!r}")


def overlay_subnet(overlays: Iterable[Mapping[str, Any]], overlay_id: int) -> str:
    """The ``internal_subnet`` of overlay ``overlay_id`` in vast.ai's overlay listing."""
    for overlay in overlays:
        if overlay.get("overlay_id") == overlay_id:
            subnet = overlay.get("internal_subnet")
            if not subnet:
                raise VastError(f"overlay {overlay_id} has no internal_subnet yet")
            return str(subnet)
    raise VastError(f"overlay {overlay_id} is not in the overlay listing")


def make_node(instance: Mapping[str, Any], overlay_ip: str) -> Node:
    """The :class:`Node` of one running instance of the listing."""
    host, port = ssh_endpoint(instance)
    return Node(
        int(instance["id"]),
        str(instance.get("label") or instance["id"]),
        host,
        port,
        overlay_ip,
        int(instance.get("num_gpus") or 1),
        float(instance.get("dph_total") or 0.0),
        str(instance.get("gpu_name") or ""),
    )


# -- what ray up reads -----------------------------------------------------------------------


def proxy_dir(name: str) -> str:
    """Where the proxy script lives, the same path under ``$HOME`` on laptop and head."""
    return f"~/.cache/dynbranch/vastai/{name}"


def render_proxy(state: ClusterState) -> str:
    """The SSH ProxyCommand script: overlay address → mapped public endpoint, or direct."""
    routes = {n.overlay_ip: [n.public_ip, n.ssh_port] for n in state.nodes}
    # NOTE: both are Python literals in the script (a JSON object of strings and ints is one).
    return PROXY_TEMPLATE.format(
        routes=json.dumps(routes, sort_keys=True), subnet=repr(state.subnet)
    )


def render_cluster_yaml(
    state: ClusterState, *, ssh_key: str, repo: str, secrets_dir: str, proxy_dir_local: str
) -> dict[str, Any]:
    """The ``ray up`` configuration of ``state`` (a plain dict; dump it as YAML).

    ``secrets_dir`` holds the token file alone and ``proxy_dir_local`` the proxy script alone:
    both are mounted as directories, which Ray syncs like any other mount.
    """
    head, workers = state.nodes[0], state.nodes[1:]
    engines = head.gpus
    node_ip = ["--node-ip-in", state.subnet] if state.subnet else []
    start = f"bash {REMOTE_REPO}/ray_cluster/start_node.sh"
    common = shlex.join([str(engines), *node_ip, "--token-file", REMOTE_TOKEN])
    remote_proxy_dir = proxy_dir(state.name)
    remote_proxy = f"{remote_proxy_dir}/{PROXY_NAME}"
    setup = [
        "python3 -m pip install -q -U pip",
        f"python3 -m pip install -q -e '{REMOTE_REPO}[vllm]'",
    ]
    if not Path(state.model).is_absolute():  # NOTE: once per node, into its HF cache
        setup.append(f"python3 -m dynbranch model fetch {shlex.quote(state.model)}")
    return {
        "cluster_name": state.name,
        "provider": {
            "type": "local",
            "head_ip": head.overlay_ip,
            "worker_ips": [w.overlay_ip for w in workers],
        },
        "auth": {
            "ssh_user": "root",
            "ssh_private_key": ssh_key,
            "ssh_proxy_command": f"python3 {remote_proxy} %h %p",
        },
        "max_workers": len(workers),
        "upscaling_speed": 1.0,
        "idle_timeout_minutes": 60,
        "file_mounts": {
            REMOTE_REPO: repo,
            REMOTE_SECRETS: secrets_dir,
            remote_proxy_dir: proxy_dir_local,
        },
        "rsync_exclude": ["**/.git", "**/.git/**", "runs/**", ".venv*/**", "**/__pycache__"],
        "setup_commands": setup,
        "head_start_ray_commands": [
            f"{start} --head {common} -- --autoscaling-config=~/ray_bootstrap_config.yaml"
        ],
        "worker_start_ray_commands": [f"{start} $RAY_HEAD_IP:{RAY_PORT} {common}"],
    }


def validate_with_ray(config: Mapping[str, Any]) -> dict[str, Any]:
    """The config as ``ray up`` prepares it, after Ray's own validation (raises if invalid).

    NOTE: Ray 2.60's launcher (``ray.autoscaler._private.commands._bootstrap_config``) calls
    ``prepare_config`` (which adds the local provider's node type and defaults) and then
    ``validate_config`` (the JSON schema plus its own checks); the raw file alone also passes
    the schema, which :func:`validate_schema` checks.
    """
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(dict(config))
    validate_config(prepared)
    return prepared


def validate_schema(config: Mapping[str, Any]) -> None:
    """The raw config against Ray's ``ray-schema.json`` (no unknown or mistyped keys)."""
    import jsonschema
    import ray.autoscaler

    schema_path = Path(ray.autoscaler.__file__).parent / "ray-schema.json"
    jsonschema.validate(dict(config), json.loads(schema_path.read_text()))


PROXY_TEMPLATE = '''#!/usr/bin/env python3
"""SSH ProxyCommand for a DynBranch vast.ai cluster (generated by scripts/vastai.py).

Ray's launcher runs it as ``python3 THIS_FILE %h %p``. Outside the overlay network the
target's overlay address is mapped to the public port vast.ai maps to its sshd; inside it
(on the head, whose autoscaler starts the workers) the target is reached directly.
"""
import ipaddress, socket, sys, threading

ROUTES = {routes}
SUBNET = {subnet}


def inside_overlay(host):
    if SUBNET is None:
        return False
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect((host, 9))  # NOTE: UDP connect sends nothing; it only picks a route
        return ipaddress.ip_address(probe.getsockname()[0]) in ipaddress.ip_network(SUBNET)
    except OSError:
        return False
    finally:
        probe.close()


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    if host in ROUTES and not inside_overlay(host):
        host, port = ROUTES[host][0], int(ROUTES[host][1])
    conn = socket.create_connection((host, port), timeout=30)
    conn.settimeout(None)

    def upstream():
        while True:
            data = sys.stdin.buffer.read1(65536)
            if not data:
                break
            conn.sendall(data)
        conn.shutdown(socket.SHUT_WR)

    threading.Thread(target=upstream, daemon=True).start()
    while True:
        data = conn.recv(65536)
        if not data:
            break
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
'''
"""The proxy script; ``{routes}`` and ``{subnet}`` are filled in by :func:`render_proxy`."""
