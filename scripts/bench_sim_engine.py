"""How fast SimEngine simulates long decodes: skip-ahead on vs off, one engine and four.

    python scripts/bench_sim_engine.py [--requests 300] [--engines 1 4] [--scenario NAME ...]

An open-loop Poisson load per engine (calls placed round robin) of long agentic calls,
prompts mostly opening with one of eight shared system prefixes (so prefix caching has
work), outputs of 300-2,000 tokens, one call in five speculative. Two scenarios:
``long-prompts`` (2k-30k-token prompts at 0.3 calls/s per engine: KV-bound, few large
sequences) and ``routing`` (1k-4k-token prompts at 1.5 calls/s per engine: batches of
dozens of decodes, as a routing replay with realistic decode lengths has). A probe reads every engine's ``load()`` every 50 ms, as the
C3 gate does. Each configuration runs in a fresh process, so its wall time and peak RSS
are its own. Prints, per configuration: wall seconds, simulated seconds, simulated
seconds per wall second, steps applied, engine wake-ups, peak RSS, and whether skip-ahead
gave the same results as stepping (a digest of every result and every probe snapshot).

Numbers go into notes, not tests.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import hashlib
import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dynbranch.clock import VirtualClock  # noqa: E402
from dynbranch.engines.profile import load_profile  # noqa: E402
from dynbranch.engines.protocol import CANONICAL, SPECULATIVE, GenerateRequest  # noqa: E402
from dynbranch.engines.sim import SimEngine  # noqa: E402

OUTPUT_TOKENS = (300, 2_000)
SHARED_PREFIXES = 8
PROBE_S = 0.05


@dataclass(frozen=True)
class Scenario:
    """Prompt and shared-prefix sizes (tokens) and the calls per second per engine."""

    prompt: tuple[int, int]
    prefix: tuple[int, int]
    rate: float


SCENARIOS = {
    "long-prompts": Scenario((2_000, 30_000), (2_000, 20_000), 0.3),
    "routing": Scenario((1_000, 4_000), (500, 3_000), 1.5),
}


class Corpus:
    """Texts of an exact stand-in token count, cut from one pre-built list of words."""

    def __init__(self, seed: int, size: int = 400_000) -> None:
        rng = random.Random(seed)
        letters = "abcdefghijklmnopqrstuvwxyz"
        self.words = [" " + "".join(rng.choices(letters, k=rng.randint(1, 6))) for _ in range(size)]

    def text(self, tokens: int, rng: random.Random) -> str:
        start = rng.randrange(len(self.words) - tokens)
        return "".join(self.words[start : start + tokens])


def requests(
    n: int, engines: int, scenario: Scenario, seed: int
) -> Iterator[tuple[float, int, GenerateRequest]]:
    """(arrival time, engine, request) for ``n`` calls of ``scenario``, made as iterated
    (so the benchmark holds only the calls in flight)."""
    rng = random.Random(seed)
    corpus = Corpus(seed)
    sizes = [rng.randint(*scenario.prefix) for _ in range(SHARED_PREFIXES)]
    prefixes = [(corpus.text(k, rng), k) for k in sizes]

    def calls() -> Iterator[tuple[float, int, GenerateRequest]]:
        t = 0.0
        for i in range(n):
            t += rng.expovariate(scenario.rate * engines)
            tokens = rng.randint(*scenario.prompt)
            prefix, k = rng.choice(prefixes) if rng.random() < 0.8 else ("", 0)
            if k >= tokens:
                prefix, k = "", 0
            prompt = prefix + corpus.text(tokens - k, rng)
            output = corpus.text(rng.randint(*OUTPUT_TOKENS), rng)
            priority = SPECULATIVE if rng.random() < 0.2 else CANONICAL
            yield t, i % engines, GenerateRequest(f"r{i}", prompt, 4096, output, priority)

    return calls()


def run_one(n: int, engines: int, scenario: Scenario, seed: int, skip_ahead: bool) -> dict:
    """Simulate one configuration in this process; returns its measurements."""
    profile = load_profile("qwen3-32b@h200")
    load = requests(n, engines, scenario, seed)
    clock = VirtualClock()
    digest = hashlib.sha256()
    built: list[SimEngine] = []

    async def main() -> float:
        pool = [
            SimEngine(profile, clock, f"sim-{i}", skip_ahead=skip_ahead) for i in range(engines)
        ]
        built.extend(pool)
        for engine in pool:
            await engine.start()
        done = asyncio.Event()

        async def call(home: int, req: GenerateRequest) -> None:
            result = await pool[home].generate(req)
            digest.update(repr(result).encode())

        async def arrive() -> None:
            in_flight: set[asyncio.Task[None]] = set()
            for at, home, req in load:
                await clock.sleep_until(at)
                task = asyncio.create_task(call(home, req))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
            await asyncio.gather(*in_flight)

        async def probe() -> None:
            while not done.is_set():
                for engine in pool:
                    digest.update(repr(engine.load()).encode())
                await clock.sleep(PROBE_S)

        prober = asyncio.create_task(probe())
        await arrive()
        done.set()
        await prober
        for engine in pool:
            await engine.shutdown()
        return clock.now()

    t0, c0 = time.perf_counter(), time.process_time()
    simulated = clock.run(main())
    wall, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {
        "engines": engines,
        "requests": n,
        "skip_ahead": skip_ahead,
        "wall_s": wall,
        "cpu_s": cpu,
        "simulated_s": simulated,
        "sim_s_per_wall_s": simulated / wall,
        "steps": sum(e.steps for e in built),
        "wakes": sum(e.wakes for e in built),
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "digest": digest.hexdigest()[:16],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=300, help="calls per engine")
    ap.add_argument("--engines", type=int, nargs="+", default=[1, 4])
    ap.add_argument("--scenario", nargs="+", choices=sorted(SCENARIOS), default=sorted(SCENARIOS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--rate", type=float, help="calls per second per engine (default: the scenario's)"
    )
    ap.add_argument("--one", help=argparse.SUPPRESS)  # internal: run one configuration
    args = ap.parse_args()
    if args.one:
        name, engines, skip = json.loads(args.one)
        n, scenario = args.requests * engines, SCENARIOS[name]
        if args.rate is not None:
            scenario = dataclasses.replace(scenario, rate=args.rate)
        print(json.dumps(run_one(n, engines, scenario, args.seed, skip)))
        return
    print(
        f"outputs {OUTPUT_TOKENS[0]:,}-{OUTPUT_TOKENS[1]:,} tokens, 80% of prompts open with "
        f"one of {SHARED_PREFIXES} shared prefixes, load() probe every {PROBE_S * 1e3:.0f} ms, "
        "qwen3-32b@h200"
    )
    for name in args.scenario:
        sc = SCENARIOS[name]
        if args.rate is not None:
            sc = dataclasses.replace(sc, rate=args.rate)
        print(f"{name}: prompts {sc.prompt[0]:,}-{sc.prompt[1]:,} tokens, {sc.rate}/s per engine")
        for engines in args.engines:
            rows = [_subprocess(args, [name, engines, skip]) for skip in (False, True)]
            print(f"  {engines} engine(s), {rows[0]['requests']} calls:")
            for r in rows:
                print(
                    f"    skip-ahead {'on ' if r['skip_ahead'] else 'off'}: wall {r['wall_s']:7.2f} s "
                    f"(CPU {r['cpu_s']:7.2f} s), simulated {r['simulated_s']:7.1f} s, "
                    f"{r['sim_s_per_wall_s']:6.1f} sim s/wall s, {r['steps']:,} steps, "
                    f"{r['wakes']:,} wake-ups, peak RSS {r['peak_rss_mb']:.0f} MB"
                )
            same = rows[0]["digest"] == rows[1]["digest"]
            print(
                f"    same results and load snapshots: {'yes' if same else 'NO'} (digest "
                f"{rows[1]['digest']}); CPU x{rows[0]['cpu_s'] / rows[1]['cpu_s']:.1f}, wall "
                f"x{rows[0]['wall_s'] / rows[1]['wall_s']:.1f}"
            )


def _subprocess(args: argparse.Namespace, one: list) -> dict:
    cmd = [
        sys.executable,
        __file__,
        "--requests",
        str(args.requests),
        "--seed",
        str(args.seed),
        "--one",
        json.dumps(one),
    ]
    return json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)


if __name__ == "__main__":
    main()
