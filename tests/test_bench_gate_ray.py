"""scripts/bench_gate_ray.py's open loop: calls go out on their arrival times whether or not
earlier ones have been answered, and each is timed from when it went out."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests import scripts

bench = scripts.load("bench_gate_ray")


def test_the_open_loop_sends_without_waiting_for_answers() -> None:
    sent: list[float] = []
    calls = 40

    async def main() -> tuple[list[float], list[float], list[float]]:
        every_one_sent = asyncio.Event()

        async def slow(i: int) -> None:
            sent.append(time.perf_counter())
            if len(sent) == calls:
                every_one_sent.set()
            # NOTE: no call is answered before the last one is sent: a closed loop, which
            # waits for each answer before sending the next, would wait here for ever
            await asyncio.wait_for(every_one_sent.wait(), 10)
            await asyncio.sleep(0.02)

        return await bench.open_loop(slow, calls, 400.0, seed=3)

    latencies, arrived, late = asyncio.run(main())
    assert len(latencies) == len(arrived) == len(late) == len(sent) == calls
    assert min(latencies) >= 20_000  # us: each timed from its own send, past its answer
    assert all(us >= 0 for us in late)
    # NOTE: from arrival counts the wait to send, so it is never shorter than from the send
    # (both are recorded by the call's own task, so they pair up in order)
    assert all(a >= s for a, s in zip(arrived, latencies, strict=True))
    # NOTE: arrivals spread out (Poisson at 400/s, about 0.1 s for 40): not all sent at once
    assert sent[-1] - sent[0] > 0.03


def test_rates_must_be_positive(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.argv", ["bench_gate_ray.py", "--rates", "200", "0"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--rates must be > 0" in capsys.readouterr().err
