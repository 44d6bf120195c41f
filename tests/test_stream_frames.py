"""The lane's framing (dynbranch.cluster.stream): frames are read in the transport's own
callback, however the bytes arrive, and a malformed one ends its connection only."""

import asyncio
import struct

import msgpack
import pytest

from dynbranch.cluster.stream import (
    MAX_FRAME,
    Lane,
    LaneBroken,
    LaneServer,
    _frame,
    _Frames,
    answer,
)

TOKEN = b"0123456789abcdef"


def _frames() -> tuple[_Frames, list, list]:
    got: list = []
    lost: list = []
    return _Frames(got.append, lost.append), got, lost


class _Transport(asyncio.Transport):
    """Records what is written and whether it was aborted (no socket under it)."""

    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.aborted = self.closed = False

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def abort(self) -> None:
        self.aborted = True

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.aborted or self.closed

    def get_write_buffer_size(self) -> int:
        return 0


def test_frames_come_out_whole_however_the_bytes_arrive():
    values = [[0, "generate", {"prompt": "x" * 5000}], b"ok", [1, 0, None], "é€𝄞"]
    stream = b"".join(_frame(v) for v in values)
    for cut in (1, 3, 4, 7, 4096, len(stream)):
        frames, got, lost = _frames()
        frames.connection_made(_Transport())
        for at in range(0, len(stream), cut):
            frames.data_received(stream[at:at + cut])
        assert got == values and not lost, cut
        assert not frames._buffer  # NOTE: nothing left over once every frame is out


@pytest.mark.parametrize("garbage", [
    struct.pack("!I", MAX_FRAME + 1),                   # a length past the limit
    struct.pack("!I", 2) + b"\xc1\xc1",                 # a body msgpack cannot read
])
def test_a_malformed_frame_ends_the_connection_and_nothing_after_it_is_read(garbage):
    frames, got, _lost = _frames()
    transport = _Transport()
    frames.connection_made(transport)
    frames.data_received(_frame("before") + garbage + _frame("after"))
    assert got == ["before"] and transport.aborted and frames.lost


def test_a_reply_is_handed_to_its_caller_in_the_callback_that_read_it():
    async def main():
        frames, _got, _lost = _frames()
        transport = _Transport()
        frames.connection_made(transport)
        lane = Lane("test", frames, lambda _rid, row: RuntimeError(row["message"]))
        reply = lane.send("load", None)
        call_id = msgpack.unpackb(transport.written[0][4:])[0]
        frames.data_received(_frame([call_id, 0, {"running": 2}]))
        done_at_once = reply.done()  # NOTE: no await in between: no task read the frame
        failed = lane.send("load", None)
        frames.data_received(_frame([call_id + 1, 1, {"type": "X", "message": "no"}]))
        with pytest.raises(RuntimeError, match="no"):
            answer(failed, lane._errors)
        pending = lane.send("load", None)
        frames.connection_lost(None)
        with pytest.raises(LaneBroken):
            answer(pending, lane._errors)
        with pytest.raises(LaneBroken):
            lane.send("load", None)
        return done_at_once, reply.result()

    done_at_once, result = asyncio.run(main())
    assert done_at_once and result == (0, {"running": 2})


def test_a_connection_that_sends_garbage_ends_alone_and_the_server_serves_on():
    async def handler(method, arg):
        return [method, arg]

    async def main():
        server = LaneServer(handler)
        host, port = await server.start("127.0.0.1")
        server.allow(TOKEN)
        try:
            good = await Lane.connect("good", host, port, TOKEN, lambda _r, row: RuntimeError())
            reader, writer = await asyncio.open_connection(host, port)
            writer.write(_frame(TOKEN))
            assert await reader.readexactly(len(_frame(b"ok"))) == _frame(b"ok")
            writer.write(_frame({"not": "a call"}))  # NOTE: a frame that is no call
            ended = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            # NOTE: a token split over two writes, then two calls in one write
            reader, writer = await asyncio.open_connection(host, port)
            hello = _frame(TOKEN)
            writer.write(hello[:3])
            await writer.drain()
            await asyncio.sleep(0.01)
            writer.write(hello[3:])
            assert await reader.readexactly(len(_frame(b"ok"))) == _frame(b"ok")
            writer.write(_frame([7, "b", [2, 3]]) + _frame([8, "c", None]))
            raw = []
            for _ in range(2):
                (n,) = struct.unpack("!I", await reader.readexactly(4))
                raw.append(msgpack.unpackb(await reader.readexactly(n)))
            writer.close()
            served = await good.call("a", 1)
            good.close()
            return ended, sorted(raw), served
        finally:
            server.close()

    ended, raw, served = asyncio.run(main())
    assert ended == b"" and served == ["a", 1]
    assert raw == [[7, 0, ["b", [2, 3]]], [8, 0, ["c", None]]]


class _Slow(_Transport):
    """A transport whose write buffer stays over the flush mark until told it drained."""

    def __init__(self) -> None:
        super().__init__()
        self.buffered = 0
        self.reading = True

    def write(self, data) -> None:
        super().write(data)
        self.buffered = 2 << 20

    def get_write_buffer_size(self) -> int:
        return self.buffered

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def _inline_connection(handler, transport):
    """An inline server's protocol for one connection, past its token."""
    server = LaneServer(handler, inline=True)
    server.allow(TOKEN)
    loop = asyncio.new_event_loop()
    try:
        connection = server._connection(loop)
        connection.connection_made(transport)
        connection.data_received(_frame(TOKEN))
        assert transport.written == [_frame(b"ok")]
        transport.written.clear()
        return connection, loop
    except BaseException:
        loop.close()
        raise


def test_an_inline_server_answers_the_calls_of_one_read_in_one_write_in_order():
    ran = []

    def handler(method, arg):
        ran.append(method)
        if method == "bad":
            raise ValueError("no such call")
        if method == "unsendable":
            return object()
        return [method, arg]

    transport = _Transport()
    connection, loop = _inline_connection(handler, transport)
    try:
        connection.data_received(_frame([1, "a", 1]) + _frame([2, "bad", None])
                                 + _frame([3, "unsendable", None]) + _frame([4, "b", [2]]))
        # NOTE: each call ran in the callback that read it: no task, no turn of the loop
        assert ran == ["a", "bad", "unsendable", "b"] and len(transport.written) == 1
        unpacker = msgpack.Unpacker()
        unpacker.feed(_strip_lengths(transport.written[0]))
        replies = list(unpacker)
        assert [r[:2] for r in replies] == [[1, 0], [2, 1], [3, 1], [4, 0]]
        assert replies[0][2] == ["a", 1] and replies[3][2] == ["b", [2]]
        assert replies[1][2]["type"] == "ValueError" and replies[2][2]["type"] == "TypeError"
        connection.data_received(_frame([5, "c", None])[:3])  # NOTE: half a frame: no reply
        assert len(transport.written) == 1
    finally:
        loop.close()


def _strip_lengths(data: bytes) -> bytes:
    out, at = b"", 0
    while at < len(data):
        (n,) = struct.unpack_from("!I", data, at)
        out += data[at + 4:at + 4 + n]
        at += 4 + n
    return out


def test_an_inline_server_reads_no_more_calls_until_its_replies_drain():
    transport = _Slow()
    connection, loop = _inline_connection(lambda method, arg: arg, transport)
    try:
        transport.written.clear()
        connection.data_received(_frame([1, "a", b"x" * 10]))
        assert len(transport.written) == 1 and not transport.reading
        connection.pause_writing()
        transport.buffered = 0
        connection.resume_writing()
        assert transport.reading and not connection.reading_paused
    finally:
        loop.close()
