"""The injected clock: the only place core code gets time from.

Two clocks share one interface. :class:`RealClock` runs an ordinary asyncio loop.
:class:`VirtualClock` runs a loop whose time jumps straight to the next timer whenever
every task is waiting, so a simulated ten-minute replay takes seconds and, because
nothing real happens in between, runs the same way every time with the same seed.

Tools that burn real CPU are measured with :meth:`Clock.stopwatch` and then charged with
:meth:`Clock.charge`: on the real clock the time has already passed (only a modelled
remainder is slept); on the virtual clock the charge advances virtual time.
"""

from __future__ import annotations

import asyncio
import selectors
import time
from abc import ABC, abstractmethod
from collections.abc import Coroutine
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

    @abstractmethod
    async def charge(self, measured_s: float, charged_s: float) -> None:
        """Account a synchronous block that really took ``measured_s`` as ``charged_s``."""

    @abstractmethod
    def run(self, main: Coroutine[Any, Any, T]) -> T:
        """Run ``main`` to completion on a loop driven by this clock."""


class RealClock(Clock):
    """Wall time through asyncio's monotonic loop clock."""

    kind = "real"

    async def charge(self, measured_s: float, charged_s: float) -> None:
        # The measured part has already elapsed; only a modelled surplus is waited out.
        await self.sleep(charged_s - measured_s)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        return asyncio.run(main)


class _JumpingSelector(selectors.DefaultSelector):
    """A selector that polls real file descriptors without blocking and, when nothing is
    ready, moves the owning loop's virtual time forward by the timeout it was asked to wait."""

    def __init__(self) -> None:
        super().__init__()
        self.loop: _VirtualTimeLoop | None = None

    def select(self, timeout: float | None = None):  # type: ignore[override]
        ready = super().select(0)
        if ready or timeout is None or timeout <= 0:
            if not ready and timeout is None:
                # NOTE: nothing scheduled and nothing ready: only another thread could wake us.
                return super().select(None)
            return ready
        assert self.loop is not None
        self.loop.advance(timeout)
        return ready


class _VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An asyncio loop whose ``time()`` is virtual and jumps to the next timer when idle."""

    def __init__(self, start: float = 0.0) -> None:
        selector = _JumpingSelector()
        super().__init__(selector)
        selector.loop = self
        self._virtual_now = start

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        self._virtual_now += seconds


class VirtualClock(Clock):
    """Discrete-event time: deterministic and as fast as the CPU work in between allows.

    Only in-process components may run under it (no threads, no Ray): a thread finishing
    in real time while virtual time jumps would make runs irreproducible.
    """

    kind = "virtual"

    def __init__(self, start: float = 0.0) -> None:
        self._start = start

    async def charge(self, measured_s: float, charged_s: float) -> None:
        await self.sleep(charged_s)

    def run(self, main: Coroutine[Any, Any, T]) -> T:
        loop = _VirtualTimeLoop(self._start)
        try:
            asyncio.set_event_loop(loop)
            return loop.run_until_complete(main)
        finally:
            try:
                _cancel_all(loop)
                loop.run_until_complete(loop.shutdown_asyncgens())
            finally:
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
