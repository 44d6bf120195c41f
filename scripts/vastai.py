#!/usr/bin/env python3
"""Rent a DynBranch Ray cluster on vast.ai, write what ``ray up`` needs, and destroy it.

    python scripts/vastai.py offers [--nodes 4] [--gpu "RTX 4090"]        what it would rent
    python scripts/vastai.py up --name NAME [--nodes 4] [--model ID] [--yes]
    python scripts/vastai.py status --name NAME                          nodes and cost so far
    python scripts/vastai.py down --name NAME [--yes]                    destroy everything

``up`` finds the physical vast.ai cluster with the cheapest ``--nodes`` 1-GPU offers (one per
machine), creates a vast.ai overlay network there and one instance per offer attached to it,
waits until they run, reads each one's SSH endpoint from the instance listing and its overlay
address over SSH, and writes into ``runs/vastai/NAME/``: ``state.json``, the cluster's Ray
token (``secrets/auth_token``, mode 0600, generated here and shipped to every node as a
file by ``ray up``), and ``cluster.yaml`` (validated by Ray's own launcher code), plus an SSH proxy
script under ``~/.cache/dynbranch/vastai/NAME/``. ``--layout single`` rents one instance with
``--nodes`` GPUs instead (no overlay). Why the overlay and the proxy: ``scripts/vastai_cluster.py``.

It speaks vast.ai's REST API (the endpoints the ``vastai`` CLI uses; ``pip install
'.[cluster]'`` brings that CLI for the account steps) with the API key of ``$VAST_API_KEY``,
else the file ``vastai set api-key`` writes. Instances get the SSH keys of the account
(``vastai create ssh-key "$(cat ~/.ssh/id_ed25519.pub)"`` once). Billing runs from ``up`` until
``down``: a stopped instance still bills its disk; only destroying it ends the meter.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from vastai_cluster import (  # noqa: E402
    PROXY_NAME,
    ClusterState,
    VastError,
    choose_cluster,
    make_node,
    offer_query,
    overlay_address,
    overlay_subnet,
    proxy_dir,
    render_cluster_yaml,
    render_proxy,
    validate_with_ray,
)

ROOT = Path(__file__).resolve().parent.parent
API_URL = os.environ.get("VAST_URL", "https://console.vast.ai")
DEFAULT_IMAGE = "vllm/vllm-openai:v0.33.0"
"""The nodes' image: CUDA, Python 3.12 and the vLLM release the ``vllm`` extra was tested with."""
RUNTYPE = "ssh_direc ssh_proxy"
"""vast.ai's launch mode: sshd on a mapped public port ("direct"), vast.ai's SSH proxy as backup."""

POLL_S = 15.0
"""Seconds between looks at the instance listing while instances start."""
Ssh = Callable[[str, int, str], str]
"""Runs a command on ``(host, port)`` over SSH and returns its stdout."""


class VastAPIError(VastError):
    """vast.ai's API refused a call (status and the start of its answer, never the key)."""


def api_key() -> str:
    """The vast.ai API key: ``$VAST_API_KEY``, else where ``vastai set api-key`` stores it."""
    if os.environ.get("VAST_API_KEY"):
        return os.environ["VAST_API_KEY"].strip()
    config = Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config"))
    for path in (config / "vastai" / "vast_api_key", Path.home() / ".vast_api_key"):
        if path.is_file():
            return path.read_text().strip()
    raise VastError(
        "no vast.ai API key: set VAST_API_KEY or run `vastai set api-key KEY` "
        "(pip install '.[cluster]' brings the vastai CLI)"
    )


class VastAPI:
    """The few vast.ai REST calls a cluster needs, over one ``requests`` session."""

    def __init__(self, key: str, *, base_url: str = API_URL, session: Any = None) -> None:
        import requests

        self._key, self._base = key, base_url.rstrip("/")
        self._session = session or requests.Session()

    def _call(
        self, method: str, path: str, *, query: Mapping[str, Any] | None = None, body: Any = None
    ) -> Any:
        from urllib.parse import quote_plus

        path = path if path.startswith("/api/v") else "/api/v0" + path
        url = self._base + path
        if query:  # NOTE: vast.ai reads each query argument as JSON, as its own CLI sends it
            url += "?" + "&".join(
                f"{k}={quote_plus(v if isinstance(v, str) else json.dumps(v))}"
                for k, v in query.items()
            )
        headers = {"Authorization": f"Bearer {self._key}", "Accept": "application/json"}
        r = self._session.request(method, url, headers=headers, json=body, timeout=120)
        if not 200 <= r.status_code < 300:
            raise VastAPIError(f"vast.ai {method} {path}: HTTP {r.status_code}: {r.text[:300]}")
        return r.json()

    def search_offers(self, query: Mapping[str, Any]) -> list[dict]:
        return list(self._call("POST", "/bundles/", body=dict(query))["offers"])

    def create_overlay(self, cluster_id: int, name: str) -> Any:
        return self._call("POST", "/overlay/", body={"cluster_id": cluster_id, "name": name})

    def overlays(self) -> list[dict]:
        return list(self._call("GET", "/overlay/"))

    def delete_overlay(self, overlay_id: int) -> Any:
        return self._call("DELETE", "/overlay/", body={"overlay_id": overlay_id})

    def create_instance(self, offer_id: int, payload: Mapping[str, Any]) -> int:
        answer = self._call("PUT", f"/asks/{offer_id}/", body=dict(payload))
        if not answer.get("success", True) or "new_contract" not in answer:
            raise VastAPIError(f"vast.ai refused offer {offer_id}: {answer}")
        return int(answer["new_contract"])

    def instances(self) -> list[dict]:
        """Every instance of the account (the v1 listing, page by page)."""
        rows: list[dict] = []
        query: dict[str, Any] = {
            "select_filters": {},
            "order_by": [{"col": "id", "dir": "asc"}],
            "limit": 25,
        }
        while True:
            page = self._call("GET", "/api/v1/instances/", query=query)
            rows.extend(page.get("instances") or [])
            if not page.get("next_token"):
                return rows
            query["after_token"] = page["next_token"]

    def destroy_instance(self, instance_id: int) -> Any:
        return self._call("DELETE", f"/instances/{instance_id}/", body={})


def instance_payload(image: str, disk_gb: int, label: str, network: str | None) -> dict:
    """The body of ``PUT /api/v0/asks/{offer}/``; ``network`` attaches the overlay (``-n``)."""
    env = {f"-n {network}": "1"} if network else {}
    return {
        "client_id": "me",
        "image": image,
        "disk": disk_gb,
        "label": label,
        "env": env,
        "runtype": RUNTYPE,
        "onstart": None,
        "price": None,
        "image_login": None,
        "python_utf8": True,
        "lang_utf8": True,
        "force": False,
        "cancel_unavail": True,
    }


def ssh_runner(key_file: str) -> Ssh:
    """An :data:`Ssh` that uses the OpenSSH client with ``key_file``."""

    def run(host: str, port: int, command: str) -> str:
        argv = [
            "ssh",
            "-p",
            str(port),
            "-i",
            key_file,
            "-o",
            "BatchMode=yes",
            "-o",
            "StrictHostKeyChecking=accept-new",
            "-o",
            "ConnectTimeout=20",
            f"root@{host}",
            command,
        ]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
        if done.returncode != 0:
            raise VastError(f"ssh root@{host} -p {port} {command!r}: {done.stderr.strip()}")
        return done.stdout

    return run


# -- the flow --------------------------------------------------------------------------------


def plan(api: VastAPI, args: argparse.Namespace) -> tuple[int | None, list[dict]]:
    """The offers ``up`` would rent: ``(physical cluster, offers)``."""
    if args.layout == "single":
        offers = api.search_offers(offer_query(args.gpu, args.nodes, args.disk, clustered=False))
        if not offers:
            raise VastError(f"no on-demand offer of {args.nodes}× {args.gpu}")
        return None, [min(offers, key=lambda o: o["dph_total"])]
    offers = api.search_offers(offer_query(args.gpu, 1, args.disk, clustered=True))
    return choose_cluster(offers, args.nodes)


def wait_running(api: VastAPI, ids: Sequence[int], timeout_s: float) -> list[dict]:
    """The listing rows of ``ids`` once every one runs with an SSH endpoint (in ``ids`` order)."""
    deadline = time.monotonic() + timeout_s
    while True:
        rows = {int(r["id"]): r for r in api.instances() if int(r["id"]) in ids}
        ready = [rows.get(i) for i in ids]
        if all(r is not None and r.get("actual_status") == "running" for r in ready):
            return [r for r in ready if r is not None]
        if time.monotonic() > deadline:
            states = {i: (rows.get(i) or {}).get("actual_status") for i in ids}
            raise VastError(f"instances not running after {timeout_s:.0f}s: {states}")
        time.sleep(POLL_S)


def build_state(
    args: argparse.Namespace,
    rows: Sequence[dict],
    overlay_id: int | None,
    overlays: Sequence[dict],
    ssh: Ssh,
) -> ClusterState:
    """The cluster from the running instances: SSH endpoints, overlay addresses."""
    subnet = overlay_subnet(overlays, overlay_id) if overlay_id is not None else None
    nodes = []
    for row in rows:
        node = make_node(row, row.get("public_ipaddr", ""))
        if subnet is not None:
            output = ssh(node.public_ip, node.ssh_port, "ip -4 -o addr show")
            node = make_node(row, overlay_address(output, subnet))
        nodes.append(node)
    return ClusterState(
        args.name, args.layout, overlay_id, subnet, tuple(nodes), args.model, args.engine_config
    )


def write_cluster(state: ClusterState, out: Path, ssh_key: str) -> Path:
    """``state.json``, the token, the proxy script and the validated ``cluster.yaml``."""
    import yaml

    out.mkdir(parents=True, exist_ok=True)
    (out / "state.json").write_text(state.to_json())
    secrets_dir = out / "secrets"  # NOTE: the token alone: this directory is mounted on nodes
    secrets_dir.mkdir(mode=0o700, exist_ok=True)
    token = secrets_dir / "auth_token"
    if not token.exists():  # NOTE: Ray's format: 256 random bits in hex; owner-only
        fd = os.open(token, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    proxy = Path(os.path.expanduser(proxy_dir(state.name))) / PROXY_NAME
    proxy.parent.mkdir(parents=True, exist_ok=True)
    proxy.write_text(render_proxy(state))
    proxy.chmod(0o700)
    config = render_cluster_yaml(
        state,
        ssh_key=ssh_key,
        repo=str(ROOT),
        secrets_dir=str(secrets_dir.resolve()),
        proxy_dir_local=str(proxy.parent),
    )
    validate_with_ray(config)
    path = out / "cluster.yaml"
    path.write_text(YAML_HEADER + yaml.safe_dump(config, sort_keys=False, width=100))
    return path


YAML_HEADER = """\
# Ray cluster for DynBranch on vast.ai, written by scripts/vastai.py (see ray_cluster/README.md).
# Nodes are named by their overlay address; SSH goes through the generated proxy script.
"""


def next_steps(state: ClusterState, out: Path) -> str:
    """What the operator runs next (printed by ``up``)."""
    yaml_path, token = out / "cluster.yaml", (out / "secrets" / "auth_token").resolve()
    config = f" --engine-config {state.engine_config}" if state.engine_config else ""
    engines = sum(n.gpus for n in state.nodes)
    return f"""
Cluster {state.name}: {len(state.nodes)} node(s), {engines} GPU(s), ${state.dph_total():.3f}/h
until `python scripts/vastai.py down --name {state.name}`.

  ray up -y {yaml_path}                 # installs .[vllm], fetches {state.model}, starts Ray
  ray dashboard {yaml_path} &           # the dashboard and job API at http://127.0.0.1:8265
  export RAY_AUTH_MODE=token RAY_AUTH_TOKEN_PATH={token}
  ray job submit --address http://127.0.0.1:8265 --working-dir . -- \\
      python -m dynbranch replay --engine vllm --model {state.model}{config} \\
      --workers {engines} --address auto --out /root/runs/vastai
  ray rsync-down {yaml_path} /root/runs/vastai runs/vastai-results
  python scripts/vastai.py down --name {state.name}   # destroys every instance: billing stops
"""


def cmd_up(
    api: VastAPI, args: argparse.Namespace, ssh: Ssh, confirm: Callable[[str], bool]
) -> ClusterState:
    """Rent, wait, read back, write (see the module doc); undo what was rented on failure."""
    cluster, offers = plan(api, args)
    total = sum(o["dph_total"] for o in offers)
    print(
        f"{len(offers)} offer(s) on cluster {cluster}: "
        + ", ".join(f"#{o['id']} ${o['dph_total']:.3f}/h" for o in offers)
        + f"; total ${total:.3f}/h"
    )
    if not args.yes and not confirm(f"rent them for ${total:.3f}/h? [y/N] "):
        raise VastError("not confirmed; nothing rented")
    overlay_id, created = None, []
    try:
        if cluster is not None:
            api.create_overlay(cluster, args.name)
            overlay_id = next(o["overlay_id"] for o in api.overlays() if o["name"] == args.name)
        network = args.name if cluster is not None else None
        for i, offer in enumerate(offers):
            payload = instance_payload(args.image, args.disk, f"{args.name}-{i}", network)
            created.append(api.create_instance(offer["id"], payload))
        rows = wait_running(api, created, args.timeout)
        state = build_state(args, rows, overlay_id, api.overlays() if overlay_id else [], ssh)
    except BaseException:
        print(
            f"up failed: destroying what it rented ({created}, overlay {overlay_id})",
            file=sys.stderr,
        )
        teardown(api, created, overlay_id)
        raise
    out = Path(args.out) / args.name
    write_cluster(state, out, str(Path(args.ssh_key).expanduser()))
    print(next_steps(state, out))
    return state


def teardown(api: VastAPI, instance_ids: Sequence[int], overlay_id: int | None) -> list[str]:
    """Destroy every instance, then the overlay; returns what could not be destroyed."""
    problems = []
    for instance_id in instance_ids:
        try:
            api.destroy_instance(instance_id)
        except VastError as e:
            problems.append(str(e))
    if overlay_id is not None:
        try:
            api.delete_overlay(overlay_id)
        except VastError as e:
            problems.append(str(e))
    return problems


def load_state(args: argparse.Namespace) -> ClusterState:
    path = Path(args.out) / args.name / "state.json"
    if not path.is_file():
        raise VastError(f"no cluster {args.name!r}: {path} does not exist")
    return ClusterState.from_json(path.read_text())


def cmd_status(api: VastAPI, args: argparse.Namespace) -> list[dict]:
    """Each node's state, uptime and cost so far, from the instance listing."""
    state = load_state(args)
    rows = {int(r["id"]): r for r in api.instances()}
    now, report = time.time(), []
    for node in state.nodes:
        row = rows.get(node.instance_id, {})
        hours = max(0.0, now - float(row.get("start_date") or now)) / 3600
        report.append(
            {
                "id": node.instance_id,
                "label": node.label,
                "status": row.get("actual_status", "gone"),
                "overlay_ip": node.overlay_ip,
                "ssh": f"root@{node.public_ip} -p {node.ssh_port}",
                "hours": round(hours, 2),
                "cost": round(hours * node.dph_total, 2),
            }
        )
    for line in report:
        print(json.dumps(line))
    print(f"total ${state.dph_total():.3f}/h; so far ${sum(r['cost'] for r in report):.2f}")
    return report


def cmd_down(api: VastAPI, args: argparse.Namespace, confirm: Callable[[str], bool]) -> None:
    """Destroy the cluster's instances and overlay; check the listing no longer has them."""
    state = load_state(args)
    ids = [n.instance_id for n in state.nodes]
    if not args.yes and not confirm(f"destroy instances {ids} (their disks too)? [y/N] "):
        raise VastError("not confirmed; nothing destroyed")
    problems = teardown(api, ids, state.overlay_id)
    left = [
        int(r["id"])
        for r in api.instances()
        if int(r["id"]) in ids and r.get("actual_status") not in ("exited", "destroyed")
    ]
    if problems or left:
        raise VastError(
            f"still billing: instances {left}; errors: {problems}. Destroy them "
            f"in the vast.ai console or with `vastai destroy instance ID`"
        )
    print(f"destroyed {ids} and overlay {state.overlay_id}; billing for {state.name} stopped")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="scripts/vastai.py", description=__doc__.split("\n")[1])
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("offers", "up", "status", "down"):
        p = sub.add_parser(name)
        p.add_argument("--name", default="dynbranch", help="cluster (and overlay) name")
        p.add_argument("--out", default=str(ROOT / "runs" / "vastai"))
        p.add_argument("--yes", action="store_true", help="do not ask before renting/destroying")
        p.add_argument("--nodes", type=int, default=4, help="GPUs in all (one per node)")
        p.add_argument("--gpu", default="RTX 4090")
        p.add_argument("--layout", default="overlay", choices=["overlay", "single"])
        p.add_argument("--disk", type=int, default=80, help="GB per instance (image + weights)")
        p.add_argument("--image", default=DEFAULT_IMAGE)
        p.add_argument("--model", default="Qwen/Qwen3-8B", help="hub id fetched on every node")
        p.add_argument("--engine-config", default="ray_cluster/engines/qwen3-8b@rtx4090.toml")
        p.add_argument("--ssh-key", default="~/.ssh/id_ed25519", help="private key for root")
        p.add_argument("--timeout", type=float, default=1200, help="seconds to wait for nodes")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        api = VastAPI(api_key())
        if args.command == "offers":
            cluster, offers = plan(api, args)
            print(json.dumps({"cluster_id": cluster, "offers": offers}, indent=2))
        elif args.command == "up":
            cmd_up(
                api,
                args,
                ssh_runner(str(Path(args.ssh_key).expanduser())),
                lambda q: input(q).strip().lower() == "y",
            )
        elif args.command == "status":
            cmd_status(api, args)
        else:
            cmd_down(api, args, lambda q: input(q).strip().lower() == "y")
    except VastError as e:
        print(f"vastai.py: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
