"""Gate decisions in process against the central gate actor on Ray, through the async clients.

Drives a :class:`~dynbranch.gate.client.LocalGateClient` and a
:class:`~dynbranch.cluster.RayGateClient` (a :class:`~dynbranch.cluster.GateActor` on a local
Ray instance, journaling every call to its checkpoint) with the same warmed-up gate, and
times ``generation`` and ``admit`` (4 candidates, the greedy priced gate with audits) one
awaited call at a time, then with ``--callers`` concurrent callers; the actor's no-op
``ping`` gives Ray's own round trip on this machine for scale. A branch entry is timed both
ways: ``generation`` then ``admit`` (two calls) and ``decide`` (Actions 0 and 1 in one call,
what the priced policy asks the Ray gate); a last table sets each op beside the in-process
figure of the same run, with the ratio. Then the same ops through a client that sends them
over a stream lane (``dynbranch/cluster/stream.py``: one TCP connection to the actor, the Ray
backend's default), and through one that sends them over the gate's compiled-graph lane (``dynbranch/cluster/gate/lane.py``; the
actor keeps a core busy while it is open), with its own ratio table. Prints p50/p99 latency in
microseconds and decisions per second (sequential: one over the mean latency; concurrent:
calls over the phase's wall time, which includes one batched ``release`` per 32 admits).
Then the actor's checkpoint: one snapshot's size and time, and how long a killed actor
takes to answer again. Numbers go into notes, not assertions.

    python scripts/bench_gate_ray.py [--calls 2000] [--callers 16]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dynbranch.engines.profile import load_profile  # noqa: E402
from dynbranch.gate import (  # noqa: E402
    BranchReturn,
    Candidate,
    ContentionModel,
    FillShape,
    Gate,
    GateConfig,
    LoadBudget,
    LoadView,
    Observation,
    Settlement,
)
from dynbranch.gate.client import GateClient, LocalGateClient  # noqa: E402

PROFILE = "qwen3-32b@h200"
RELEASE_EVERY = 32
VIEWS = [LoadView(0.01 * (i % 40), 0.01 * (i % 30), 0.005 * (i % 60)) for i in range(97)]


def gate_spec() -> tuple[ContentionModel, GateConfig]:
    profile = load_profile(PROFILE)
    model = ContentionModel.from_profile(profile, LoadBudget.from_profile(profile, engines=2))
    return model, GateConfig(fanout=3, audit_rate=0.02)


def candidates() -> list[Candidate]:
    shape = FillShape(prompt_tokens=512, output_tokens=64, context_tokens=1024)
    blocks = shape.kv_blocks(16)
    return [Candidate(f"h{r}", r, f"stage{r}", 1500.0 - 300 * r, shape, blocks) for r in range(4)]


async def warm(client: GateClient) -> None:
    """Posteriors and returns as a running system would have them (2,000 branch entries)."""
    for batch in range(20):
        obs, settled = [], []
        for i in range(100 * batch, 100 * (batch + 1)):
            obs += [Observation(f"stage{r}", r, r == i % 3 == 0, True) for r in range(4)]
            settled.append(Settlement(f"coord{i % 16}", BranchReturn(saved_ms=400.0,
                                                                     setup_ms=30.0)))
        await client.learn(obs, settled)


async def timed(call: Callable[[int], Awaitable[object]], calls: range) -> list[float]:
    """Latencies (us) of ``await call(i)`` for each i, one at a time."""
    out = []
    for i in calls:
        t0 = time.perf_counter()
        await call(i)
        out.append((time.perf_counter() - t0) * 1e6)
    return out


class AdmitLoad:
    """Admit calls that hand their receipts back in one ``release`` per
    :data:`RELEASE_EVERY` admits (as requests do when they end), and at :meth:`drain`.

    ``mode``: ``admit`` (Action 1 alone), ``branch`` (a branch entry as two calls,
    ``generation`` then ``admit``, as the priced policy asks an in-process gate) or
    ``decide`` (a branch entry as one call, as it asks the Ray gate)."""

    def __init__(self, client: GateClient, cands: list[Candidate], mode: str = "admit") -> None:
        self.client, self.cands, self.held, self.mode = client, cands, [], mode

    async def __call__(self, i: int) -> None:
        coord, view, now = f"coord{i % 16}", VIEWS[i % len(VIEWS)], float(i)
        if self.mode == "decide":
            out = (await self.client.decide(coord, self.cands, view, now)).admissions
        elif self.mode == "branch" and not (await self.client.generation(coord, now)).open:
            out = []
        else:
            out = await self.client.admit(coord, self.cands, view, now)
        self.held += [a.reservation for a in out if a.admitted]
        if i % RELEASE_EVERY == RELEASE_EVERY - 1:
            await self.drain()

    async def drain(self) -> None:
        receipts, self.held = self.held, []
        await self.client.release(receipts)


async def phase(call: Callable[[int], Awaitable], calls: int, callers: int
                ) -> tuple[list[float], float]:
    """All latencies and the wall time of ``calls`` calls split over ``callers`` callers."""
    per = calls // callers
    t0 = time.perf_counter()
    parts = await asyncio.gather(*(timed(call, range(c * per, (c + 1) * per))
                                   for c in range(callers)))
    return [us for part in parts for us in part], time.perf_counter() - t0


async def open_loop(call: Callable[[int], Awaitable], calls: int, rate: float, seed: int = 0
                    ) -> tuple[list[float], list[float], list[float]]:
    """``calls`` calls sent as a Poisson process at ``rate`` per second: each one's latency
    (us) from when it was sent, from when it arrived (its time in the process), and how late
    it was sent.

    NOTE: the event loop's timers wake in whole milliseconds, so a call goes out up to about
    1 ms after it arrives even when nothing else runs (the in-process gate shows that
    floor); a client whose calls block the loop (the compiled-graph lane) sends later still,
    and the latency from arrival counts that wait.
    """
    rng = random.Random(seed)
    latencies: list[float] = []
    arrived: list[float] = []
    late: list[float] = []
    tasks = []

    async def one(i: int, due: float) -> None:
        t0 = time.perf_counter()
        await call(i)
        done = time.perf_counter()
        latencies.append((done - t0) * 1e6)
        arrived.append((done - due) * 1e6)

    due = time.perf_counter()
    for i in range(calls):
        due += rng.expovariate(rate)
        wait = due - time.perf_counter()
        if wait > 0:
            await asyncio.sleep(wait)
        late.append(max(0.0, time.perf_counter() - due) * 1e6)
        tasks.append(asyncio.ensure_future(one(i, due)))
    await asyncio.gather(*tasks)
    return latencies, arrived, late


def cuts(us: list[float]) -> tuple[float, float]:
    """p50 and p99 of ``us``."""
    q = statistics.quantiles(us, n=100, method="inclusive")
    return q[49], q[98]


def row(label: str, us: list[float], per_s: float) -> str:
    p50, p99 = cuts(us)
    return f"  {label:<56} p50 {p50:8.1f} us   p99 {p99:8.1f} us   {per_s:>9,.0f} /s"


OPS = ("generation", "admit (4 candidates)", "branch: generation + admit (2 calls)",
       "branch: decide (Actions 0+1, 1 call)")


async def bench_client(name: str, client: GateClient, calls: int, callers: int,
                       measured: dict[tuple[str, str], list[float]],
                       rates: tuple[float, ...] = ()) -> list[str]:
    """Time every op of :data:`OPS` on ``client``, then ``decide`` open loop at each of
    ``rates`` per second; latencies go into ``measured`` under ``(name, phase op)`` for the
    ratio table."""
    await warm(client)
    cands, lines = candidates(), []
    gen = lambda i: client.generation(f"coord{i % 16}", float(i))  # noqa: E731
    loads = [AdmitLoad(client, cands, mode) for mode in ("admit", "branch", "decide")]
    for op, call in zip(OPS, (gen, *loads), strict=True):
        await timed(call, range(200))  # warm-up: first RPCs, caches
        us, _ = await phase(call, calls, 1)
        measured[(name.strip(), f"{op}, sequential")] = us
        lines.append(row(f"{name} {op}, sequential", us, 1e6 / statistics.fmean(us)))
        us, wall = await phase(call, calls, callers)
        measured[(name.strip(), f"{op}, {callers} callers")] = us
        lines.append(row(f"{name} {op}, {callers} callers", us, len(us) / wall))
    for rate in rates:
        us, arrived, late = await open_loop(loads[-1], calls, rate)
        op = f"decide, open loop at {rate:,.0f}/s"
        measured[(name.strip(), op)] = us
        lines.append(row(f"{name} {op}", us, rate)
                     + f"   (from arrival: p99 {cuts(arrived)[1]:,.0f} us; "
                       f"sent late: p99 {cuts(late)[1]:,.0f} us)")
    for load in loads:
        await load.drain()
    stats = await client.stats()
    if stats.get("unavailable"):
        raise RuntimeError(f"{name}: the gate stopped answering mid-benchmark: {stats}")
    lines.append(f"  ({name}: reserved now {stats['reserved_blocks']} blocks; "
                 f"{stats['admitted'] + stats['audit']:,} fills admitted)")
    return lines


async def bench_laned(name: str, client, counter: str, how: str, calls: int, callers: int,
                      measured: dict[tuple[str, str], list[float]],
                      rates: tuple[float, ...] = ()) -> list[str]:
    """:func:`bench_client` on a client with a lane, then what its lane carried, and the
    lane closed."""
    lines = await bench_client(name, client, calls, callers, measured, rates)
    counts = (await client.stats())["client"]
    lines.append(f"  ({name.strip()}: {counts[counter + '_calls']:,} calls {how}, "
                 f"{counts[counter + '_broken']} broken, {counts[counter + '_unopened']} "
                 f"unopened)")
    client.close_lane()
    return lines


async def bench_checkpoint(deployment) -> list[str]:
    """One snapshot's size and round trip, then the time a killed actor takes to answer."""
    import ray

    actor = deployment.actor
    before = (await actor.stats.remote())["checkpoint"]
    t0 = time.perf_counter()
    snap = await actor.checkpoint.remote()
    snap_ms = (time.perf_counter() - t0) * 1e3
    await actor.generation.remote("bench:restart", "coord0", 0.0)  # one entry to replay
    ray.kill(actor, no_restart=False)
    t0 = time.perf_counter()
    while True:  # the old incarnation may answer until the kill lands
        try:
            stats = await asyncio.wait_for(actor.stats.remote(), 5.0)
            if stats["checkpoint"]["restored"]:
                break
        except (ray.exceptions.RayActorError, TimeoutError):
            pass
        await asyncio.sleep(0.01)
    back_s = time.perf_counter() - t0
    n = before["snapshots"]
    return [f"  snapshot: {snap['bytes'] / 1024:,.0f} KiB at journal entry {snap['seq']:,}, "
            f"{snap_ms:.1f} ms round trip",
            f"  the {n} snapshots the actor wrote during the run (no call answered meanwhile): "
            f"mean {before['snapshot_ms_total'] / max(n, 1):.1f} ms, "
            f"max {before['snapshot_ms_max']:.1f} ms; {before['snapshot_failures']} failed",
            f"  restart: killed actor answered again after {back_s:.2f} s "
            f"(replayed {stats['checkpoint']['replayed']} journal entries)"]


def ratio_table(measured: dict[tuple[str, str], list[float]], where: str) -> list[str]:
    """Each op through the actor (``where``: ``ray``, an actor call, ``stream``, the stream
    lane, or ``lane``, the compiled-graph lane) beside the in-process gate of the same run, and the ratio."""
    lines = [f"this run, {where} against in process (ms):\n  {'op':<52}{'local p50':>10}"
             f"{'p99':>8}{where + ' p50':>9}{'p99':>8}{'ratio p50':>11}{'p99':>7}"]
    for (at, op), us in measured.items():
        if at != "local" or (where, op) not in measured:
            continue
        (l50, l99), (r50, r99) = cuts(us), cuts(measured[(where, op)])
        lines.append(f"  {op:<52}{l50 / 1e3:>10.3f}{l99 / 1e3:>8.3f}{r50 / 1e3:>9.3f}"
                     f"{r99 / 1e3:>8.3f}{r50 / l50:>11.1f}{r99 / l99:>7.1f}")
    return lines


async def run(calls: int, callers: int, rates: tuple[float, ...] = (),
              snapshot_every: int | None = None) -> list[str]:
    from dynbranch.cluster import GateDeployment
    from dynbranch.cluster.gate import SNAPSHOT_EVERY

    model, config = gate_spec()
    lines = [f"gate decisions ({PROFILE}, {calls:,} calls per phase, fanout 3, audits 2%):"]
    measured: dict[tuple[str, str], list[float]] = {}
    lines += await bench_client("local", LocalGateClient(Gate(model, config)), calls, callers,
                                measured, rates)
    with tempfile.TemporaryDirectory(prefix="bench-gate-") as directory:
        deployment = GateDeployment.start(model, config, directory,
                                          snapshot_every=snapshot_every or SNAPSHOT_EVERY)
        try:
            client = deployment.client(model, config)
            ping = lambda _i: deployment.actor.ping.remote()  # noqa: E731
            await timed(ping, range(200))
            us, _ = await phase(ping, calls, 1)
            lines.append(row("ray   ping (a no-op round trip), sequential", us,
                             1e6 / statistics.fmean(us)))
            lines += await bench_client("ray  ", client, calls, callers, measured)
            lines += await bench_laned("stream", deployment.client(model, config, stream=True),
                                       "stream", "over the stream lane", calls, callers,
                                       measured, rates)
            # NOTE: the lane opens at its client's first call, after the other clients'
            # phases (its polling thread must not slow them), and closes before the kill.
            lines += await bench_laned("lane ", deployment.client(model, config, lane=True),
                                       "lane", "through the compiled graph", calls, callers,
                                       measured, rates)
            lines += ["checkpoint:", *await bench_checkpoint(deployment)]
            lines += (ratio_table(measured, "ray") + ratio_table(measured, "stream")
                      + ratio_table(measured, "lane"))
        finally:
            deployment.stop()
    return lines


def main() -> None:
    import ray

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--callers", type=int, default=16)
    parser.add_argument("--rates", type=float, nargs="*", default=[200.0, 1000.0, 2000.0],
                        help="decide calls per second, open loop (none: skip that phase)")
    parser.add_argument("--snapshot-every", type=int, default=None, metavar="ENTRIES",
                        help="journal entries between the gate actor's snapshots (default: the "
                             "actor's own, 1,024); a large number leaves them out of the run")
    args = parser.parse_args()
    if any(r <= 0 for r in args.rates):
        parser.error(f"--rates must be > 0, got {args.rates}")
    if args.snapshot_every is not None and args.snapshot_every < 1:
        parser.error(f"--snapshot-every must be >= 1, got {args.snapshot_every}")
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             configure_logging=False)
    try:
        print("\n".join(asyncio.run(run(args.calls, args.callers, tuple(args.rates),
                                         args.snapshot_every))))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
