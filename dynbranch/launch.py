"""Launching a replay's requests open loop, as a server admits them.

:class:`Launcher` starts each request at its scheduled arrival, under the run's
:class:`~dynbranch.runtime.run.AdmissionOptions`: a request arriving while ``max_inflight``
are in flight is rejected at once; an admitted one gets its tenant (by arrival order, set
here, never read from the request) and its deadline. Every request ends in exactly one
record: its own, a typed failure when something escaped it (no request's failure aborts the
run), ``rejected``, or ``interrupted`` when the run is interrupted (:class:`Interruption`:
SIGINT or SIGTERM cancel the launch, which cancels what is in flight and returns what it
has). Each record goes to the result stream the moment it exists.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

from dynbranch.clock import Clock
from dynbranch.errors import AdmissionRejected, RunInterrupted
from dynbranch.orchestrator import Orchestrator
from dynbranch.runtime.run import AdmissionOptions
from dynbranch.runtime.runlog import RequestRecord
from dynbranch.workload import LazyTrace, RequestInstance


class Interruption:
    """A signal that asks the run to stop: the first cancels ``target`` (while armed);
    after it the default handlers are back, so a second signal stops the process."""

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.target: asyncio.Task | None = None

    def __call__(self, signum: int) -> None:
        if self.signal_name is not None:
            return
        self.signal_name = signal.Signals(signum).name
        _restore_default_handlers()
        if self.target is not None and not self.target.done():
            self.target.cancel()

    @contextlib.contextmanager
    def installed(self, target: asyncio.Task) -> Iterator[Interruption]:
        """Catch SIGINT and SIGTERM on the running loop while the block runs (not on a
        loop outside the main thread, where signals cannot be caught)."""
        loop = asyncio.get_running_loop()
        self.target = target
        caught = []
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self, sig)
                caught.append(sig)
            except (NotImplementedError, RuntimeError, ValueError):
                pass
        try:
            yield self
        finally:
            self.target = None
            for sig in caught:
                loop.remove_signal_handler(sig)

    def disarm(self) -> None:
        """From now on a signal is noted, but cancels nothing (results are being written)."""
        self.target = None


def _restore_default_handlers() -> None:
    with contextlib.suppress(RuntimeError):
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(sig)


@dataclass
class LaunchOutcome:
    """What a launch produced: one record per arrived request, in arrival order."""

    records: list[RequestRecord]
    not_started: int = 0
    counts: dict[str, int] = field(default_factory=dict)


class Launcher:
    """Launches ``instances`` at ``arrivals`` (seconds from the origin) on ``orch``.

    ``finished`` hears of every record as soon as it exists (the result stream, the
    progress bar); ``default_tenant`` is the tenant when ``admission.tenants`` is 1.

    With ``release`` the launcher owns ``instances`` (a list or a
    :class:`~dynbranch.workload.LazyTrace` it may change): a request's
    instance is dropped from it once the request has ended, so what a finished request
    held (its conversation, its outcome) does not stay in memory for the rest of the run.
    """

    def __init__(
        self,
        orch: Orchestrator,
        clock: Clock,
        instances: Sequence[RequestInstance],
        arrivals: Sequence[float],
        admission: AdmissionOptions,
        *,
        default_tenant: str = "default",
        finished: Callable[[RequestRecord], None] = lambda _r: None,
        interruption: Interruption | None = None,
        release: bool = False,
    ) -> None:
        if len(instances) != len(arrivals):
            raise ValueError(f"{len(instances)} instances for {len(arrivals)} arrivals")
        if release and not isinstance(instances, list | LazyTrace):
            raise TypeError(f"release needs the instances as a list or a LazyTrace it owns, "
                            f"not a {type(instances).__name__}")
        self.release = release
        self.orch, self.clock, self.admission = orch, clock, admission
        self.instances, self.arrivals = instances, arrivals
        self.default_tenant, self._finished = default_tenant, finished
        self.interruption = interruption or Interruption()
        self._records: list[RequestRecord | None] = [None] * len(instances)
        self._running: dict[int, tuple[asyncio.Task, float]] = {}
        self._arrived = 0
        self.counts = {"escaped": 0, "peak_inflight": 0}

    async def run(self) -> LaunchOutcome:
        """Launch every request and wait for all; on an interruption, stop and return what
        has ended (the requests in flight as ``interrupted`` records)."""
        t0 = self.orch.start_run()
        try:
            for i, at in enumerate(self.arrivals):
                await self.clock.sleep_until(t0 + at)
                self._arrive(i, self.instances[i], at)
            while self._running:
                await asyncio.wait([task for task, _start in self._running.values()])
        except asyncio.CancelledError:
            if self.interruption.signal_name is None:
                raise
            # NOTE: the cancel was the interruption's; what follows (cleanup, results) must
            # not see it pending.
            task = asyncio.current_task()
            if task is not None:
                task.uncancel()
            await self._stop_all()
        records = [r for r in self._records if r is not None]
        return LaunchOutcome(records, len(self.instances) - self._arrived, dict(self.counts))

    def _arrive(self, i: int, instance: RequestInstance, at: float) -> None:
        self._arrived += 1
        limit, inflight = self.admission.max_inflight, len(self._running)
        if limit is not None and inflight >= limit:
            now = self.orch.rel()
            refusal = AdmissionRejected(instance.request_id, inflight, limit)
            self._end(
                i,
                RequestRecord(
                    instance.request_id,
                    at,
                    now,
                    now,
                    "rejected",
                    tenant=self._tenant(i),
                    error_type=type(refusal).__name__,
                    error=str(refusal),
                ),
            )
            return
        task = asyncio.create_task(self._one(i, instance, at), name=instance.request_id)
        self._running[i] = (task, self.orch.rel())
        self.counts["peak_inflight"] = max(self.counts["peak_inflight"], len(self._running))

    async def _one(self, i: int, instance: RequestInstance, at: float) -> None:
        deadline_s = self.admission.deadline_s
        start = self.orch.rel()
        try:
            record = await self.orch.run_request(
                instance,
                at,
                tenant=self._tenant(i),
                deadline=None if deadline_s is None else at + deadline_s,
            )
        except Exception as e:  # NOTE: no request's failure may abort the run
            self.counts["escaped"] += 1
            record = RequestRecord(
                instance.request_id,
                at,
                start,
                self.orch.rel(),
                "failed",
                tenant=self._tenant(i),
                error_type=type(e).__name__,
                error=f"escaped the request: {e!r}",
            )
        finally:
            self._running.pop(i, None)
        self._end(i, record)

    async def _stop_all(self) -> None:
        running = dict(self._running)
        for task, _start in running.values():
            task.cancel()
        await asyncio.gather(*(task for task, _s in running.values()), return_exceptions=True)
        assert self.interruption.signal_name is not None
        for i, (_task, start) in running.items():
            if self._records[i] is None:
                instance = self.instances[i]
                stop = RunInterrupted(instance.request_id, self.interruption.signal_name)
                self._end(
                    i,
                    RequestRecord(
                        instance.request_id,
                        self.arrivals[i],
                        start,
                        self.orch.rel(),
                        "interrupted",
                        tenant=self._tenant(i),
                        error_type=type(stop).__name__,
                        error=str(stop),
                    ),
                )
        self._running.clear()

    def _tenant(self, i: int) -> str:
        return self.admission.tenant(i, self.default_tenant)

    def _end(self, i: int, record: RequestRecord) -> None:
        self._records[i] = record
        if self.release:
            self.instances[i] = None  # type: ignore[index]
        self._finished(record)
