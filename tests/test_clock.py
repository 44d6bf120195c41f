"""The injected clocks: virtual time jumps, real time passes, charges account tool work."""

import asyncio

import pytest

from dynbranch.clock import RealClock, VirtualClock, make_clock
from dynbranch.errors import UnknownNameError


def test_virtual_clock_jumps_to_next_timer_in_order():
    clock = VirtualClock()
    order = []

    async def sleeper(name, dt):
        await clock.sleep(dt)
        order.append((name, clock.now()))

    async def main():
        await asyncio.gather(sleeper("c", 300.0), sleeper("a", 100.0), sleeper("b", 200.0))

    clock.run(main())
    assert order == [("a", 100.0), ("b", 200.0), ("c", 300.0)]


def test_virtual_clock_charge_advances_by_charged_not_measured():
    clock = VirtualClock()

    async def main():
        t0 = clock.now()
        await clock.charge(measured_s=5.0, charged_s=0.25)
        return clock.now() - t0

    assert clock.run(main()) == pytest.approx(0.25)


def test_virtual_clock_sleep_until_past_returns_at_once():
    clock = VirtualClock()

    async def main():
        await clock.sleep(10)
        await clock.sleep_until(3)
        return clock.now()

    assert clock.run(main()) == 10


def test_real_clock_passes_real_time_and_charges_only_the_surplus():
    clock = RealClock()

    async def main():
        t0 = clock.now()
        await clock.sleep(0.02)
        t1 = clock.now()
        await clock.charge(measured_s=1.0, charged_s=0.5)  # already elapsed: no wait
        return t1 - t0, clock.now() - t1

    slept, charged = clock.run(main())
    assert slept >= 0.019
    assert charged < 0.01


def test_virtual_loop_cancels_leftover_tasks_on_exit():
    clock = VirtualClock()
    cancelled = []

    async def forever():
        try:
            await clock.sleep(1e9)
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    async def main():
        asyncio.get_running_loop().create_task(forever())
        await clock.sleep(1)

    clock.run(main())
    assert cancelled == [True]


def test_make_clock_names():
    assert make_clock("real").kind == "real"
    assert make_clock("virtual").kind == "virtual"
    with pytest.raises(UnknownNameError, match="known clocks: real, virtual"):
        make_clock("sundial")
