"""scripts/calls_per_request.py on the shipped BFCL fixture: the per-request figures it
prints are differences between two replays, and the functions it lists are counted ones."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from tests import scripts

FIXTURE = Path(__file__).parent / "fixtures" / "bfcl"
calls = scripts.load("calls_per_request")


def test_prints_calls_and_cpu_per_request_and_the_functions_called_most(
        monkeypatch, capsys) -> None:
    monkeypatch.setattr(sys, "argv", ["calls_per_request.py", "--requests", "2", "5",
                                      "--arm", "floor", "--top", "4",
                                      "--bfcl-root", str(FIXTURE)])
    calls.main()
    out = capsys.readouterr().out.splitlines()
    # NOTE: the CPU figure is a difference of two short timings, which this machine's noise
    # may leave unresolved (test_cpu_figures covers both answers)
    head = re.match(r"requests 3-5 of Routing `floor` at 4 req/s, per request: ([\d.]+) stages, "
                    r"([\d,]+) Python calls, ([\d,]+) calls into C, "
                    r"(?:[\d.]+ ms CPU .* [\d.]+ µs per Python call|CPU per request not resolved"
                    r" .*)$", out[0])
    assert head is not None, out[0]
    stages, python_calls = float(head[1]), int(head[2].replace(",", ""))
    assert stages >= 1 and python_calls > 100  # a request runs at least its router stage
    assert out[1].startswith("called most per request")
    listed = out[2:]
    assert len(listed) == 4
    per_request = [float(line.split()[0]) for line in listed]
    assert per_request == sorted(per_request, reverse=True) and per_request[0] > 0


def test_cpu_figures() -> None:
    assert calls.cpu_figures(10.0, 16.0, 300, 10_000) == (
        "20.0 ms CPU (10.00 and 16.00 s for the two replays), 2.00 µs per Python call")
    unresolved = calls.cpu_figures(87.58, 82.94, 600, 6_468)
    assert unresolved.startswith("CPU per request not resolved (87.58 and 82.94 s")
    assert " -" not in unresolved.replace(" --requests", "")  # no negative figure


def test_a_span_that_is_not_one_is_refused(monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["calls_per_request.py", "--requests", "5", "5"])
    with pytest.raises(SystemExit):
        calls.main()
