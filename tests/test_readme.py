"""The README stays true: its quick start, CLI flags and paths exist; CI runs its test command."""

import re
from pathlib import Path

from dynbranch.cli import build_parser

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _quick_start() -> list[str]:
    section = README.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    return [line for line in block.splitlines() if line.strip()]


def test_quick_start_is_two_commands_and_ci_runs_the_second():
    install_and_run, install_and_test = _quick_start()
    assert "pip install ." in install_and_run and "dynbranch replay" in install_and_run
    assert "pytest" in install_and_test
    ci = (ROOT / ".ci" / "run").read_text().strip().splitlines()
    assert ci[-1] == install_and_test


def test_every_flag_the_readme_names_is_accepted():
    section = README.split("## CLI", 1)[1].split("\n## ", 1)[0]
    section = re.search(r"```\n(.*?)```", section, re.S).group(1)  # the usage block
    parser = build_parser()
    subparsers = parser._subparsers._group_actions[0].choices
    accepted = {opt for sp in subparsers.values() for a in sp._actions for opt in a.option_strings}
    named = set(re.findall(r"(--[a-z][a-z-]+)", section))
    assert named and named <= accepted, named - accepted


def test_every_path_the_readme_names_exists():
    paths = set(re.findall(r"`((?:dynbranch|workloads|ray_cluster|scripts|tests)/[\w./*-]*)`",
                           README))
    for p in paths:
        for part in p.split(", "):
            matches = list(ROOT.glob(part.rstrip("/")))
            assert matches, f"README names {part}, which does not exist"
