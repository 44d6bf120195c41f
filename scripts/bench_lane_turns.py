"""How many turns of the caller's event loop a lane call waits, measured with a busy loop.

A lane call's reply reaches its caller through the caller's event loop: the bytes arrive in
one turn, and whoever waits resumes in a later one. Each turn runs everything made ready
before it, so on a driver whose loop serves hundreds of requests a call costs its transport
plus, per turn it waits, the other requests' steps. This benchmark makes those steps
explicit: ``--others`` tasks on the caller's loop, each running ``--step-us`` of work and
then yielding, beside one caller sending lane calls (a ``--payload``-character argument,
echoed back) to a bare echo actor in another process, one at a time.

With the loop idle the round trip is the transport alone. With N others of S µs each, every
turn costs about N × S µs more, so ``(busy - idle) / (N × S)`` is the number of turns of
other work each call waited. It prints both round trips (p50 / p90 / p99) and that estimate.

The busy loop's calls are made three ways, as callers with a deadline make them: awaited
directly, under ``asyncio.timeout`` (a deadline on the caller's own task) and under
``asyncio.wait_for`` (which runs the call as a task of its own: it is sent a turn late, and
its answer reaches the caller two turns late).

    python scripts/bench_lane_turns.py [--calls 2000] [--others 4] [--step-us 100]
        [--stream PATH]

``--stream PATH`` measures another version of ``dynbranch/cluster/stream.py`` (say,
``git show REV:dynbranch/cluster/stream.py > /tmp/stream_rev.py``) instead of this tree's.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import multiprocessing as mp
import sys
import time
from pathlib import Path
from types import ModuleType

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
TOKEN = b"bench-lane-turns"


def _stream(path: str | None) -> ModuleType:
    if path is None:
        if str(ROOT) not in sys.path:  # NOTE: measure this tree's code, not an installed copy
            sys.path.insert(0, str(ROOT))
        from dynbranch.cluster import stream
        return stream
    spec = importlib.util.spec_from_file_location("stream_under_test", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _echo_server(path: str | None, address: mp.Queue) -> None:
    stream = _stream(path)

    async def echo(_method: str, arg: object) -> object:
        return arg

    async def main() -> None:
        server = stream.LaneServer(echo)
        address.put(await server.start("127.0.0.1"))
        server.allow(TOKEN)
        await asyncio.Event().wait()

    asyncio.run(main())


def _spin(us: float) -> None:
    end = time.perf_counter() + us * 1e-6
    while time.perf_counter() < end:
        pass


WAYS = ("directly", "under asyncio.timeout", "under asyncio.wait_for")


async def _calls(stream: ModuleType, address: tuple[str, int], calls: int, others: int,
                 step_us: float, payload: int, way: str = WAYS[0]) -> np.ndarray:
    lane = await stream.Lane.connect("echo", *address, TOKEN,
                                     lambda _rid, row: RuntimeError(row))
    running = True

    async def other() -> None:
        while running:
            _spin(step_us)
            await asyncio.sleep(0)

    busy = [asyncio.ensure_future(other()) for _ in range(others)]
    arg = {"prompt": "x" * payload}
    took = []
    try:
        for _ in range(calls):
            t = time.perf_counter()
            if way == WAYS[0]:
                await lane.call("echo", arg)
            elif way == WAYS[1]:
                async with asyncio.timeout(10.0):
                    await lane.call("echo", arg)
            else:
                await asyncio.wait_for(lane.call("echo", arg), 10.0)
            took.append(time.perf_counter() - t)
            await asyncio.sleep(0.0005)  # NOTE: one call at a time, as a stage's own
    finally:
        running = False
        await asyncio.gather(*busy)
        lane.close()
    return np.array(took) * 1e3


def _line(label: str, ms: np.ndarray) -> str:
    p50, p90, p99 = np.percentile(ms, [50, 90, 99])
    return f"{label}: p50 {p50:.3f} ms, p90 {p90:.3f} ms, p99 {p99:.3f} ms"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--others", type=int, default=4, help="busy tasks on the caller's loop")
    ap.add_argument("--step-us", type=float, default=100.0, help="each busy task's step")
    ap.add_argument("--payload", type=int, default=20_000, help="characters per call")
    ap.add_argument("--stream", default=None, help="another version of stream.py to measure")
    args = ap.parse_args()
    if args.calls < 10 or args.others < 1 or not args.step_us > 0 or args.payload < 0:
        ap.error("--calls >= 10, --others >= 1, --step-us > 0 and --payload >= 0")
    stream = _stream(args.stream)
    address: mp.Queue = mp.Queue()
    server = mp.Process(target=_echo_server, args=(args.stream, address), daemon=True)
    server.start()
    try:
        host, port = address.get(timeout=30)
        idle = asyncio.run(_calls(stream, (host, port), args.calls, 0, 0.0, args.payload))
        busy = {way: asyncio.run(_calls(stream, (host, port), args.calls, args.others,
                                        args.step_us, args.payload, way)) for way in WAYS}
    finally:
        server.terminate()
    turn_ms = args.others * args.step_us / 1e3
    print(f"lane round trips of {args.calls} calls, {args.payload}-character argument, "
          f"{args.stream or 'this tree'}; with {args.others} other tasks of "
          f"{args.step_us:g} us per turn on the caller's loop, a turn costs about "
          f"{turn_ms:.3f} ms more:")
    print("  " + _line("caller's loop idle, called directly", idle))
    for way, ms in busy.items():
        waited = [(np.percentile(ms, q) - np.percentile(idle, q)) / turn_ms for q in (50, 90)]
        print("  " + _line(f"caller's loop busy, called {way}", ms)
              + f"; turns of other work waited per call {waited[0]:.2f} at p50, "
              f"{waited[1]:.2f} at p90")


if __name__ == "__main__":
    main()
