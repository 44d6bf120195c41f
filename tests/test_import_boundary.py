"""The core never imports Ray or vLLM: only dynbranch.cluster may (and vLLM only lazily)."""

import json
import pkgutil
import subprocess
import sys

import dynbranch

FORBIDDEN = ("ray", "vllm")


def _core_modules() -> list[str]:
    names = ["dynbranch"]
    for info in pkgutil.walk_packages(dynbranch.__path__, "dynbranch."):
        if not info.name.startswith(("dynbranch.cluster", "dynbranch.__main__")):
            names.append(info.name)
    return names


def test_core_and_workloads_import_without_ray_or_vllm():
    modules = _core_modules() + ["workloads", "workloads.routing"]
    code = (
        "import importlib, json, sys\n"
        f"for m in {modules!r}: importlib.import_module(m)\n"
        f"print(json.dumps(sorted({{n.split('.')[0] for n in sys.modules}} & {set(FORBIDDEN)!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []
    assert "dynbranch.orchestrator" in modules and "dynbranch.engines.sim" in modules
