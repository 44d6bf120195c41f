"""The engine lane without Ray: an engine served over a local TCP stream, as an engine actor
serves it to the driver (the Ray backend's tests run it between processes)."""

import asyncio
import functools
from collections.abc import AsyncIterator

import pytest

from dynbranch.clock import RealClock
from dynbranch.cluster.engine_lane import (
    decode_error,
    decode_load,
    decode_request,
    decode_result,
    encode_load,
    encode_request,
    encode_result,
    engine_handler,
)
from dynbranch.cluster.stream import Lane, LaneBroken, LaneServer, answer
from dynbranch.engines.protocol import (
    Engine,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)
from dynbranch.engines.tokenizer import count_tokens
from dynbranch.engines.zero import ZeroEngine
from dynbranch.errors import EngineAborted, EngineError, PromptTooLongError

TOKEN = b"0123456789abcdef"


class _Scripted(Engine):
    """An engine whose calls do what their prompt says: fail in a named way, or wait."""

    engine_id, model = "scripted-0", "scripted"

    def __init__(self) -> None:
        self.release = asyncio.Event()
        self.waited: list[str] = []  # the calls that reached the engine and wait

    async def start(self) -> None:
        pass

    async def generate_stream(self, request: GenerateRequest) -> AsyncIterator[GenerateChunk]:
        if request.prompt == "too long":
            raise PromptTooLongError("prompt of 9,999,999 tokens")
        if request.prompt == "abort":
            raise EngineAborted(request.request_id)
        if request.prompt == "bug":
            raise ValueError("not an engine error")
        self.waited.append(request.request_id)
        await self.release.wait()
        yield GenerateChunk(request.request_id, "x", GenerateResult(
            request.request_id, "x", 1, 1, 0, "stop", 1.0, 1.0, 1.0, 2.0, 0, self.engine_id))

    async def abort(self, request_id: str) -> bool:
        return True

    def load(self) -> LoadSnapshot:
        return LoadSnapshot(self.engine_id, 3.5, 2, 1, 10, 100, busy=0.25)

    async def shutdown(self) -> None:
        pass


async def _serve(engine: Engine) -> tuple[LaneServer, Lane]:
    async def ready() -> Engine:
        return engine

    server = LaneServer(engine_handler(ready))
    host, port = await server.start("127.0.0.1")
    server.allow(TOKEN)
    return server, await _connect(engine.engine_id, host, port, TOKEN)


async def _connect(engine_id: str, host: str, port: int, token: bytes) -> Lane:
    return await Lane.connect(f"engine {engine_id}", host, port, token,
                              functools.partial(decode_error, engine_id))


def test_the_codec_gives_back_what_it_was_given():
    request = GenerateRequest("r-1", "a prompt", 7, replay_text="out", priority=1, seed=3,
                              cache_salt="s", session="q-1")
    result = GenerateResult("r-1", "out", 3, 1, 2, "length", 0.5, 0.6, 0.7, 0.9, 1, "e-0")
    load = LoadSnapshot("e-0", 1.0, 2, 3, 4, 5, 6, 7, 8, 9, 0.5, 1.5)
    assert decode_request(encode_request(request)) == request
    assert decode_result(encode_result(result)) == result
    assert decode_load(encode_load(load)) == load


def test_calls_come_back_from_a_real_engine_many_in_flight():
    clock = RealClock()

    async def main():
        engine = ZeroEngine(clock, "zero-0")
        await engine.start()
        server, lane = await _serve(engine)
        try:
            requests = [GenerateRequest(f"r-{i}", f"prompt number {i} " * (i + 1), 64,
                                        replay_text=f"answer {i}") for i in range(20)]
            results = await asyncio.gather(*(lane.call("generate", encode_request(r), r.request_id)
                                             for r in requests))
            load = decode_load(await lane.call("load", None, "load"))
            aborted = await lane.call("abort", "never-sent", "never-sent")
            # NOTE: a lane carries promote as it carries abort (the zero engine moves nothing)
            aborted = aborted or await lane.call("promote", "never-sent", "never-sent")
            return requests, [decode_result(r) for r in results], load, aborted, lane.calls
        finally:
            lane.close()
            server.close()

    requests, results, load, aborted, calls = clock.run(main())
    for request, result in zip(requests, results, strict=True):
        assert result.request_id == request.request_id
        assert result.text == request.replay_text
        assert result.prompt_tokens == count_tokens(request.prompt)
        assert result.engine_id == "zero-0"
    assert load.engine_id == "zero-0" and aborted is False and calls == 23


def test_engine_errors_come_back_typed():
    clock = RealClock()

    async def main():
        server, lane = await _serve(_Scripted())
        got = {}
        try:
            for prompt in ("too long", "abort", "bug"):
                with pytest.raises(EngineError) as e:
                    await lane.call("generate", encode_request(GenerateRequest("r", prompt, 4)),
                                    "r")
                got[prompt] = e.value
            with pytest.raises(EngineError, match="no call 'pickle'"):
                await lane.call("pickle", None, "r")
            load = decode_load(await lane.call("load", None, "load"))
        finally:
            lane.close()
            server.close()
        return got, load

    got, load = clock.run(main())
    assert type(got["too long"]) is PromptTooLongError and "9,999,999" in str(got["too long"])
    assert type(got["abort"]) is EngineAborted and got["abort"].request_id == "r"
    assert type(got["bug"]) is EngineError and "ValueError" in str(got["bug"])
    assert load == LoadSnapshot("scripted-0", 3.5, 2, 1, 10, 100, busy=0.25)


def test_a_wrong_token_is_refused():
    clock = RealClock()

    async def main():
        server, lane = await _serve(_Scripted())
        lane.close()
        host, port = server.address
        try:
            with pytest.raises((ConnectionError, asyncio.IncompleteReadError)):
                await _connect("scripted-0", host, port, b"f" * 16)
        finally:
            server.close()

    clock.run(main())


def test_calls_in_flight_when_the_connection_ends_raise_lane_broken():
    clock = RealClock()

    async def main():
        engine = _Scripted()
        server, lane = await _serve(engine)
        waiting = asyncio.ensure_future(
            lane.call("generate", encode_request(GenerateRequest("w", "wait", 4)), "w"))
        await asyncio.sleep(0.05)
        server.close()
        with pytest.raises(LaneBroken):
            await asyncio.wait_for(waiting, 5)
        with pytest.raises(LaneBroken):  # NOTE: and a later call fails at once, unsent
            await lane.call("load", None, "load")
        engine.release.set()
        lane.close()
        return lane.broken

    assert clock.run(main())


def test_a_call_sent_at_once_is_on_the_wire_before_the_caller_suspends():
    clock = RealClock()

    async def main():
        engine = _Scripted()
        server, lane = await _serve(engine)
        transport = lane._connection.transport
        written: list[int] = []

        def write(data, write=transport.write):
            written.append(len(data))
            write(data)

        transport.write = write
        try:
            sent = lane.send("generate", encode_request(GenerateRequest("s", "wait", 4)))
            waiting = lane.send("generate", encode_request(GenerateRequest("t", "wait", 4)))
            on_the_wire = len(written)  # NOTE: read before this task first suspends
            async with asyncio.timeout(5):
                while len(engine.waited) < 2:
                    await asyncio.sleep(0.001)
            taken_up = list(engine.waited)  # NOTE: both reached the engine, neither awaited
            engine.release.set()
            await asyncio.wait_for(asyncio.gather(sent, waiting), 5)
            first = decode_result(answer(sent, lane._errors, "s"))
            failing = lane.send("generate", encode_request(GenerateRequest("u", "too long", 4)))
            await asyncio.wait_for(asyncio.wait((failing,)), 5)
            with pytest.raises(PromptTooLongError):
                answer(failing, lane._errors, "u")
            dropped = lane.send("generate", encode_request(GenerateRequest("v", "wait", 4)))
            dropped.cancel()  # NOTE: no one reads it: its reply is let go when it comes
            return on_the_wire, taken_up, first, lane.calls
        finally:
            lane.close()
            server.close()

    on_the_wire, taken_up, first, calls = clock.run(main())
    assert on_the_wire == 2
    assert taken_up == ["s", "t"] and first.request_id == "s" and calls == 4
