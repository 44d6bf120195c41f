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


def test_virtual_time_lands_exactly_on_each_deadline():
    # NOTE: 0.2 + (0.9 - 0.2) != 0.9 in floating point: a jump by the remaining time would
    # land one ulp off the deadline.
    clock = VirtualClock()
    seen = []

    async def at(t):
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        loop.call_at(t, fut.set_result, None)
        await fut
        seen.append(clock.now())

    async def main():
        await at(0.2)
        await at(0.9)
        await at(1e6 + 0.3)

    clock.run(main())
    assert 0.2 + (0.9 - 0.2) != 0.9
    assert seen == [0.2, 0.9, 1e6 + 0.3]


def test_virtual_clock_runs_simultaneous_timers_in_creation_order():
    clock = VirtualClock()
    order = []

    async def sleeper(name, dt):
        await clock.sleep(dt)
        order.append(name)

    async def main():
        # Many timers at other times reshape asyncio's heap; ties must not depend on it.
        names = [f"t{i}" for i in range(40)]
        noise = [clock.sleep(0.25 * k) for k in range(1, 30)]
        await asyncio.gather(*(sleeper(n, 1.0) for n in names), *noise)
        return names

    names = clock.run(main())
    assert order == names


def test_alarms_fire_after_every_other_event_of_their_instant_in_rank_order():
    clock = VirtualClock()
    log = []

    async def main():
        first = clock.alarm(lambda: log.append(("first", clock.now(), second.due(2.0))))
        second = clock.alarm(lambda: log.append(("second", clock.now(), first.due(2.0))))
        second.set(2.0)
        first.set(5.0)
        first.set(2.0)  # re-set: replaces 5.0

        async def chain():
            await clock.sleep(2.0)
            log.append(("sleeper", clock.now(), first.due(2.0)))
            await asyncio.sleep(0)  # a callback later in the same instant
            log.append(("sleeper again", clock.now(), first.due(2.0)))

        await asyncio.gather(chain(), clock.sleep(6.0))
        log.append(("end", clock.now(), first.due(2.0)))

    clock.run(main())
    assert log == [
        ("sleeper", 2.0, False),
        ("sleeper again", 2.0, False),
        ("first", 2.0, False),  # the second alarm (made later) has not fired yet
        ("second", 2.0, True),
        ("end", 6.0, True),
    ]


def test_cancelled_alarm_does_not_fire_and_past_alarm_fires_now():
    clock = VirtualClock()
    fired = []

    async def main():
        alarm = clock.alarm(lambda: fired.append(clock.now()))
        alarm.set(1.0)
        alarm.cancel()
        await clock.sleep(3.0)
        alarm.set(1.0)  # already passed: fires in this instant
        await clock.sleep(1.0)

    clock.run(main())
    assert fired == [3.0]


def test_real_clock_alarm_fires():
    clock = RealClock()

    async def main():
        done = asyncio.get_running_loop().create_future()
        alarm = clock.alarm(lambda: done.set_result(clock.now()))
        t = clock.now() + 0.01
        alarm.set(t)
        assert not alarm.due(t)
        assert await done >= t and alarm.due(t)

    clock.run(main())
