"""The simulated engine, its roofline profiles, the zero engine and the engine registry.

Everything runs on the virtual clock, so step times are exact and runs deterministic. Step
times are checked against the roofline recomputed here from the profile's raw fields.
"""

from __future__ import annotations

import asyncio
import dataclasses
import math
import random
from collections.abc import Coroutine
from pathlib import Path
from typing import Any, TypeVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.clock import RealClock, VirtualClock
from dynbranch.engines import ENGINE_KINDS, make_engine
from dynbranch.engines.profile import (
    Profile,
    SeqWork,
    attention_pairs,
    known_profiles,
    load_profile,
    load_profile_file,
)
from dynbranch.engines.protocol import CANONICAL, SPECULATIVE, GenerateRequest, GenerateResult
from dynbranch.engines.sim import BlockPool, SimEngine
from dynbranch.engines.tokenizer import count_tokens
from dynbranch.engines.zero import ZeroEngine
from dynbranch.errors import (
    EngineError,
    MalformedProfileError,
    PromptTooLongError,
    UnknownNameError,
)
from tests.engine_contract import check_engine_contract

T = TypeVar("T")
P32 = load_profile("qwen3-32b@h200")
BS = P32.scheduler.block_size


def run(main: Coroutine[Any, Any, T]) -> T:
    return VirtualClock().run(main)


def words(n: int, seed: int) -> str:
    """A text of exactly ``n`` tokens under the stand-in tokenizer (one per word)."""
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    text = "".join(" " + "".join(rng.choices(letters, k=rng.randint(1, 6))) for _ in range(n))
    assert count_tokens(text) == n
    return text


def request(rid: str, prompt: int, output: int, seed: int, **kw: Any) -> GenerateRequest:
    """A call with a ``prompt``-token prompt replaying ``output`` pieces (then EOS)."""
    kw.setdefault("max_tokens", 4096)
    return GenerateRequest(rid, words(prompt, seed), replay_text=words(output, seed + 10_000), **kw)


def with_limits(profile: Profile, **limits: int) -> Profile:
    return dataclasses.replace(profile, scheduler=dataclasses.replace(profile.scheduler, **limits))


async def started(profile: Profile = P32, **kw: Any) -> SimEngine:
    engine = SimEngine(profile, VirtualClock(), **kw)
    await engine.start()
    return engine


async def stream_times(engine: SimEngine, req: GenerateRequest) -> tuple[list[float], str]:
    """The clock time each chunk arrives at, and the streamed text."""
    times, text = [], ""
    async for chunk in engine.generate_stream(req):
        times.append(engine.clock.now())
        text += chunk.text_delta
    return times, text


def roofline(p: Profile, work: list[tuple[int, int]]) -> tuple[float, float, float]:
    """(compute, memory, overhead) seconds of a step, from the profile's raw fields.

    ``work`` holds (context tokens, new tokens) per scheduled sequence.
    """
    m, g, c = p.model, p.gpu, p.calibration
    q, kv = m.num_attention_heads * m.head_dim, m.num_kv_heads * m.head_dim
    layers = m.num_layers * (
        2 * m.hidden_size * q + 2 * m.hidden_size * kv + 3 * m.hidden_size * m.intermediate_size
    )
    norms = m.num_layers * (2 * m.hidden_size + 2 * m.head_dim) + m.hidden_size
    embed = m.vocab_size * m.hidden_size
    # One embedding-sized matrix is read per step whether tied or not (the LM head).
    weight_read = (layers + norms + embed) * m.bytes_per_param
    kv_token = 2 * m.num_layers * kv * m.kv_bytes_per_elem
    tokens = sum(n for _, n in work)
    pairs = sum(n * ctx + n * (n + 1) // 2 for ctx, n in work)
    flops = 2 * layers * tokens + 2 * embed * len(work) + 4 * m.num_layers * q * pairs
    compute = flops / (g.peak_bf16_tflops * 1e12 * c.mfu)
    moved = weight_read + kv_token * sum(ctx + n for ctx, n in work)
    memory = moved / (g.bandwidth_gb_s * 1e9 * c.bandwidth_efficiency)
    overhead = c.step_overhead_ms / 1e3 + len(work) * c.seq_overhead_us / 1e6
    return compute, memory, overhead


def step_s(p: Profile, work: list[tuple[int, int]]) -> float:
    compute, memory, overhead = roofline(p, work)
    return max(compute, memory) + overhead


def assert_idle(engine: SimEngine) -> None:
    snap = engine.load()
    assert (snap.running, snap.waiting, snap.kv_blocks_used) == (0, 0, 0)


# -- (1) step times are the roofline ------------------------------------------------------


def test_decode_step_time_is_memory_bound_roofline() -> None:
    prompt, output = 1000, 20

    async def main() -> tuple[list[float], str]:
        engine = await started()
        return await stream_times(engine, request("r", prompt, output, seed=1))

    times, text = run(main())
    assert len(times) == output + 1  # one chunk per piece, then the EOS step
    compute, memory, _ = roofline(P32, [(prompt, 1)])
    assert memory > 20 * compute, "batch-1 decode must be memory-bound"
    assert times[0] == pytest.approx(step_s(P32, [(0, prompt)]), rel=1e-9)
    for k in range(1, len(times)):
        expected = step_s(P32, [(prompt + k - 1, 1)])
        assert times[k] - times[k - 1] == pytest.approx(expected, rel=1e-9)
    assert 1 / (times[1] - times[0]) == pytest.approx(53.3, abs=0.5)  # tokens/s


def test_long_prefill_is_compute_bound_and_chunked() -> None:
    async def ttft(prompt: int) -> float:
        engine = await started()
        result = await engine.generate(request("r", prompt, 3, seed=2))
        return result.first_token_at - result.first_scheduled_at

    compute, memory, _ = roofline(P32, [(0, 4000)])
    assert compute > 10 * memory
    assert run(ttft(4000)) == pytest.approx(step_s(P32, [(0, 4000)]), rel=1e-9)
    # 10,000 tokens exceed the 8,192-token step budget: two chunks, the second reads the first.
    budget = P32.scheduler.max_num_batched_tokens
    expected = step_s(P32, [(0, budget)]) + step_s(P32, [(budget, 10_000 - budget)])
    assert run(ttft(10_000)) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 40_000), st.integers(1, 8192)), min_size=1, max_size=40),
    st.sampled_from(["qwen3-32b@h200", "qwen3-8b@rtx4090", "qwen3-0.6b@h200"]),
)
def test_step_time_from_totals_is_the_same_float_as_step_cost(
    work: list[tuple[int, int]], name: str
) -> None:
    profile = load_profile(name)
    pairs = sum(attention_pairs(c, n) for c, n in work)
    totals = (len(work), sum(n for _, n in work), sum(c for c, _ in work), pairs)
    assert profile.step_time(*totals) == profile.step_cost([SeqWork(c, n) for c, n in work]).total_s
    assert pairs == sum(n * c + n * (n + 1) // 2 for c, n in work)


def test_profile_step_cost_matches_independent_roofline() -> None:
    work = [(0, 512), (3000, 1), (700, 1), (4096, 2048)]
    cost = P32.step_cost([SeqWork(c, n) for c, n in work])
    assert (cost.compute_s, cost.memory_s, cost.overhead_s) == pytest.approx(
        roofline(P32, work), rel=1e-12
    )
    assert cost.bound == "compute"


# -- (2) KV accounting --------------------------------------------------------------------


def test_kv_blocks_follow_computed_tokens_and_free_on_completion() -> None:
    prompt, output = 1000, 30

    async def main() -> tuple[list[int], SimEngine, GenerateResult | None]:
        engine = await started()
        used, result = [], None
        async for chunk in engine.generate_stream(request("r", prompt, output, seed=3)):
            used.append(engine.load().kv_blocks_used)
            result = chunk.result
        return used, engine, result

    used, engine, result = run(main())
    assert used[0] == math.ceil(prompt / BS) == 63
    # NOTE: when chunk k arrives, the engine has already scheduled the next step, which
    # computes token prompt + k, so it holds blocks for prompt + k + 1 tokens.
    for k, blocks in enumerate(used[:-1]):
        assert blocks == math.ceil((prompt + k + 1) / BS)
    assert used[-1] == 0
    assert result is not None and result.output_tokens == output + 1
    # Full blocks stay in the prefix cache, yet count as free.
    assert engine.block_pool.num_cached == (prompt + output) // BS
    assert engine.block_pool.num_free == engine.block_pool.num_blocks


def test_speculative_blocks_are_reported_apart() -> None:
    async def main() -> list[tuple[int, int, int]]:
        engine = await started()
        task = asyncio.create_task(
            engine.generate(request("s", 100, 50, seed=4, priority=SPECULATIVE))
        )
        await engine.clock.sleep(0.5)
        snap = engine.load()
        await task
        return [(snap.spec_running, snap.spec_kv_blocks, snap.kv_blocks_used)]

    [(spec_running, spec_blocks, used)] = run(main())
    assert spec_running == 1 and spec_blocks == used > 0


# -- (3) preemption -----------------------------------------------------------------------


def test_speculative_request_is_preempted_and_both_finish() -> None:
    # 10 blocks = 160 tokens; each request needs 119 alone, the two together 238.
    spec = request("spec", 60, 59, seed=5, priority=SPECULATIVE)
    canon = request("canon", 60, 59, seed=6, priority=CANONICAL)

    async def main() -> tuple[list[GenerateResult], list[str], int]:
        engine = await started(kv_blocks=10)

        async def consume(req: GenerateRequest) -> tuple[GenerateResult, str]:
            text, result = "", None
            async for chunk in engine.generate_stream(req):
                text, result = text + chunk.text_delta, chunk.result
            assert result is not None
            return result, text

        # The speculative request arrives first: priority, not arrival, picks the victim.
        pairs = await asyncio.gather(consume(spec), consume(canon))
        assert_idle(engine)
        return [p[0] for p in pairs], [p[1] for p in pairs], engine.load().preemptions_total

    (s, c), (s_text, c_text), total = run(main())
    assert (s.preemptions, c.preemptions, total) == (1, 0, 1)
    assert s.text == s_text == spec.replay_text and s.finish_reason == "stop"
    assert c.text == c_text == canon.replay_text and c.finish_reason == "stop"
    assert s.output_tokens == c.output_tokens == 60
    assert s.first_token_at < c.finished_at < s.finished_at


def test_a_promoted_waiting_fill_queues_among_canonical_requests_by_arrival() -> None:
    # NOTE: a canonical stage that joins a fill waits on it: it must not wait behind every
    # canonical request that came after the fill
    async def main(promote: bool) -> tuple[list[str], list[bool], int]:
        engine = await started(with_limits(P32, max_num_seqs=1))
        head = asyncio.ensure_future(engine.generate(request("head", 50, 30, seed=40)))
        await engine.clock.sleep(0.01)
        spec = asyncio.ensure_future(
            engine.generate(request("spec", 50, 5, seed=41, priority=SPECULATIVE)))
        later = asyncio.ensure_future(engine.generate(request("later", 50, 5, seed=42)))
        await asyncio.sleep(0)
        moved = []
        if promote:
            moved = [await engine.promote("spec"), await engine.promote("later"),
                     await engine.promote("nobody")]
        waiting = engine.load().spec_waiting
        results = await asyncio.gather(head, spec, later)
        assert_idle(engine)
        order = sorted(results, key=lambda r: r.first_scheduled_at)
        return [r.request_id for r in order], moved, waiting

    assert run(main(False)) == (["head", "later", "spec"], [], 1)
    assert run(main(True)) == (["head", "spec", "later"], [True, False, False], 0)


def test_a_promoted_running_fill_is_no_longer_the_first_victim() -> None:
    # 10 blocks = 160 tokens; each request needs 119 alone, the two together 238 (as above)
    async def main() -> tuple[GenerateResult, GenerateResult, int]:
        engine = await started(kv_blocks=10)
        spec = asyncio.ensure_future(
            engine.generate(request("spec", 60, 59, seed=5, priority=SPECULATIVE)))
        await engine.clock.sleep(0.05)
        assert engine.load().spec_kv_blocks > 0
        assert await engine.promote("spec")
        assert (engine.load().spec_kv_blocks, engine.load().spec_running) == (0, 0)
        canon = asyncio.ensure_future(engine.generate(request("canon", 60, 59, seed=6)))
        s, c = await asyncio.gather(spec, canon)
        assert_idle(engine)
        return s, c, engine.load().preemptions_total

    s, c, total = run(main())
    # NOTE: both canonical now: the latest arrival is the victim
    assert (s.preemptions, c.preemptions, total) == (0, 1, 1)
    assert s.finish_reason == c.finish_reason == "stop"


def test_latest_arrival_is_preempted_among_equals() -> None:
    async def main() -> list[GenerateResult]:
        engine = await started(kv_blocks=10)
        reqs = [request(f"c{i}", 60, 59, seed=7 + i) for i in range(2)]
        return list(await asyncio.gather(*(engine.generate(r) for r in reqs)))

    first, second = run(main())
    assert (first.preemptions, second.preemptions) == (0, 1)
    assert first.finished_at < second.finished_at


# -- (4) cancellation ---------------------------------------------------------------------


def test_abort_waiting_and_running_requests() -> None:
    profile = with_limits(P32, max_num_seqs=1)

    async def main() -> None:
        engine = await started(profile)
        running = asyncio.create_task(stream_times(engine, request("run", 500, 200, seed=9)))
        waiting = asyncio.create_task(engine.generate(request("wait", 500, 20, seed=10)))
        await engine.clock.sleep(1.0)
        snap = engine.load()
        assert (snap.running, snap.waiting) == (1, 1) and snap.kv_blocks_used > 500 / BS

        assert await engine.abort("wait") is True
        aborted = await waiting
        assert (aborted.finish_reason, aborted.text, aborted.output_tokens) == ("abort", "", 0)
        assert await engine.abort("wait") is False
        assert engine.load().waiting == 0

        assert await engine.abort("run") is True
        assert_idle(engine)  # blocks are freed at once, not at the end of the step
        times, text = await running
        assert len(times) > 1 and text == request("run", 500, 200, seed=9).replay_text[: len(text)]
        assert await engine.abort("run") is False
        assert await engine.abort("never-seen") is False
        await engine.shutdown()

    run(main())


def test_cancelling_the_consumer_aborts_inside_the_engine() -> None:
    profile = with_limits(P32, max_num_seqs=1)

    async def main() -> None:
        engine = await started(profile)
        running = asyncio.create_task(engine.generate(request("run", 500, 200, seed=11)))
        waiting = asyncio.create_task(engine.generate(request("wait", 500, 20, seed=12)))
        await engine.clock.sleep(1.0)
        assert (engine.load().running, engine.load().waiting) == (1, 1)
        for task in (waiting, running):
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        assert_idle(engine)
        assert await engine.abort("run") is False
        # The engine still serves after the cancellations.
        result = await engine.generate(request("next", 50, 5, seed=13))
        assert result.finish_reason == "stop"

    run(main())


def test_shutdown_aborts_in_flight_calls() -> None:
    async def main() -> GenerateResult:
        engine = await started()
        task = asyncio.create_task(engine.generate(request("r", 100, 500, seed=14)))
        await engine.clock.sleep(0.5)
        await engine.shutdown()
        assert not await engine.health()
        return await task

    assert run(main()).finish_reason == "abort"


# -- (5) prefix caching -------------------------------------------------------------------


def test_prefix_cache_reuse_and_salt_isolation() -> None:
    prompt = words(2000, seed=15)

    def call(rid: str, salt: str | None = None) -> GenerateRequest:
        return GenerateRequest(rid, prompt, 64, replay_text=" ok", cache_salt=salt)

    async def main(caching: bool) -> list[GenerateResult]:
        engine = await started(prefix_caching=caching)
        return [
            await engine.generate(call("first")),
            await engine.generate(call("again")),
            await engine.generate(call("salted", salt="tenant-b")),
        ]

    first, again, salted = run(main(True))
    hit = (2000 - 1) // BS * BS  # whole blocks, never the last token
    assert (first.cached_prompt_tokens, again.cached_prompt_tokens) == (0, hit)
    assert salted.cached_prompt_tokens == 0
    ttft = [r.first_token_at - r.arrived_at for r in (first, again, salted)]
    assert ttft[0] == pytest.approx(step_s(P32, [(0, 2000)]), rel=1e-9)
    assert ttft[1] == pytest.approx(step_s(P32, [(hit, 2000 - hit)]), rel=1e-9)
    assert ttft[1] < ttft[0] / 10 and ttft[2] == pytest.approx(ttft[0], rel=1e-9)
    assert all(r.cached_prompt_tokens == 0 for r in run(main(False)))


def test_block_pool_refcounts_and_lru_eviction() -> None:
    pool = BlockPool(4)
    a = pool.allocate(2)
    pool.cache(a[0], b"k0")
    pool.cache(a[1], b"k1")
    assert pool.lookup([b"k0", b"k1", b"k2"]) == a
    pool.touch(a)  # a second request shares both blocks
    pool.release(a)
    assert pool.num_free == 2  # still referenced once
    pool.release(a)
    assert pool.num_free == 4 and pool.lookup([b"k0", b"k1"]) == a  # free yet cached
    pool.allocate(3)  # two never-used blocks, then the tail block of the freed prefix
    assert pool.lookup([b"k0", b"k1"]) == [a[0]]
    assert pool.num_cached == 1 and pool.num_free == 1


# -- (6) batching -------------------------------------------------------------------------


def test_concurrent_decodes_slow_each_other_but_raise_throughput() -> None:
    # No per-sequence overhead: any slowdown must come from the roofline's KV reads.
    profile = P32.with_calibration(seq_overhead_us=0.0)
    n, prompt, output = 8, 1000, 40

    def decode_step(r: GenerateResult) -> float:
        return (r.finished_at - r.first_token_at) / (r.output_tokens - 1)

    async def main(batch: int) -> list[GenerateResult]:
        engine = await started(profile)
        reqs = [request(f"r{i}", prompt, output, seed=20 + i) for i in range(batch)]
        return list(await asyncio.gather(*(engine.generate(r) for r in reqs)))

    [alone] = run(main(1))
    batched = run(main(n))
    assert len({r.first_token_at for r in batched}) == 1  # one prefill step, then lockstep
    assert all(decode_step(r) > decode_step(alone) for r in batched)
    assert n / decode_step(batched[0]) > 1 / decode_step(alone)
    mean_ctx = prompt + output / 2
    expected = step_s(profile, [(round(mean_ctx), 1)] * n) - step_s(profile, [(round(mean_ctx), 1)])
    assert decode_step(batched[0]) - decode_step(alone) == pytest.approx(expected, rel=0.05)


# -- (7) priority -------------------------------------------------------------------------


def test_canonical_request_queued_after_speculative_is_admitted_first() -> None:
    # 20 blocks: the first request holds 14, and each later one needs 13 to start.
    async def main() -> tuple[GenerateResult, GenerateResult, GenerateResult, Any]:
        engine = await started(kv_blocks=20)
        first = asyncio.create_task(engine.generate(request("first", 200, 20, seed=30)))
        await engine.clock.sleep(0.01)
        spec = asyncio.create_task(
            engine.generate(request("spec", 200, 5, seed=31, priority=SPECULATIVE))
        )
        await engine.clock.sleep(0.01)
        canon = asyncio.create_task(engine.generate(request("canon", 200, 5, seed=32)))
        await engine.clock.sleep(0.01)
        snap = engine.load()
        return await first, await spec, await canon, snap

    first, spec, canon, snap = run(main())
    assert (snap.running, snap.waiting, snap.spec_waiting) == (1, 2, 1)
    assert spec.arrived_at < canon.arrived_at
    assert canon.first_scheduled_at == first.finished_at
    assert spec.first_scheduled_at == canon.finished_at
    assert spec.preemptions == canon.preemptions == 0


# -- (8) determinism ----------------------------------------------------------------------


def mixed_workload(seed: int) -> tuple[list[GenerateResult], int]:
    async def main() -> tuple[list[GenerateResult], int]:
        engine = await started(kv_blocks=64)
        rng = random.Random(seed)

        async def one(i: int, delay: float) -> GenerateResult:
            await engine.clock.sleep(delay)
            req = request(
                f"r{i}",
                rng.randint(20, 300),
                rng.randint(5, 120),
                seed=seed * 100 + i,
                priority=rng.choice([CANONICAL, SPECULATIVE]),
            )
            return await engine.generate(req)

        async def abort_later() -> None:
            await engine.clock.sleep(1.0)
            await engine.abort("r3")

        delays = [rng.expovariate(10.0) * i for i in range(16)]
        tasks = [one(i, d) for i, d in enumerate(delays)]
        results = await asyncio.gather(*tasks, abort_later())
        assert_idle(engine)
        return list(results[:-1]), engine.load().preemptions_total

    return run(main())


def test_same_workload_gives_identical_results() -> None:
    first, preemptions = mixed_workload(seed=40)
    assert preemptions > 0, "the workload should exercise preemption"
    assert any(r.finish_reason == "abort" for r in first)
    assert (first, preemptions) == mixed_workload(seed=40)


@settings(max_examples=25, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.integers(1, 120),  # prompt tokens
            st.integers(0, 60),  # output pieces
            st.integers(1, 80),  # max_tokens
            st.sampled_from([CANONICAL, SPECULATIVE]),
            st.floats(0.0, 0.5),  # arrival delay
        ),
        min_size=1,
        max_size=10,
    ),
    st.integers(12, 40),  # KV blocks
)
def test_any_workload_completes_with_its_text_and_leaks_nothing(
    calls: list[tuple[int, int, int, int, float]], kv_blocks: int
) -> None:
    async def main() -> None:
        engine = await started(with_limits(P32, max_num_batched_tokens=64), kv_blocks=kv_blocks)

        async def one(i: int, call: tuple[int, int, int, int, float]) -> None:
            prompt, output, max_tokens, priority, delay = call
            await engine.clock.sleep(delay)
            req = request(f"r{i}", prompt, output, seed=i, max_tokens=max_tokens, priority=priority)
            result = await engine.generate(req)
            assert req.replay_text is not None
            if output < max_tokens:
                assert (result.text, result.finish_reason) == (req.replay_text, "stop")
                assert result.output_tokens == output + 1
            else:
                assert result.finish_reason == "length" and result.output_tokens == max_tokens
                assert count_tokens(result.text) == max_tokens
                assert req.replay_text.startswith(result.text)

        await asyncio.gather(*(one(i, c) for i, c in enumerate(calls)))
        assert_idle(engine)

    run(main())


# -- (9) prompts that cannot fit ----------------------------------------------------------


def test_prompt_too_long_raises_at_once() -> None:
    async def main() -> None:
        engine = await started(kv_blocks=4)  # 64 tokens
        with pytest.raises(PromptTooLongError, match="64 tokens"):
            await engine.generate(request("long", 100, 1, seed=50))
        with pytest.raises(PromptTooLongError):  # the prompt fits, prompt + output does not
            await engine.generate(request("grows", 50, 30, seed=51))
        assert engine.clock.now() == 0.0
        assert_idle(engine)
        ok = await engine.generate(request("fits", 50, 14, seed=52))  # 50 + 15 - 1 = 64
        assert ok.finish_reason == "stop"

    run(main())


def test_sim_engine_needs_replay_text() -> None:
    async def main() -> None:
        engine = await started()
        with pytest.raises(EngineError, match="replays recorded text"):
            await engine.generate(GenerateRequest("r", "hello", 10))

    run(main())


def test_request_ids_are_unique_while_in_flight_and_reusable_after() -> None:
    async def main() -> None:
        engine = await started()
        first = asyncio.create_task(engine.generate(request("same", 100, 10, seed=53)))
        await engine.clock.sleep(0.01)
        with pytest.raises(EngineError, match="in flight"):
            await engine.generate(request("same", 100, 10, seed=54))
        assert (await first).finish_reason == "stop"
        assert (await engine.generate(request("same", 100, 10, seed=54))).finish_reason == "stop"

    run(main())


# -- (10) profiles and the registry -------------------------------------------------------


SHIPPED = {
    "qwen3-32b@h200": (262_144, (40, 60)),
    "qwen3-8b@rtx4090": (147_456, (40, 55)),
    "qwen3-0.6b@h200": (114_688, (250, 600)),
}


@pytest.mark.parametrize("name", sorted(SHIPPED))
def test_shipped_profiles_load_and_are_plausible(name: str) -> None:
    profile = load_profile(name)
    kv_per_token, (lo, hi) = SHIPPED[name]
    assert profile.name == name and profile.version == 1
    assert profile.kv_bytes_per_token == kv_per_token
    assert abs(profile.param_count / profile.model.num_params - 1) < 0.03
    assert profile.kv_pool_tokens > 16 * 1024
    decode = profile.step_cost([SeqWork(1024, 1)])
    assert lo < 1 / decode.total_s < hi  # batch-1 decode tokens/s at 1k context
    assert decode.bound == "memory"
    if name == "qwen3-0.6b@h200":
        assert decode.overhead_s > decode.memory_s  # overhead-bound


def test_known_and_unknown_profiles() -> None:
    assert set(SHIPPED) <= set(known_profiles())
    with pytest.raises(UnknownNameError) as info:
        load_profile("qwen3-70b@h200")
    assert info.value.kind == "profile" and "qwen3-32b@h200" in info.value.known


def _shipped_text(name: str) -> str:
    folder = Path(__file__).resolve().parents[1] / "dynbranch" / "engines" / "profiles"
    return (folder / f"{name}.toml").read_text()


@pytest.mark.parametrize(
    ("old", "new", "field"),
    [
        ("num_layers = 64", 'num_layers = "sixty-four"', "[model].num_layers"),
        ("num_layers = 64", "num_layers = true", "[model].num_layers"),
        ("mfu = 0.6947", "mfu = 1.5", "[calibration].mfu"),
        ("mfu = 0.6947", "mfu_typo = 0.5", "[calibration].mfu"),
        ("block_size = 16\n", "", "[scheduler].block_size"),
        ("num_params = 32.8e9", "num_params = 3.28e9", "[model].num_params"),
        ("memory_gib = 140.4", "memory_gib = 40.0", "[gpu].memory_gib"),
        ("version = 1", "version = 2", "version"),
    ],
)
def test_malformed_profile_names_file_and_field(
    tmp_path: Path, old: str, new: str, field: str
) -> None:
    text = _shipped_text("qwen3-32b@h200")
    assert old in text
    path = tmp_path / "broken@h200.toml"
    path.write_text(text.replace(old, new, 1))
    with pytest.raises(MalformedProfileError) as info:
        load_profile_file(path)
    assert info.value.field.startswith(field)
    assert str(path) in str(info.value) and field in str(info.value)


def test_profile_file_round_trip(tmp_path: Path) -> None:
    path = tmp_path / "copy@h200.toml"
    path.write_text(_shipped_text("qwen3-32b@h200"))
    copy = load_profile_file(path)
    assert copy.name == "copy@h200" and copy.model == P32.model
    assert copy.calibration == P32.calibration


def test_registry() -> None:
    clock = VirtualClock()
    sim = make_engine("sim", profile="qwen3-8b@rtx4090", clock=clock, engine_id="e1")
    assert isinstance(sim, SimEngine) and sim.engine_id == "e1"
    assert sim.model == "Qwen/Qwen3-8B"
    zero = make_engine("zero", profile="qwen3-32b@h200", clock=clock, engine_id="z")
    assert isinstance(zero, ZeroEngine) and zero.model == "Qwen/Qwen3-32B"
    assert set(ENGINE_KINDS) == {"sim", "zero", "hf", "vllm"}
    with pytest.raises(UnknownNameError):
        make_engine("tgi", profile="qwen3-32b@h200", clock=clock, engine_id="t")
    with pytest.raises(UnknownNameError):
        make_engine("sim", profile="nope", clock=clock, engine_id="t")


# -- the engine contract ------------------------------------------------------------------


def test_sim_engine_passes_the_contract() -> None:
    run(check_engine_contract(SimEngine(P32, VirtualClock(), "sim-contract")))


def test_sim_engine_passes_the_contract_with_a_tiny_pool() -> None:
    run(check_engine_contract(SimEngine(P32, VirtualClock(), "sim-tiny", kv_blocks=8)))


def test_sim_engine_stepping_one_by_one_passes_the_contract() -> None:
    engine = SimEngine(P32, VirtualClock(), "sim-steps", kv_blocks=8, skip_ahead=False)
    run(check_engine_contract(engine))


def test_zero_engine_passes_the_contract() -> None:
    run(check_engine_contract(ZeroEngine(VirtualClock(), "zero-contract")))


def test_zero_engine_takes_no_time() -> None:
    async def main() -> tuple[GenerateResult, GenerateResult, float]:
        engine = ZeroEngine(VirtualClock())
        await engine.start()
        replayed = await engine.generate(GenerateRequest("a", "hi there", 3, replay_text="x y z w"))
        empty = await engine.generate(GenerateRequest("b", "hi there", 3))
        return replayed, empty, engine.clock.now()

    replayed, empty, now = run(main())
    assert now == 0.0 and replayed.engine_s == 0.0
    assert (replayed.text, replayed.finish_reason) == ("x y z", "length")
    assert (empty.text, empty.finish_reason) == ("", "stop")


def test_zero_engine_reports_its_own_work_on_the_real_clock() -> None:
    """On the real clock the call's ``engine_s`` is the time the engine took to cut the text
    and count the prompt (what the overhead benchmark subtracts); it is not queued."""
    prompt = " ".join(f"word{i} ({i}), " for i in range(5_000))  # new text: encoded afresh

    async def main() -> GenerateResult:
        engine = ZeroEngine(RealClock())
        await engine.start()
        return await engine.generate(GenerateRequest("a", prompt, 8, replay_text="x y z"))

    result = RealClock().run(main())
    assert result.prompt_tokens == count_tokens(prompt)
    assert result.first_scheduled_at == result.arrived_at  # nothing queues
    assert result.finished_at == result.first_token_at > result.arrived_at
    assert result.engine_s == result.finished_at - result.arrived_at > 0.0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(0, 2**32 - 1), min_size=0, max_size=200),
       st.integers(1, 12), st.integers(0, 12), st.sampled_from([None, "", "tenant-a"]))
def test_block_keys_computed_in_one_pass_are_the_chained_block_hashes(
    tokens: list[int], block_size: int, first: int, salt: str | None
) -> None:
    from dynbranch.engines.blocks import block_hash, root_hash
    from dynbranch.engines.scheduler import ReplayPlan, Seq

    request = GenerateRequest(request_id="r", prompt="x", max_tokens=1, cache_salt=salt)
    seq = Seq(request, ReplayPlan.__new__(ReplayPlan), len(tokens), list(tokens), 0, 0.0, (0, 0))
    full = len(tokens) // block_size
    seq.ensure_hashes(min(first, full), block_size)  # in two steps: the chain continues
    seq.ensure_hashes(full, block_size)
    expected, parent = [], root_hash(salt)
    for b in range(full):
        parent = block_hash(parent, tokens[b * block_size : (b + 1) * block_size])
        expected.append(parent)
    assert seq.hashes == expected
