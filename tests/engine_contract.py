"""The contract every engine passes: run :func:`check_engine_contract` inside its clock.

It drives the engine through its whole lifecycle with exact assertions on what the
protocol promises (``dynbranch/engines/protocol.py``): streams end with one result chunk
whose text is the concatenated deltas, unknown ids are not aborted, load snapshots are
consistent and empty when idle, and a shut-down engine refuses work. Engines that replay
recorded text (``sim``, ``zero``) must return exactly that text; real engines pass
``replays_text=False``.
"""

from __future__ import annotations

import asyncio

import pytest

from dynbranch.engines.protocol import SPECULATIVE, Engine, GenerateRequest, LoadSnapshot
from dynbranch.errors import EngineError

REPLAY = 'Call get_weather(city="Paris") then answer: 18 degrees and sunny.'


def _request(request_id: str, **kw: object) -> GenerateRequest:
    base: dict[str, object] = {
        "prompt": f"You are a router. Request {request_id}: pick a handler.",
        "max_tokens": 256,
        "replay_text": REPLAY,
    }
    base.update(kw)
    return GenerateRequest(request_id=request_id, **base)  # type: ignore[arg-type]


def _check_snapshot(engine: Engine, snap: LoadSnapshot) -> None:
    assert snap.engine_id == engine.engine_id
    assert snap.running >= 0 and snap.waiting >= 0
    assert 0 <= snap.kv_blocks_used <= snap.kv_blocks_total
    assert 0 <= snap.spec_running <= snap.running
    assert 0 <= snap.spec_waiting <= snap.waiting
    assert 0 <= snap.spec_kv_blocks <= snap.kv_blocks_used
    assert snap.preemptions_total >= 0


def _check_idle(engine: Engine) -> None:
    snap = engine.load()
    _check_snapshot(engine, snap)
    assert (snap.running, snap.waiting, snap.kv_blocks_used) == (0, 0, 0)
    assert (snap.spec_running, snap.spec_waiting, snap.spec_kv_blocks) == (0, 0, 0)


async def _check_stream(engine: Engine, request: GenerateRequest, replays_text: bool) -> None:
    chunks = [c async for c in engine.generate_stream(request)]
    assert chunks and chunks[-1].finished
    assert not any(c.finished for c in chunks[:-1]), "only the last chunk carries the result"
    assert all(c.request_id == request.request_id for c in chunks)
    result = chunks[-1].result
    assert result is not None
    assert "".join(c.text_delta for c in chunks) == result.text
    assert result.request_id == request.request_id
    assert result.engine_id == engine.engine_id
    assert result.finish_reason == "stop"
    assert result.arrived_at <= result.first_scheduled_at <= result.first_token_at
    assert result.first_token_at <= result.finished_at
    assert result.prompt_tokens > 0 and result.output_tokens >= 1
    assert 0 <= result.cached_prompt_tokens <= result.prompt_tokens
    if replays_text:
        assert result.text == request.replay_text


async def check_engine_contract(engine: Engine, *, replays_text: bool = True) -> None:
    """Drive ``engine`` (not yet started) through the protocol; it ends shut down."""
    await engine.start()
    assert await engine.health()
    _check_idle(engine)

    await _check_stream(engine, _request("contract-stream"), replays_text)
    result = await engine.generate(_request("contract-generate"))
    assert result.finish_reason == "stop"
    if replays_text:
        assert result.text == REPLAY

    # Concurrent calls, canonical and speculative, all complete.
    requests = [_request(f"contract-c{i}", priority=i % 2 * SPECULATIVE) for i in range(6)]
    results = await asyncio.gather(*(engine.generate(r) for r in requests))
    assert [r.request_id for r in results] == [r.request_id for r in requests]
    assert all(r.finish_reason == "stop" for r in results)
    if replays_text:
        assert all(r.text == REPLAY for r in results)

    assert await engine.abort("contract-unknown") is False
    assert await engine.abort("contract-generate") is False, "finished calls are not aborted"
    _check_idle(engine)

    await engine.shutdown()
    with pytest.raises(EngineError):
        await engine.generate(_request("contract-after-shutdown"))
