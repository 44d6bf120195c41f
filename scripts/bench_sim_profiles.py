"""Speeds of every shipped sim profile: simulated by SimEngine vs the bare roofline.

For each profile it prints single-request prefill throughput (a 2,048-token prompt) and
decode speed (batch 1 at 1k context), each as simulated on the virtual clock and as the
bare roofline (weight bytes / bandwidth for decode, 2 x params x tokens / peak FLOPS for
prefill, no efficiency factors or overheads), the KV pool size in tokens, and decode
throughput at batch 8, 32 and 128 (1k-token prompts, 256 output tokens each).

The numbers are deterministic (virtual clock) and go into notes, not tests:

    python scripts/bench_sim_profiles.py
"""

from __future__ import annotations

import asyncio
import random
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from dynbranch.clock import VirtualClock  # noqa: E402
from dynbranch.engines.profile import Profile, known_profiles, load_profile  # noqa: E402
from dynbranch.engines.protocol import GenerateRequest, GenerateResult  # noqa: E402
from dynbranch.engines.sim import SimEngine  # noqa: E402

PREFILL_TOKENS = 2048
CONTEXT_TOKENS = 1024
DECODE_TOKENS = 256
BATCHES = (8, 32, 128)


def text_of(tokens: int, seed: int) -> str:
    """A text of exactly ``tokens`` stand-in tokens (one short word each)."""
    rng = random.Random(seed)
    return "".join(
        " " + "".join(rng.choices("abcdefghij", k=rng.randint(1, 6))) for _ in range(tokens)
    )


@dataclass
class BatchRun:
    results: list[GenerateResult]
    chunk_times: list[float]
    peak_running: int
    preemptions: int


async def _run_batch(profile: Profile, n: int, prompt: int, output: int) -> BatchRun:
    engine = SimEngine(profile, VirtualClock(), "bench")
    await engine.start()
    chunk_times: list[float] = []
    peak = 0

    async def one(i: int) -> GenerateResult:
        nonlocal peak
        req = GenerateRequest(
            f"r{i}", text_of(prompt, i), output + 1, replay_text=text_of(output, -i - 1)
        )
        async for chunk in engine.generate_stream(req):
            chunk_times.append(engine.clock.now())
            peak = max(peak, engine.load().running)
            if chunk.result is not None:
                return chunk.result
        raise AssertionError("stream ended without a result")

    results = await asyncio.gather(*(one(i) for i in range(n)))
    preemptions = engine.load().preemptions_total
    await engine.shutdown()
    return BatchRun(list(results), chunk_times, peak, preemptions)


def run_batch(profile: Profile, n: int, prompt: int, output: int) -> BatchRun:
    return VirtualClock().run(_run_batch(profile, n, prompt, output))


def decode_rates(run: BatchRun) -> tuple[float | None, float]:
    """(steady, sustained) decode tokens/s.

    Steady: tokens streamed while all calls were decoding together (None if they never
    were, e.g. when the KV pool cannot hold them all). Sustained: every decoded token over
    the span from the first first-token to the last finish.
    """
    start = max(r.first_token_at for r in run.results)
    end = min(r.finished_at for r in run.results)
    steady = None
    if end > start:
        steady = sum(1 for t in run.chunk_times if start < t <= end) / (end - start)
    span = max(r.finished_at for r in run.results) - min(r.first_token_at for r in run.results)
    decoded = sum(r.output_tokens - 1 for r in run.results)
    return steady, decoded / span


def bench(name: str) -> list[str]:
    p = load_profile(name)
    [prefill] = run_batch(p, 1, PREFILL_TOKENS, 1).results
    prefill_sim = PREFILL_TOKENS / (prefill.first_token_at - prefill.first_scheduled_at)
    prefill_bare = p.peak_flops / (2 * p.param_count)
    [single] = run_batch(p, 1, CONTEXT_TOKENS, DECODE_TOKENS).results
    decode_sim = (single.output_tokens - 1) / (single.finished_at - single.first_token_at)
    decode_bare = p.bandwidth_bytes_s / p.weight_bytes
    lines = [
        f"{name}  ({p.model.name} on {p.gpu.name}, profile v{p.version})",
        f"  KV pool: {p.kv_pool_tokens:,} tokens ({p.kv_pool_blocks:,} blocks of "
        f"{p.scheduler.block_size}); weights {p.weight_bytes / 2**30:.1f} GiB",
        f"  prefill {PREFILL_TOKENS} tokens, batch 1: sim {prefill_sim:,.0f} tok/s"
        f"   bare roofline {prefill_bare:,.0f} tok/s   (TTFT {1e3 * PREFILL_TOKENS / prefill_sim:.1f} ms)",
        f"  decode @{CONTEXT_TOKENS} ctx, batch 1: sim {decode_sim:,.1f} tok/s"
        f"   bare roofline {decode_bare:,.1f} tok/s   ({1e3 / decode_sim:.2f} ms/step)",
    ]
    for n in BATCHES:
        run = run_batch(p, n, CONTEXT_TOKENS, DECODE_TOKENS)
        steady, sustained = decode_rates(run)
        shown = "n/a (never all co-resident)" if steady is None else f"{steady:,.0f} tok/s"
        lines.append(
            f"  decode batch {n:>3}: steady {shown:>12}, sustained {sustained:,.0f} tok/s, "
            f"peak running {run.peak_running}, preemptions {run.preemptions}"
        )
    return lines


def main() -> None:
    for name in known_profiles():
        print("\n".join(bench(name)), end="\n\n")


if __name__ == "__main__":
    main()
