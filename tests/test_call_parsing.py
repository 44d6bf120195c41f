"""BFCL call parsing hands out calls nobody else holds, however often a text recurs."""

from __future__ import annotations

import pytest

from workloads.routing.calls import CallSyntaxError, parse_call


def test_a_recurring_call_parses_equal_and_unshared():
    first = parse_call("cd(folder='docs', depth=2)")
    first.kwargs["folder"] = "changed"  # a caller that edits its arguments
    again = parse_call("cd(folder='docs', depth=2)")
    assert again.name == "cd" and again.kwargs == {"folder": "docs", "depth": 2}
    assert again.kwargs is not first.kwargs


def test_a_call_with_a_list_argument_is_parsed_afresh_each_time():
    first = parse_call("sort(items=[3, 1, 2])")
    first.kwargs["items"].append(9)  # a tool may change a list it was handed
    assert parse_call("sort(items=[3, 1, 2])").kwargs == {"items": [3, 1, 2]}


def test_bad_calls_still_fail_every_time():
    for _ in range(2):
        with pytest.raises(CallSyntaxError, match="literal"):
            parse_call("cd(folder=os.getcwd())")
