"""The gate's stream lane: the same decisions as the actor's ordinary calls, and the plain
path (with its retries and call ids) from the first call the stream fails on.

First the actor's side as a plain object (a stream call, its rows through msgpack, answers
what the method answers and leaves the same gate); then on a local Ray instance: a streamed
client decides exactly as an in-process gate, and a killed actor breaks the stream once and
the client goes on the plain way without losing what the gate learned.
"""

import asyncio
import random

import msgpack
import pytest

from dynbranch.cluster.gate.client import _gate_error, _stream_reply
from dynbranch.errors import ConfigError
from dynbranch.gate import BranchReturn, LoadView, Observation, Settlement

ray = pytest.importorskip("ray")

from dynbranch.cluster import GateActor, GateDeployment  # noqa: E402
from dynbranch.cluster.gate.codec import encode_candidate, journal_args  # noqa: E402
from tests.test_ray_gate import (  # noqa: E402
    PATIENT,
    candidates,
    decided_as_in_process,
    gate_spec,
    killed_and_back,
)

on_ray = pytest.mark.ray


def _over_the_wire(actor: GateActor, method: str, args: tuple):
    """``method(*args)`` as a stream-lane call: rows encoded and decoded by msgpack both ways."""
    rows = msgpack.unpackb(msgpack.packb(journal_args(method, args)), raw=False)
    reply = actor._stream_run(method, rows)
    return _stream_reply(method, msgpack.unpackb(msgpack.packb(reply), raw=False))


def test_a_stream_call_answers_what_the_call_answers(tmp_path):
    model, config = gate_spec(audit_rate=0.0)
    by_call = GateActor(model, config, str(tmp_path / "a"))
    by_stream = GateActor(model, config, str(tmp_path / "b"))
    rng = random.Random(2)
    rows, view = candidates(rng), LoadView(0.1, 0.2, 0.3)
    observations = [Observation(c.stage_key, c.rank, c.rank == 1, True) for c in rows]
    settlements = [Settlement("r", BranchReturn(saved_ms=120.0, fill_cost_ms=30.0))]

    async def called():
        got = [await by_call.generation("g:1", "r", 0.0),
               await by_call.admit("a:1", "r", rows, view, 0.5),
               await by_call.decide("d:1", "r", [encode_candidate(c) for c in rows],
                                    view.as_tuple(), 0.6)]
        held = [a.reservation for a in got[1] if a.admitted]
        got.append(await by_call.learn("l:1", observations, settlements))
        got.append(await by_call.release(held))
        got.append(await by_call.abandon(["d:1"]))
        return got, held

    got, held = asyncio.run(called())
    streamed = [_over_the_wire(by_stream, "generation", ("g:1", "r", 0.0)),
                _over_the_wire(by_stream, "admit", ("a:1", "r", rows, view, 0.5)),
                _over_the_wire(by_stream, "decide", ("d:1", "r", [encode_candidate(c) for c in rows],
                                                     view.as_tuple(), 0.6)),
                _over_the_wire(by_stream, "learn", ("l:1", observations, settlements)),
                _over_the_wire(by_stream, "release", (held,)),
                _over_the_wire(by_stream, "abandon", (["d:1"],))]
    assert held and streamed == got
    assert asyncio.run(by_stream.state()) == asyncio.run(by_call.state())
    # NOTE: a repeated id is answered from the call log, as a retried ordinary call is
    assert _over_the_wire(by_stream, "admit", ("a:1", "r", rows, view, 0.5)) == got[1]


def test_a_stream_call_refuses_other_calls_and_errors_come_back_typed(tmp_path):
    actor = GateActor(*gate_spec(), str(tmp_path))
    for off_lane in ("state", "checkpoint", "stats", "ping"):
        with pytest.raises(ValueError, match="lane"):
            actor._stream_run(off_lane, [None, []])
    error = _gate_error("", {"type": "ValueError", "message": "bad row"})
    assert type(error) is ValueError and str(error) == "bad row"
    assert type(_gate_error("", {"type": "ConfigError", "message": "no"})) is ConfigError
    # NOTE: a type whose constructor takes more than a message, or an unknown one, is named
    for name in ("UnknownNameError", "NoSuchError"):
        error = _gate_error("", {"type": name, "message": "x"})
        assert type(error) is RuntimeError and name in str(error)


@on_ray
def test_a_streamed_client_decides_as_an_in_process_gate(local_ray, tmp_path):
    model, config = gate_spec()
    deployment = GateDeployment.start(model, config, tmp_path)
    try:
        counts = decided_as_in_process(deployment, stream=True)
        assert counts["stream_calls"] > 40 and counts["stream_broken"] == 0
        assert counts["stream_calls"] == counts["calls"] - 1  # all but stats
        # NOTE: streams are not compiled graphs: any number of clients may hold one
        other = deployment.client(model, config, PATIENT, stream=True)
        assert asyncio.run(other.generation("routing/router/0", 9.0)).estimate is not None
        assert other.counts["stream_calls"] == 1
    finally:
        deployment.stop()


@on_ray
def test_a_killed_gate_breaks_the_stream_once_and_the_client_goes_on_plainly(local_ray,
                                                                                tmp_path):
    model, config = gate_spec(audit_rate=0.0, generation_audit_rate=0.0)
    deployment = GateDeployment.start(model, config, tmp_path)
    try:
        counts, before = killed_and_back(deployment, stream=True)
        assert before == 2 and counts["stream_broken"] == 1 and counts["stream_calls"] == 2
        # NOTE: the first plain answer after the break opened a new stream to the new actor
        assert counts["stream_reopened"] == 1 and counts["after"] == 3
    finally:
        deployment.stop()
