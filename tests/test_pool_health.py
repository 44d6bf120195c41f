"""The engine pool when engines die or hang: typed failures, one retry on another engine,
placement and the load view skip engines that are down, probes take them back up."""

import asyncio

import pytest

from dynbranch.clock import VirtualClock
from dynbranch.engines.client import DownSnapshot, EngineClient
from dynbranch.engines.protocol import (
    SPECULATIVE,
    GenerateRequest,
    GenerateResult,
    LoadSnapshot,
)
from dynbranch.errors import EngineDied, NoEngineError
from dynbranch.gate.load import LoadBudget, LoadView
from dynbranch.runtime.placement import LeastOutstanding
from dynbranch.runtime.pool import FILL_LOAD, EnginePool, HealthPolicy, idempotent


class FakeEngine(EngineClient):
    """A remote-looking engine a test can kill, hang or bring back."""

    remote = True

    def __init__(self, engine_id: str, clock: VirtualClock, step_s: float = 1.0) -> None:
        self.engine_id, self.clock, self.step_s = engine_id, clock, step_s
        self.dead = self.hung = False
        self.calls: list[str] = []
        self.aborted: list[str] = []
        self.promoted: list[str] = []

    async def generate(self, request: GenerateRequest) -> GenerateResult:
        self.calls.append(request.request_id)
        if self.dead:
            raise EngineDied(self.engine_id, request.request_id, "actor died")
        start = self.clock.now()
        await self.clock.sleep(self.step_s)
        while self.hung:
            await self.clock.sleep(1.0)
        if self.dead:
            raise EngineDied(self.engine_id, request.request_id, "actor died mid-call")
        now = self.clock.now()
        return GenerateResult(
            request.request_id,
            f"out:{self.engine_id}",
            3,
            2,
            0,
            "stop",
            start,
            start,
            now,
            now,
            engine_id=self.engine_id,
        )

    async def abort(self, request_id: str) -> bool:
        self.aborted.append(request_id)
        return True

    async def promote(self, request_id: str) -> bool:
        if self.dead:
            raise EngineDied(self.engine_id, request_id, "actor died")
        self.promoted.append(request_id)
        return True

    async def load(self) -> LoadSnapshot:
        if self.dead:
            raise EngineDied(self.engine_id, "load", "actor died")
        return LoadSnapshot(
            self.engine_id,
            self.clock.now(),
            running=2,
            waiting=0,
            kv_blocks_used=1,
            kv_blocks_total=10,
            spec_running=1,
        )

    async def health(self) -> bool:
        return not (self.dead or self.hung)


def req(i: int, *, greedy: bool = True, replay: str | None = None,
        fill: bool = False) -> GenerateRequest:
    return GenerateRequest(
        f"r{i}", "hello", 8, replay_text=replay, temperature=0.0 if greedy else 0.7,
        priority=SPECULATIVE if fill else 0,
    )


def pool_of(n: int, clock, **health) -> tuple[EnginePool, list[FakeEngine]]:
    engines = [FakeEngine(f"e{i}", clock) for i in range(n)]
    pool = EnginePool(
        {"target": engines}, LeastOutstanding, clock=clock, health=HealthPolicy(**health)
    )
    return pool, engines


def test_idempotent_means_replayed_or_greedy():
    assert idempotent(req(0)) and idempotent(req(0, greedy=False, replay="x"))
    assert not idempotent(req(0, greedy=False))


def test_a_dead_engine_gets_no_calls_and_its_call_is_retried_once_elsewhere():
    clock = VirtualClock()

    async def main():
        pool, (e0, e1, e2) = pool_of(3, clock, probe_s=0.5)
        e0.dead = True
        client, result = await pool.generate("target", req(1))
        later = [await pool.generate("target", req(i)) for i in range(2, 6)]
        return pool, e0, client, result, later

    pool, e0, client, result, later = clock.run(main())
    assert client.engine_id == "e1" and result.text == "out:e1"
    assert e0.calls == ["r1"]  # tried once, then never placed on again
    assert {c.engine_id for c, _ in later} <= {"e1", "e2"}
    assert pool.counts["went_down"] == 1 and pool.counts["retried"] == 1
    assert pool.down() == {"e0": "actor died"}


def test_a_sampled_call_on_a_dead_engine_fails_typed_without_a_retry():
    clock = VirtualClock()

    async def main():
        pool, (e0, e1) = pool_of(2, clock)
        e0.dead = True
        with pytest.raises(EngineDied, match="engine e0 died under call r1") as err:
            await pool.generate("target", req(1, greedy=False))
        return err.value, e1

    error, e1 = clock.run(main())
    assert error.retried is False and e1.calls == []


def test_a_retry_that_dies_too_fails_typed_and_no_engine_left_is_named():
    clock = VirtualClock()

    async def main():
        pool, engines = pool_of(2, clock)
        for e in engines:
            e.dead = True
        with pytest.raises(EngineDied, match="after a retry on another engine"):
            await pool.generate("target", req(1))
        with pytest.raises(NoEngineError, match="every engine of role 'target' is down"):
            await pool.generate("target", req(2))

    clock.run(main())


def test_a_hung_engine_is_found_by_the_sweep_and_its_call_abandoned_and_retried():
    clock = VirtualClock()

    async def main():
        pool, (e0, e1) = pool_of(2, clock, sweep_s=2.0, probe_s=0.5)
        e0.hung = True
        t0 = clock.now()
        client, _result = await pool.generate("target", req(1))
        took = clock.now() - t0
        e0.hung = False  # it answers again: the probe takes it back up
        await clock.sleep(1.0)
        down_after = pool.down()
        await pool.close()
        return pool, e0, client, took, down_after

    pool, e0, client, took, down_after = clock.run(main())
    assert client.engine_id == "e1" and e0.aborted == ["r1"]
    assert took == pytest.approx(3.0)  # found at the 2 s sweep, then 1 s on e1
    assert pool.counts["abandoned"] == 1 and pool.counts["recovered"] == 1
    assert down_after == {}


def test_the_load_view_leaves_a_down_engine_out_explicitly():
    clock = VirtualClock()

    async def main():
        pool, (e0, e1) = pool_of(2, clock)
        both = await pool.serving_loads()
        e0.dead = True
        loads = await pool.serving_loads()
        e1.dead = True
        pool._engines["target"][1].down_reason = None  # e1 dies now: load() raises
        none = await pool.serving_loads()
        return both, loads, none, pool

    both, loads, none, pool = clock.run(main())
    budget = LoadBudget(fill_slots=4, spec_kv_blocks=8, max_num_seqs=4, engines=2)
    assert isinstance(loads[0], DownSnapshot) and not isinstance(loads[1], DownSnapshot)
    full, half = LoadView.from_snapshots(both, budget), LoadView.from_snapshots(loads, budget)
    # one canonical sequence per engine over 4 slots each; with one engine left, 1 of 4
    assert full.rho == pytest.approx(2 / 8) and half.rho == pytest.approx(1 / 4)
    assert half.o_fill == pytest.approx(1 / 4) and full.o_fill == pytest.approx(2 / 8)
    assert LoadView.from_snapshots(none, budget).as_tuple() == (1.0, 1.0, 1.0, 1.0, 1.0)
    assert set(pool.down()) == {"e0", "e1"}


class _SlowLoad(FakeEngine):
    """An engine in this process whose load read takes a network round trip."""

    remote = False

    async def load(self) -> LoadSnapshot:
        await self.clock.sleep(0.25)
        return await super().load()


class _AtOnce(FakeEngine):
    """An engine in this process whose load is answered without suspending."""

    remote = False
    load_at_once = True


def test_loads_are_read_side_by_side_unless_each_answers_at_once():
    """A load that suspends (a modelled network between pool and engine) is read for every
    engine concurrently: one round trip for all, not one each. Loads that answer at once
    are read without a task each, and come back the same, in the engines' order."""
    clock = VirtualClock()

    async def main(kind):
        engines = [kind(f"e{i}", clock) for i in range(4)]
        pool = EnginePool({"target": engines}, LeastOutstanding, clock=clock)
        start = clock.now()
        loads = await pool.serving_loads()
        return clock.now() - start, [(s.engine_id, s.running) for s in loads]

    took, slow = clock.run(main(_SlowLoad))
    assert took == pytest.approx(0.25)
    took, at_once = clock.run(main(_AtOnce))
    assert took == 0.0 and at_once == slow == [(f"e{i}", 2) for i in range(4)]


class _Immediate(FakeEngine):
    """Answers its load without suspending but does not say so: read through gather."""

    remote = False


def test_reading_loads_at_once_turns_the_event_loop_as_often_as_gather():
    """The fast path must leave every other task's interleaving as it was: the reader
    resumes after as many turns of the loop as through asyncio.gather."""
    clock = VirtualClock()

    async def trace(kind):
        pool = EnginePool({"target": [kind(f"e{i}", clock) for i in range(3)]},
                          LeastOutstanding, clock=clock)
        marks: list = []

        async def ticker():
            for i in range(8):
                marks.append(i)
                await asyncio.sleep(0)

        async def reader():
            await pool.serving_loads()
            marks.append("loads")

        await asyncio.gather(ticker(), reader())
        return marks

    through_gather = clock.run(trace(_Immediate))
    assert "loads" in through_gather[1:-1]
    assert clock.run(trace(_AtOnce)) == through_gather


class _Sending(FakeEngine):
    """A remote engine whose calls are sent at once, as over a lane: :meth:`start` returns the
    future of the answer, which comes ``step_s`` later (never while the engine hangs)."""

    def __init__(self, engine_id: str, clock: VirtualClock, events: list[str]) -> None:
        super().__init__(engine_id, clock)
        self.events = events
        self.pending: list[asyncio.Future] = []
        self._answering: set[asyncio.Task] = set()

    def start(self, request: GenerateRequest) -> asyncio.Future:
        self.calls.append(request.request_id)
        self.events.append(f"sent {request.request_id} to {self.engine_id}")
        future = asyncio.get_running_loop().create_future()
        self.pending.append(future)

        async def answer() -> None:
            result = await self.generate(request)
            if not future.done():
                future.set_result(result)

        task = asyncio.ensure_future(answer())
        self._answering.add(task)
        task.add_done_callback(self._answering.discard)
        return future

    def finish(self, started: asyncio.Future, request: GenerateRequest) -> GenerateResult:
        return started.result()


def test_a_call_the_client_can_send_at_once_goes_before_anything_else_ready():
    clock = VirtualClock()

    async def main():
        events: list[str] = []
        sending = _Sending("e0", clock, events)
        pool = EnginePool({"target": [sending]}, LeastOutstanding, clock=clock)
        asyncio.get_running_loop().call_soon(events.append, "another step")
        _client, result = await pool.generate("target", req(1))
        plain_pool, (plain,) = pool_of(1, clock)
        asyncio.get_running_loop().call_soon(events.append, "another step")
        await plain_pool.generate("target", req(2))
        return events, result, plain

    events, result, plain = clock.run(main())
    # NOTE: a client that cannot send at once is run as a task, which waits its turn
    assert events == ["sent r1 to e0", "another step", "another step"]
    assert result.text == "out:e0" and plain.calls == ["r2"]


def test_a_call_sent_at_once_is_abandoned_and_retried_when_its_engine_hangs():
    clock = VirtualClock()

    async def main():
        events: list[str] = []
        e0, e1 = _Sending("e0", clock, events), _Sending("e1", clock, events)
        pool = EnginePool({"target": [e0, e1]}, LeastOutstanding, clock=clock,
                          health=HealthPolicy(sweep_s=2.0, probe_s=0.5))
        e0.hung = True
        client, result = await pool.generate("target", req(1))
        await pool.close()
        return pool, e0, client, events

    pool, e0, client, events = clock.run(main())
    assert events == ["sent r1 to e0", "sent r1 to e1"] and client.engine_id == "e1"
    assert e0.aborted == ["r1"] and e0.pending[0].cancelled()
    assert pool.counts["abandoned"] == 1 and pool.counts["retried"] == 1


class _Noting(LeastOutstanding):
    """Least outstanding, noting each call it placed (as prefix affinity notes its blocks)."""

    def __init__(self, events: list[str]) -> None:
        self.events = events

    def place(self, outstanding, request):
        def note(engine: int) -> None:
            self.events.append(f"noted {request.request_id} on {engine}")

        return self.choose(outstanding, request), note


def test_a_placement_notes_a_call_after_sending_it_and_before_anything_else_runs():
    clock = VirtualClock()

    async def main():
        events: list[str] = []
        pool = EnginePool({"target": [_Sending(f"e{i}", clock, events) for i in range(2)]},
                          lambda: _Noting(events), clock=clock)
        asyncio.get_running_loop().call_soon(events.append, "another step")
        first = asyncio.ensure_future(pool.generate("target", req(1)))
        await asyncio.sleep(0)  # NOTE: the first call's task runs up to its answer
        asyncio.get_running_loop().call_soon(events.append, "another step")
        await pool.generate("target", req(2))
        await first
        return events

    assert clock.run(main()) == ["another step", "sent r1 to e0", "noted r1 on 0",
                                 "sent r2 to e1", "noted r2 on 1", "another step"]


def test_a_placement_notes_each_engine_a_call_was_sent_to_once():
    clock = VirtualClock()

    async def main():
        events: list[str] = []
        e0, e1 = _Sending("e0", clock, events), _Sending("e1", clock, events)
        pool = EnginePool({"target": [e0, e1]}, lambda: _Noting(events), clock=clock,
                          health=HealthPolicy(sweep_s=2.0, probe_s=0.5))
        e0.hung = True
        await pool.generate("target", req(1))
        await pool.close()
        plain_events: list[str] = []
        plain_pool = EnginePool({"target": [FakeEngine("p0", clock)]},
                                lambda: _Noting(plain_events), clock=clock)
        await plain_pool.generate("target", req(2))
        return events, plain_events

    events, plain_events = clock.run(main())
    # NOTE: the hung engine was sent the call first, so it holds the prompt as much as the
    # engine that answered; a call that is not sent at once (a task) is noted as it starts
    assert events == ["sent r1 to e0", "noted r1 on 0", "sent r1 to e1", "noted r1 on 1"]
    assert plain_events == ["noted r2 on 0"]


def test_a_policy_remembers_the_engine_the_pool_sent_a_call_to_not_the_one_it_picked():
    from dynbranch.baselines.parrot import ParrotConfig, ParrotPlacement

    clock = VirtualClock()
    parrot = ParrotPlacement(ParrotConfig(latency_task_cap=1))

    def call(rid: str, session: str) -> GenerateRequest:
        return GenerateRequest(rid, f"prompt of {session}", 8, temperature=0.0, session=session)

    async def main():
        e0, e1 = FakeEngine("e0", clock), FakeEngine("e1", clock, step_s=10.0)
        pool = EnginePool({"target": [e0, e1]}, lambda: parrot, clock=clock,
                          health=HealthPolicy(probe_s=0.5))
        first = asyncio.ensure_future(pool.generate("target", call("a1", "a")))
        await asyncio.sleep(0)
        busy = asyncio.ensure_future(pool.generate("target", call("b1", "b")))  # e1, 10 s
        await first
        e0.dead = True
        # NOTE: a2 goes home to e0, which dies; the retry finds e1 at Parrot's cap, so Parrot
        # picks its context, the down e0, and the pool sends the call to e1 instead
        client, _ = await pool.generate("target", call("a2", "a"))
        busy.cancel()
        return client.engine_id, e0.calls, e1.calls

    sent_to, e0_calls, e1_calls = clock.run(main())
    assert (sent_to, e0_calls, e1_calls) == ("e1", ["a1", "a2"], ["b1", "a2"])
    assert parrot.stats()["over_cap"] == 1
    assert parrot._home["a"] == 1  # before: e0, the engine Parrot had picked


@pytest.mark.parametrize("sent_at_once", [False, True])
def test_a_cancelled_caller_aborts_its_remote_call(sent_at_once: bool):
    clock = VirtualClock()

    async def main():
        e0 = _Sending("e0", clock, []) if sent_at_once else FakeEngine("e0", clock)
        pool = EnginePool({"target": [e0]}, LeastOutstanding, clock=clock)
        task = asyncio.ensure_future(pool.generate("target", req(7)))
        await clock.sleep(0.5)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return e0, pool

    e0, pool = clock.run(main())
    assert e0.aborted == ["r7"] and pool._engines["target"][0].open == 0
    assert pool.counts["abandoned"] == 0
    if sent_at_once:
        assert e0.pending[0].cancelled()


def test_promote_reaches_the_engine_running_the_call_and_nothing_else():
    clock = VirtualClock()

    async def main():
        pool, engines = pool_of(3, clock)
        calls = [asyncio.ensure_future(pool.generate("target", req(i))) for i in range(3)]
        await clock.sleep(0.1)
        moved = [await pool.promote("r1"), await pool.promote("nobody")]
        held = next(e for e in engines if "r1" in e.calls)
        held.dead = True  # NOTE: a failing engine leaves the call as it was; never raises
        moved.append(await pool.promote("r1"))
        held.dead = False
        await asyncio.gather(*calls)
        moved.append(await pool.promote("r1"))  # finished: nobody holds it
        return moved, [e.promoted for e in engines], held, pool.counts["promoted"]

    moved, promoted, held, count = clock.run(main())
    assert moved == [True, False, False, False] and count == 1
    assert held.promoted == ["r1"] and sum(map(len, promoted)) == 1


def test_canonical_calls_weigh_open_fills_at_fill_load_and_fills_weigh_all():
    """With a lighter weight, fills do not push canonical calls off an engine as a canonical
    call would; a fill is placed against everything open; a promoted fill counts as
    canonical; every count is back to zero once the calls end."""
    clock = VirtualClock()

    async def main():
        engines = [FakeEngine(f"e{i}", clock, step_s=10.0) for i in range(2)]
        pool = EnginePool({"target": engines}, LeastOutstanding, clock=clock, fill_load=0.5)
        e0, e1 = engines
        calls = [asyncio.ensure_future(pool.generate("target", req(0)))]  # e0: canonical
        await clock.sleep(0.1)
        calls += [asyncio.ensure_future(pool.generate("target", req(i, fill=True)))
                  for i in (1, 2, 3)]  # e1; then e0 (a tie: the lower); then e1
        await clock.sleep(0.1)
        placed = {r: e.engine_id for e in engines for r in e.calls}
        counts = [(e.open, e.canonical) for e in pool._engines["target"]]
        # NOTE: e1 holds two fills (1.0) and e0 a canonical call and a fill (1.5): a canonical
        # call goes to e1, though it has as many calls open
        calls.append(asyncio.ensure_future(pool.generate("target", req(4))))
        await clock.sleep(0.1)
        placed4 = next(e.engine_id for e in engines if "r4" in e.calls)
        assert await pool.promote("r1")
        after_promote = [e.canonical for e in pool._engines["target"]]
        calls.append(asyncio.ensure_future(pool.generate("target", req(5))))  # 1.5 against 2.5
        await asyncio.gather(*calls)
        placed5 = next(e.engine_id for e in engines if "r5" in e.calls)
        end = [(e.open, e.canonical) for e in pool._engines["target"]]
        return placed, counts, placed4, after_promote, placed5, end, pool._canonical

    placed, counts, placed4, after_promote, placed5, end, left = clock.run(main())
    assert placed == {"r0": "e0", "r1": "e1", "r2": "e0", "r3": "e1"}
    assert counts == [(2, 1), (2, 0)]
    assert placed4 == "e1"
    assert after_promote == [1, 2]  # r1 runs on e1 as canonical work now
    assert placed5 == "e0"
    assert end == [(0, 0), (0, 0)] and left == {}


@pytest.mark.parametrize("fill_load", [None, 0.0, 1.0])
def test_fill_load_weighs_fills_against_canonical_calls(fill_load):
    clock = VirtualClock()
    engines = [FakeEngine(f"e{i}", clock) for i in range(2)]
    pool = EnginePool({"target": engines}, LeastOutstanding, clock=clock, fill_load=fill_load)
    e0, e1 = pool._engines["target"]
    weight = FILL_LOAD if fill_load is None else fill_load
    assert FILL_LOAD == 0.5 and pool.fill_load == weight

    def place(fill: bool) -> int:
        return pool._place("target", req(9, fill=fill), [])[0]

    # e0: three fills; e1: one canonical call. A fill sees 3 against 1; a canonical call
    # 3 * weight against 1
    e0.open, e0.canonical, e1.open, e1.canonical = 3, 0, 1, 1
    assert place(fill=True) == 1
    assert place(fill=False) == (0 if 3 * weight < 1 else 1)
    # e0: two fills; e1: a canonical call and a fill. A fill sees a tie (the lower index); a
    # canonical call 2 * weight against 1 + weight, below it under any lighter weight
    e0.open, e1.open = 2, 2
    assert place(fill=True) == 0 and place(fill=False) == 0
    # e0: four fills; e1 as before: a canonical call sees 4 * weight against 1 + weight
    e0.open = 4
    assert place(fill=False) == (0 if 4 * weight < 1 + weight else 1)


@pytest.mark.parametrize("bad", [-0.5, float("nan"), float("inf")])
def test_fill_load_must_be_a_finite_weight(bad):
    with pytest.raises(ValueError, match="fill_load"):
        EnginePool({"target": []}, LeastOutstanding, fill_load=bad)
