"""The splice checker's view of a replayed LLM output equals what the engine returns."""

from __future__ import annotations

import dataclasses

from dynbranch.clock import VirtualClock
from dynbranch.engines.profile import load_profile
from dynbranch.engines.protocol import GenerateRequest
from dynbranch.engines.scheduler import replayed_text
from dynbranch.engines.sim import SimEngine
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
