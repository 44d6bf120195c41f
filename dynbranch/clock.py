"""The injected clock: the only place core code gets time from.

Two clocks share one interface. :class:`RealClock` runs an ordinary asyncio loop.
:class:`VirtualClock` runs a loop whose time jumps straight to the next timer whenever
every task is waiting, so a simulated ten-minute replay takes seconds and, because
nothing real happens in between, runs the same way every time with the same seed.

Tools that burn real CPU are measured with :meth:`Clock.stopwatch` and then charged with
:meth:`Clock.charge`: on the real clock the time has already passed (only a modelled
remainder is slept); on the virtual clock the charge advances virtual time.

Simulated hardware (the sim engine's step loop) waits on an :class:`Alarm` instead of a
sleep. On the virtual clock an alarm set for ``t`` fires at ``t`` *after every other event
of that instant* (alarms of one instant fire in the order their alarms were made), so what
an engine does at a step boundary never depends on how asyncio happens to order timers
that are due together, and :meth:`Alarm.due` tells an engine, at any moment, whether a
boundary at ``t`` has already been reached in that order. Virtual time jumps exactly to
the next timer's deadline (never to ``now + (deadline - now)``, which can round).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import selectors
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")

CLOCKS = ("real", "virtual")


class Stopwatch:
    """Measures the real time of a synchronous block (a tool call) with a monotonic counter."""

    def __init__(self) -> None:
        self.elapsed_s = 0.0
        self._t0 = 0.0

    def __enter__(self) -> Stopwatch:
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.elapsed_s = time.perf_counter() - self._t0


class Clock(ABC):
    """Time for everything above the engines. Only valid inside :meth:`run`."""

    kind: str

    def now(self) -> float:
        """Seconds on this clock (the running loop's time)."""
        return asyncio.get_running_loop().time()

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` on this clock."""
        await asyncio.sleep(max(0.0, seconds))

    async def sleep_until(self, t: float) -> None:
        """Wait until this clock reads ``t`` (returns at once if it already does)."""
        await self.sleep(t - self.now())

    def stopwatch(self) -> Stopwatch:
        """A stopwatch for real work done synchronously inside the loop."""
        return Stopwatch()

    def alarm(self, callback: Callable[[], None]) -> Alarm:
        """A new, unset alarm that calls ``callback`` when it fires (inside :meth:`run`)."""
        return _LoopAlarm(asyncio.get_running_loop(), callback)

    @abstractmethod
    async def charge(self, measured_s: float, charged_s: float) -> None:
        """Account a synchronous block that really took ``measured_s`` as ``charged_s``."""

    @abstractmethod
    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main`` to completion on a loop driven by this clock."""


class Alarm(ABC):
    """A re-settable wake-up on a clock: calls its callback once the clock reaches a time.

    Setting it again replaces the earlier time; it fires at most once per setting.
    """

    @abstractmethod
    def set(self, t: float) -> None:
        """Fire at clock time ``t`` (at once, in this instant, if ``t`` has passed)."""

    @abstractmethod
    def cancel(self) -> None:
        """Do not fire (until set again)."""

    @abstractmethod
    def due(self, t: float) -> bool:
        """Whether this alarm, set for ``t``, would have fired by now."""


class _LoopAlarm(Alarm):
    """An alarm on any asyncio loop: a ``call_at`` timer (real time has no exact ties)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop, self._callback = loop, callback
        self._handle: asyncio.TimerHandle | None = None

    def set(self, t: float) -> None:
        if self._handle is not None:
            if self._handle.when() == t:
                return
            self._handle.cancel()
        self._handle = self._loop.call_at(t, self._fire)

    def cancel(self) -> None:
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None

    def due(self, t: float) -> bool:
        return t <= self._loop.time()

    def _fire(self) -> None:
        self._handle = None
        self._callback()


class RealClock(Clock):
    """Wall time through asyncio's monotonic loop clock."""

    kind = "real"

    async def charge(self, measured_s: float, charged_s: float) -> None:
        # The measured part has already elapsed; only a modelled surplus is waited out.
        await self.sleep(charged_s - measured_s)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(main)


BUSY_POLL_TURNS = 64
"""Busy turns of a virtual-time loop between polls of its real descriptors."""


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that polls real file descriptors without blocking and, when nothing is
    ready, moves the owning loop's virtual time forward by the timeout it was asked to wait."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: _VirtualTimeLoop | None = None
        self._busy_turns = 0

    def select(self, timeout: float | None = None):  # type: ignore[override]
        if timeout == 0:
            # NOTE: callbacks are ready or a timer is due: this instant goes on, and real
            # descriptors (the loop's wake-up pipe: a signal, another thread's call) are
            # polled only every BUSY_POLL_TURNS such turns, and always before virtual time
            # moves (below). A poll per turn was a system call per callback batch, about
            # 3 % of a replay; what it finds waits at most those turns, never past the
            # instant, so the replay's order and results are the same.
            self._busy_turns += 1
            if self._busy_turns < BUSY_POLL_TURNS:
                return []
            self._busy_turns = 0
            return super().select(0)
        self._busy_turns = 0
        ready = super().select(0)
        if ready:
            return ready
        assert self.loop is not None
        # NOTE: asyncio asks to wait only when nothing is ready: the instant is quiet.
        if not self.loop.next_instant():
            # Nothing scheduled and nothing ready: only another thread could wake us.
            return super().select(None)
        return ready


class _OrderedTimer(asyncio.TimerHandle):
    """A timer that orders by (deadline, creation): timers due together run first-made
    first (SimPy's event order), whatever else the heap holds.

    NOTE: asyncio's own timers compare by deadline only, so heapq pops equal deadlines in
    an order that depends on the heap's other contents; a simulator that schedules fewer
    timers would then reorder everyone else's ties.
    """

    __slots__ = ("_order",)

    def __init__(
        self,
        when: float,
        callback: Callable[..., object],
        args: tuple[Any, ...],
        loop: asyncio.AbstractEventLoop,
        context: Any,
        order: int,
    ) -> None:
        super().__init__(when, callback, args, loop, context)
        self._order = order

    def __lt__(self, other: object) -> bool:
        if isinstance(other, _OrderedTimer):
            return (self._when, self._order) < (other._when, other._order)
        return super().__lt__(other)


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` is virtual and jumps to the next timer when idle.

    Besides asyncio's timers it keeps *late* alarms (:class:`_VirtualAlarm`): one set for
    ``t`` fires when the loop is quiet at ``t`` — every callback and every timer due at
    ``t`` has run — one alarm per quiet moment, alarms of one instant in rank order.
    """

    def __init__(self, start: float = 0.0) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = start
        self._late: list[tuple[float, int, int, _VirtualAlarm]] = []  # (t, rank, setting, alarm)
        self._ranks = itertools.count()
        self._settings = itertools.count()
        self._timers = itertools.count()
        self.fired: tuple[float, int] = (float("-inf"), -1)  # the last alarm fired: (t, rank)

    def time(self) -> float:
        return self._virtual_now

    def call_at(self, when, callback, *args, context=None):  # type: ignore[no-untyped-def]
        # asyncio's call_at with a timer that keeps ties in creation order (_OrderedTimer).
        if when is None:
            raise TypeError("when cannot be None")
        self._check_closed()
        timer = _OrderedTimer(when, callback, args, self, context, next(self._timers))
        if timer._source_traceback:
            del timer._source_traceback[-1]
        heapq.heappush(self._scheduled, timer)
        timer._scheduled = True
        return timer

    def new_rank(self) -> int:
        """The rank of a new alarm: alarms made earlier fire first within an instant."""
        return next(self._ranks)

    def push_alarm(self, alarm: _VirtualAlarm, t: float) -> int:
        """Schedule ``alarm`` at ``t``; returns the setting's id (older ones go stale)."""
        setting = next(self._settings)
        heapq.heappush(self._late, (t, alarm.rank, setting, alarm))
        return setting

    def next_instant(self) -> bool:
        """Called when the loop is quiet: fire a due alarm or jump to the next event.

        Returns False when nothing at all is scheduled.
        """
        late = self._late
        while late and late[0][3].setting != late[0][2]:
            heapq.heappop(late)  # a stale setting (re-set or cancelled since)
        timer = self._scheduled[0].when() if self._scheduled else None
        if not late:
            if timer is None:
                return False
            self._virtual_now = max(self._virtual_now, timer)
            return True
        t_alarm = max(self._virtual_now, late[0][0])
        # NOTE: a timer due within asyncio's clock resolution of the alarm belongs to the
        # same instant and runs first (asyncio pops it together with anything due then).
        if timer is not None and timer < t_alarm + self._clock_resolution:
            self._virtual_now = max(self._virtual_now, min(timer, t_alarm))
            return True
        _t, rank, _setting, alarm = heapq.heappop(late)
        self._virtual_now = t_alarm
        self.fired = (t_alarm, rank)
        alarm.setting = -1
        self.call_soon(alarm.callback)
        return True


class _VirtualAlarm(Alarm):
    """An alarm that fires after every other event of its instant (see the module doc)."""

    def __init__(self, loop: _VirtualTimeLoop, callback: Callable[[], None]) -> None:
        self.loop, self.callback = loop, callback
        self.rank = loop.new_rank()
        self.setting = -1  # the live setting's id; -1 when unset
        self._at: float | None = None

    def set(self, t: float) -> None:
        if self.setting >= 0 and self._at == t:
            return
        self._at = t
        self.setting = self.loop.push_alarm(self, t)

    def cancel(self) -> None:
        self.setting, self._at = -1, None

    def due(self, t: float) -> bool:
        now = self.loop.time()
        return t < now or (t == now and self.loop.fired >= (t, self.rank))


class VirtualClock(Clock):
    """Discrete-event time: deterministic and as fast as the CPU work in between allows.

    Only in-process components may run under it (no threads, no Ray): a thread finishing
    in real time while virtual time jumps would make runs irreproducible.
    """

    kind = "virtual"

    def __init__(self, start: float = 0.0) -> None:
        self._start = start
        self._loop: _VirtualTimeLoop | None = None  # while run() runs

    def now(self) -> float:
        # NOTE: read straight from this clock's loop (the hottest call in a replay); a
        # clock used on some other running loop falls back to that loop's time.
        loop = self._loop
        if loop is not None:
            return loop._virtual_now
        return super().now()

    async def charge(self, measured_s: float, charged_s: float) -> None:
        await self.sleep(charged_s)

    def alarm(self, callback: Callable[[], None]) -> Alarm:
        loop = asyncio.get_running_loop()
        if not isinstance(loop, _VirtualTimeLoop):
            raise RuntimeError("a virtual clock's alarm needs the loop of VirtualClock.run")
        return _VirtualAlarm(loop, callback)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        loop = _VirtualTimeLoop(self._start)
        self._loop = loop
        try:
            asyncio.set_event_loop(loop)
            return loop.run_until_complete(main)
        finally:
            try:
                _cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
                self._loop = None
                asyncio.set_event_loop(None)
                loop.close()


def _cancel_all(loop: asyncio.AbstractEventLoop) -> None:
    tasks = [t for t in asyncio.all_tasks(loop) if not t.done()]
    for t in tasks:
        t.cancel()
    if tasks:
        loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))


def make_clock(kind: str) -> Clock:
    """The clock named ``kind`` (``real`` or ``virtual``)."""
    if kind == "real":
        return RealClock()
    if kind == "virtual":
        return VirtualClock()
    from dynbranch.errors import UnknownNameError

    raise UnknownNameError("clock", kind, list(CLOCKS))
