"""The transformers engine and the tiny model it runs (skipped without torch/transformers).

Two tiny models are built once per session: the default one (seed 0), whose greedy outputs
end after some tokens, and an *endless* one (EOS suppressed), whose requests always run to
``max_tokens``, so tests that need a request to still be running or waiting are exact.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

# NOTE: set before transformers is first imported (huggingface_hub reads it at import);
# the engine and these tests also pass local_files_only, so nothing reaches for a hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch", reason="the hf engine needs torch")
transformers = pytest.importorskip("transformers", reason="the hf engine needs transformers")
pytest.importorskip("tokenizers", reason="the tiny model's tokenizer needs tokenizers")

from dynbranch.clock import RealClock  # noqa: E402
from dynbranch.engines.hf import BLOCK_SIZE, HFEngine, IncrementalDetokenizer  # noqa: E402
from dynbranch.engines.profile import kv_blocks_for  # noqa: E402
from dynbranch.engines.protocol import (  # noqa: E402
    CANONICAL,
    SPECULATIVE,
    GenerateChunk,
    GenerateRequest,
    GenerateResult,
)
from dynbranch.errors import ModelNotFoundError, PromptTooLongError  # noqa: E402
from dynbranch.models.tiny import (  # noqa: E402
    CORPUS,
    MAX_POSITIONS,
    SUPPRESS_BIAS,
    main,
    make_tiny,
)
from tests.engine_contract import check_engine_contract  # noqa: E402

PROMPTS = [
    "Hi",
    "You are a router. Pick a handler for: weather in Paris?",
    "Book me a flight from Berlin to Lisbon on 2024-05-17, window seat, no luggage.",
    " ".join(CORPUS.split()[:60]),
]
"""Prompts of clearly different lengths (2 to ~100 tokens)."""


# -- fixtures and helpers -------------------------------------------------------------------


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny(tmp_path_factory.mktemp("tiny") / "tiny-seed0", seed=0)


@pytest.fixture(scope="session")
def endless_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model that never samples EOS: every request runs to ``max_tokens``."""
    return make_tiny(tmp_path_factory.mktemp("tiny") / "endless", eos_bias=-SUPPRESS_BIAS)


@pytest.fixture(scope="session")
def tokenizer(tiny_dir: Path) -> Any:
    return transformers.AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)


@pytest.fixture(scope="session")
def reference(tiny_dir: Path, tokenizer: Any) -> Callable[[str, int], tuple[str, int, str]]:
    """``generate(do_sample=False)`` on the plain transformers model, as (text, tokens, reason)."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    eos = model.generation_config.eos_token_id

    def greedy(prompt: str, max_tokens: int) -> tuple[str, int, str]:
        inputs = tokenizer(prompt, return_tensors="pt")
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # NOTE: as the engine's worker; many times faster on a busy CPU
        try:
            with torch.inference_mode():
                out = model.generate(**inputs, do_sample=False, max_new_tokens=max_tokens)
        finally:
            torch.set_num_threads(threads)
        ids = out[0, inputs.input_ids.shape[1] :].tolist()
        reason = "stop" if ids[-1] == eos else "length"
        text = tokenizer.decode([t for t in ids if t != eos], skip_special_tokens=True)
        return text, len(ids), reason

    return greedy


def run_with(model_dir: Path, body: Callable[[HFEngine], Awaitable[Any]], **kw: Any) -> Any:
    """Start an engine on the real clock, run ``body`` with it, shut it down; assert idle."""
    clock = RealClock()

    async def main() -> Any:
        engine = HFEngine(model_dir, clock, "hf-test", **kw)
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


async def drain(stream: Any, seen: list[GenerateChunk] | None = None) -> GenerateResult:
    chunks = list(seen or []) + [c async for c in stream]
    result = chunks[-1].result
    assert result is not None
    assert "".join(c.text_delta for c in chunks) == result.text
    return result


# -- the tiny model -------------------------------------------------------------------------


def test_make_tiny_same_seed_same_bytes_other_seed_other_weights(tmp_path: Path, tiny_dir: Path):
    again = make_tiny(tmp_path / "again", seed=0)
    other = make_tiny(tmp_path / "other", seed=1)
    weights = (tiny_dir / "model.safetensors").read_bytes()
    assert (again / "model.safetensors").read_bytes() == weights
    assert (other / "model.safetensors").read_bytes() != weights
    for name in ("tokenizer.json", "config.json"):
        assert (again / name).read_bytes() == (tiny_dir / name).read_bytes()
        assert (other / name).read_bytes() == (tiny_dir / name).read_bytes()


def test_tiny_loads_as_a_qwen3_checkpoint(tiny_dir: Path):
    config = json.loads((tiny_dir / "config.json").read_text())
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_dir, local_files_only=True)
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_dir, local_files_only=True)
    assert len(tokenizer) == model.config.vocab_size == 512
    assert tokenizer.eos_token_id == model.config.eos_token_id
    assert tokenizer.pad_token_id == model.config.pad_token_id
    assert tokenizer.bos_token_id == model.config.bos_token_id


@pytest.mark.parametrize(
    "text",
    [
        'Call get_weather(city="Paris") then answer: 18 degrees and sunny.',
        "Crème brûlée in Zürich — 12 €, ≤ ∞; 日本語 and русский 🚀✅",
        "never seen: ǅ ꙮ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 \x00\x07\t\r\n  trailing  ",
    ],
    ids=["ascii", "non-ascii", "unseen-and-control"],
)
def test_tokenizer_round_trips(tokenizer: Any, text: str):
    ids = tokenizer(text)["input_ids"]
    assert tokenizer.decode(ids) == text


def test_incremental_detokenizer_never_splits_a_character(tokenizer: Any):
    text = "ok 𝔘𝔫𝔦 日本 🚀 é"
    ids = tokenizer(text)["input_ids"]
    assert any("\ufffd" in tokenizer.decode([i]) for i in ids), "some character spans tokens"
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push(i) for i in ids] + [detok.flush()]
    assert not any("\ufffd" in d for d in deltas)
    assert "".join(deltas) == detok.text == text
    assert "" in deltas, "a token ending mid-character releases nothing"


def test_detokenizer_flushes_an_unfinished_character(tokenizer: Any):
    ids = tokenizer("a🚀")["input_ids"]
    detok = IncrementalDetokenizer(tokenizer)
    deltas = [detok.push(i) for i in ids[:-1]] + [detok.flush()]
    assert "".join(deltas) == detok.text == tokenizer.decode(ids[:-1])
    assert detok.text.startswith("a") and detok.text.endswith("\ufffd")


def test_module_imports_pull_in_neither_torch_nor_transformers():
    code = (
        "import sys, json\n"
        "import dynbranch.engines, dynbranch.engines.hf, dynbranch.models, dynbranch.models.tiny\n"
        "print(json.dumps(sorted({'torch', 'transformers', 'tokenizers'} & set(sys.modules))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_main_writes_a_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]):
    main([str(tmp_path / "m"), "--seed", "3"])
    assert capsys.readouterr().out.strip() == str(tmp_path / "m")
    names = {p.name for p in (tmp_path / "m").iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= names


# -- the engine -----------------------------------------------------------------------------


def test_engine_contract(tiny_dir: Path):
    clock = RealClock()
    clock.run(check_engine_contract(HFEngine(tiny_dir, clock), replays_text=False))


def test_start_without_a_model_names_the_path(tmp_path: Path):
    clock = RealClock()
    with pytest.raises(ModelNotFoundError, match="no model at .*missing.*make-tiny"):
        clock.run(HFEngine(tmp_path / "missing", clock).start())


def test_greedy_equals_generate_alone(tiny_dir: Path, reference: Callable[..., Any]):
    async def body(engine: HFEngine) -> list[GenerateResult]:
        return [
            await engine.generate(GenerateRequest(f"r{i}", p, 24)) for i, p in enumerate(PROMPTS)
        ]

    results = run_with(tiny_dir, body)
    assert [outcome(r) for r in results] == [reference(p, 24) for p in PROMPTS]
    assert {r.finish_reason for r in results} == {"stop", "length"}, "both endings covered"


def test_greedy_equals_generate_in_one_batch(tiny_dir: Path, reference: Callable[..., Any]):
    async def body(engine: HFEngine) -> list[GenerateResult]:
        requests = [GenerateRequest(f"b{i}", p, 48) for i, p in enumerate(PROMPTS)]
        return await asyncio.gather(*(engine.generate(r) for r in requests))

    results = run_with(tiny_dir, body)
    assert len({r.first_scheduled_at for r in results}) == 1, "all four prefilled in one step"
    assert [outcome(r) for r in results] == [reference(p, 48) for p in PROMPTS]


def test_greedy_equals_generate_when_requests_join_a_running_batch(
    tiny_dir: Path, reference: Callable[..., Any]
):
    early_prompts, late_prompts = PROMPTS[0::3], PROMPTS[1:3]

    async def body(engine: HFEngine) -> list[GenerateResult]:
        early = [
            engine.generate_stream(GenerateRequest(f"e{i}", p, 48))
            for i, p in enumerate(early_prompts)
        ]
        seen = [[await first_chunk(s)] for s in early]
        late = [
            engine.generate(GenerateRequest(f"l{i}", p, 48)) for i, p in enumerate(late_prompts)
        ]
        drained = [drain(s, c) for s, c in zip(early, seen, strict=True)]
        return list(await asyncio.gather(*drained, *late))

    results = run_with(tiny_dir, body)
    early, late = results[:2], results[2:]
    assert min(r.first_scheduled_at for r in late) > max(r.first_token_at for r in early)
    assert max(r.first_scheduled_at for r in late) < early[0].finished_at, "joined mid-decode"
    expected = [reference(p, 48) for p in early_prompts + late_prompts]
    assert [outcome(r) for r in early + late] == expected


def test_stream_has_one_chunk_per_token_and_deltas_make_the_text(tiny_dir: Path):
    async def body(engine: HFEngine) -> list[list[GenerateChunk]]:
        return [
            [c async for c in engine.generate_stream(GenerateRequest(f"s{i}", p, 48))]
            for i, p in enumerate(PROMPTS)
        ]

    for chunks in run_with(tiny_dir, body):
        result = chunks[-1].result
        assert result is not None and not any(c.finished for c in chunks[:-1])
        assert len(chunks) == result.output_tokens
        assert "".join(c.text_delta for c in chunks) == result.text
        assert result.prompt_tokens > 0 and result.cached_prompt_tokens == 0


def test_max_tokens_beyond_the_kv_budget_is_cut(endless_dir: Path):
    async def body(engine: HFEngine) -> GenerateResult:
        with pytest.raises(PromptTooLongError):
            await engine.generate(GenerateRequest("long", " ".join(["word"] * 40), 4))
        return await engine.generate(GenerateRequest("cut", "Hi", 100))

    result = run_with(endless_dir, body, kv_blocks=1)
    assert (result.finish_reason, result.prompt_tokens + result.output_tokens) == (
        "length",
        BLOCK_SIZE,
    )


def test_abort_running_request(endless_dir: Path):
    async def body(engine: HFEngine) -> tuple[GenerateResult, bool]:
        stream = engine.generate_stream(GenerateRequest("run", PROMPTS[1], 200))
        seen = [await first_chunk(stream)]
        aborted = await engine.abort("run")
        return await drain(stream, seen), aborted

    result, aborted = run_with(endless_dir, body)
    assert aborted and result.finish_reason == "abort"
    assert 1 <= result.output_tokens < 200


def test_shutdown_aborts_calls_in_flight(endless_dir: Path):
    async def body(engine: HFEngine) -> tuple[GenerateResult, bool]:
        stream = engine.generate_stream(GenerateRequest("inflight", PROMPTS[1], 200))
        seen = [await first_chunk(stream)]
        await engine.shutdown()
        return await drain(stream, seen), await engine.health()

    result, healthy = run_with(endless_dir, body)
    assert result.finish_reason == "abort" and not healthy


def test_abort_waiting_request(endless_dir: Path):
    async def body(engine: HFEngine) -> tuple[GenerateResult, GenerateResult]:
        running = engine.generate_stream(GenerateRequest("first", PROMPTS[1], 200))
        seen = [await first_chunk(running)]
        waiting = asyncio.ensure_future(engine.generate(GenerateRequest("second", "Hi", 5)))
        await asyncio.sleep(0)  # let it arrive
        assert (engine.load().running, engine.load().waiting) == (1, 1)
        assert await engine.abort("second")
        assert await engine.abort("first")
        return await waiting, await drain(running, seen)

    second, first = run_with(endless_dir, body, max_batch=1)
    assert (second.finish_reason, second.output_tokens, second.text) == ("abort", 0, "")
    assert second.first_scheduled_at == second.finished_at
    assert first.finish_reason == "abort"


def test_cancelling_the_consumer_aborts_the_request(endless_dir: Path):
    async def body(engine: HFEngine) -> GenerateResult:
        started = asyncio.Event()

        async def consume() -> None:
            async for _ in engine.generate_stream(GenerateRequest("x", PROMPTS[1], 200)):
                started.set()

        task = asyncio.ensure_future(consume())
        await started.wait()
        assert engine.load().running == 1
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.load().running == 0
        assert await engine.abort("x") is False, "already gone"
        return await engine.generate(GenerateRequest("x", "Hi", 3))  # the id is free again

    assert run_with(endless_dir, body).finish_reason == "length"


def test_priority_orders_the_waiting_queue(endless_dir: Path):
    async def body(engine: HFEngine) -> list[GenerateResult]:
        head = engine.generate_stream(GenerateRequest("head", PROMPTS[0], 20))
        seen = [await first_chunk(head)]
        later = [
            GenerateRequest("spec-1", "Hi", 2, priority=SPECULATIVE),
            GenerateRequest("spec-2", "Hi", 2, priority=SPECULATIVE),
            GenerateRequest("canon", "Hi", 2, priority=CANONICAL),
        ]
        return list(await asyncio.gather(drain(head, seen), *map(engine.generate, later)))

    results = run_with(endless_dir, body, max_batch=1)
    order = sorted(results, key=lambda r: r.first_scheduled_at)
    assert [r.request_id for r in order] == ["head", "canon", "spec-1", "spec-2"]
    assert len({r.first_scheduled_at for r in results}) == 4


def test_a_promoted_speculative_request_queues_among_canonical_ones_by_arrival(
    endless_dir: Path,
):
    async def body(engine: HFEngine) -> tuple[list[GenerateResult], list[bool]]:
        head = engine.generate_stream(GenerateRequest("head", PROMPTS[0], 20))
        seen = [await first_chunk(head)]
        spec = asyncio.ensure_future(
            engine.generate(GenerateRequest("spec", "Hi", 2, priority=SPECULATIVE)))
        canon = asyncio.ensure_future(engine.generate(GenerateRequest("canon", "Hi", 2)))
        await asyncio.sleep(0)
        moved = [await engine.promote("spec"), await engine.promote("spec"),
                 await engine.promote("canon"), await engine.promote("nobody")]
        assert engine.load().spec_waiting == 0
        return list(await asyncio.gather(drain(head, seen), spec, canon)), moved

    results, moved = run_with(endless_dir, body, max_batch=1)
    assert moved == [True, False, False, False]
    order = sorted(results, key=lambda r: r.first_scheduled_at)
    assert [r.request_id for r in order] == ["head", "spec", "canon"]


def test_load_snapshot_counts_requests_and_kv(endless_dir: Path, tokenizer: Any):
    async def body(engine: HFEngine) -> None:
        requests = [
            GenerateRequest("canon", PROMPTS[3], 40),
            GenerateRequest("spec", PROMPTS[2], 40, priority=SPECULATIVE),
            GenerateRequest("spec-waiting", "Hi", 40, priority=SPECULATIVE),
        ]
        streams = [engine.generate_stream(r) for r in requests]
        seen = [await first_chunk(s) for s in streams[:2]]
        waiting = asyncio.ensure_future(anext(streams[2]))
        await asyncio.sleep(0)
        snap = engine.load()
        assert (snap.running, snap.waiting, snap.spec_running, snap.spec_waiting) == (2, 1, 1, 1)
        assert snap.kv_blocks_total == 2 * kv_blocks_for(MAX_POSITIONS, BLOCK_SIZE)
        prompt_blocks = [
            kv_blocks_for(len(tokenizer(r.prompt)["input_ids"]), BLOCK_SIZE) for r in requests[:2]
        ]
        assert snap.kv_blocks_used >= sum(prompt_blocks)
        assert snap.spec_kv_blocks >= prompt_blocks[1]
        assert snap.spec_kv_blocks <= snap.kv_blocks_used <= snap.kv_blocks_total
        for r in requests:
            await engine.abort(r.request_id)
        await drain(streams[0], seen[:1])
        await drain(streams[1], seen[1:])
        assert (await waiting).result.finish_reason == "abort"

    run_with(endless_dir, body, max_batch=2)


def test_kv_budget_holds_back_a_request_that_does_not_fit(endless_dir: Path):
    async def body(engine: HFEngine) -> list[GenerateResult]:
        # Each needs KV for 2 prompt + 20 - 1 new tokens = 2 blocks: only one fits in 3.
        requests = [GenerateRequest(f"k{i}", "Hi", 20) for i in range(2)]
        streams = [engine.generate_stream(r) for r in requests]
        seen = [await first_chunk(streams[0])]
        pending = asyncio.ensure_future(drain(streams[1]))
        await asyncio.sleep(0)
        assert (engine.load().running, engine.load().waiting) == (1, 1)
        return [await drain(streams[0], seen), await pending]

    first, second = run_with(endless_dir, body, max_batch=2, kv_blocks=3)
    assert second.first_scheduled_at >= first.finished_at
    assert [r.finish_reason for r in (first, second)] == ["length", "length"]
