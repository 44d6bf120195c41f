"""Filler text and the requests built from it: what every calibration measurement submits.

Calibration measures an engine's timing, not its answers, so prompts and replayed outputs
are random words whose token count is exact under the sim's tokenizer stand-in (one word of
1–6 letters with its leading space is one token; see :mod:`dynbranch.engines.tokenizer`)
and whose texts share no prefix by chance. One :class:`FillerText` holds the seeded
generator and the vocabulary; every text and request of a measurement is drawn from it in
the order the measurement submits them, so a run is a deterministic function of its seed.
"""

from __future__ import annotations

import random

from dynbranch.engines.protocol import GenerateRequest

_LETTERS = "abcdefghijklmnopqrstuvwxyz"
VOCABULARY_SIZE = 4096
"""Distinct words a :class:`FillerText` draws from (its vocabulary is drawn first)."""


class FillerText:
    """Random stand-in text from one seeded generator, and requests made of it.

    ``rng`` is consumed: the vocabulary is drawn from it when the filler is made, then every
    :meth:`text` and :meth:`request` draws from it in call order.
    """

    def __init__(self, rng: random.Random, vocabulary_size: int = VOCABULARY_SIZE) -> None:
        self.rng = rng
        self.vocabulary = [
            " " + "".join(rng.choices(_LETTERS, k=rng.randint(1, 6)))
            for _ in range(vocabulary_size)
        ]

    def text(self, tokens: int) -> str:
        """A text of exactly ``tokens`` stand-in tokens (distinct texts share no prefix)."""
        return "".join(self.rng.choices(self.vocabulary, k=tokens))

    def request(
        self, request_id: str, prompt: str, max_tokens: int, priority: int = 0
    ) -> GenerateRequest:
        """A request for ``prompt`` that decodes exactly ``max_tokens`` tokens.

        NOTE: the replay text (drawn after the caller drew ``prompt``) has ``max_tokens``
        tokens, so a replay engine ends it on ``"length"`` with exactly that many; a real
        engine ignores it and may stop earlier.
        """
        return GenerateRequest(
            request_id,
            prompt,
            max_tokens=max_tokens,
            replay_text=self.text(max_tokens),
            priority=priority,
        )
