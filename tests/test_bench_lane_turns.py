"""scripts/bench_lane_turns.py runs end to end: an echo actor in another process, lane calls
with the caller's loop idle and busy (made three ways), and the turns estimate (no timing is
asserted)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_lane_turns.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True,
                          text=True, timeout=120)


def test_it_measures_both_loops_and_estimates_the_turns_waited(tmp_path):
    # NOTE: a copy of the stream module loaded from a path, as --stream loads an old one
    copy = tmp_path / "stream_copy.py"
    copy.write_text((SCRIPT.parents[1] / "dynbranch" / "cluster" / "stream.py").read_text())
    for extra in ((), ("--stream", str(copy))):
        done = _run("--calls", "20", "--others", "2", "--step-us", "50", "--payload", "100",
                    *extra)
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert ("this tree" in out) == (not extra)
        assert "caller's loop idle, called directly: p50" in out
        assert "2 other tasks of 50 us per turn" in out
        busy = re.findall(r"loop busy, called (.+): p50 .* per call (-?\d+\.\d+) at p50, "
                          r"(-?\d+\.\d+) at p90", out)
        assert [way for way, *_ in busy] == ["directly", "under asyncio.timeout",
                                             "under asyncio.wait_for"]


def test_bad_arguments_stop_with_a_usage_line():
    done = _run("--others", "0")
    assert done.returncode == 2 and "--others >= 1" in done.stderr
