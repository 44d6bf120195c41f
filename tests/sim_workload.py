"""Random workloads for the sim engine, and everything a caller can observe of one.

:func:`observe` runs a :class:`Workload` on fresh engines on the virtual clock and returns
an :class:`Observation`: every call's result (or error), every streamed chunk with the
clock time it arrived at, and load snapshots taken at planned times and in reaction to
chunks. Two engines built differently (skip-ahead on and off) must give equal
observations.

Besides timers at arbitrary times, a workload can act at *exact step boundaries*: a
stream's consumer reacts to its k-th chunk (snapshots every engine's load, starts another
call, aborts one), and :attr:`Workload.tie_at` places arrivals, aborts and snapshots on a
timer at a time that is a step boundary (the caller finds one by observing a first run).
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dynbranch.clock import VirtualClock
from dynbranch.engines.profile import Profile
from dynbranch.engines.protocol import GenerateRequest, GenerateResult, LoadSnapshot
from dynbranch.engines.tokenizer import count_tokens

PREFIXES = (0, 20, 40, 100)
"""Shared prompt prefixes a call may start with (tokens), so prefix caching has work."""


def words(n: int, seed: int | str) -> str:
    """A text of exactly ``n`` tokens under the stand-in tokenizer (one per word)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = "".join(" " + "".join(rng.choices(letters, k=rng.randint(1, 6))) for _ in range(n))
    assert count_tokens(text) == n
    return text


@dataclass(frozen=True)
class Call:
    """One generate call of a workload."""

    at: float  # arrival time (s); ignored for a call started by a reaction
    engine: int  # which engine serves it
    prefix: int  # index into PREFIXES
    prompt: int  # tokens after the prefix (>= 1)
    output: int  # pieces of replay text (EOS follows)
    max_tokens: int
    priority: int
    salt: str | None
    stream: bool
    abort_at: float | None = None  # a timer aborts it then
    react_at: int | None = None  # stream only: react to this chunk (0-based)
    spawn: int | None = None  # the reaction starts this call (index into Workload.spawned)
    kill: int | None = None  # the reaction aborts this call (index into Workload.calls)
    follows: int | None = None  # a next turn: its prompt continues that earlier call's
    # prompt and output (index into Workload.calls), so it can share blocks a decode fills
    twin: int | None = None  # same texts as that earlier call (a fill and its canonical)


@dataclass(frozen=True)
class Workload:
    """Calls, snapshot times and engine settings."""

    calls: tuple[Call, ...]
    spawned: tuple[Call, ...] = ()
    snapshots: tuple[float, ...] = ()
    engines: int = 1
    mirror: bool = False  # every call also goes to the other engine (exact ties across engines)
    tie_at: float | None = None  # at this time: tie_calls arrive, tie_kill aborts, loads taken
    tie_calls: tuple[Call, ...] = ()
    tie_kill: int | None = None

    def prompt(self, name: str, call: Call, index: int | None = None) -> str:
        """The prompt of ``call`` (named ``name``; ``index`` in :attr:`calls`, if there)."""
        if call.follows is not None and index is not None and call.follows < index:
            earlier = self.calls[call.follows]
            before = f"c{call.follows}"
            base = self.prompt(before, earlier, call.follows) + self.replay(before, earlier)
        else:
            base = words(PREFIXES[call.prefix], "prefix") if call.prefix else ""
        return base + words(call.prompt, f"p-{name}")

    def replay(self, name: str, call: Call) -> str:
        return words(call.output, f"o-{name}")

    def request(self, name: str, home: int, call: Call, index: int | None) -> GenerateRequest:
        """The request of ``call`` sent to engine ``home`` (same text on every engine)."""
        text_name, text_call, text_index = name, call, index
        if call.twin is not None and index is not None and call.twin < index:
            text_index = call.twin
            text_name, text_call = f"c{text_index}", self.calls[text_index]
        return GenerateRequest(
            f"{name}@{home}",
            self.prompt(text_name, text_call, text_index),
            call.max_tokens,
            replay_text=self.replay(text_name, text_call),
            priority=call.priority,
            cache_salt=call.salt,
        )


@dataclass
class Observation:
    """What callers saw: per call id its outcome and chunks, and the load snapshots."""

    outcomes: dict[str, GenerateResult | str] = field(default_factory=dict)
    chunks: dict[str, list[tuple[str, bool, float]]] = field(default_factory=dict)
    loads: list[tuple[str, float, LoadSnapshot]] = field(default_factory=list)
    pools: list[tuple[int, int]] = field(default_factory=list)


async def _at(t: float) -> None:
    """Sleep until exactly ``t`` (a timer at ``t`` itself, not ``now + (t - now)``)."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    loop.call_at(t, lambda: fut.done() or fut.set_result(None))
    await fut


def observe(
    workload: Workload, make_engine: Callable[[Any, str], Any], *, check_idle: bool = True
) -> Observation:
    """Run ``workload`` on engines ``make_engine(clock, engine_id)`` and record everything."""
    clock = VirtualClock()
    obs = Observation()

    async def main() -> None:
        engines = [make_engine(clock, f"e{i}") for i in range(workload.engines)]
        for engine in engines:
            await engine.start()
        tasks: list[asyncio.Task[None]] = []

        def snapshot(label: str) -> None:
            for engine in engines:
                obs.loads.append((label, clock.now(), engine.load()))

        async def run_call(req: GenerateRequest, call: Call, engine: Any) -> None:
            rid = req.request_id
            chunks = obs.chunks.setdefault(rid, [])
            try:
                if not call.stream:
                    obs.outcomes[rid] = await engine.generate(req)
                    chunks.append(("", True, clock.now()))  # when the caller got it
                    return
                async for chunk in engine.generate_stream(req):
                    chunks.append((chunk.text_delta, chunk.finished, clock.now()))
                    if call.react_at == len(chunks) - 1:
                        await react(rid, call)
                    if chunk.result is not None:
                        obs.outcomes[rid] = chunk.result
            except Exception as exc:  # a typed error is an outcome too
                obs.outcomes[rid] = type(exc).__name__

        async def react(rid: str, call: Call) -> None:
            snapshot(f"react-{rid}")
            spawned = "-s" in rid  # NOTE: one generation only, so every workload ends
            if call.spawn is not None and call.spawn < len(workload.spawned) and not spawned:
                child = workload.spawned[call.spawn]
                start(f"{rid.split('@')[0]}-s{call.spawn}", child, child.engine)
            if call.kill is not None and call.kill < len(workload.calls):
                for i, engine in enumerate(engines):
                    await engine.abort(f"c{call.kill}@{i}")
            snapshot(f"react-after-{rid}")

        def start(name: str, call: Call, engine_index: int, index: int | None = None) -> None:
            homes = [engine_index % len(engines)]
            if workload.mirror and len(engines) > 1:
                homes = list(range(len(engines)))
            for home in homes:
                req = workload.request(name, home, call, index)
                tasks.append(asyncio.ensure_future(run_call(req, call, engines[home])))

        async def arrive(i: int, call: Call) -> None:
            await _at(call.at)
            start(f"c{i}", call, call.engine, i)

        async def abort_later(rid: str, at: float) -> None:
            await _at(at)
            for i, engine in enumerate(engines):
                await engine.abort(f"{rid}@{i}")

        async def sample(t: float) -> None:
            await _at(t)
            snapshot(f"timer-{t!r}")

        async def tie(t: float) -> None:
            await _at(t)
            snapshot("tie")
            for j, call in enumerate(workload.tie_calls):
                start(f"t{j}", call, call.engine)
            if workload.tie_kill is not None and workload.tie_kill < len(workload.calls):
                for i, engine in enumerate(engines):
                    await engine.abort(f"c{workload.tie_kill}@{i}")
            snapshot("tie-after")

        planned = [arrive(i, c) for i, c in enumerate(workload.calls)]
        planned += [
            abort_later(f"c{i}", c.abort_at)
            for i, c in enumerate(workload.calls)
            if c.abort_at is not None
        ]
        planned += [sample(t) for t in workload.snapshots]
        if workload.tie_at is not None:
            planned.append(tie(workload.tie_at))
        await asyncio.gather(*planned)
        while tasks:  # calls started by reactions start further ones
            pending, tasks[:] = list(tasks), []
            await asyncio.gather(*pending)
        for engine in engines:
            snap = engine.load()
            obs.loads.append(("end", clock.now(), snap))
            if check_idle:
                assert (snap.running, snap.waiting, snap.kv_blocks_used) == (0, 0, 0)
                assert snap.spec_kv_blocks == 0
            pool = engine.block_pool
            obs.pools.append((pool.num_free, pool.num_cached))
            await engine.shutdown()

    clock.run(main())
    return obs


def chunk_times(obs: Observation) -> list[float]:
    """Every time a chunk arrived (each a step boundary or an abort)."""
    return sorted({t for chunks in obs.chunks.values() for _, _, t in chunks})


def with_limits(profile: Profile, **limits: int) -> Profile:
    """``profile`` with some scheduler limits replaced."""
    return dataclasses.replace(profile, scheduler=dataclasses.replace(profile.scheduler, **limits))


def differences(a: Observation, b: Observation) -> Sequence[str]:
    """Where two observations differ (empty when equal), for readable failures."""
    out = []
    for rid in sorted(set(a.outcomes) | set(b.outcomes)):
        if a.outcomes.get(rid) != b.outcomes.get(rid):
            out.append(f"outcome {rid}: {a.outcomes.get(rid)} != {b.outcomes.get(rid)}")
        if a.chunks.get(rid) != b.chunks.get(rid):
            out.append(f"chunks {rid} differ")
    if len(a.loads) != len(b.loads):
        out.append(f"{len(a.loads)} != {len(b.loads)} load snapshots")
    for x, y in zip(a.loads, b.loads, strict=False):
        if x != y:
            out.append(f"load {x} != {y}")
            break
    if a.pools != b.pools:
        out.append(f"pools {a.pools} != {b.pools}")
    return out
