"""The splice checker's view of a replayed LLM output equals what the engine returns."""

from __future__ import annotations

import dataclasses

from hypothesis import given, settings
from hypothesis import strategies as st

from dynbranch.clock import VirtualClock
from dynbranch.engines.profile import load_profile
from dynbranch.engines.protocol import GenerateRequest
from dynbranch.engines.scheduler import Seq, replay_plan, replayed_text
from dynbranch.engines.sim import SimEngine
from dynbranch.engines.tokenizer import encode, encode_array
from dynbranch.engines.zero import ZeroEngine
from tests.test_sim_engine import words

P32 = load_profile("qwen3-32b@h200")


def _generate(engine, request):
    async def main():
        await engine.start()
        try:
            return await engine.generate(request)
        finally:
            await engine.shutdown()
    return engine.clock.run(main())


def test_an_output_cut_by_the_context_is_cut_the_same_way():
    small = dataclasses.replace(P32, model=dataclasses.replace(P32.model, max_model_len=64))
    prompt, text = words(60, 1), words(20, 2)
    result = _generate(SimEngine(small, VirtualClock()), GenerateRequest("a", prompt, 4096,
                                                                         replay_text=text))
    assert result.finish_reason == "length" and result.output_tokens == 4
    assert replayed_text(prompt, text, 4096, 64) == result.text != text
    # the zero engine cuts at max_tokens only, as replayed_text without a context limit
    zero = _generate(ZeroEngine(VirtualClock()), GenerateRequest("b", prompt, 7, replay_text=text))
    assert replayed_text(prompt, text, 7) == zero.text and zero.output_tokens == 7
    assert replayed_text(prompt, text, 4096) == text


def _full_plan(prompt: str, text: str, max_tokens: int, context: int | None) -> str:
    """What the engine returns, computed without the shortcuts (the prompt always encoded,
    the text always split)."""
    room = None if context is None else context - len(encode(prompt))
    request = GenerateRequest("full", prompt, max_tokens=max_tokens, replay_text=text)
    return "".join(replay_plan(request, room).pieces)


@settings(max_examples=300, deadline=None)
@given(st.text("ab c1{}.é", max_size=300), st.text("xy z9,;", min_size=1, max_size=300),
       st.integers(1, 200), st.one_of(st.none(), st.integers(1, 700)))
def test_the_shortcuts_give_what_the_full_plan_gives(prompt, text, max_tokens, context):
    prompt = prompt or "p"
    assert replayed_text(prompt, text, max_tokens, context) == _full_plan(
        prompt, text, max_tokens, context)


def test_prompt_ids_as_an_array_hash_to_the_same_block_keys():
    ids = encode(words(300, 3))
    as_list = Seq(GenerateRequest("l", "x", 8), None, len(ids), list(ids), 0, 0.0, (0, 0))
    as_array = Seq(GenerateRequest("a", "x", 8), None, len(ids), encode_array(words(300, 3)),
                   0, 0.0, (0, 0))
    assert list(as_array.token_ids) == ids
    as_list.ensure_hashes(len(ids) // 16, 16)
    as_array.ensure_hashes(len(ids) // 16, 16)
    assert as_array.hashes == as_list.hashes and len(as_list.hashes) == len(ids) // 16
