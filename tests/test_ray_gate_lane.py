"""The gate's compiled-graph lane: the same decisions as the actor's ordinary calls, faster,
and the plain path (with its retries and call ids) from the first call a lane fails on.

First the actor's side as a plain object (a lane request answers what the call answers, an
error comes back as a value, a call that may not use the lane is refused); then on a local
Ray instance: a laned client decides exactly as an in-process gate, a killed actor breaks
the lane once and the client goes on the plain way without losing what the gate learned, a
gate takes one laned client, and ``--gate-lane`` is refused off Ray.
"""

import asyncio
import random

import pytest

from dynbranch.errors import ConfigError
from dynbranch.gate import LoadView

ray = pytest.importorskip("ray")

from dynbranch.cluster import GateActor, GateDeployment  # noqa: E402
from dynbranch.cluster.gate.codec import encode_candidate  # noqa: E402
from dynbranch.cluster.gate.lane import LANE_BATCH_MAX, LANE_METHODS, fits_lane  # noqa: E402
from tests.test_ray_gate import (  # noqa: E402
    candidates,
    decided_as_in_process,
    gate_spec,
    killed_and_back,
)

# -- the actor's side, as a plain object ----------------------------------------------------------


def test_a_lane_request_answers_what_the_call_answers(tmp_path):
    model, config = gate_spec(audit_rate=0.0)
    by_call = GateActor(model, config, str(tmp_path / "a"))
    by_lane = GateActor(model, config, str(tmp_path / "b"))
    rows = candidates(random.Random(2))
    view = LoadView(0.1, 0.2, 0.3)

    async def called():
        return [await by_call.generation("g:1", "r", 0.0),
                await by_call.admit("a:1", "r", rows, view, 0.5),
                await by_call.decide("d:1", "r", [encode_candidate(c) for c in rows],
                                     view.as_tuple(), 0.6)]

    laned = [by_lane.lane(("generation", ("g:1", "r", 0.0))),
             by_lane.lane(("admit", ("a:1", "r", rows, view, 0.5))),
             by_lane.lane(("decide", ("d:1", "r", [encode_candidate(c) for c in rows],
                                      view.as_tuple(), 0.6)))]
    assert all(ok for ok, _ in laned)
    assert [value for _, value in laned] == asyncio.run(called())
    assert any(a.admitted for a in laned[1][1])  # a decision that reserved blocks
    assert asyncio.run(by_lane.state()) == asyncio.run(by_call.state())


def test_a_lane_returns_errors_as_values_and_refuses_other_calls(tmp_path):
    actor = GateActor(*gate_spec(), str(tmp_path))
    ok, error = actor.lane(("admit", ("a:1", "r", ["not a candidate"], LoadView(), 0.0)))
    assert not ok and isinstance(error, Exception)  # bad input: raised to the caller, later
    for off_lane in ("state", "checkpoint", "stats"):
        ok, error = actor.lane((off_lane, ()))
        assert not ok and isinstance(error, ValueError) and "lane" in str(error)
    assert sorted(LANE_METHODS) == ["abandon", "admit", "decide", "generation", "learn",
                                    "release"]
    assert actor.lane(("ping", ()))[0]  # opens a lane: answered, not journaled


def test_a_batch_too_big_for_the_lane_goes_the_ordinary_way():
    small, big = [object()] * 10, [object()] * (LANE_BATCH_MAX + 1)
    assert fits_lane("learn", ("c:1", small, small)) and fits_lane("release", (small,))
    assert not fits_lane("learn", ("c:1", big, []))  # the train split's history, say
    assert not fits_lane("abandon", (big,)) and not fits_lane("stats", ())
    assert fits_lane("decide", ("d:1", "r", [], (0.0, 0.0, 0.0), 0.0))


def test_gate_lane_is_refused_off_ray():
    from dynbranch.driver import ReplayConfig, prepare

    with pytest.raises(ConfigError, match="gate-lane"):
        prepare(ReplayConfig(backend="local", clock="virtual", gate_lane=True, requests=1),
                progress=lambda _m: None)


# -- on Ray ---------------------------------------------------------------------------------------

on_ray = pytest.mark.ray


@on_ray
def test_a_laned_client_decides_as_an_in_process_gate(local_ray, tmp_path):
    model, config = gate_spec()
    deployment = GateDeployment.start(model, config, tmp_path)
    try:
        counts = decided_as_in_process(deployment, lane=True)
        assert counts["lane_calls"] > 40 and counts["lane_broken"] == 0
        assert counts["lane_calls"] == counts["calls"] - 1  # all but stats
        with pytest.raises(ConfigError, match="laned client"):
            deployment.client(model, config, lane=True)  # one compiled graph per actor
        assert not deployment.client(model, config).wants_lane
    finally:
        deployment.stop()


@on_ray
def test_a_killed_gate_breaks_the_lane_once_and_the_client_goes_on_plainly(local_ray, tmp_path):
    model, config = gate_spec(audit_rate=0.0, generation_audit_rate=0.0)
    deployment = GateDeployment.start(model, config, tmp_path)
    try:
        counts, before = killed_and_back(deployment, lane=True)
        assert before == 2 and counts["lane_broken"] == 1 and counts["lane_calls"] == 2
        assert "generation got no reply" in counts["lane_error"]
    finally:
        deployment.stop()
