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

    async def slow(i: int) -> None:
        sent.append(time.perf_counter())
        await asyncio.sleep(0.05)

    async def main() -> tuple[list[float], list[float], list[float], float]:
        t0 = time.perf_counter()
        latencies, arrived, late = await bench.open_loop(slow, 40, 400.0, seed=3)
        return latencies, arrived, late, time.perf_counter() - t0

    latencies, arrived, late, wall = asyncio.run(main())
    assert len(latencies) == len(arrived) == len(late) == len(sent) == 40
    # NOTE: a closed loop would take 40 x 50 ms; 40 arrivals at 400/s take about 0.1 s
    assert wall < 0.6
    assert min(latencies) >= 50_000 * 0.95  # us: each timed from its own send
    assert all(us >= 0 for us in late)
    # NOTE: from arrival counts the wait to send, so it is never shorter than from the send
    # (both are recorded by the call's own task, so they pair up in order)
    assert all(a >= s for a, s in zip(arrived, latencies, strict=True))
    # NOTE: arrivals spread out (Poisson at 400/s): not all sent at once
    assert sent[-1] - sent[0] > 0.03


def test_rates_must_be_positive(monkeypatch, capsys) -> None:
    monkeypatch.setattr("sys.argv", ["bench_gate_ray.py", "--rates", "200", "0"])
    with pytest.raises(SystemExit):
        bench.main()
    assert "--rates must be > 0" in capsys.readouterr().err
